"""FSDP2 sharding (memory.shard="fsdp2"), verified by its effects against DDP on the same two gloo ranks: the same
losses step for step and the same trained model (gathered back), with about half the parameter, gradient and
optimizer-state bytes per rank, and a lower step peak on every rank (the ``step`` measure); refused at world size
1 (and with what cannot run sharded) before any work.

One launch (two ranks, ~10 s): each rank joins the group once and runs the DDP and the FSDP2 run in it, then the
recipe's DDP and FSDP2 files (``python -m lab recipe``), so the comparisons cost one spawn, not four."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from lab import RunConfig
from lab.cli import main
from lab.memory.sharding import meta_skeleton
from lab.train import check

#: The tiny transformer: one encoder layer (a block FSDP2 shards as its own group) plus the root's embeddings and
#: head; a 33-row embedding makes rank 0's shard a row larger than rank 1's (uneven shards, padded).
BASE = RunConfig(workload="transformer", size="tiny", max_steps=4, warmup_steps=1, threads=1, latency_repeats=0,
                 eval_batch_size=64).with_overrides(**{"ddp.world_size": 2, "ddp.timeout_s": 60})
ROLES = ("params_bytes", "grads_bytes", "optimizer_state_bytes")


def train_file(path: str, cfg: RunConfig) -> dict:
    """The recipe file at ``path`` trains the lab's model on 64 training rows (4 steps of 8 per rank) in this rank's
    group (its own join and leave are skipped: the group is the worker's); what its optimizer held, and the result."""
    import importlib.util
    from unittest import mock

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from lab.context import prepare

    spec = importlib.util.spec_from_file_location(f"recipe_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with prepare(cfg) as ctx:
        model, rows = ctx.new_model(), tuple(t[:64] for t in ctx.data.train)
    held: dict[str, int] = {}

    def seen(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        params = [p for g in opt.param_groups for p in g["params"]]
        held["local"] = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
        held["full"] = sum(p.numel() for p in params)
        held["sharded"] = int(all(isinstance(p, DTensor) for p in params))

    hook = register_optimizer_step_pre_hook(seen)
    try:
        with mock.patch.object(dist, "init_process_group"), mock.patch.object(dist, "destroy_process_group"):
            trained, losses = module.train(model, ctx.workload.loss, torch.utils.data.TensorDataset(*rows), epochs=1,
                                           batch_size=8, lr=ctx.resolved.lr, shuffle=False)
    finally:
        hook.remove()
    return {**held, "losses": losses, "params": [float(p.double().sum()) for p in trained.parameters()],
            "plain": not any(isinstance(p, DTensor) for p in trained.parameters())}


def both_runs_worker(cfg_dict: dict, files: dict[str, str]) -> dict | None:
    """In each spawned rank: join the group once, run DDP then FSDP2 in it, then the recipe files of both; rank 0
    returns what they recorded."""
    from lab import run
    from lab.distributed import init_from_env
    from lab.memory.roles import counting_step_peak

    info = init_from_env(timeout_s=60)
    out: dict = {}
    peaks: dict = {}
    for shard in ("none", "fsdp2"):
        cfg = RunConfig.from_dict(cfg_dict).with_overrides(**{"memory.shard": shard})
        with counting_step_peak():  # each rank's second step's real peak, as a budget search's FSDP2 try asks
            result = run(cfg)  # the group exists: the run joins it and leaves it standing
        peaks[shard] = {k: v for k, v in (result.details.get("memory") or {}).items() if k.endswith("_bytes")}
        if info.rank == 0:
            assert result.status == "ok", result.error
            out[shard] = {"losses": result.losses, "metric": result.metric, "memory": result.details["memory"],
                          "ddp": result.details["distributed"]}
    for shard, path in files.items():
        out[f"file_{shard}"] = train_file(path, RunConfig.from_dict(cfg_dict))
    return {**out, "step_peaks": peaks} if info.rank == 0 else {"step_peaks": peaks}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    from lab.distributed import spawn
    from lab.portable import build

    folder = tmp_path_factory.mktemp("recipes")
    files = {}
    for shard in ("none", "fsdp2"):
        files[shard] = str(folder / f"recipe_{shard}.py")
        Path(files[shard]).write_text(build(BASE.with_overrides(**{"memory.shard": shard})).text)
    ranks = spawn(both_runs_worker, 2, (BASE.to_dict(), files), timeout_s=240, threads_per_rank=1)
    return {**ranks[0], "step_peaks": [r["step_peaks"] for r in ranks]}


def test_fsdp2_trains_what_ddp_trains_with_half_the_bytes_per_rank(runs):
    ddp, fsdp = runs["none"], runs["fsdp2"]
    assert len(fsdp["losses"]) == len(ddp["losses"]) == 4
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-5, abs=1e-6)
    assert fsdp["metric"] == pytest.approx(ddp["metric"], abs=1e-6)  # the gathered model is the trained one
    mem = fsdp["memory"]
    assert mem["shard"] == "fsdp2" and mem["world_size"] == 2 and mem["sharded_blocks"] == ["encoder.layers.0"]
    assert fsdp["ddp"]["wrapper"] == "fsdp2" and "wrapper" not in ddp["ddp"]
    for role in ROLES:  # rank 0's shard of every tensor: half, and a padded row more where dim 0 is odd
        assert 0.45 < mem[role] / ddp["memory"][role] < 0.55, (role, mem[role], ddp["memory"][role])
    ours = sum(mem[r] for r in ROLES[::2])
    theirs = sum(ddp["memory"][r] for r in ROLES[::2])
    assert 0.45 < ours / theirs < 0.55
    # the all-gathered full parameters a block runs with are parameters, not saved activations
    saved = mem["saved_activations_bytes"] / ddp["memory"]["saved_activations_bytes"]
    assert 0.95 < saved < 1.05, saved


def test_each_rank_measures_its_steps_real_peak_lower_sharded_than_replicated(runs):
    """The ``step`` measure (lab.measure.memory.StepPeak, what ``--memory-budget`` holds an FSDP2 try to) is taken
    on every rank: the parameters and optimizer state at rest are the rank's shards (half DDP's), and the step's peak
    is lower sharded than replicated (a block's full parameters exist only while it runs)."""
    for rank, peaks in enumerate(runs["step_peaks"]):
        ddp, fsdp = peaks["none"], peaks["fsdp2"]
        assert ddp["step_peak_at_rest_bytes"] == ddp["params_bytes"] + ddp["optimizer_state_bytes"], rank
        assert fsdp["step_peak_at_rest_bytes"] == fsdp["params_bytes"] + fsdp["optimizer_state_bytes"], rank
        assert 0.45 < fsdp["step_peak_at_rest_bytes"] / ddp["step_peak_at_rest_bytes"] < 0.55, (rank, peaks)
        assert fsdp["step_peak_at_rest_bytes"] < fsdp["step_peak_bytes"] < ddp["step_peak_bytes"], (rank, peaks)


def test_the_recipe_file_shards_with_fsdp2_and_trains_what_its_ddp_file_trains(runs):
    """The plain-PyTorch file (``python -m lab recipe --techniques fsdp2 --world-size 2``) on two ranks: its
    optimizer steps the shards (about half of every parameter per rank), and it ends with the DDP file's losses and
    a plain model of the same weights (gathered)."""
    ddp, fsdp = runs["file_none"], runs["file_fsdp2"]
    assert fsdp["sharded"] and not ddp["sharded"] and ddp["local"] == ddp["full"] == fsdp["full"]
    assert 0.45 < fsdp["local"] / fsdp["full"] < 0.55
    assert len(fsdp["losses"]) == len(ddp["losses"]) == 4
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-5, abs=1e-6)
    assert fsdp["plain"] and fsdp["params"] == pytest.approx(ddp["params"], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize(("overrides", "said"), [
    ({}, "add --ddp-world-size 2"),
    ({"ddp.world_size": 2, "prune.method": "l1_unstructured", "prune.amount": 0.5,
      "prune.schedule": "gradual"}, "prune once after"),
    ({"ddp.world_size": 2, "profile": True}, "profile the DDP run"),
], ids=["world-size-1", "gradual-pruning", "profile"])
def test_what_cannot_run_sharded_is_refused_before_any_work(overrides, said, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not a rank torchrun started
    cfg = RunConfig(workload="mlp", size="tiny").with_overrides(**{"memory.shard": "fsdp2", **overrides})
    with pytest.raises(ValueError, match="memory.shard='fsdp2' is invalid") as err:
        check(cfg)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_the_cli_refuses_fsdp2_on_one_rank_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["run", "--workload", "mlp", "--size", "tiny", "--memory-shard", "fsdp2", "--no-store"]) == 2
    err = capsys.readouterr().err
    assert "--ddp-world-size 2" in err and err.count("\n") == 1, err


def test_the_skeleton_keeps_the_structure_and_ties_without_bytes():
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # tied
    model = nn.Sequential(embed, nn.BatchNorm1d(4), head)
    skeleton = meta_skeleton(model)
    assert [n for n, _ in skeleton.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(t.device.type == "meta" for t in (*skeleton.parameters(), *skeleton.buffers()))
    assert skeleton[0].weight is skeleton[2].weight and skeleton[0].weight is not model[0].weight
    assert model[0].weight.device.type == "cpu" and torch.isfinite(model[0].weight).all()


def test_each_rank_compiles_into_a_cache_of_its_own(monkeypatch, tmp_path):
    """Ranks hold shards of different sizes: a graph one rank compiled for its DTensor shard must not be read back
    by another from a shared on-disk cache (torchao's low-bit update failed so)."""
    from lab.memory.launcher import own_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LAB_SHARED_INDUCTOR_CACHE", raising=False)
    assert own_compile_cache(1) == str(tmp_path / "rank1")
    assert own_compile_cache(0) == str(tmp_path / "rank0")  # a second run in the same process: not nested
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(tmp_path / "rank0")


def test_the_crossover_map_does_not_time_sharding_in_one_process():
    from lab.crossover.arms import apply_options
    from lab.crossover.measure import make_bench
    from lab.timed import TRAIN, NotTimed, base_arm
    from lab.workloads import get_workload

    bench = make_bench(get_workload("mlp"), "xs", batch_size=8)
    with pytest.raises(NotTimed, match="shards a model across ranks"):
        apply_options(bench, base_arm(bench, TRAIN), "fsdp2")
