"""The option registry and recipes: every option is a valid config that really runs, stacks refuse
conflicts, a factorial has 2^k arms, and a new option joins a recipe by registration alone."""

from __future__ import annotations

import pytest
import torch

from lab import RunConfig, run
from lab.recipes import (
    RECIPES,
    combine,
    data_loading,
    factorial,
    from_techniques,
    get_option,
    get_recipe,
    stacked,
)
from lab.registry import OPTIONS
from lab.technique import Option, register_option


@pytest.fixture
def base(toy_workload) -> RunConfig:
    return RunConfig(workload="toy", size="tiny", threads=1, max_steps=6, latency_repeats=3)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_technique_changes_the_config_and_runs(name, base):
    cfg = base.with_overrides(**get_option(name).overrides)
    assert cfg != base and cfg.enabled_families()  # a technique that changes nothing is a bug
    if cfg.compute.fast_kernels:  # a workload's own faster implementation: only ctr has one
        cfg = cfg.with_overrides(workload="ctr", size="tiny")
    if cfg.memory.checkpoint != "none":  # the toy's Linear / ReLU stack has no block to checkpoint
        cfg = cfg.with_overrides(workload="transformer", size="tiny")
    if cfg.memory.shard != "none":  # sharding needs ranks to shard across: refused alone, run in tests/memory
        with pytest.raises(ValueError, match="add --ddp-world-size 2"):
            run(cfg)
        return
    if cfg.memory.offload != "none" and not torch.cuda.is_available():  # CUDA only: refused here, tests/memory
        with pytest.raises(ValueError, match="needs CUDA"):
            run(cfg)
        return
    # torchao's low-bit update eagerly: tests/memory compiles it once. The PT2E int8 model too (its batch-1 and
    # bucket compiles, ~2-4 s per option): tests/quant/test_quantization.py's run of the default flow compiles one
    # and tests/quant/test_storage.py stores compiled ones; here the option's config runs through every stage.
    if cfg.memory.optimizer_state != "fp32" or (cfg.quant.enabled and cfg.quant.flow != "legacy"):
        with torch.compiler.set_stance("force_eager"):
            result = run(cfg, on_error="record")
    else:
        result = run(cfg, on_error="record")
    assert result.status == "ok", result.error


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_builds_an_ablation_with_the_baseline_first(name, base):
    ab = get_recipe(name)(base)
    arms = list(ab.arms)
    # speed_stack's baseline is the naive loader on emulated storage by design; the rest start from ``base``.
    expected = base.with_overrides(**{"data.loader": "naive", "data.storage": "network_fs"}) \
        if name == "speed_stack" else base
    assert arms[0] == "baseline" and ab.arms["baseline"] == expected and len(arms) >= 2
    assert all(cfg.workload == "toy" and cfg.size == "tiny" for cfg in ab.arms.values())


def test_stacked_contains_the_seeds_combinations(base):
    ab = stacked(base, include_emulated=True)  # bf16 arms are left out where bf16 is emulated (an AVX2 CPU)
    assert {"bf16+prune50", "workers2+bf16", "prune50+int8_eager"} <= set(ab.arms)
    cfg = ab.arms["bf16+prune50"]
    assert cfg.precision.dtype == "bf16" and cfg.prune.amount == 0.5


def test_stacked_measures_fast_kernels_where_the_workload_has_them(base):
    """The doctor prescribes a workload's fast kernels, so the default ablation (the one the recommendation card
    reads) measures them where they exist, and leaves them out where asking would be refused."""
    assert "fast_kernels" not in stacked(base, include_emulated=True).arms  # the toy workload has none
    ctr = stacked(base.with_overrides(workload="ctr"), include_emulated=True)
    assert ctr.arms["fast_kernels"].compute.fast_kernels and ctr.techniques["fast_kernels"] == ("fast_kernels",)


def test_two_stacks_under_one_name_never_share_stored_rows(base):
    a = from_techniques("custom", base, [["bf16"]])
    b = from_techniques("custom", base, [["prune50"]])
    assert a.key != b.key and a.key.split("#")[0] == b.key.split("#")[0]


def test_factorial_has_all_subsets_and_refuses_conflicts(base):
    ab = factorial(base, ["bf16", "prune50", "int8_dynamic"])
    assert len(ab.arms) == 9 and "aa" in ab.arms  # 2^3 subsets (the empty one is the baseline) + the A/A arm
    assert ab.techniques["bf16+prune50+int8_dynamic"] == ("bf16", "prune50", "int8_dynamic")
    with pytest.raises(ValueError, match="conflict on precision.dtype"):
        factorial(base, ["bf16", "fp16"])
    with pytest.raises(ValueError, match="techniques=\\[\\]"):
        factorial(base, [])
    with pytest.raises(ValueError, match="technique='nope' is invalid"):
        combine(["nope"])
    with pytest.raises(ValueError, match="recipe='nope' is invalid"):
        get_recipe("nope")


def test_a_new_loader_is_one_registration_not_an_app_change(base):
    name = "workers1_test"
    try:
        register_option(Option(name, {"data.loader": "dataloader", "data.num_workers": 1}, "data"))
        assert name in data_loading(base).arms
        with pytest.raises(ValueError, match="already registered"):
            register_option(Option(name, {"data.num_workers": 1}, "data"))
        with pytest.raises(ValueError):  # overrides are validated at registration
            register_option(Option("bad_test", {"data.num_workers": -1}, "data"))
    finally:
        OPTIONS.pop(name, None)
        OPTIONS.pop("bad_test", None)
