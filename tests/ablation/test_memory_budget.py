"""``--memory-budget MB`` on ``lab run`` (lab.ablation.memory_budget): the search over the memory levers that keep
the batch picks the fastest measured configuration that fits, skips what can only cost more, refuses a lever once,
halves the batch only as a fallback, and refuses a budget nothing meets in one line naming the smallest peak. A
planted measure (peaks and times as a function of the config) pins the logic; one real search on the tiny
transformer checks that the chosen configuration's measured peak is under the budget."""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import re
from typing import Any

import pytest
import torch

from lab.ablation.memory_budget import (
    BudgetNotMet,
    candidates,
    chosen_config,
    fit_budget,
    format_budget,
    resolve_measure,
    shard_note,
)
from lab.cli import main
from lab.config import RunConfig
from lab.loop import train_step
from lab.measure.memory import MIB, StepPeak
from lab.memory.checkpointing import checkpointed_copy
from lab.memory.roles import STEP_PEAK_ENV, CountingStep, counting_step_peak
from lab.result import RunResult

BASE = RunConfig(workload="mlp", size="tiny")


def planted(calls: list[RunConfig], *, refuse_checkpoint: bool = False, batch_mb: float = 0.0):
    """Peak: 100 MB less what each lever saves (accumulation 20 / 30, checkpointing 30, 8 / 4-bit state 15 / 20),
    plus ``batch_mb`` per row above 8; step time: 10 ms plus what each lever costs (accumulation 1 / 4 ms,
    checkpointing 2 ms, 8 / 4-bit state 8 / 9 ms)."""
    def measure(cfg: RunConfig) -> dict:
        calls.append(cfg)
        m = cfg.memory
        if refuse_checkpoint and m.checkpoint == "blocks":
            raise ValueError("memory.checkpoint='blocks' is invalid for workload 'mlp': no blocks")
        peak = 100 - {1: 0, 2: 20, 4: 30}[m.micro_batches] - (30 if m.checkpoint == "blocks" else 0) \
            - {"fp32": 0, "int8": 15, "int4": 20}[m.optimizer_state] + batch_mb * max((cfg.batch_size or 64) - 8, 0)
        ms = 10 + {1: 0, 2: 1, 4: 4}[m.micro_batches] + (2 if m.checkpoint == "blocks" else 0) \
            + {"fp32": 0, "int8": 8, "int4": 9}[m.optimizer_state]
        return {"peak_mb": peak, "step_ms": ms}
    return measure


def test_the_candidates_start_at_the_budget_free_config_and_try_low_bit_state_last():
    cands = candidates(BASE)
    assert cands[0].name == "baseline" and len(cands) == 18 and len({c.levels for c in cands}) == 18
    assert [c.name for c in cands[1:4]] == ["accum2", "accum4", "checkpoint_blocks"]
    first_low_bit = next(i for i, c in enumerate(cands) if c.last_resort)
    assert all(c.last_resort for c in cands[first_low_bit:])
    # a lever the config already sets is kept: no candidate goes below it
    mine = candidates(BASE.with_overrides(**{"memory.checkpoint": "blocks"}))
    assert len(mine) == 9 and all(c.overrides["memory.checkpoint"] == "blocks" for c in mine)
    assert mine[0].name == "baseline" and "checkpoint_blocks" not in {o for c in mine for o in c.options}


def test_the_search_picks_the_fastest_that_fits_not_the_first_and_skips_what_only_adds_levers():
    calls: list[RunConfig] = []
    found = fit_budget(BASE, 72, measure_fn=planted(calls), measure="roles")
    c = found["chosen"]  # accum4 fits first (70 MB, 14 ms); checkpointing fits too and is faster (70 MB, 12 ms)
    assert c["name"] == "checkpoint_blocks" and c["peak_mb"] == 70 <= 72
    assert found["step_time_ratio"] == pytest.approx(12 / 10)
    status = {r["name"]: r["status"] for r in found["candidates"]}
    assert [r["name"] for r in found["candidates"] if r["status"] == "measured"] == \
        ["baseline", "accum2", "accum4", "checkpoint_blocks"]
    assert status["accum2+checkpoint_blocks"] == "skipped" and status["adam8bit"] == "skipped"
    assert len(calls) == 4 and all(cfg.max_steps == 5 and cfg.latency_repeats == 0 for cfg in calls)
    assert "fits with checkpoint_blocks (peak 70 MB, budget-free 100 MB)" in format_budget(found)
    run_cfg = chosen_config(BASE, found)
    assert run_cfg.memory.checkpoint == "blocks" and run_cfg.max_steps == BASE.max_steps  # not the try's
    found = fit_budget(BASE, 85, measure_fn=planted([]), measure="roles")
    assert found["chosen"]["name"] == "accum2" and found["step_time_ratio"] == pytest.approx(1.1)
    assert fit_budget(BASE, 100, measure_fn=planted([]), measure="roles")["candidates"][0]["fits"]


