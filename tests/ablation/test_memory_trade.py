"""Issue 43 item 3: the memory trade per arm (lab.ablation.memory_trade) and its figure (lab.plots.memory) on
planted records: peak ratios by role and step-time ratios against the baseline, intervals only from 3 runs, the
Pareto front's membership, the budget line, and a budget search's tries read back from its record."""

from __future__ import annotations

import math
import os

import pytest

from lab import ResultStore, RunResult
from lab.ablation.memory_budget import fit_budget
from lab.ablation.memory_trade import (
    carries_memory,
    from_ablation,
    from_budget,
    pareto_front,
    pick_measure,
    stored_budget_searches,
)
from lab.config import RunConfig
from lab.memory.roles import STEP_PEAK_ENV

MIB = 2**20


def _run(arm_mb: dict[str, float], step_ms: float, *, seed: int = 0, memory: dict | None = None,
         rss_mb: float = 400.0, arm: str = "") -> RunResult:
    """A finished run whose step holds ``arm_mb`` MB by role and takes ``step_ms`` (2 warm-up steps first)."""
    roles = {f"{k}_bytes": int(v * MIB) for k, v in arm_mb.items()}
    cfg = {"seed": seed, **({"memory": memory} if memory else {})}
    return RunResult(run_id=f"{arm}{seed}".ljust(32, "0"), config=cfg, env={},
                     metric_name="accuracy", metric=0.9, steps=10, warmup_steps=2, batch_size=64, train_time_s=1.0,
                     step_times_ms={"total": [50.0, 40.0] + [step_ms * (1 + 0.01 * i) for i in range(8)]},
                     peak_memory_mb=rss_mb, memory_kind="rss",
                     details={"memory": roles, "resolved": {"steps_per_epoch": 10, "n_train": 1000, "n_test": 500,
                                                            "epochs": 1}})


def _roles(params: float, grads: float, state: float, saved: float) -> dict[str, float]:
    return {"params": params, "grads": grads, "optimizer_state": state, "saved_activations": saved}


BASE = _roles(10, 10, 20, 60)  # 100 MB
PLANTED = {  # arm -> (roles, step ms, memory config): baseline 100 MB at 10 ms
    "baseline": (BASE, 10.0, None),
    "aa": (BASE, 10.0, None),
    "accum2": (_roles(10, 10, 20, 30), 11.0, {"micro_batches": 2}),  # 70 MB, 1.1x: front
    "checkpoint_blocks": (_roles(10, 10, 20, 15), 13.0, {"checkpoint": "blocks"}),  # 55 MB, 1.3x: front
    "accum4": (_roles(10, 10, 20, 15), 14.0, {"micro_batches": 4}),  # 55 MB, 1.4x: dominated by checkpointing
    "adam8bit": (_roles(10, 10, 5, 60), 12.0, {"optimizer_state": "int8"}),  # 85 MB, 1.2x: dominated by accum2
}


def _runs(n: int = 3) -> dict[str, list[RunResult]]:
    return {arm: [_run(roles, ms * (1 + 0.02 * s), seed=s, memory=mem, rss_mb=400 + s, arm=arm) for s in range(n)]
            for arm, (roles, ms, mem) in PLANTED.items()}


def test_the_trade_holds_each_arm_against_the_baseline_by_role_with_intervals_from_three_runs():
    trade = from_ablation(_runs(3), budget_mb=60)
    assert trade["measure"] == "roles" and trade["baseline_peak_mb"] == pytest.approx(100)
    rows = {r["name"]: r for r in trade["rows"]}
    assert rows["baseline"]["peak_ratio"] == 1.0 == rows["baseline"]["time_ratio"] == rows["baseline"]["time_hi"]
    assert rows["accum2"]["peak_ratio"] == pytest.approx(0.70) and rows["accum2"]["time_ratio"] == pytest.approx(1.1)
    assert rows["checkpoint_blocks"]["peak_ratio"] == pytest.approx(0.55)
    assert rows["checkpoint_blocks"]["time_ratio"] == pytest.approx(1.3, rel=1e-3)
    t = rows["checkpoint_blocks"]
    assert t["time_lo"] < t["time_ratio"] < t["time_hi"] and t["peak_lo"] == pytest.approx(0.55)  # bytes: exact
    assert rows["aa"]["time_lo"] <= 1.0 <= rows["aa"]["time_hi"]
    # the front: nothing holds less and steps faster; the A/A arm (the baseline again) is never on it
    assert pareto_front(trade["rows"]) == ["baseline", "accum2", "checkpoint_blocks"]
    assert {r["name"] for r in trade["rows"] if r["front"]} == {"baseline", "accum2", "checkpoint_blocks"}
    assert trade["budget_ratio"] == pytest.approx(0.6)
    assert [r["name"] for r in trade["rows"] if r["fits"]] == ["checkpoint_blocks", "accum4"]
    # one run per arm: the ratios stand, no interval is claimed
    one = {r["name"]: r for r in from_ablation(_runs(1))["rows"]}
    assert one["accum2"]["peak_ratio"] == pytest.approx(0.7) and math.isnan(one["accum2"]["time_lo"])
    assert all(r["fits"] is None for r in one.values())


