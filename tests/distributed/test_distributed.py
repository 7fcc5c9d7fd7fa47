"""Distributed lab: DDP equals one big batch, data exactly once, failures end, the alpha-beta model.

Multi-process launches cost seconds each (every rank imports torch): this file launches 4 times.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from lab import RunConfig, run
from lab.config import DDPConfig
from lab.distributed import (
    LaunchInfo,
    detect_launch,
    init_process_group,
    resolve_backend,
    ring_allreduce,
    spawn,
    spawn_run,
)
from lab.distributed import scaling as sm
from lab.distributed.checks import equivalence_worker, killed_rank_worker

#: The pasted models (tests/pasted_models.py), brought by spec as a user's file is: the ranks load it too.
PASTED = str(Path(__file__).resolve().parents[1] / "pasted_models.py")


def register_toy() -> None:
    """Run in each spawned rank: fresh processes do not know the test-only toy workload."""
    from toy_workload import TOY

    from lab.workloads import register_workload
    register_workload(TOY, overwrite=True)


# ------------------------------------------------------------------------------ single process, pure
def test_ring_allreduce_by_hand_equals_the_sum():
    ts = [torch.randn(10, 3, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    total = sum(ts)
    for out in ring_allreduce(ts):
        torch.testing.assert_close(out, total)


def test_detect_launch_reads_torchrun_and_slurm():
    assert detect_launch({}) == LaunchInfo()
    tr = detect_launch({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"})
    assert (tr.rank, tr.world_size, tr.launcher) == (1, 4, "torchrun")
    sl = detect_launch({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"})
    assert (sl.rank, sl.local_rank, sl.world_size, sl.launcher) == (3, 1, 8, "slurm")


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"world_size": 0}, "ddp.world_size=0"),
    ({"backend": "mpi"}, "ddp.backend='mpi'"),
    ({"grad_accum_steps": 0}, "ddp.grad_accum_steps=0"),
    ({"timeout_s": -1.0}, "ddp.timeout_s=-1.0"),
])
def test_bad_ddp_config_names_field_and_value(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        DDPConfig(**kwargs)


def test_nccl_without_cuda_is_an_error():
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    with pytest.raises(ValueError, match="NCCL needs CUDA"):
        resolve_backend("nccl", torch.device("cpu"))


def test_unreachable_rendezvous_fails_within_timeout(monkeypatch):
    from lab.distributed import free_port
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nobody listens: rank 1 waits for a rank 0 that never comes
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1: rendezvous at 127.0.0.1"):
        init_process_group(LaunchInfo(rank=1, world_size=2, launcher="env"), "gloo", timeout_s=2.0)
    assert time.monotonic() - t0 < 30


def test_world_size_disagreeing_with_launcher_is_an_error(toy_workload, monkeypatch):
    from lab.distributed import setup_for_run
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="ddp.world_size=2 is invalid here"):
        setup_for_run(RunConfig(ddp=DDPConfig(world_size=2)), torch.device("cpu"))


def test_grad_accumulation_equals_one_big_batch(toy_workload):
    """2 micro-batches of 16 accumulated (loss / 2 each) = one batch of 32: the sampler's permutation does
    not depend on the batch size, so the micro-batches are exactly the big batch's halves."""
    base = dict(workload="toy", size="tiny", max_steps=4, latency_repeats=0, threads=1, optimizer="sgd")
    big = run(RunConfig(batch_size=32, **base))
    acc = run(RunConfig(batch_size=16, ddp=DDPConfig(grad_accum_steps=2), **base))
    assert acc.steps == big.steps == 4
    assert acc.details["distributed"]["effective_batch"] == 32
    assert acc.losses == pytest.approx(big.losses, rel=1e-5)
    assert acc.metric == pytest.approx(big.metric, abs=1e-6)


