"""One context for runs and studies: ``prepare`` builds what a run needs once, ``ctx.fit`` assembles the step
from the config through the technique packages' doors, so a study trains exactly the step its run trains."""

from __future__ import annotations

import pytest
import torch

from lab import RunConfig, prepare, run
from lab.context import doors
from lab.data.studies.stalls import ideal_replay
from lab.train import DOORS

STEP_CFG = dict(workload="toy", size="tiny", threads=1, max_steps=4, latency_repeats=0)


def test_prepare_restores_threads_and_builds_a_seeded_model(toy_workload):
    before = torch.get_num_threads()
    cfg = RunConfig(**STEP_CFG)
    with prepare(cfg) as ctx:
        assert torch.get_num_threads() == 1
        a, b = ctx.new_model(), ctx.new_model()
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
        assert ctx.result.env["torch_threads"] == 1 and ctx.is_main_rank
    assert torch.get_num_threads() == before


def test_every_technique_package_is_a_door_with_the_same_verbs(toy_workload):
    assert doors() == DOORS
    result = run(RunConfig(**STEP_CFG))
    for door in DOORS:
        for verb in ("check", "before_training", "after_training", "report"):
            assert callable(getattr(door, verb)), (door.__name__, verb)
        assert isinstance(door.report(result), dict)
    assert result.details["steps"]["train"] == {"optimizer": "Adam", "fused": False, "precision": "fp32",
                                                "compiled": False, "ddp": False, "loader": "InMemoryLoader"}


@pytest.mark.parametrize("overrides", [
    {},
    {"precision.dtype": "bf16", "compute.fused_optimizer": True},
    {"precision.dtype": "bf16", "compute.fused_optimizer": True, "optimizer": "sgd"},
], ids=["plain", "bf16+fused", "bf16+fused+sgd"])
def test_ideal_replay_runs_the_same_step_as_its_run(toy_workload, overrides):
    cfg = RunConfig(**STEP_CFG).with_overrides(**{"data.loader": "thread", "data.storage": "local_ssd"}, **overrides)
    ran = run(cfg).details["steps"]["train"]
    replay = ideal_replay(cfg, steps=3)["step"]
    assert replay["loader"] == "CachedLoader" and ran["loader"] == "ThreadPrefetcher"
    assert {k: v for k, v in replay.items() if k != "loader"} == {k: v for k, v in ran.items() if k != "loader"}
    if overrides:
        assert replay["precision"] == "bf16" and replay["fused"] is True
