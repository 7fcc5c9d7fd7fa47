"""Activation checkpointing per block (memory.checkpoint="blocks"), verified by its effects: the blocks run forward
twice per step, the bytes saved for backward drop, losses and gradients equal the plain run's, BatchNorm's running
statistics move once per step; refused for a model without blocks; the blocks come from the workload's hook."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

from lab import RunConfig, run
from lab.loop import make_optimizer, train_step
from lab.measure.memory import SavedTensorBytes
from lab.memory.checkpointing import CheckpointedForward, checkpoint_blocks, checkpointed_copy, restore_blocks
from lab.memory.roles import CountingStep
from lab.workloads import Workload, get_workload
from lab.workloads.base import default_blocks
from lab.workloads.resnet import BasicBlock, small_resnet


def _rung(name: str, rung: str, n: int = 16):
    wl = get_workload(name)
    spec = wl.spec_at("tiny", rung)
    torch.manual_seed(0)
    model = wl.make_model(spec).train()
    data = wl.make_data(spec, 0)
    return wl, model, tuple(t[:n] for t in data.train)


def _forward_counts(model: nn.Module, blocks: list[nn.Module]) -> dict[str, int]:
    """Forward calls of every parameterised leaf inside the blocks, by name."""
    counts: dict[str, int] = {}
    names = {id(m): n for n, m in model.named_modules()}
    for block in blocks:
        for leaf in block.modules():
            if not list(leaf.children()) and any(True for _ in leaf.parameters(recurse=False)):
                key = names[id(leaf)]
                counts[key] = 0
                leaf.register_forward_hook(lambda m, i, o, key=key: counts.__setitem__(key, counts[key] + 1))
    return counts


@pytest.mark.parametrize(("workload", "rung", "min_ratio"), [("transformer", "s", 3.0), ("vision", "s", 2.0)])
def test_blocks_run_twice_per_step_and_keep_fewer_bytes_with_the_same_gradients(workload, rung, min_ratio):
    wl, model, batch = _rung(workload, rung)
    twin, names = checkpointed_copy(model, wl.model_blocks)
    assert names and all(isinstance(b.__dict__["forward"], CheckpointedForward) for b in wl.model_blocks(twin))
    counts = {"plain": _forward_counts(model, wl.model_blocks(model)),
              "checkpointed": _forward_counts(twin, wl.model_blocks(twin))}
    out = {}
    for tag, m in (("plain", model), ("checkpointed", twin)):
        optimizer = make_optimizer("adam", m.parameters(), 1e-3)
        counting = CountingStep(None, m)
        losses = [train_step(m, optimizer, wl.loss, itertools.repeat(batch), torch.device("cpu"),
                             policy=counting).item() for _ in range(3)]
        out[tag] = (losses, counting.record["saved_activations_bytes"], copy.deepcopy(m.state_dict()))
    ran = [k for k, n in counts["plain"].items() if n]  # not nn.MultiheadAttention's out_proj: its weight is used
    assert len(ran) >= 4 and {counts["plain"][k] for k in ran} == {3}  # once per step
    # ... and again in each backward: the recompute runs each block up to its last op whose saved tensors the
    # backward needs (torch stops there: a transformer layer's last Linear saved its input and is not rerun)
    again = [k for k in ran if counts["checkpointed"][k] == 6]
    assert {counts["checkpointed"][k] for k in ran} <= {3, 6} and len(again) >= len(ran) / 2
    for name in names:
        assert any(k.startswith(name + ".") for k in again), name
    assert out["plain"][1] >= min_ratio * out["checkpointed"][1]
    torch.testing.assert_close(out["checkpointed"][0], out["plain"][0], rtol=1e-5, atol=1e-6)
    for key, value in out["plain"][2].items():  # weights after three Adam steps, and BatchNorm's running stats
        torch.testing.assert_close(out["checkpointed"][2][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_batchnorm_running_stats_move_once_per_step():
    block = BasicBlock(4, 4).train()
    twin = copy.deepcopy(block)
    checkpoint_blocks(twin, [twin])
    x = torch.randn(8, 4, 6, 6)
    block(x).sum().backward()
    twin(x).sum().backward()  # the recompute runs the norms again
    assert int(twin.bn1.num_batches_tracked) == int(block.bn1.num_batches_tracked) == 1
    torch.testing.assert_close(twin.bn1.running_mean, block.bn1.running_mean)
    torch.testing.assert_close(twin.bn2.running_var, block.bn2.running_var)
    torch.testing.assert_close(twin.conv1.weight.grad, block.conv1.weight.grad)


def test_a_checkpointed_copy_is_independent_and_restoring_gives_the_plain_model():
    wl, model, batch = _rung("transformer", "s")
    twin, _ = checkpointed_copy(model, wl.model_blocks)
    assert not any(isinstance(m.__dict__.get("forward"), CheckpointedForward) for m in model.modules())
    again = copy.deepcopy(twin)
    for block in wl.model_blocks(again):
        assert block.__dict__["forward"].block is block  # the copy's wrapper drives the copy's block
    assert again.state_dict().keys() == model.state_dict().keys()
    assert restore_blocks(again) == len(wl.model_blocks(model)) and restore_blocks(again) == 0
    with SavedTensorBytes(list(again.parameters())) as plain:
        again(*batch[:-1]).sum()
    with SavedTensorBytes(list(twin.parameters())) as checkpointed:
        twin(*batch[:-1]).sum()
    assert plain.bytes > 3 * checkpointed.bytes
    with torch.no_grad():  # evaluation runs a checkpointed block plainly
        torch.testing.assert_close(twin(*batch[:-1]), again(*batch[:-1]))


def test_a_run_checkpoints_the_blocks_trains_the_same_and_hands_on_the_plain_model():
    base = RunConfig(workload="transformer", size="tiny", model_scale="s", max_steps=6, threads=1, latency_repeats=0)
    plain = run(base)
    ckpt = run(base.with_overrides(**{"memory.checkpoint": "blocks"}))
    assert ckpt.status == "ok" and ckpt.details["memory"]["checkpointed_blocks"] == ["encoder.layers.0",
                                                                                     "encoder.layers.1"]
    torch.testing.assert_close(ckpt.losses, plain.losses, rtol=1e-5, atol=1e-6)
    assert ckpt.metric == pytest.approx(plain.metric, abs=1e-6)
    assert plain.details["memory"]["saved_activations_bytes"] > 3 * ckpt.details["memory"]["saved_activations_bytes"]
    assert ckpt.details["memory"]["params_bytes"] == plain.details["memory"]["params_bytes"]
    assert ckpt.details["techniques"]["memory"]["checkpoint"] == "blocks" and ckpt.config["memory"]["checkpoint"]


def test_a_model_without_blocks_is_refused_before_training_in_one_line():
    cfg = RunConfig(workload="mlp", size="tiny", max_steps=4).with_overrides(**{"memory.checkpoint": "blocks"})
    with pytest.raises(ValueError, match="no blocks to checkpoint") as err:
        run(cfg, on_error="record")  # a refusal, not an error row
    assert "\n" not in str(err.value) and "'mlp'" in str(err.value)


def test_blocks_come_from_the_workload_hook_with_a_default_for_common_shapes(toy_workload):
    assert default_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))) == []
    assert default_blocks(nn.LSTM(4, 4)) == []
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 3,
                                    enable_nested_tensor=False)
    assert default_blocks(encoder) == list(encoder.layers)
    resnet = small_resnet(blocks=(2, 1, 1))
    assert [type(b) for b in default_blocks(resnet)] == [BasicBlock] * 4  # not the stages, not the stem
    # a workload names its own blocks, and the family uses them
    import dataclasses

    own = dataclasses.replace(toy_workload, name="toy_blocks", blocks=lambda m: [m[0]])
    model = own.make_model(own.size("tiny"))
    assert own.model_blocks(model) == [model[0]] and toy_workload.model_blocks(model) == []
    assert isinstance(own, Workload)
