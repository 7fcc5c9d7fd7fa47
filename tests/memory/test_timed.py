"""The memory options are timeable by the crossover map's machinery (Memory.timed through
lab.crossover.arms.apply_options), without being rows of the map: a checkpointed arm trains a checkpointed copy,
a low-bit arm steps torchao's optimizer."""

from __future__ import annotations

import pytest
import torch

from lab.crossover import TECHNIQUES as MAP_TECHNIQUES
from lab.crossover.arms import apply_options
from lab.crossover.measure import make_bench
from lab.memory.checkpointing import CheckpointedForward
from lab.timed import INFER, TRAIN, NotTimed, base_arm, timed
from lab.workloads import get_workload


def test_a_checkpointed_arm_trains_a_copy_whose_blocks_run_forward_twice():
    wl = get_workload("transformer")
    bench = make_bench(wl, "xs", batch_size=8)
    before = {k: v.clone() for k, v in bench.model.state_dict().items()}
    arm = apply_options(bench, base_arm(bench, TRAIN), "checkpoint_blocks")
    assert arm.derived == ("checkpointed",) and arm.model is not bench.model and arm.notes == ["1 blocks checkpointed"]
    block = wl.model_blocks(arm.model)[0]
    assert isinstance(block.__dict__["forward"], CheckpointedForward)
    calls = []
    block.linear1.register_forward_hook(lambda *_: calls.append(1))
    step = timed(bench, arm)
    step()
    step()
    assert len(calls) == 4  # forward and recompute, two steps
    after = arm.model.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in before.items())  # the copy trained
    assert all(torch.equal(bench.model.state_dict()[k], v) for k, v in before.items())  # the rung's model did not
    with pytest.raises(NotTimed, match="training only"):
        apply_options(bench, base_arm(bench, INFER), "checkpoint_blocks")


def test_a_model_without_blocks_is_not_timed_with_the_refusal():
    bench = make_bench(get_workload("mlp"), "xs", batch_size=8)
    with pytest.raises(NotTimed, match="no blocks to checkpoint"):
        apply_options(bench, base_arm(bench, TRAIN), "checkpoint_blocks")


def test_a_low_bit_arm_steps_torchaos_optimizer_and_the_map_does_not_time_it():
    bench = make_bench(get_workload("mlp"), "m", batch_size=16)  # the shapes tests/memory/test_low_bit.py compiles
    arm = apply_options(bench, base_arm(bench, TRAIN), "adam8bit")
    assert arm.derived == () and arm.notes == ["torchao AdamW8bit"]
    first = next(bench.model.parameters()).detach().clone()
    # eager: the same torchao update without its first-step compile (tests/memory/test_low_bit.py compiles it;
    # once per suite is enough, each compile is 10-20 s of CI's 15 minutes)
    with torch.compiler.set_stance("force_eager"):
        timed(bench, arm)()
    assert not torch.equal(next(bench.model.parameters()), first)  # the step updated the weights
    fused = base_arm(bench, TRAIN)
    fused.fused = True
    with pytest.raises(NotTimed, match="fused Adam"):
        apply_options(bench, fused, "adam8bit")
    assert not {"checkpoint_blocks", "adam8bit", "adam4bit"} & set(MAP_TECHNIQUES)


def test_an_accumulating_arm_runs_the_fixed_batch_as_micro_batches():
    bench = make_bench(get_workload("mlp"), "xs", batch_size=8)
    arm = apply_options(bench, base_arm(bench, TRAIN), "accum4")
    assert arm.micro_batches == 4 and arm.notes == ["4 micro-batches"] and arm.model is bench.model
    rows = []
    arm.model.register_forward_pre_hook(lambda _, args: rows.append(len(args[0])))
    timed(bench, arm)()
    assert rows == [2, 2, 2, 2]  # the fixed batch of 8, four forwards of 2 rows
    with pytest.raises(NotTimed, match="training only"):
        apply_options(bench, base_arm(bench, INFER), "accum4")
