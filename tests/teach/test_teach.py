"""The notebooks' exercises: every checker passes on its reference solution and fails on a wrong answer
(a checker that cannot fail checks nothing); LAB_SOLUTIONS swaps a stub for the reference by name."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from lab import teach
from lab.pruning.report import SensitivityStudy
from lab.teach import capstone
from lab.teach import checks as C
from lab.teach import solutions as S

STEPS = {"data_wait": [9.0, 1.0, 2.0], "forward": [1.0, 2.0, 3.0], "backward": [1.0, 1.0, 1.0],
         "optimizer": [0.5, 0.5, 0.5]}
SIZES = [1e3, 1e4, 1e5, 1e6, 4e6]
TIMES = [2 * 50e-6 + s * 1.1e-9 for s in SIZES]
SHARES = {"matmul": 0.6, "elementwise": 0.2}
TECHS = {"bf16": {"matmul": 2.0}, "compile": {"elementwise": 3.0}}


def _scan():
    rows = []
    for layer, drops in (("0.weight", (0, 0.2, 3.0)), ("2.weight", (0, 0.1, 0.5)), ("4.weight", (0, 2.0, 9.0))):
        rows += [{"layer": layer, "amount": a, "metric": 0.9 - d / 100}
                 for a, d in zip((0.0, 0.5, 0.9), drops, strict=True)]
    return rows


MODEL = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 4))


class _Study(SensitivityStudy):
    """A study of MODEL's scan (_scan) whose fine-tune wins back 70 % of what the scan lost, masks kept: the
    checker's logic without a training run (tests/pruning/test_pruning.py runs the real fine-tune)."""

    def finetuned(self, amounts, epochs=1):
        lost = sum(self.dense - next(r["metric"] for r in self.rows if r["layer"] == n and r["amount"] == a)
                   for n, a in amounts.items() if a > 0)
        return {"metric_pruned": self.dense - lost, "metric_finetuned": self.dense - 0.3 * lost,
                "sparsity": {n: amounts.get(n, 0.0) for n in self.sizes}}


STUDY = _Study(cfg=None, rows=_scan(), dense=0.9, sizes={n: m.weight.numel() for n, m in
                                                         (("0.weight", MODEL[0]), ("2.weight", MODEL[2]),
                                                          ("4.weight", MODEL[4]))}, state={})
LAB_RUNS = {"baseline": SimpleNamespace(metric=0.9, model_bytes=300_000, latency_ms={"batch_256": [0.4, 0.5, 0.45]}),
            "int8_eager": SimpleNamespace(metric=0.895, model_bytes=80_000, latency_ms={"batch_256": [0.2, 0.3]})}


def _lab_table(**wrong):
    """The table the lab's runs above make (what a right answer reads), with ``wrong`` columns replaced."""
    rows = {arm: capstone.lab_row(r) for arm, r in LAB_RUNS.items()}
    table = pd.DataFrame(rows).T.assign(within_budget=pd.Series(capstone.verdict(rows, "baseline", 1.0, 0.15)))
    for column, values in wrong.items():
        table[column] = values
    return table


def _wrong_prefetch(loader, depth=2):
    return list(loader)  # reads everything first: a list, no overlap


def _unbounded_prefetch(loader, depth=2):
    yield from S.prefetch(loader, depth=10_000)


def _naive_crossing(bo, bc, to, tc):
    return (to - bo) / (bc - tc) * 1e6 if bc != tc else None  # no "always" / "never" case


def _one_moment(widths, batch):  # Adam's state counted as one moment, not two
    return {**S.step_bytes(widths, batch), "optimizer_state_bytes": S.step_bytes(widths, batch)["params_bytes"]}


def _no_input(widths, batch):  # the activations without the input batch the first Linear keeps
    got = S.step_bytes(widths, batch)
    return {**got, "saved_activations_bytes": got["saved_activations_bytes"] - batch * widths[0] * 4}


def _linear_codes(x, qmap, block_size=256):  # absmax int8 on an even grid, not the map's nearest entry
    codes, scales = S.quantize_blockwise(x, qmap, block_size)
    even = torch.round((x.reshape(-1, block_size) / scales[:, None]) * 127.5 + 127.5).clamp(0, 255)
    return even.to(torch.uint8).reshape(x.shape), scales


def _one_scale(x, qmap, block_size=256):  # per-tensor absmax: one scale for all blocks
    return S.quantize_blockwise(x, qmap, x.numel())

class _TourRun:  # what checks.median_step reads of a RunResult
    step_times_ms, warmup_steps, median_step_ms = {"total": [30.0, 20.0, 5.0, 1.0, 2.0, 3.0, 4.0]}, 2, 3.0


def _fp32_loop(model, optimizer, loader, loss_fn):  # the recipe's loop without autocast
    losses = []
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


