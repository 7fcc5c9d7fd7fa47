"""run_ablation: interleaving, columns, exact baseline, error rows, resume after SIGKILL; CI maths on
synthetic samples; budget search, Pareto front and interaction effects on a hand-made table."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pandas")
import pandas as pd  # noqa: E402

from lab import ResultStore, RunConfig, RunResult, run  # noqa: E402
from lab.ablation import (  # noqa: E402
    COLUMNS,
    Ablation,
    best_under_budget,
    end_to_end_train_s,
    interaction_effects,
    pareto_front,
    run_ablation,
    summarize,
)
from lab.measure.stats import bootstrap_ratio_ci  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]


def _two_arm(toy_workload, name: str = "t") -> Ablation:
    base = RunConfig(workload="toy", size="tiny", threads=1, latency_repeats=5)
    return Ablation(name=name, baseline=base, arms={"bf16": base.with_overrides(**{"precision.dtype": "bf16"})},
                    aa=False)


def test_two_arm_ablation_has_documented_columns_and_exact_baseline(toy_workload, private_store):
    events = []
    with ResultStore(private_store) as store:
        df = run_ablation(_two_arm(toy_workload), repeats=2, store=store, progress=events.append)
        assert store.count(status="ok") == 4
    assert list(df.columns) == COLUMNS and list(df["arm"]) == ["baseline", "bf16"]
    base = df.iloc[0]
    for k in ("train_speedup", "train_speedup_lo", "train_speedup_hi", "infer_speedup", "step_speedup"):
        assert base[k] == 1.0
    assert base["acc_loss_pt"] == 0.0 and base["within_noise"]
    arm = df.iloc[1]
    assert arm["status"] == "ok" and arm["n_ok"] == 2
    assert arm["train_speedup"] > 0 and math.isnan(arm["train_speedup_lo"])  # 2 runs: no interval, not a 0-width one
    assert arm["metric_name"] == "accuracy" and arm["hardware_id"]
    order = [e["arm"] for e in events if e["phase"] == "ablation"]
    assert order == ["baseline", "bf16", "bf16", "baseline"]  # interleaved, each round starting one arm later


def test_failing_arm_is_an_error_row_and_the_others_finish(toy_workload):
    def flaky(cfg, **kw):
        if cfg.precision.dtype == "bf16":
            raise RuntimeError("kernel missing")
        return run(cfg, **kw)

    df = run_ablation(_two_arm(toy_workload), repeats=1, run_fn=flaky)
    bad = df.set_index("arm").loc["bf16"]
    assert bad["status"] == "error" and "kernel missing" in bad["error"] and pd.isna(bad["train_speedup"])
    assert df.set_index("arm").loc["baseline", "status"] == "ok"


def test_resume_after_sigkill_reruns_only_missing_runs(toy_workload, private_store):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        from toy_workload import TOY
        from lab import ResultStore, RunConfig, register_workload
        from lab.ablation import Ablation, run_ablation
        register_workload(TOY, overwrite=True)
        base = RunConfig(workload="toy", size="tiny", threads=1, latency_repeats=5)
        ab = Ablation(name="t", baseline=base, arms={{"bf16": base.with_overrides(**{{"precision.dtype": "bf16"}})}},
                      aa=False)
        def die(ev):
            if ev["phase"] == "ablation" and ev["done"] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        run_ablation(ab, repeats=3, store=ResultStore({str(private_store)!r}), progress=die)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    with ResultStore(private_store) as store:
        assert store.count(status="ok") == 3  # nothing finished was lost
        calls = []

        def counting(cfg, **kw):
            calls.append(cfg.precision.dtype)
            return run(cfg, **kw)

        df = run_ablation(_two_arm(toy_workload), repeats=3, store=store, run_fn=counting)
        assert calls == ["fp32", "fp32", "bf16"]  # only the 3 missing (arm, repeat) runs, in rotated order
        assert store.count(status="ok") == 6
    assert list(df["n_ok"]) == [3, 3]


def test_bad_arguments_raise_value_error_naming_the_field(toy_workload):
    ab = _two_arm(toy_workload)
    with pytest.raises(ValueError, match="repeats=0"):
        run_ablation(ab, repeats=0)
    with pytest.raises(ValueError, match="seeds"):
        run_ablation(ab, seeds=())
    with pytest.raises(ValueError, match="arms"):
        Ablation(name="x", baseline=ab.baseline, arms={})


# ---------------------------------------------------------------------------------------------- synthetic

def _fake(train_s: float, lat: list[float], metric: float, *, seed=0, why=(), details=None) -> RunResult:
    return RunResult(run_id="x" * 32, config={"seed": seed}, env={"hardware_id": "hw"}, metric_name="accuracy",
                     metric=metric,
                     train_time_s=train_s, latency_ms={"batch_256": lat}, model_bytes=100, macs_per_sample=10,
                     why=list(why), details=details or {})


def test_speedup_and_ci_on_synthetic_samples_match_bootstrap():
    base = [_fake(t, [4.0, 4.2, 3.9], 0.90) for t in (2.0, 2.2, 1.9)]
    arm = [_fake(t, [2.0, 2.1, 1.9], m, details={"pruning": {"finetune": {"time_s": 0.5}}})
           for t, m in ((0.5, 0.88), (0.6, 0.89), (0.55, 0.87))]
    df = summarize({"baseline": base, "fast": arm}).set_index("arm")
    est, lo, hi = bootstrap_ratio_ci([2.0, 2.2, 1.9], [1.0, 1.1, 1.05])  # fine-tune time counted
    assert df.loc["fast", "train_speedup"] == pytest.approx(est) == pytest.approx(2.0 / 1.05)
    assert (df.loc["fast", "train_speedup_lo"], df.loc["fast", "train_speedup_hi"]) == pytest.approx((lo, hi))
    assert df.loc["fast", "infer_speedup"] == pytest.approx(4.0 / 2.0)
    assert df.loc["fast", "acc_loss_pt"] == pytest.approx(100 * (0.90 - 0.88))
    assert end_to_end_train_s(arm[0]) == pytest.approx(1.0)


def test_within_noise_uses_the_seed_spread():
    base = [_fake(1.0, [1.0], m, seed=s) for s, m in enumerate((0.80, 0.84, 0.88, 0.82))]  # IQR 3.5 points
    df = summarize({"baseline": base, "a": [_fake(1.0, [1.0], 0.83)], "b": [_fake(1.0, [1.0], 0.70)]})
    df = df.set_index("arm")
    assert df.loc["a", "within_noise"] and not df.loc["b", "within_noise"]
    assert df.loc["a", "noise_pt"] == pytest.approx(3.5)
    one_seed = summarize({"baseline": [_fake(1.0, [1.0], 0.8)] * 3, "a": [_fake(1.0, [1.0], 0.79)]})
    assert one_seed.iloc[1]["within_noise"] is None and math.isnan(one_seed.iloc[1]["noise_pt"])  # unknown, not 0


def _table(n: int = 3) -> pd.DataFrame:
    rows = [("baseline", "", 1.0, 0.0), ("p", "p", 1.3, 0.4), ("q", "q", 1.5, 2.5), ("p+q", "p+q", 2.4, 2.2),
            ("slow", "slow", 0.8, 0.5), ("aa", "", 1.02, 0.0), ("lucky", "lucky", 1.6, 0.0)]
    df = pd.DataFrame([{c: None for c in COLUMNS} | {
        "arm": a, "techniques": t, "status": "ok", "n_ok": n, "train_speedup": s,
        "train_speedup_lo": (0.7 if a == "lucky" else s - 0.1), "train_speedup_hi": s + 0.1, "acc_loss_pt": loss,
        "acc_loss_lo": loss - 0.1, "acc_loss_hi": loss + 0.1, "loss_unit": "pt", "baseline_learned": True}
        for a, t, s, loss in rows])
    return df


def test_budget_pareto_and_interactions_on_a_hand_made_table():
    df = _table()
    assert best_under_budget(df, 1.0)["arm"] == "p"  # "lucky" is faster on its point estimate, not beyond noise
    assert best_under_budget(df, 1.0, conservative=False)["arm"] == "lucky"
    assert best_under_budget(df, 3.0)["arm"] == "p+q"
    assert best_under_budget(df, 0.0) is None  # the baseline and the A/A arm never win
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget_pt"):
            best_under_budget(df, bad)
    assert pareto_front(df) == ["p+q", "lucky"]  # lucky dominates the baseline on its point estimate; aa takes no part
    effects = interaction_effects(df).set_index("techniques")
    pq = effects.loc["p+q"]
    assert pq["term"] == "2-way" and pq["effect"] == pytest.approx(2.4 / (1.3 * 1.5))
    assert pq["effect_lo"] < pq["effect"] < pq["effect_hi"] and pq["verdict"] == "compound"
    assert pq["loss_effect_pt"] == pytest.approx(2.2 - 0.4 - 2.5)
    assert effects.loc["slow", "term"] == "main" and effects.loc["slow", "verdict"] == "cancel"


def test_the_verdict_needs_three_runs_a_learning_baseline_and_a_margin_beyond_noise():
    from lab.ablation import verdict

    assert verdict(_table(n=1))["text"].startswith("n = 1: no interval, no verdict")
    said = verdict(_table())
    assert said["winner"] == "p" and "beats the baseline beyond noise" in said["text"] and "A/A" in said["text"]
    unlearned = _table().assign(baseline_learned=False)
    assert verdict(unlearned)["winner"] is None and "did not learn" in verdict(unlearned)["text"]
    noisy = _table().assign(train_speedup_lo=0.9)
    assert verdict(noisy)["text"].startswith("no technique beat the baseline beyond noise")


def test_a_three_way_term_is_reported_with_an_interval():
    rows = {"": 1.0, "a": 1.2, "b": 1.1, "c": 1.3, "a+b": 1.32, "a+c": 1.56, "b+c": 1.43, "a+b+c": 2.4}
    df = pd.DataFrame([{c: None for c in COLUMNS} | {
        "arm": t or "baseline", "techniques": t, "status": "ok", "n_ok": 3, "train_speedup": s,
        "train_speedup_lo": s * 0.95, "train_speedup_hi": s * 1.05, "acc_loss_pt": 0.0} for t, s in rows.items()])
    three = interaction_effects(df).set_index("term").loc["3-way"]
    assert three["effect"] == pytest.approx(2.4 * 1.2 * 1.1 * 1.3 / (1.32 * 1.56 * 1.43))
    assert three["effect_lo"] < three["effect"] < three["effect_hi"]


def test_post_training_int8_never_crowned_for_training_and_aa_is_the_baseline_again(toy_workload):
    from lab.recipes import from_techniques

    base = RunConfig(workload="toy", size="tiny", threads=1, latency_repeats=5)
    ab = from_techniques("axes", base, [["int8_eager"], ["bf16"]])
    df = run_ablation(ab, repeats=3).set_index("arm")
    assert list(df.index) == ["baseline", "int8_eager", "bf16", "aa"]
    assert math.isnan(df.loc["int8_eager", "train_speedup"]) and df.loc["int8_eager", "axes"] == "inference,size"
    assert math.isnan(df.loc["bf16", "infer_speedup"])  # inference runs in fp32: no bf16 inference figure
    assert df.loc["int8_eager", "infer_speedup"] > 0 and df.loc["bf16", "train_speedup"] > 0
    # The A/A arm is the baseline's own config run again (what it measures is the noise floor); whether its
    # interval covers 1 depends on this machine's load, so only its structure is asserted.
    assert ab.arms["aa"] == ab.baseline and ab.techniques["aa"] == ()
    aa = df.loc["aa"]
    assert aa["n_ok"] == 3 and aa["train_speedup_lo"] <= aa["train_speedup"] <= aa["train_speedup_hi"]
    best = best_under_budget(df.reset_index(), 100.0, "train_speedup")
    assert best is None or best["arm"] != "int8_eager"


def test_ablate_cli_prints_the_table_and_refuses_bad_input_in_one_line(toy_workload, private_store, capsys):
    from lab.cli import main

    assert main(["ablate", "--workload", "toy", "--techniques", "bf16", "--repeats", "1", "--store",
                 str(private_store)]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "bf16" in out and "verdict (train, within 1): n = 1: no interval, no verdict" in out
    assert "recommendation: No recommendation yet: n = 1: no interval" in out  # the card's words: a preview crowns none
    assert "the code:" not in out
    assert "of_ceiling" in out  # each arm's share of its ceiling (blank where this machine has no card)
    assert main(["ablate", "--recipe", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lab: error: recipe='nope' is invalid") and "\n" not in err


def test_stored_ablations_are_grouped_by_workload_size_and_threads(toy_workload, private_store):
    from lab.ablation import load_stored, stored_ablations

    ab = _two_arm(toy_workload, name="grp")
    with ResultStore(private_store) as store:
        run_ablation(ab, repeats=1, store=store)
        other = Ablation(name="grp", baseline=ab.baseline.with_overrides(threads=2), arms={"bf16": ab.arms["bf16"]})
        assert other.key != ab.key  # another thread count is another comparison
        (key,) = stored_ablations(store)
        assert key.startswith("grp@toy/tiny/t1#") and key == ab.key
        runs = load_stored(store, ab.key)
    assert {a: len(r) for a, r in runs.items()} == {"baseline": 1, "bf16": 1}


@pytest.mark.parametrize("repeats,seeds", [(3, [0]), (2, [0, 1]), (5, [0])])
def test_every_round_runs_every_arm_once_and_no_arm_always_runs_first(repeats, seeds):
    base = RunConfig(workload="ctr", size="tiny")
    ab = Ablation(name="order", baseline=base, arms={"bf16": base.with_overrides(**{"precision.dtype": "bf16"}),
                                                     "fused": base.with_overrides(**{"compute.fused_optimizer": True})})
    plan = ab.schedule(repeats, seeds)
    n = len(ab.arms)  # baseline, the two arms and the A/A arm
    rounds = [plan[i:i + n] for i in range(0, len(plan), n)]
    assert len(rounds) == repeats * len(seeds)
    assert all(sorted(a for a, *_ in r) == sorted(ab.arms) for r in rounds)  # each round: every arm once
    firsts = [r[0][0] for r in rounds]
    assert len(set(firsts)) == min(n, len(rounds))  # the first slot rotates through the arms
    assert all({rep for _, rep, *_ in r} == {r[0][1]} for r in rounds)  # one repeat per round


def test_a_winner_must_clear_the_a_a_arms_interval_not_only_1():
    """The dashboard crowned prune50 at [1.15, 5.48] while the A/A arm (the baseline again) read [0.3, 5.5]:
    noise alone reached 5.5x in that table, so nothing below it is a win."""
    from lab.ablation import verdict

    wide = _table().copy()
    wide.loc[wide["arm"] == "aa", ["train_speedup", "train_speedup_lo", "train_speedup_hi"]] = [1.0, 0.3, 5.5]
    assert best_under_budget(wide, 1.0) is None and verdict(wide)["winner"] is None
    clear = wide.copy()
    clear.loc[clear["arm"] == "p", ["train_speedup", "train_speedup_lo", "train_speedup_hi"]] = [6.0, 5.6, 6.4]
    assert best_under_budget(clear, 1.0)["arm"] == "p" and verdict(clear)["winner"] == "p"


def test_a_table_with_a_run_measured_on_a_busy_machine_crowns_nothing():
    from lab.ablation import verdict

    busy = _table().assign(busy_runs=0, others_cores=0.1)
    busy.loc[busy["arm"] == "lucky", ["busy_runs", "others_cores"]] = [1, 1.3]
    said = verdict(busy)
    assert said["winner"] is None and said.get("busy")
    assert "busy" in said["text"] and "1.3 cores in 1 of 21 runs" in said["text"] and "rerun when idle" in said["text"]
    assert verdict(busy.assign(busy_runs=0))["winner"] == "p"  # the same table measured quietly names it


def test_summarize_counts_busy_runs_and_keeps_their_sentence_out_of_the_why():
    sentence = "measured while this machine was busy (other processes used 1.2 of 2 cores; load 3.0): ..."
    quiet = {"contention": {"busy": False, "others_cores": 0.05, "sentence": ""}}
    loud = {"contention": {"busy": True, "others_cores": 1.2, "sentence": sentence}}
    base = [_fake(1.0, [1.0], 0.8, details=quiet) for _ in range(3)]
    arm = [_fake(1.0, [1.0], 0.8, details=d) for d in (quiet, loud, quiet)]
    arm[1].why.append(sentence)
    df = summarize({"baseline": base, "a": arm}).set_index("arm")
    assert df.loc["a", "busy_runs"] == 1 and df.loc["a", "others_cores"] == pytest.approx(1.2)
    assert df.loc["baseline", "busy_runs"] == 0 and sentence not in df.loc["a", "why"]


def test_each_arm_carries_the_median_share_of_the_gemm_peak_its_runs_reached_and_the_table_shows_it():
    """``details["utilisation"]`` per run (lab.measure.run_utilisation) becomes the arm's median share; an arm
    whose runs have none (no machine card) says nothing rather than 0."""
    from lab.plots.tables import ablation_table

    def util(share: float) -> dict:
        return {"utilisation": {"train_step": {"share": share}, "inference": {"share": share / 2}}}

    base = [_fake(1.0, [1.0], 0.9, details=util(s)) for s in (0.10, 0.12, 0.30)]
    arm = [_fake(1.0, [1.0], 0.9) for _ in range(3)]
    df = summarize({"baseline": base, "nocard": arm})
    row = df.set_index("arm")
    assert row.loc["baseline", "train_utilisation"] == pytest.approx(0.12)
    assert row.loc["baseline", "infer_utilisation"] == pytest.approx(0.06)
    assert row.loc["nocard", "train_utilisation"] is None or math.isnan(row.loc["nocard", "train_utilisation"])
    table = ablation_table(df).set_index("Arm")
    assert table.loc["baseline", "GEMM peak used, train step (%)"] == "12"
    assert table.loc["nocard", "GEMM peak used, train step (%)"] == ""
