"""``--profile`` on a data-parallel run: DDP's collectives land in the ``comm`` class, only their exposed part is
counted (the in-flight time that overlaps backward is reported beside the classes), and the classes still sum
to the step. One 2-rank gloo launch (seconds: every rank imports torch); the rest are pure functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import RunConfig, run
from lab.config import DDPConfig
from lab.distributed import spawn_run
from lab.measure.profile import Breakdown, OpEvent, breakdown, classify_op, comm_overlap_us


def register_toy() -> None:
    """Run in each spawned rank: fresh processes do not know the test-only toy workload."""
    from toy_workload import TOY

    from lab.workloads import register_workload
    register_workload(TOY, overwrite=True)


@pytest.mark.parametrize(("name", "cls"), [
    # what a 2-rank gloo DDP step shows in torch.profiler (checked on a toy run), and NCCL's counterparts
    ("c10d::allreduce_", "comm"), ("gloo:all_reduce", "comm"), ("nccl:all_reduce", "comm"),
    ("record_param_comms", "comm"), ("c10d::broadcast_", "comm"), ("c10d::_allgather_base_", "comm"),
    ("torch::distributed::reducer::mul_out", "comm"), ("torch::distributed::reducer::copy_", "comm"),
    ("torch.distributed.ddp.reducer::copy_bucket_to_grad", "comm"),
    ("DistributedDataParallel.forward", "overhead"),  # its self time is the wrapped forward's Python
    ("aten::broadcast_tensors", "elementwise"), ("aten::gather", "embedding"), ("aten::mul", "elementwise"),
])
def test_ddp_op_names_are_classified(name, cls):
    assert classify_op(name) == cls


def test_only_the_exposed_part_of_a_background_all_reduce_is_comm():
    # One step of 1000 us: backward ops 0-600, the training thread idle 600-800 (waiting), optimizer 800-1000;
    # an all-reduce in flight 400-800 on gloo's thread: 200 us overlap backward, 200 us are a wait.
    ev = [OpEvent("aten::mm", 550.0, 600.0, (), True, start_us=0.0),
          OpEvent("c10d::allreduce_", 50.0, 50.0, ("aten::mm",), start_us=400.0),  # nested: issued from backward
          OpEvent("gloo:all_reduce", 0.0, 400.0, (), start_us=400.0, background=True),
          OpEvent("Optimizer.step#SGD.step", 200.0, 200.0, (), start_us=800.0)]
    assert comm_overlap_us(ev) == pytest.approx((400.0, 200.0))
    b = breakdown(ev, n_steps=1, step_ms=1.0, profiled_step_ms=1.0)
    assert b.ms["comm"] == pytest.approx(0.25)  # 50 us issuing + 200 us waiting, not the 400 us in flight
    assert b.comm_inflight_ms == pytest.approx(0.4)
    assert b.ms["matmul"] == pytest.approx(0.55) and b.ms["optimizer"] == pytest.approx(0.2)
    assert sum(b.ms.values()) == pytest.approx(1.0)
    assert Breakdown.from_dict(json.loads(json.dumps(b.to_dict()))).comm_inflight_ms == pytest.approx(0.4)


def test_single_process_breakdown_has_no_comm():
    ev = [OpEvent("aten::addmm", 300.0, 300.0, (), True), OpEvent("aten::broadcast_tensors", 5.0, 5.0, (), True)]
    b = breakdown(ev, n_steps=1, step_ms=1.0)
    assert b.ms["comm"] == 0.0 and b.comm_inflight_ms == 0.0


def test_profiled_two_rank_gloo_run_has_comm_and_classes_sum_to_the_step(toy_workload, private_store):
    base = dict(workload="toy", size="tiny", max_steps=4, warmup_steps=1, latency_repeats=0, optimizer="sgd")
    r = spawn_run(RunConfig(batch_size=8, profile=True, ddp=DDPConfig(world_size=2, timeout_s=30), **base), run,
                  setup=register_toy, timeout_s=120)
    assert r.status == "ok" and r.steps == 4  # the profiled steps are extra, not timed ones
    prof = r.details["profile"]
    assert prof["world_size"] == 2 and prof["steps"]["active"] == 5
    b = Breakdown.from_dict(prof["train"])
    assert b.ms["comm"] > 0 and b.comm_inflight_ms > 0
    assert any(cls == "comm" for _, cls, _ in b.top_ops)
    assert sum(b.ms.values()) == pytest.approx(b.step_ms, rel=1e-6)
    assert b.step_ms == pytest.approx(r.median_step_ms)
    trace = json.loads(Path(prof["trace"]).read_text())["traceEvents"]
    assert any("allreduce" in e.get("name", "") for e in trace)  # rank 0's trace, collectives included
