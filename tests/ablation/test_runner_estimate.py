"""Issue 30, "a lab that answers in a minute": an ablation's time estimated from one probe run per arm before it
starts (said by the CLI, kept in the job's spec and state), and stacked recipes that leave out the arms this
machine's capabilities say cannot pay (an emulated bf16), with the reason, unless asked to run them. The
capabilities are planted (an AMX Xeon's and an AVX2-only EPYC's flags), so every branch runs on any CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    RunResult,
    jobs,  # noqa: E402
)
from lab.ablation import Ablation, estimate_ablation, estimate_text, from_spec, run_ablation, to_spec  # noqa: E402
from lab.measure import capabilities_of  # noqa: E402
from lab.recipes import RECIPES, payable, stacked, top_stack  # noqa: E402

SPR = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile", "fma"})
ZEN3 = frozenset({"avx2", "fma", "f16c"})


def _caps(flags: frozenset[str]):  # noqa: ANN202 - a CpuCapabilities
    return capabilities_of(flags, {}, "AVX512" if "avx512f" in flags else "AVX2")


def _probe_result(cfg: RunConfig, step_ms: float) -> RunResult:
    steps = cfg.max_steps or 0
    return RunResult(run_id="p" * 32, config=cfg.to_dict(), env={}, status="ok", steps=steps,
                     warmup_steps=cfg.warmup_steps, train_time_s=steps * step_ms / 1e3,
                     step_times_ms={"total": [50.0] * cfg.warmup_steps + [step_ms] * (steps - cfg.warmup_steps)},
                     details={"resolved": {"epochs": 2, "steps_per_epoch": 10}})


def test_the_estimate_is_probe_wall_plus_the_steps_it_did_not_take():
    base = RunConfig(workload="ctr", size="tiny", warmup_steps=2)
    fused = base.with_overrides(**{"compute.fused_optimizer": True})
    pruned = base.with_overrides(**{"prune.method": "l1_unstructured", "prune.amount": 0.5,
                                    "prune.finetune_epochs": 1})
    ab = Ablation(name="est", baseline=base, arms={"fused": fused, "pruned": pruned, "bad": base.with_overrides(
        **{"precision.dtype": "fp16"})})
    probed: list[RunConfig] = []

    def fake(cfg: RunConfig, **kw) -> RunResult:
        probed.append(cfg)
        if cfg.precision.dtype == "fp16":
            raise RuntimeError("refused")
        step_ms = 20.0 if cfg.compute.fused_optimizer else 40.0
        return _probe_result(cfg, step_ms)

    est = estimate_ablation(ab, repeats=2, seeds=[0, 1], run_fn=fake, probe_steps=3)
    assert len(probed) == 5 and all(c.max_steps == 5 for c in probed)  # the A/A arm is not probed again...
    assert probed[0] == probed[-1] == base.with_overrides(max_steps=5)  # ...the baseline twice (first and last)
    # 2 epochs x 10 steps = 20 steps; the probe took 5 (2 warm-up, at 50 ms): 15 more at the median measured
    # step; the fake probes take ~0 s of wall time (the one-off costs a real probe's wall time holds)
    wall = pytest.approx  # noqa: N806 - read as "about"
    assert est["per_run_s"]["baseline"] == wall(15 * 0.040, abs=0.05)
    assert est["per_run_s"]["fused"] == wall(15 * 0.020, abs=0.05)
    assert est["per_run_s"]["pruned"] == wall((20 + 10 - 5) * 0.040, abs=0.05)  # + the fine-tune epoch
    assert est["per_run_s"]["aa"] == est["per_run_s"]["baseline"]
    assert "bad" in est["failed"] and "refused" in est["failed"]["bad"]
    assert est["runs"] == 5 * 4 and est["total_s"] == pytest.approx(sum(est["per_run_s"].values()) * 4)
    assert 0 <= est["probe_s"] < 1.0
    text = estimate_text(est)
    assert text.startswith(f"estimated {est['total_s']:.0f} s for 20 runs") and "pruned" in text and "bad" in text


def test_the_job_keeps_the_estimate_and_the_skipped_arms(toy_workload, private_store):
    base = RunConfig(workload="toy", size="tiny", threads=1, max_steps=6, latency_repeats=3)
    ab = payable("skipjob", base, [["bf16"], ["fused_optim"]], caps=_caps(ZEN3))
    assert "bf16" not in ab.arms and set(ab.skipped) == {"bf16"}
    est = estimate_ablation(ab, repeats=1)
    assert set(est["per_run_s"]) == {"baseline", "fused_optim", "aa"} and est["total_s"] > 0
    with ResultStore(private_store) as store:
        df = run_ablation(ab, repeats=1, store=store, estimate=est)
        row = jobs.job(store, ab.key)
    assert row["spec"]["estimate"]["total_s"] == est["total_s"] and row["state"]["estimate_s"] == est["total_s"]
    assert row["spec"]["skipped"] == ab.skipped and "emulated" in row["spec"]["skipped"]["bf16"]
    assert df.attrs["skipped"] == ab.skipped and df.attrs["estimate"] is est
    again, _, _ = from_spec(to_spec(ab, 1, [0]))
    assert again.skipped == ab.skipped and again.key == ab.key


@pytest.mark.parametrize("recipe", [stacked, top_stack])
def test_stacked_recipes_skip_emulated_bf16_with_the_reason_unless_asked(recipe):
    base = RunConfig(workload="vision", size="tiny", device="cpu")
    amd = recipe(base, caps=_caps(ZEN3))
    bf16_arms = {a for a, t in recipe(base, caps=_caps(SPR)).techniques.items() if "bf16" in t}
    assert bf16_arms and not (bf16_arms & set(amd.arms))  # every bf16 arm left out on the AVX2 box...
    assert set(amd.skipped) == bf16_arms  # ...each with its reason
    assert all("bf16 is emulated on this CPU" in why and "avx512_bf16" in why for why in amd.skipped.values())
    assert not recipe(base, caps=_caps(SPR)).skipped  # native bf16: nothing left out
    forced = recipe(base, caps=_caps(ZEN3), include_emulated=True)
    assert bf16_arms <= set(forced.arms) and not forced.skipped


def test_the_top_stack_stacks_what_pays_on_both_phases():
    ab = top_stack(RunConfig(workload="vision", size="small", model_scale="m", device="cpu"), caps=_caps(SPR))
    whole = ab.arms["fused_optim+prune_channels50+int8_static"]
    assert whole.compute.fused_optimizer and whole.precision.dtype == "fp32"  # int8 refuses autocast training
    assert whole.prune.method == "structured_channels" and whole.prune.amount == 0.5 and whole.quant.method == "static"
    # the stack's pruning fine-tunes longer than prune_channels50 alone does (1 epoch left a seed 28 pt down)
    assert whole.prune.finetune_epochs == ab.arms["prune_channels50"].prune.finetune_epochs == 3
    assert top_stack(RunConfig(workload="vision", size="small", device="cpu"), caps=_caps(SPR),
                     prune_finetune_epochs=1).arms["prune_channels50"].prune.finetune_epochs == 1
    assert ab.arms["fused_optim+amp_auto"].precision.dtype == "auto"
    assert set(ab.axes["fused_optim+amp_auto"]) == {"train_step", "train"}  # training half: no inference claim
    assert "top_stack" in RECIPES


def test_ablate_cli_says_the_estimate_and_the_skipped_arms(toy_workload, private_store, capsys, monkeypatch):
    from lab.cli import main

    monkeypatch.setattr("lab.measure.cpu_capabilities", lambda: _caps(ZEN3))
    RECIPES.register("t_skip", lambda base, include_emulated=False: payable(
        "t_skip", base, [["bf16"], ["fused_optim"]], include_emulated=include_emulated), overwrite=True)
    try:
        argv = ["ablate", "--workload", "toy", "--recipe", "t_skip", "--repeats", "1", "--max-steps", "6",
                "--store", str(private_store)]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "skipped bf16: bf16: bf16 is emulated on this CPU" in out and "--include-emulated runs it" in out
        assert "estimated " in out and " s for 3 runs" in out
        assert main([*argv, "--include-emulated", "--no-estimate"]) == 0
        out = capsys.readouterr().out
        assert "skipped bf16" not in out and "estimated" not in out and "bf16" in out
        assert main(["ablate", "--workload", "toy", "--recipe", "speed_stack", "--include-emulated"]) == 2
    finally:
        RECIPES._items.pop("t_skip", None)
