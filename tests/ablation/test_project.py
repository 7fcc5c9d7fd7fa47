"""Issue 29: the full-run projection's arithmetic on a stored record, the per-arm time-to-target ratio, the
memory-budget search (on a fake measurement), and ``lab project`` end to end."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pandas")

from lab import ResultStore, RunResult  # noqa: E402
from lab.ablation import summarize  # noqa: E402
from lab.ablation.memory_fit import format_fit, largest_batch  # noqa: E402
from lab.ablation.project import format_projection, project_arm, project_run  # noqa: E402
from lab.ablation.target import default_target, ttt_columns  # noqa: E402


def _record(step_ms: float = 10.0, *, seed: int = 0, reach_s: float | None = 1.0, metric: float = 0.8) -> RunResult:
    steps = [50.0, 30.0] + [step_ms] * 8  # 2 warm-up steps, then 8 of step_ms
    curve = [{"step": 5, "train_s": 0.5, "metric": 0.5, "eval_s": 0.02},
             {"step": 10, "train_s": reach_s or 2.0, "metric": metric if reach_s else 0.5, "eval_s": 0.02}]
    return RunResult(run_id=f"{seed:032d}", config={"seed": seed}, env={}, metric_name="auc", metric=metric,
                     steps=10, warmup_steps=2, batch_size=100, train_time_s=sum(steps) / 1e3 + 0.1,
                     step_times_ms={"total": steps},
                     details={"resolved": {"steps_per_epoch": 10, "n_train": 1000, "n_test": 500},
                              "eval_every": 5, "eval_s": 0.04, "eval_curve": curve,
                              "one_off_s": {"compile": 0.04, "precision_probe": 0.5, "prune_finetune": 0.3,
                                            "total": 0.84}})


def test_projection_arithmetic_on_a_stored_record(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(_record(), label="p")
        (stored,) = store.list_results(label="p")
    p = project_run(stored, epochs=5, rows=2000)
    assert (p["steps_per_epoch"], p["steps"], p["evaluations"]) == (20, 100, 20)
    assert p["step_s"] == pytest.approx(0.010) and p["loop_overhead_s"] == pytest.approx(0.01)
    assert p["warmup_excess_s"] == pytest.approx(0.080 - 2 * 0.010)  # compile is paid here, so not added again
    assert p["one_off_s"] == pytest.approx({"precision_probe": 0.5, "prune_finetune": 0.6})  # fine-tune x rows
    # 100 x (10 ms + 10 ms) + 0.06 warm-up + 20 x 0.02 evaluations + 0.5 + 0.6
    assert p["total_s"] == pytest.approx(2.0 + 0.06 + 0.4 + 1.1)
    assert p["lo_s"] == pytest.approx(p["total_s"]) == pytest.approx(p["hi_s"])  # identical steps: no spread
    assert project_run(stored, epochs=5, rows=2000, eval_every=None)["evaluations"] == 0
    # projected to its own length, a run gives back its own end-to-end time (the sums are exact)
    from lab.result.timeline import end_to_end_s

    same = project_run(stored, epochs=1)
    assert same["total_s"] == pytest.approx(end_to_end_s(stored.train_time_s, stored.details))
    with pytest.raises(ValueError, match="epochs=0"):
        project_run(stored, epochs=0)


def test_per_arm_projection_is_said_the_seeds_way():
    pd = pytest.importorskip("pandas")
    base = [_record(10.0 + i, seed=i) for i in range(3)]
    fast = [_record(5.0 + i, seed=i) for i in range(3)]
    arm, b = project_arm(fast, epochs=100), project_arm(base, epochs=100)
    assert arm["runs"] == 3 and arm["lo_s"] <= arm["total_s"] <= arm["hi_s"] and arm["total_s"] < b["total_s"]
    table = pd.DataFrame([{"arm": "fast", "acc_loss_pt": 0.2, "acc_loss_lo": 0.0, "acc_loss_hi": 0.4,
                           "loss_unit": "pt"}])
    text = format_projection({"baseline": b, "fast": arm}, table)
    assert text.splitlines()[1].startswith(f"baseline {b['total_s']:.3g} s -> fast {arm['total_s']:.3g} s [")
    assert "accuracy -0.2 pt [-0.4, 0]" in text


def test_time_to_target_ratio_per_arm_with_never_reached_said():
    base = [_record(reach_s=t, seed=i) for i, t in enumerate((1.0, 1.1, 0.9))]
    fast = [_record(reach_s=t, seed=i) for i, t in enumerate((0.5, 0.55, 0.45))]
    never = [_record(reach_s=None, seed=i, metric=0.5) for i in range(3)]
    some = [*fast[:2], never[0]]
    assert default_target(base, budget_pt=1.0) == pytest.approx(0.79)
    row = ttt_columns(base, fast, 0.79)  # each time has the 0.5 s precision probe paid before training
    assert row["ttt_speedup"] == pytest.approx(1.5 / 1.0) and row["ttt_speedup_lo"] <= 1.5 <= row["ttt_speedup_hi"]
    assert row["ttt_reached"] == "reached" and row["ttt_s"] == pytest.approx(1.0)
    assert ttt_columns(base, never, 0.79)["ttt_reached"] == "never reached"
    partial = ttt_columns(base, some, 0.79)
    assert partial["ttt_reached"] == "2/3 reached" and math.isnan(partial["ttt_speedup"])
    df = summarize({"baseline": base, "fast": fast, "never": never}).set_index("arm")
    assert df.loc["baseline", "ttt_speedup"] == 1.0 and df.loc["fast", "ttt_speedup"] == pytest.approx(1.5)
    assert df.loc["never", "ttt_reached"] == "never reached" and df.loc["fast", "one_off_s"] == pytest.approx(0.84)


def _fake_peak(per_row_mb: float, fixed_mb: float = 100.0, n_train: int = 1 << 16):
    calls = []

    def try_fn(cfg):
        calls.append(cfg.batch_size)
        assert cfg.max_steps and cfg.latency_repeats == 0  # a short try, not a run
        return {"peak_mb": fixed_mb + per_row_mb * cfg.batch_size, "kind": "rss", "step_ms": 1.0,
                "samples_per_s": 1e3, "n_train": n_train}
    return try_fn, calls


def test_memory_budget_search_returns_a_fitting_batch_whose_doubling_does_not_fit():
    from lab import RunConfig

    try_fn, calls = _fake_peak(0.5)
    found = largest_batch(RunConfig(batch_size=64), 400.0, try_fn=try_fn)
    assert found["peak_mb"] <= 400.0 < found["doubling_peak_mb"] and found["doubling"] == 2 * found["batch"]
    assert 600 * 0.95 <= found["batch"] <= 600  # the true edge is 600 rows, bisected to 5 %
    assert calls[:5] == [64, 128, 256, 512, 1024]  # doubling, then bisection
    assert "largest batch" in format_fit(found)
    none_fit = largest_batch(RunConfig(batch_size=8), 50.0, try_fn=_fake_peak(0.5)[0])
    assert none_fit["batch"] is None and "not even batch 1" in format_fit(none_fit)
    bounded = largest_batch(RunConfig(batch_size=64), 1e6, try_fn=_fake_peak(0.5, n_train=300)[0])
    assert bounded["batch"] == 300 and "training split" in bounded["bound"]
    with pytest.raises(ValueError, match="memory_budget"):
        largest_batch(RunConfig(), 0.0, try_fn=try_fn)


def test_lab_project_projects_the_baseline_of_a_measured_run(tmp_path, capsys):
    from lab.cli import main

    code = main(["project", "--workload", "ctr", "--size", "tiny", "--epochs", "4", "--rows", "32768",
                 "--repeats", "1", "--max-steps", "12", "--latency-repeats", "0", "--store", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert code == 0 and "baseline" in out and "256 steps, 64 per epoch" in out  # 2x the rows: 2x the batches
    # the memory line reads each run's step's real peak, measured on a warm-up step, and it holds at least what
    # the roles say the step keeps (here: saved activations and gradients coexist with a matmul's output)
    assert "peak memory per arm (step: a training step's real peak" in out
    with ResultStore(tmp_path / "s") as store:
        (r,) = store.list_results()
    rec = r.details["memory"]
    roles = sum(rec[k] for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes", "saved_activations_bytes"))
    assert rec["step_peak_bytes"] >= roles > 0
    assert f"baseline {rec['step_peak_bytes'] / 2**20:.4g} MB" in out
    assert main(["project", "--workload", "ctr"]) == 2  # --epochs is required


def test_project_steps_is_the_arithmetic_the_doctor_calls_without_a_run():
    from lab.ablation.project import project_steps

    p = project_steps(0.02, steps_per_epoch=100, epochs=3, step_lo_s=0.018, step_hi_s=0.025, per_eval_s=0.5,
                      eval_every=100, one_off_s={"compile": 4.0, "quantize": 1.0, "total": 5.0})
    assert (p["steps"], p["evaluations"]) == (300, 3) and p["one_off_total_s"] == pytest.approx(5.0)  # total ignored
    assert p["total_s"] == pytest.approx(300 * 0.02 + 3 * 0.5 + 5.0)
    assert p["lo_s"] == pytest.approx(300 * 0.018 + 6.5) and p["hi_s"] == pytest.approx(300 * 0.025 + 6.5)
    assert project_steps(0.02, steps_per_epoch=10, epochs=1)["total_s"] == pytest.approx(0.2)  # no eval, no one-off
    with pytest.raises(ValueError, match="steps_per_epoch=0"):
        project_steps(0.02, steps_per_epoch=0, epochs=1)


def test_the_headline_says_end_to_end_first_with_the_per_step_ratio_and_memory_beside_it():
    pd = pytest.importorskip("pandas")
    from lab.ablation.project import measured_arms, seeds_way

    base = [_record(10.0 + i, seed=i) for i in range(3)]
    fast = [_record(5.0 + i, seed=i) for i in range(3)]
    slow = [_record(20.0 + i, seed=i) for i in range(3)]
    times = measured_arms({"baseline": base, "fast": fast, "slow": slow, "aa": base})
    assert "aa" not in times and times["fast"]["lo_s"] <= times["fast"]["total_s"] <= times["fast"]["hi_s"]
    table = pd.DataFrame([
        {"arm": "baseline", "peak_memory_mb": 410.0},
        {"arm": "fast", "train_speedup": 2.0, "step_speedup": 1.8, "step_speedup_lo": 1.6, "step_speedup_hi": 2.0,
         "acc_loss_pt": 0.2, "acc_loss_lo": 0.0, "acc_loss_hi": 0.4, "loss_unit": "pt", "peak_memory_mb": 380.0},
        {"arm": "slow", "step_speedup": float("nan"), "acc_loss_pt": float("nan"), "peak_memory_mb": 500.0}])
    said = seeds_way(table, times)  # default: the fastest arm end to end
    b, f = times["baseline"]["total_s"], times["fast"]["total_s"]
    assert said.startswith(f"baseline {b:.3g} s -> fast {f:.3g} s [")
    assert said.endswith("end to end (per step 1.80x [1.60, 2.00]), accuracy -0.2 pt [-0.4, 0], "
                         "peak memory 410 -> 380 MB")
    slow_said = seeds_way(table, times, arm="slow")  # no per-step figure, no accuracy: left out, not "nan"
    assert "nan" not in slow_said and "per step" not in slow_said and slow_said.endswith("410 -> 500 MB")
    # a loss is said as one: never "baseline 10 s -> slow 21 s" in the neutral words of a gain
    assert slow_said.startswith(f"slower end to end, {times['slow']['total_s'] / b:.2f}x the baseline's time: ")
    trains_slower = table.assign(train_speedup=[float("nan"), 2.0, 0.5])  # slow competes on training time
    only_slow = seeds_way(trains_slower, {k: v for k, v in times.items() if k != "fast"})
    assert only_slow.startswith("no arm is faster end to end; the fastest (slow) takes ")
    assert not said.startswith(("slower", "no arm"))
    one = measured_arms({"baseline": base[:1], "fast": fast[:1]})  # one run: no interval, and none is said
    assert "[" not in seeds_way(None, one).split("end to end")[0]
    assert seeds_way(table, {"baseline": times["baseline"]}) is None  # nothing to compare
    # a post-training arm (int8: its training is the baseline's) is never "the fastest end to end" by default,
    # even when noise makes it so; an accuracy interval of zero width (one seed) is not printed as certainty
    quicker = [_record(4.0 + i, seed=i) for i in range(3)]
    times = measured_arms({"baseline": base, "fast": fast, "int8": quicker})
    table = pd.concat([table, pd.DataFrame([{"arm": "int8", "train_speedup": float("nan")}])], ignore_index=True)
    assert " -> fast " in seeds_way(table, times)
    assert seeds_way(table.query("arm != 'fast'"), {k: v for k, v in times.items() if k != "fast"}) is None
    table.loc[table["arm"] == "fast", ["acc_loss_lo", "acc_loss_hi"]] = 0.2
    assert "accuracy -0.2 pt (one seed: no interval)" in seeds_way(table, times)