def test_the_measure_falls_back_to_the_process_peak_where_a_run_did_not_count_roles():
    runs = _runs(3)
    assert pick_measure([r for rs in runs.values() for r in rs]) == "roles"
    runs["baseline"][0].details.pop("memory")
    trade = from_ablation(runs)
    assert trade["measure"] == "rss" and trade["baseline_peak_mb"] == pytest.approx(401)
    assert carries_memory(runs) and not carries_memory({"baseline": runs["baseline"], "aa": runs["aa"]})
    with pytest.raises(ValueError, match="no finished 'baseline' run"):
        from_ablation({"accum2": runs["accum2"]})


def test_the_figure_draws_the_trade_rows_the_front_and_the_budget():
    pytest.importorskip("plotly")
    from lab.plots.memory import memory_vs_time

    trade = from_ablation(_runs(3), budget_mb=60)
    fig = memory_vs_time(trade)
    points = {t.name: t for t in fig.data if t.mode == "markers+text"}
    assert set(points) == {"fits the budget", "over the budget"}
    over = points["over the budget"]
    at = dict(zip(over.text, zip(over.x, over.y, strict=True), strict=True))
    assert at["accum2"] == pytest.approx((1.1, 0.7)) and at["A/A"][1] == pytest.approx(1.0)
    (front,) = [t for t in fig.data if t.name == "Pareto front"]
    assert list(front.x) == pytest.approx([1.0, 1.1, 1.3], rel=1e-3) and list(front.y) == pytest.approx([1, 0.7, 0.55])
    assert any(s.y0 == pytest.approx(0.6) and s.line.dash == "dash" for s in fig.layout.shapes)  # the budget line


def test_a_budget_search_record_becomes_the_trade_of_its_tries(tmp_path):
    def measure(cfg: RunConfig) -> dict:  # the baseline 100 MB at 10 ms; accum2 70 MB at 11 ms; accum4 60 at 14
        k = cfg.memory.micro_batches
        if cfg.memory.checkpoint == "blocks":
            raise ValueError("no blocks")
        return {"peak_mb": {1: 100, 2: 70, 4: 60}[k], "step_ms": {1: 10.0, 2: 11.0, 4: 14.0}[k]}

    found = fit_budget(RunConfig(workload="mlp", size="tiny"), 65, measure_fn=measure, measure="roles")
    trade = from_budget(found)
    rows = {r["name"]: r for r in trade["rows"]}
    assert set(rows) == {"baseline", "accum2", "accum4"} and rows["accum4"]["chosen"]
    assert rows["accum4"]["peak_ratio"] == pytest.approx(0.6) and rows["accum4"]["time_ratio"] == pytest.approx(1.4)
    assert [r["name"] for r in trade["rows"] if r["fits"]] == ["accum4"] and trade["budget_ratio"] == 0.65
    assert pareto_front(trade["rows"]) == ["baseline", "accum2", "accum4"]
    from lab.plots.memory import memory_vs_time

    (star,) = [t for t in memory_vs_time(trade).data if t.name.startswith("the budget's answer")]
    assert list(star.text) == ["accum4 (chosen)"] and (star.x[0], star.y[0]) == pytest.approx((1.4, 0.6))
    # stored with the run it chose, it is found again (and reads the same) from the results store
    r = _run(BASE, 10.0)
    r.details["memory_budget"] = found
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(_run(BASE, 10.0, seed=1), label="plain")
        store.add(r, label="budget")
        (hit,) = stored_budget_searches(store)
        assert hit["run_id"] == r.run_id and hit["budget_mb"] == 65
        again = from_budget(store.get(hit["run_id"]).details["memory_budget"])
    assert [x["name"] for x in again["rows"] if x["chosen"]] == ["accum4"]