def test_fsdp2_is_tried_where_the_run_has_ranks_and_said_not_tried_where_it_has_one():
    """Two ranks: FSDP2 halves a rank's params + grads + state (60 of the 100 MB) for 1.5 ms; it is a candidate,
    fits a budget only it meets, and the answer says its peak is one rank's. One rank: no FSDP2 candidate, and a
    budget nothing meets says why it was not tried."""
    two = BASE.with_overrides(**{"ddp.world_size": 2})

    def measure(cfg: RunConfig) -> dict:
        got = planted([])(cfg)
        if cfg.memory.shard == "fsdp2":
            got = {"peak_mb": got["peak_mb"] - 30, "step_ms": got["step_ms"] + 1.5}
        return got

    assert len(candidates(two)) == 36 and len(candidates(BASE)) == 18
    assert "fsdp2" in {o for c in candidates(two) for o in c.options}
    found = fit_budget(two, 72, measure_fn=measure, measure="roles")
    assert found["chosen"]["name"] == "fsdp2" and found["chosen"]["peak_mb"] == 70  # 11.5 ms: checkpointing is 12
    assert found["shard"]["tried"] and "fsdp2 tried at world size 2, in place of DDP: a peak is one rank's" in \
        format_budget(found)
    assert not shard_note(two, "rss")["tried"]
    with pytest.raises(BudgetNotMet, match=r"MB; fsdp2 not tried: one rank has nobody to shard with"):
        fit_budget(BASE, 5, measure_fn=planted([]), measure="roles", batch="never")


def test_a_refused_lever_is_refused_once_and_low_bit_state_is_tried_when_nothing_else_fits():
    calls: list[RunConfig] = []
    found = fit_budget(BASE, 55, measure_fn=planted(calls, refuse_checkpoint=True), measure="roles")
    assert sum(c.memory.checkpoint == "blocks" for c in calls) == 1
    refused = [r for r in found["candidates"] if r["status"] == "refused"]
    assert len(refused) == 9 and all("checkpoint_blocks" in r["options"] for r in refused)
    assert found["chosen"]["name"] == "accum4+adam8bit" and found["chosen"]["peak_mb"] == 55


def test_a_budget_nothing_meets_is_one_line_naming_the_smallest_peak():
    with pytest.raises(BudgetNotMet) as err:
        fit_budget(BASE, 5, measure_fn=planted([]), measure="roles", batch="never")
    msg = str(err.value)
    assert "\n" not in msg and "smallest peak reached is 20 MB (accum4+checkpoint_blocks+adam4bit" in msg
    assert "at least 20 MB" in msg


def test_the_batch_is_halved_only_when_nothing_that_keeps_it_fits():
    found = fit_budget(BASE, 30, measure_fn=planted([], batch_mb=0.5), measure="roles")
    assert found["batch"] == {"from": 64, "to": 16} and found["chosen"]["batch_size"] == 16
    assert found["chosen"]["name"] == "accum4+checkpoint_blocks+adam4bit"
    assert chosen_config(BASE, found).batch_size == 16 and "the effective batch changes" in format_budget(found)
    with pytest.raises(BudgetNotMet, match=r"smallest peak reached is 20 MB \(.* at batch 8"):
        fit_budget(BASE, 5, measure_fn=planted([], batch_mb=0.5), measure="roles")


@pytest.mark.parametrize("bad", ["0", "-5", "abc", "nan", "inf"])
def test_a_bad_budget_is_one_line_before_any_work(bad, capsys, monkeypatch):
    import lab.train

    monkeypatch.setattr(lab.train, "run", lambda *a, **k: pytest.fail("trained despite a bad budget"))
    assert main(["run", "--workload", "mlp", "--size", "tiny", "--no-store", f"--memory-budget={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--memory-budget={bad} is invalid: allowed: a number of MB > 0" in err


def test_a_real_search_runs_the_configuration_whose_measured_peak_fits(capsys):
    base = RunConfig(workload="transformer", size="tiny", threads=1, max_steps=3, warmup_steps=1,
                     latency_repeats=0, seed=0)
    free = fit_budget(base, 1e6)  # the budget-free run fits any budget: its peak, no lever
    assert free["chosen"] is free["baseline"] and len(free["candidates"]) == 1
    peak = free["baseline"]["peak_mb"]
    found = fit_budget(base, 0.7 * peak)
    assert found["measure"] == "step" and found["chosen"]["peak_mb"] <= 0.7 * peak
    assert found["chosen"]["options"] and found["baseline"]["peak_mb"] == pytest.approx(peak, rel=1e-6)
    roles = found["chosen"]["roles_mb"]
    assert roles["saved_activations"] < found["baseline"]["roles_mb"]["saved_activations"]  # what the lever cut
    code = main(["run", "--workload", "transformer", "--size", "tiny", "--threads", "1", "--max-steps", "3",
                 "--warmup-steps", "1", "--latency-repeats", "0", "--no-store", "--no-progress",
                 f"--memory-budget={0.7 * peak:.4f}"])
    out = capsys.readouterr().out
    own = re.search(r"the run's own peak ([0-9.]+) MB \(step\), configuration (\S+)", out)
    assert code == 0 and "fits with" in out and own, out
    assert float(own[1]) <= 0.7 * peak and own[2] != "baseline"  # the run itself held what its try measured


def _block_model() -> torch.nn.Module:
    torch.manual_seed(0)
    block = lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))  # noqa: E731
    return torch.nn.Sequential(*(block() for _ in range(3)), torch.nn.Linear(64, 4))