CASES = {  # name: (check with the reference, check with a wrong answer)
    "median_step": (lambda: C.median_step(S.median_step, _TourRun()),
                    lambda: C.median_step(lambda t, w: S.median_step(t, 0), _TourRun())),  # warm-up left in
    "interaction": (lambda: C.interaction(S.interaction, None, ["workers2", "bf16"]),
                    lambda: C.interaction(lambda j, a, b: j - a - b + 1, None, ["workers2", "bf16"])),
    "prefetch": (lambda: C.prefetch(S.prefetch), lambda: C.prefetch(_wrong_prefetch)),
    "prefetch-unbounded": (lambda: C.prefetch(S.prefetch, 1), lambda: C.prefetch(_unbounded_prefetch, 1)),
    "wait_fraction": (lambda: C.wait_fraction(S.wait_fraction, STEPS),
                      lambda: C.wait_fraction(lambda st: S.wait_fraction(st, skip=0), STEPS)),
    "bf16_round": (lambda: C.bf16_round(S.bf16_round),
                   lambda: C.bf16_round(lambda x: (x.view(torch.int32) & -65536).view(torch.float32))),  # truncation
    "next_loss_scale": (lambda: C.next_loss_scale(S.next_loss_scale),
                        lambda: C.next_loss_scale(lambda s, inf, g, n: S.next_loss_scale(s, inf, g, n + 1))),
    "train_bf16": (lambda: C.train_bf16(S.train_bf16, steps=4),  # more wrong loops: tests/teach/test_own_loop.py
                   lambda: C.train_bf16(_fp32_loop, steps=4)),
    "global_masks": (lambda: C.global_masks(S.global_masks),
                     lambda: C.global_masks(lambda ws, a: {n: S.global_masks({n: w}, a)[n] for n, w in ws.items()})),
    "per_layer_amounts": (  # the target reached where the scan is flat; half everywhere falls short of it
        lambda: C.per_layer_amounts(S.per_layer_amounts(_scan(), STUDY.sizes, 0.7), STUDY, 0.7),
        lambda: C.per_layer_amounts({"0.weight": 0.5, "2.weight": 0.5, "4.weight": 0.5}, STUDY, 0.7)),
    "per_layer_amounts-over-budget": (  # the target reached, but fine-tuned it costs 3.75 pt
        lambda: None,
        lambda: C.per_layer_amounts({"0.weight": 0.9, "2.weight": 0.9, "4.weight": 0.9}, STUDY, 0.7)),
    "capstone_table": (lambda: C.capstone_table(_lab_table(), LAB_RUNS, 1.0, 0.15),
                       lambda: C.capstone_table(_lab_table(size_mb=[300_000, 80_000]), LAB_RUNS, 1.0, 0.15)),
    "capstone_table-fraction": (lambda: None,  # accuracy as a fraction, not in percent
                                lambda: C.capstone_table(_lab_table(accuracy_pct=[0.9, 0.895]), LAB_RUNS, 1.0, 0.15)),
    "capstone_table-verdict": (lambda: None,  # the baseline called within budget at 0.3 MB of a 0.15 MB budget
                               lambda: C.capstone_table(_lab_table(within_budget=[True, True]), LAB_RUNS, 1.0, 0.15)),
    "capstone_table-seconds": (lambda: None,  # latency in seconds
                               lambda: C.capstone_table(_lab_table(latency_ms=[4.5e-4, 2.5e-4]), LAB_RUNS, 1.0, 0.15)),
    "capstone_table-per-row": (lambda: None,  # the 256-row batch's latency divided by its rows
                               lambda: C.capstone_table(_lab_table(latency_ms=[0.45 / 256, 0.25 / 256]), LAB_RUNS, 1.0,
                                                        0.15)),
    "quantize_per_channel_symmetric": (
        lambda: C.quantize_per_channel_symmetric(S.quantize_per_channel_symmetric),
        lambda: C.quantize_per_channel_symmetric(lambda w: (lambda q, s: (q, s * 127.5 / 127))(
            *S.quantize_per_channel_symmetric(w)))),
    "int8_linear": (lambda: C.int8_linear(S.int8_linear),
                    lambda: C.int8_linear(lambda x, w, b: S.int8_linear(x, w, None))),  # bias forgotten
    "fit_ring": (lambda: C.fit_ring(S.fit_ring, SIZES, TIMES),
                 lambda: C.fit_ring(lambda s, t, p: S.fit_ring(s, t, p + 1), SIZES, TIMES)),
    "ddp_speedup": (lambda: C.ddp_speedup(S.ddp_speedup, 0.01, 60e6),
                    lambda: C.ddp_speedup(lambda c, g, p, a, b: S.ddp_speedup(c, g, p, a, b, bucket_bytes=1e12),
                                          0.01, 60e6)),  # one bucket: too few latencies
    "crossing_macs": (lambda: C.crossing_macs(S.crossing_macs),
                      lambda: C.crossing_macs(_naive_crossing)),
    "regime_of": (lambda: C.regime_of(S.regime_of),
                  lambda: C.regime_of(lambda o, s, m, b: "compute-bound" if o / s < 0.5 else "dispatch-bound")),
    "amdahl_speedup": (lambda: C.amdahl_speedup(S.amdahl_speedup, SHARES, {"matmul": 2.0}),
                       lambda: C.amdahl_speedup(lambda sh, r: 2.0, SHARES, {"matmul": 2.0})),
    "best_technique": (lambda: C.best_technique(S.best_technique, SHARES, TECHS),
                       lambda: C.best_technique(lambda sh, r: max(r, key=lambda t: max(r[t].values())), SHARES, TECHS)),
    "step_bytes": (lambda: C.step_bytes(S.step_bytes), lambda: C.step_bytes(_one_moment)),
    "step_bytes-no-input": (lambda: None, lambda: C.step_bytes(_no_input)),
    "quantize_blockwise": (lambda: C.quantize_blockwise(S.quantize_blockwise),
                           lambda: C.quantize_blockwise(_linear_codes)),
    "quantize_blockwise-one-scale": (lambda: None, lambda: C.quantize_blockwise(_one_scale)),
    "dequantize_blockwise": (lambda: C.dequantize_blockwise(S.dequantize_blockwise),
                             lambda: C.dequantize_blockwise(lambda c, s, q: q[c.long()])),  # the scale forgotten
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checker_passes_on_the_reference_and_fails_on_a_wrong_answer(name):
    right, wrong = CASES[name]
    right()
    with pytest.raises(AssertionError):
        wrong()


def test_the_capstone_holds_latency_to_its_units_not_to_this_machines_speed():
    """The same right figures read 5x slower (a busy CI box timed the learner's calls at 3x the lab's) pass; the
    checker grades units, never speed."""
    C.capstone_table(_lab_table(latency_ms=[0.45 * 5, 0.25 * 5]), LAB_RUNS, 1.0, 0.15)
    C.capstone_table(_lab_table(latency_ms=[0.45 / 5, 0.25 / 5]), LAB_RUNS, 1.0, 0.15)


def test_every_solution_has_a_checker_and_a_case():
    public = {n for n in dir(S) if not n.startswith("_") and callable(getattr(S, n))
              and getattr(S, n).__module__ == S.__name__}
    assert public <= {n for n in dir(C) if not n.startswith("_")}
    assert public <= {n.split("-")[0] for n in CASES}


def test_lab_solutions_swaps_a_stub_for_the_reference_by_name(monkeypatch):
    def bf16_round(x):
        raise NotImplementedError("your turn")

    monkeypatch.setenv("LAB_SOLUTIONS", "1")
    assert teach.use_solution(bf16_round) is S.bf16_round
    monkeypatch.setenv("LAB_SOLUTIONS", "0")
    assert teach.use_solution(bf16_round) is bf16_round
    monkeypatch.delenv("LAB_SOLUTIONS")
    assert teach.use_solution(bf16_round) is bf16_round
    with pytest.raises(NotImplementedError):
        C.bf16_round(teach.use_solution(bf16_round))


def test_the_doctor_exercise_fails_the_speed_up_the_largest_class_rule():
    """The notebook's own numbers (matmul 60 %: bf16 x2 wins) let "speed up the largest class" pass; the checker's
    second case, where the largest class is matmul yet a big rate on two smaller classes wins, does not."""
    def largest_class(shares, rates):
        top = max(shares, key=shares.get)
        return max(rates, key=lambda t: rates[t].get(top, 1.0))

    assert largest_class(SHARES, TECHS) == C.best_technique(S.best_technique, SHARES, TECHS)  # passes the first
    with pytest.raises(AssertionError, match="the largest class is not always the one to speed up"):
        C.best_technique(largest_class, SHARES, TECHS)


def test_the_capstone_solution_measures_size_and_accuracy_as_the_lab_does():
    """The reference table's size is lab.measure's serialized size, its accuracy the share right in percent, and
    within_budget follows the budget (no timing is asserted: latency is only positive)."""
    from lab.measure import serialized_size_bytes

    torch.manual_seed(0)
    x, y = torch.randn(300, 8), torch.randint(0, 4, (300,))
    small = nn.Sequential(nn.Linear(8, 4))
    models = {"baseline": MODEL, "small": small}
    table = S.capstone_table(models, (x, y), 1.0, 0.005, repeats=2)
    for arm, m in models.items():
        assert table.loc[arm, "size_mb"] == serialized_size_bytes(m) / 1e6
        assert table.loc[arm, "accuracy_pct"] == pytest.approx(100 * (m(x).argmax(1) == y).float().mean().item())
        assert table.loc[arm, "latency_ms"] > 0
    acc = table["accuracy_pct"]
    assert table.loc["small", "within_budget"] == (acc["baseline"] - acc["small"] <= 1.0)
    assert not table.loc["baseline", "within_budget"]  # over 0.005 MB
