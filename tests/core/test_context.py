"""One context for runs and studies: ``prepare`` builds what a run needs once, ``ctx.fit`` assembles the step
from the config through the run's technique chain, so a study trains exactly the step its run trains."""

from __future__ import annotations

import pytest
import torch

from lab import RunConfig, prepare, run
from lab.data.studies.stalls import ideal_replay
from lab.registry import FAMILIES, FAMILY_ORDER, LAUNCHERS
from lab.technique import SINGLE_PROCESS, Launcher, Technique, TechniqueChain, default_chain

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


def test_every_family_is_one_registered_technique_in_the_stated_order(toy_workload):
    chain = default_chain()
    assert chain.names() == FAMILY_ORDER and set(FAMILIES.names()) == set(FAMILY_ORDER)
    assert all(isinstance(t, Technique) and FAMILIES.get(t.name) is t for t in chain)
    result = run(RunConfig(**STEP_CFG))
    summaries = result.details["techniques"]  # the run record's family section comes from report()
    assert set(summaries) == set(FAMILY_ORDER) and summaries["precision"]["resolved"] == "fp32"
    assert summaries["compute"] == {"fused_optimizer": False, "fast_kernels": False, "compile": False}
    assert result.details["steps"]["train"] == {"optimizer": "Adam", "fused": False, "precision": "fp32",
                                                "compiled": False, "ddp": False, "loader": "InMemoryLoader",
                                                "micro_batches": 1}


class Recorder(Technique):
    """A toy technique: one package's worth of stages, added to a run without touching lab.train."""

    name = "recorder"

    def __init__(self, calls: list[str], *, refuse: bool = False) -> None:
        self.calls, self.refuse = calls, refuse

    def check(self, cfg):
        self.calls.append("check")
        if self.refuse:
            raise ValueError("recorder=on is invalid here")

    def preflight(self, ctx, model):
        self.calls.append("preflight")

    def before_training(self, ctx, model):
        self.calls.append("before_training")
        return model, [lambda step, _model: self.calls.append("hook") if step == 0 else None]

    def after_training(self, ctx, model):
        self.calls.append("after_training")
        torch.nn.init.zeros_(next(model.parameters()))  # visible in the final metric and the nonzero count
        return model

    def report(self, result):
        return {"calls": len(self.calls)}


class RecordingLauncher(Launcher):
    """A toy launcher: a single process that records when the run calls it."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def launch(self, cfg, run):
        self.calls.append("launch")

    def join(self, ctx):
        self.calls.append("join")

    def wrap(self, ctx, model):
        self.calls.append("wrap")
        return model

    def unwrap(self, ctx, model):
        self.calls.append("unwrap")
        return model

    def leave(self, ctx):
        self.calls.append("leave")


@pytest.fixture
def recording_launcher():
    calls: list[str] = []
    LAUNCHERS.register(Recorder.name, RecordingLauncher(calls))
    try:
        yield calls
    finally:
        LAUNCHERS.unregister(Recorder.name)


def test_a_toy_technique_and_its_launcher_join_a_run_in_stage_order(toy_workload, recording_launcher):
    calls = recording_launcher  # the technique and its launcher record into one list
    chain = TechniqueChain([*default_chain(), Recorder(calls)])
    assert isinstance(chain.launcher(RunConfig(**STEP_CFG)), RecordingLauncher)  # distributed's does not apply
    plain = run(RunConfig(**STEP_CFG))
    toyed = run(RunConfig(**STEP_CFG), techniques=chain)
    assert [c for c in calls if c != "hook"] == ["check", "launch", "join", "preflight", "before_training", "wrap",
                                                 "unwrap", "leave", "after_training"]
    assert calls.count("hook") == 1  # its step hook ran inside the fit
    assert toyed.details["techniques"]["recorder"] == {"calls": len(calls)}
    assert toyed.losses == plain.losses  # the same training; only after_training changed the model
    assert toyed.nonzero_params < plain.nonzero_params


def test_a_technique_that_refuses_stops_the_run_before_any_work(toy_workload):
    calls: list[str] = []
    with pytest.raises(ValueError, match="recorder=on is invalid"):
        run(RunConfig(**STEP_CFG), techniques=TechniqueChain([*default_chain(), Recorder(calls, refuse=True)]))
    assert calls == ["check"]


@pytest.mark.parametrize("overrides,env,data_parallel", [
    ({}, {}, False), ({"ddp.world_size": 2}, {}, True), ({"ddp.grad_accum_steps": 2}, {}, True),
    ({}, {"RANK": "0", "WORLD_SIZE": "2"}, True)], ids=["single", "world2", "accum2", "torchrun-rank"])
def test_the_chain_picks_the_data_parallel_launcher_only_where_it_applies(overrides, env, data_parallel, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = RunConfig(workload="ctr", size="tiny").with_overrides(**overrides)
    assert default_chain().launcher(cfg) is (LAUNCHERS.get("distributed") if data_parallel else SINGLE_PROCESS)
    assert default_chain().without("distributed").launcher(cfg) is SINGLE_PROCESS  # a chain without the family
    assert not any(hasattr(Technique, stage) for stage in ("launch", "join", "wrap", "unwrap", "leave"))


def test_a_chain_refuses_duplicates_and_unnamed_techniques():
    with pytest.raises(ValueError, match="twice"):
        TechniqueChain([*default_chain(), FAMILIES.get("data")])
    with pytest.raises(TypeError, match="not a named"):
        TechniqueChain([Technique()])
    bare = TechniqueChain([])
    with prepare(RunConfig(workload="ctr", size="tiny", threads=1), techniques=bare) as ctx, \
            pytest.raises(RuntimeError, match="builds loaders"):
        ctx.make_loader()


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


@pytest.mark.parametrize("overrides,replaced", [
    ({}, False), ({"precision.dtype": "bf16"}, False), ({"prune.method": "l1_unstructured", "prune.amount": 0.5}, True),
    ({"quant.method": "dynamic"}, True), ({"compute.fused_optimizer": True}, False)])
def test_the_chain_says_when_after_training_hands_on_another_model(overrides, replaced):
    # the divergence rules judge only the model training produced (lab.result.health.judge in lab.train)
    cfg = RunConfig(workload="ctr", size="tiny").with_overrides(**overrides)
    assert default_chain().replaces_model(cfg) is replaced
    assert [t.name for t in default_chain() if t.replaces_model(cfg)] == (
        [] if not replaced else ["pruning" if "prune.method" in overrides else "quant"])