def test_a_checkpointed_steps_peak_is_the_benchmarks_definition_and_holds_what_the_step_keeps():
    """``step_peak_bytes`` (the run's count, asked for by ``counting_step_peak``) is the same bytes as
    ``benchmarks/memory.py --largest``'s peak (StepPeak around the second step), and at least the parameters,
    gradients and optimizer state that all exist before the optimizer step."""
    model, _ = checkpointed_copy(_block_model(), lambda m: list(m)[:3])
    twin = copy.deepcopy(model)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    loss = torch.nn.functional.cross_entropy

    def two_steps(m: torch.nn.Module, policy: CountingStep, *, around: bool) -> tuple[torch.optim.Optimizer, Any]:
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        batches = itertools.repeat((x, y))
        train_step(m, opt, loss, batches, torch.device("cpu"), policy=policy)
        with StepPeak(m, opt) if around else contextlib.nullcontext() as peak:
            train_step(m, opt, loss, batches, torch.device("cpu"), policy=policy)
        return opt, peak

    with counting_step_peak():
        counting = CountingStep(None, model)
    assert counting.step_peak and os.environ.get(STEP_PEAK_ENV) is None  # asked for inside, not leaked after
    two_steps(model, counting, around=False)
    rec = counting.record
    _, bench_peak = two_steps(twin, CountingStep(None, twin), around=True)
    assert rec["step_peak_bytes"] == bench_peak.bytes  # one definition, two callers
    kept = rec["params_bytes"] + rec["grads_bytes"] + rec["optimizer_state_bytes"]
    assert rec["step_peak_bytes"] >= kept and rec["saved_activations_bytes"] > 0
    plain = CountingStep(None, twin)  # not asked: no profiler, no figure
    two_steps(twin, plain, around=False)
    assert "step_peak_bytes" not in plain.record


def _planted_run(roles_mb: float, step_mb: float, ms: float) -> RunResult:
    parts = {"params_bytes": 1, "grads_bytes": 1, "optimizer_state_bytes": 2,
             "saved_activations_bytes": round(roles_mb * MIB) - 4}
    return RunResult(run_id="x", config={}, env={}, steps=5, warmup_steps=2,
                     step_times_ms={"total": [ms] * 5},
                     details={"memory": {**parts, "step_peak_bytes": round(step_mb * MIB)}})


def test_a_budget_held_by_the_step_peak_never_chooses_what_only_the_roles_say_fits(monkeypatch):
    """Checkpointing keeps fewer bytes by role (60 MB) but its recompute peaks at 90 MB: under a 72 MB budget the
    roles choose it, the step's real peak does not (accum4 fits both ways, at more time)."""
    import lab.train

    seen: list[str | None] = []

    def run(cfg: RunConfig, **_: Any) -> RunResult:
        seen.append(os.environ.get(STEP_PEAK_ENV))
        ck, k = cfg.memory.checkpoint == "blocks", cfg.memory.micro_batches
        if ck:
            return _planted_run(60, 90, 12)
        return _planted_run({1: 100, 2: 85, 4: 70}[k], {1: 100, 2: 85, 4: 70}[k], {1: 10, 2: 11, 4: 14}[k])

    monkeypatch.setattr(lab.train, "run", run)
    by_roles = fit_budget(BASE, 72, measure="roles", batch="never")
    assert by_roles["chosen"]["name"] == "checkpoint_blocks"  # the bug this guards against: fits by role only
    seen.clear()
    by_step = fit_budget(BASE, 72, measure="step", batch="never")
    assert by_step["chosen"]["name"] == "accum4" and by_step["chosen"]["peak_mb"] == pytest.approx(70)
    ck = next(r for r in by_step["candidates"] if r["name"] == "checkpoint_blocks")
    assert ck["peak_mb"] == pytest.approx(90) and not ck["fits"]
    assert seen and set(seen) == {"1"}  # every try asked for the step's peak
    assert resolve_measure(BASE, "auto") == "step"