@pytest.mark.parametrize("p", [1, 2, 8, 1024])
def test_ring_model_formula_and_calibration_recovers_alpha_beta(p):
    link = sm.Link("x", alpha_s=20e-6, bandwidth_bytes_per_s=1e9)
    s = 4e6
    expected = 0.0 if p == 1 else 2 * (p - 1) * 20e-6 + 2 * (p - 1) / p * s / 1e9
    assert sm.ring_allreduce_s(s, p, link.alpha_s, link.beta_s_per_byte) == pytest.approx(expected)
    if p > 1:
        sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
        fit = sm.calibrate(sizes, [sm.ring_allreduce_s(x, p, 20e-6, 1e-9) for x in sizes], p)
        assert fit.alpha_s == pytest.approx(20e-6, rel=1e-6) and fit.bandwidth_bytes_per_s == pytest.approx(1e9)


def test_projection_small_models_scale_worse_and_buckets_cost_latency():
    link = sm.LINK_PRESETS["10GbE"]
    ps = sm.powers_of_two(64)
    small = sm.project(1e-3, 1e6, ps, link)
    large = sm.project(1.0, 1e6, ps, link)
    assert small[0]["speedup"] == large[0]["speedup"] == 1.0
    assert small[-1]["efficiency"] < large[-1]["efficiency"] <= 1.0
    many = sm.comm_s_per_step(1e8, 8, link, bucket_bytes=1e5)
    few = sm.comm_s_per_step(1e8, 8, link, bucket_bytes=1e7)
    assert many > few
    with pytest.raises(ValueError, match="overlap=2"):
        sm.project(1.0, 1.0, [2], link, overlap=2)


# ------------------------------------------------------------------------------ multi-process (3 launches)
def test_ddp_two_ranks_equal_one_process_with_double_batch_and_data_once():
    out = spawn(equivalence_worker, 2, (3, 4, 0), timeout_s=90)
    for r in out:
        assert r["param_diff"] < 1e-6, r  # DDP (2 x 4) == local model (1 x 8) after 3 SGD steps
        assert r["grad_diff"] == 0.0  # all-reduced gradients are bit-identical across ranks
        assert r["n_seen"] == r["n_unique"] == r["n_expected"]  # each sample once per epoch across ranks
        assert r["bytes_per_step"] == [(8 * 16 + 16 + 16 + 1) * 4] * 3
    assert [r["uneven_steps"] for r in out] == [2, 3]  # uneven counts finished under Join (no hang)


def test_killed_rank_ends_the_job_with_an_error_naming_it():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^rank 1 died: killed by SIGKILL \(exit code -9\)") as err:
        spawn(killed_rank_worker, 2, (5.0,), timeout_s=60)
    assert err.value.rank == 1 and err.value.signal == "SIGKILL" and "\n" not in str(err.value)
    assert time.monotonic() - t0 < 60


def test_run_with_world_size_2_matches_single_process_double_batch(toy_workload):
    base = dict(workload="toy", size="tiny", max_steps=6, latency_repeats=0, optimizer="sgd")
    single = run(RunConfig(batch_size=16, threads=1, **base))
    ddp = spawn_run(RunConfig(batch_size=8, ddp=DDPConfig(world_size=2, timeout_s=30), **base), run,
                    setup=register_toy, timeout_s=90)
    d = ddp.details["distributed"]
    assert (d["rank"], d["world_size"], d["effective_batch"], d["threads_per_rank"]) == (0, 2, 16, 1)
    assert d["bytes_per_step"] == ddp.param_count * 4 and len(ddp.step_times_ms["comm"]) == 6
    assert ddp.steps == single.steps == 6
    assert ddp.metric == pytest.approx(single.metric, abs=1e-6)  # same model after 6 steps
    assert ddp.metric_before == single.metric_before


# ------------------------------------------------ a pasted model whose buffer is a view (issue 45, 1 launch)


