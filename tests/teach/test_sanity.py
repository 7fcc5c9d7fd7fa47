"""lab.teach.sanity: the rules an executed copy's runs are held to before the render publishes it. The two
planted cases are the copies that once went out: 02's ``auto`` (ran fp32) at 1.25x over fp32, 05's two ranks on
two cores at 5.15x over one process on the same cores. Runs are built by hand (no training): the rules read only
the records."""

from __future__ import annotations

import json

import numpy as np

from lab.result import RunResult
from lab.teach.sanity import AA_BAND, check_rows, check_runs, fp32_twins, held_runs, probe_source, ranks_on_cores


def _steps(ms: float, n: int = 40, seed: int = 0) -> list[float]:
    return list(ms * (1 + 0.02 * np.random.default_rng(seed).standard_normal(n)))


def precision_run(requested: str, resolved: str, ms: float, seed: int = 0, workload: str = "ctr") -> RunResult:
    cfg = {"workload": workload, "size": "small", "max_steps": 40, "threads": 1, "precision": {"dtype": requested}}
    return RunResult(run_id=f"{requested}-{seed}", config=cfg, env={"usable_cores": 2}, workload=workload,
                     step_times_ms={"total": _steps(ms, seed=seed)},
                     details={"precision": {"requested": requested, "resolved": resolved}})


def ddp_run(world: int, per_rank_batch: int, threads: int, ms: float, seed: int = 0) -> RunResult:
    cfg = {"workload": "ctr", "size": "small", "max_steps": 40, "epochs": None, "seed": 0, "threads": threads,
           "batch_size": per_rank_batch, "precision": {"dtype": "fp32"}, "device": "auto",
           "ddp": {"world_size": world, "grad_accum_steps": 1}}
    details = {"distributed": {"world_size": world, "effective_batch": per_rank_batch * world}} if world > 1 else {}
    return RunResult(run_id=f"w{world}-{threads}-{seed}", config=cfg, env={"usable_cores": 2}, workload="ctr",
                     batch_size=per_rank_batch, step_times_ms={"total": _steps(ms, seed=seed)}, details=details)


def test_an_auto_that_ran_fp32_must_read_1_like_an_a_a() -> None:
    fp32 = [precision_run("fp32", "fp32", 10.0, s) for s in (0, 1)]
    quiet = fp32_twins([*fp32, *(precision_run("auto", "fp32", 10.0, s + 5) for s in (0, 1))])
    assert len(quiet) == 1 and quiet[0].ok and "within its noise" in quiet[0].text
    # 02's copy: auto (fp32) at 1.25x over fp32 -- a drifting machine, not a technique
    loud = fp32_twins([*fp32, *(precision_run("auto", "fp32", 8.0, s + 5) for s in (0, 1))])
    assert len(loud) == 1 and not loud[0].ok, loud
    assert loud[0].speedup[0] > AA_BAND and "excludes 1" in loud[0].text


def test_a_wide_a_a_interval_still_fails_when_its_estimate_is_far_from_1() -> None:
    fp32 = precision_run("fp32", "fp32", 10.0)
    noisy = precision_run("auto", "fp32", 8.0, seed=3)
    noisy.step_times_ms["total"] = [8.0, 30.0, 4.0, 8.0, 12.0, 5.0, 7.9, 25.0]  # an interval that spans 1
    [f] = fp32_twins([fp32, noisy])
    assert f.speedup[1] <= 1.0 <= f.speedup[2] and not f.ok and "further than" in f.text


def test_a_real_bf16_speedup_and_an_unpaired_run_are_not_a_a() -> None:
    fp32 = precision_run("fp32", "fp32", 10.0)
    bf16 = precision_run("bf16", "bf16", 6.0)
    other = precision_run("auto", "fp32", 6.0, workload="sequence")  # no fp32 run of its configuration
    assert fp32_twins([fp32, bf16, other]) == []


def test_two_ranks_on_two_cores_cannot_beat_one_process_on_them() -> None:
    ddp = ddp_run(2, 1024, 1, 79.0)
    fair = ranks_on_cores([ddp_run(1, 2048, 2, 70.0), ddp])
    assert len(fair) == 1 and fair[0].ok
    # 05's copy: the 1-process baseline slowed to 407 ms by a neighbour -> DDP "5.15x"
    [f] = ranks_on_cores([ddp_run(1, 2048, 2, 407.0), ddp])
    assert not f.ok and f.speedup[1] > 1 and "2 ranks x batch 1024 on 2 cores" in f.text
    # the half-batch single-thread run is not the same work: no comparison is made with it
    assert ranks_on_cores([ddp_run(1, 1024, 1, 35.0), ddp]) == []


def test_check_runs_applies_every_rule_and_check_rows_reads_json() -> None:
    runs = [precision_run("fp32", "fp32", 10.0), precision_run("auto", "fp32", 8.0), ddp_run(1, 2048, 2, 407.0),
            ddp_run(2, 1024, 1, 79.0)]
    assert [f.rule for f in check_runs(runs)] == ["A/A reads 1", "ranks on cores"]
    rows = [json.loads(r.to_json()) for r in runs] + [{"not": "a run"}]
    assert [f.ok for f in check_rows(rows)] == [False, False]


def test_held_runs_finds_runs_in_nested_containers_once_and_the_probe_writes_them(tmp_path) -> None:
    a, b = precision_run("fp32", "fp32", 10.0), precision_run("bf16", "bf16", 6.0)
    ns = {"results": {("ctr", "fp32"): [a, b]}, "again": a, "_private": precision_run("fp16", "fp16", 5.0),
          "deep": [[[[b]]]], "n": 3}
    assert {r.run_id for r in held_runs(ns)} == {"fp32-0", "bf16-0"}
    out = tmp_path / "runs.json"
    exec(probe_source(str(out)), ns)  # what the render runs in the kernel, here in a plain namespace
    assert sorted(r["run_id"] for r in json.loads(out.read_text())) == ["bf16-0", "fp32-0"]
    assert "held_runs" not in ns and "_lab_render_probe" not in ns  # the probe leaves the namespace as it was