def test_lab_project_says_the_budget_the_seeds_way_from_the_measured_arms():
    from lab.ablation.memory_trade import format_memory

    runs = _runs(3)
    projected = {"baseline": {"total_s": 7200.0}, "checkpoint_blocks": {"total_s": 9360.0}}
    text = format_memory(from_ablation(runs, budget_mb=60), projected)
    lines = text.splitlines()
    assert lines[0].startswith("peak memory per arm (roles: tensor bytes by role")
    assert "  baseline 100 MB" in lines and not any(line.strip().startswith("aa ") for line in lines)
    assert any(line.startswith("  accum2 70 MB (0.70x the baseline's), 1.10x the time per step [") for line in lines)
    # the fastest arm that fits (accum4 fits too, at 1.4x), with the projected full run beside it
    assert lines[-1].startswith("60 MB: does not fit (baseline 100 MB) -> fits at 55 MB with checkpoint_blocks, "
                                "1.30x the time per step [")
    assert lines[-1].endswith("(full run 2 h -> 2.6 h)")
    pd = pytest.importorskip("pandas")  # the ablation table's accuracy change, said beside bytes and time
    table = pd.DataFrame([{"arm": "checkpoint_blocks", "acc_loss_pt": 0.2, "acc_loss_lo": 0.0, "acc_loss_hi": 0.4,
                           "loss_unit": "pt"}])
    with_acc = format_memory(from_ablation(runs, budget_mb=60, table=table), projected).splitlines()
    assert with_acc[-1].endswith("(full run 2 h -> 2.6 h), accuracy -0.2 pt [-0.4, 0]")
    assert any(line.startswith("  checkpoint_blocks 55 MB") and line.endswith("accuracy -0.2 pt [-0.4, 0]")
               for line in with_acc)
    assert format_memory(from_ablation(runs, budget_mb=120)).endswith("120 MB: fits (baseline 100 MB): no memory "
                                                                       "lever needed")
    none = format_memory(from_ablation(runs, budget_mb=40)).splitlines()[-1]
    assert none.startswith("40 MB: does not fit (baseline 100 MB); no measured arm fits either: the smallest peak "
                           "is 55 MB (checkpoint_blocks)")
    alone = format_memory(from_ablation({"baseline": runs["baseline"]}, budget_mb=40), None)
    assert alone.endswith("no arm measured: add --recipe or --techniques (accum2, checkpoint_blocks, adam8bit, ...)")
    one = format_memory(from_ablation(_runs(1), budget_mb=60))
    assert "1.30x the time per step (no interval)" in one  # one run: the ratio, no interval claimed


def test_lab_ablate_prints_the_memory_lines_for_memory_arms_only(tmp_path):
    from lab.ablation import run_ablation
    from lab.cli.ablate import _memory_lines
    from lab.recipes import from_techniques

    asked: list[str | None] = []

    def planted(cfg: RunConfig, **kw: object) -> RunResult:  # no training: the planted arm's figures, its config
        asked.append(os.environ.get(STEP_PEAK_ENV))  # whether this run was asked to measure its step's peak
        arm = "accum2" if cfg.memory.micro_batches == 2 else "baseline"
        roles, ms, _ = PLANTED[arm]
        r = _run(roles, ms, seed=cfg.seed, arm=f"{arm}{planted.n}")
        planted.n += 1
        r.config = cfg.to_dict()
        return r

    planted.n = 0
    base = RunConfig(workload="mlp", size="tiny")
    with ResultStore(tmp_path / "r.sqlite") as store:
        mem = from_techniques("m", base, [["accum2"]])
        run_ablation(mem, repeats=3, store=store, run_fn=planted)
        # a memory ablation asks every run for its step's real peak (on its second step, a warm-up step) ...
        assert asked == ["1"] * 9 and os.environ.get(STEP_PEAK_ENV) is None
        said = _memory_lines(mem, store, 3, [0]).splitlines()
        # ... and runs that did not record one (these planted ones, or runs stored before) are read by role, said so
        assert said[0].startswith("peak memory per arm (roles: ")
        assert said[1] == "  (9 of 9 runs did not measure their step's real peak (stored before runs recorded it, " \
                          "or fewer than 2 warm-up steps): read by roles instead)"
        assert said[2] == "  baseline 100 MB" and len(said) == 4
        assert said[3].startswith("  accum2 70 MB (0.70x the baseline's), 1.10x the time per step [")
        assert _memory_lines(from_techniques("p", base, [["fused_optim"]]), store, 3, [0]) is None
        asked.clear()  # no memory lever, or no second warm-up step to measure on: no profiler in any run
        run_ablation(from_techniques("p", base, [["fused_optim"]]), repeats=1, run_fn=planted)
        run_ablation(from_techniques("w", base.with_overrides(warmup_steps=1), [["accum2"]]), repeats=1, run_fn=planted)
        assert asked == [None] * 6


def test_the_trade_reads_the_steps_real_peak_where_every_run_measured_it():
    """The seeds' sentence from ``step_peak_bytes`` (above the roles' sum: transients no role holds), no note."""
    from lab.ablation.memory_trade import format_memory

    runs = _runs(3)
    for rs in runs.values():
        for r in rs:
            rec = r.details["memory"]
            rec["step_peak_bytes"] = int(1.2 * sum(rec.values()))
    trade = from_ablation(runs, budget_mb=60)
    assert trade["measure"] == "step" and "measure_note" not in trade
    text = format_memory(trade).splitlines()
    assert text[0].startswith("peak memory per arm (step: ") and text[1] == "  baseline 120 MB"
    assert text[-1].startswith("60 MB: does not fit (baseline 120 MB); no measured arm fits either: the smallest "
                               "peak is 66 MB (checkpoint_blocks)")