def test_ddp_of_a_model_whose_buffer_is_a_transposed_view_runs_and_says_so():
    """``pe.unsqueeze(0).transpose(0, 1)`` registered as a buffer: DDP's per-step buffer broadcast wrote into it
    through a view with other strides ("some elements ... refer to a single memory location"). The wrap replaces
    it by a contiguous copy (the same values) and names it in ``why``; training is the single process's."""
    base = dict(workload=f"{PASTED}:TRANSFORMER", size="tiny", threads=1, max_steps=4, warmup_steps=1,
                latency_repeats=0, optimizer="sgd")
    single = run(RunConfig(batch_size=16, **base))
    ddp = run(RunConfig(batch_size=8, ddp=DDPConfig(world_size=2, timeout_s=60), **base))
    assert ddp.status == "ok", ddp.error
    assert ddp.details["distributed"]["buffers_made_contiguous"] == ["pos_encoder.pe"]
    assert any("pos_encoder.pe" in w and "contiguous" in w for w in ddp.why), ddp.why
    assert ddp.steps == single.steps == 4
    assert ddp.metric == pytest.approx(single.metric, abs=1e-6)
    assert ddp.metric_before == single.metric_before


def test_contiguous_buffers_replaces_views_whose_strides_a_broadcast_cannot_write_through():
    from pasted_models import NextTokenTransformer

    from lab.distributed import contiguous_buffers

    model = NextTokenTransformer(12, 16, 2, 32, 1, dropout=0.0)
    pe = model.pos_encoder.pe
    assert pe.is_contiguous() and pe.stride() == (16, 1024, 1)  # "contiguous", yet not laid out as its shape
    assert pe.contiguous() is pe  # why .contiguous() is not the fix
    assert contiguous_buffers(model) == ["pos_encoder.pe"]
    assert model.pos_encoder.pe.stride() == (16, 16, 1) and torch.equal(model.pos_encoder.pe, pe)
    assert contiguous_buffers(model) == []


# ------------------------------------------------------------------------------ multi-node, on one machine
@pytest.mark.slow
def test_two_torchrun_agents_on_loopback_train_what_one_node_with_two_ranks_trains(tmp_path, capsys, monkeypatch):
    """docs/distributed.md's multi-node recipe on the existing engine: two ``torchrun`` agents (``--nnodes 2``,
    c10d rendezvous on 127.0.0.1, one CPU rank each) running ``python -m lab run``; both agents end 0, rank 0
    alone prints the result, and its losses and metric are the same as a 2-rank single-node run's (the same
    command through ``lab.cli.main`` here, whose ranks are spawned processes: no interpreter of its own to start)."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lab_run = ["-m", "lab", "run", "--workload", "ctr", "--size", "tiny", "--threads", "1", "--world-size", "2",
               "--json", "--no-progress"]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "LAB_RESULTS_DB": str(tmp_path / "nodes.sqlite")}
    agents = [subprocess.Popen([str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"lab-test-{port}", *lab_run],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    # the single-node reference runs while the agents do: each side keeps about one core busy (interpreter
    # starts, rendezvous), so on 2 cores the two overlap instead of adding up
    from lab.cli import main

    monkeypatch.setenv("LAB_RESULTS_DB", str(tmp_path / "one.sqlite"))
    capsys.readouterr()
    try:
        assert main(lab_run[2:]) == 0
    finally:
        outs = [a.communicate(timeout=240) for a in agents]
    single = json.loads(capsys.readouterr().out)
    assert [a.returncode for a in agents] == [0, 0], [err[-1500:] for _, err in outs]
    printed = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(printed) == 1  # rank 0's result; rank 1 prints and stores nothing
    nodes = printed[0]
    assert nodes["status"] == "ok" and nodes["details"]["distributed"]["launcher"] == "torchrun"
    assert nodes["details"]["distributed"]["world_size"] == 2
    assert single["details"]["distributed"]["launcher"] == "spawn"
    assert nodes["losses"] == single["losses"] and nodes["metric"] == single["metric"]
