"""Memory by role at the tensor level (lab.measure.memory, lab.memory.roles): a toy MLP's parameters, gradients,
Adam state and saved activations against a hand count; the run records them in ``details["memory"]``."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from lab import RunConfig, run
from lab.loop import train_step
from lab.measure.memory import ByteCount, SavedTensorBytes, optimizer_state_bytes, tensor_bytes
from lab.memory.roles import CountingStep

B, D_IN, H, C = 32, 64, 256, 10
F32, I64 = 4, 8


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def test_a_toy_mlps_bytes_by_role_match_a_hand_count():
    model = _mlp()
    rows = torch.randn(1000, D_IN)  # the batch is a slice of a larger split, as the in-memory loader gives it
    batch = (rows[100:100 + B], torch.randint(0, C, (B,)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    counting = CountingStep(None, model)
    train_step(model, optimizer, nn.functional.cross_entropy, itertools.repeat(batch), torch.device("cpu"),
               policy=counting)
    rec = counting.record
    params = (D_IN * H + H) + (H * H + H) + (H * C + C)
    hand = {
        "params_bytes": params * F32,
        "grads_bytes": params * F32,
        "optimizer_state_bytes": 2 * params * F32 + 6 * F32,  # exp_avg, exp_avg_sq, and a scalar step per tensor
        # the input, the two ReLU outputs (each the next Linear's input too), the log-probabilities, the targets
        "saved_activations_bytes": (B * D_IN + 2 * B * H + B * C) * F32 + B * I64,
    }
    for role, want in hand.items():
        assert rec[role] == pytest.approx(want, rel=0.05), role
    assert rec["optimizer"] == "Adam"


def test_the_count_is_taken_once_and_steps_aside_afterwards():
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    counting = CountingStep(None, model)
    batch = (torch.randn(B, D_IN), torch.randint(0, C, (B,)))
    train_step(model, optimizer, nn.functional.cross_entropy, itertools.repeat(batch), torch.device("cpu"),
               policy=counting)
    first = counting.record
    bigger = (torch.randn(4 * B, D_IN), torch.randint(0, C, (4 * B,)))
    train_step(model, optimizer, nn.functional.cross_entropy, itertools.repeat(bigger), torch.device("cpu"),
               policy=counting)
    assert counting.record is first and SavedTensorBytes.active() is None
    assert not hasattr(counting, "scaler") or counting.scaler is None  # what the plain step lacks, it lacks


def test_byte_counts_share_storages_and_count_only_the_span_of_a_view():
    base = torch.zeros(100, 10)
    assert tensor_bytes(base, base[3:5], base.t()) == 100 * 10 * F32  # views of one storage: its bytes once
    assert tensor_bytes(base[3:5]) == 2 * 10 * F32  # a slice holds its span, not the whole buffer
    assert tensor_bytes(base[:, 0]) == (99 * 10 + 1) * F32  # a strided column reaches from first to last
    tied = nn.Linear(4, 4, bias=False)
    assert ByteCount(exclude=[tied.weight]).add(tied.weight.t(), torch.ones(3)).bytes == 3 * F32


def test_low_bit_state_is_counted_by_its_inner_tensors():
    from torchao.optim.subclass_8bit import OptimState8bit

    state = OptimState8bit.zeros((64, 256), signed=True, block_size=256)
    codes, scale, qmap = (getattr(state, a) for a in state.__tensor_flatten__()[0])
    assert codes.dtype == torch.uint8
    expected = codes.numel() + scale.numel() * F32 + qmap.numel() * F32
    assert tensor_bytes(state) == expected < state.numel() * F32 / 3.5
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(2))])
    opt.state[opt.param_groups[0]["params"][0]] = {"exp_avg": state, "step": torch.tensor(1.0)}
    assert optimizer_state_bytes(opt) == expected + F32


def test_a_run_records_its_bytes_by_role_beside_the_rss_peak(toy_workload):
    r = run(RunConfig(workload="toy", size="tiny", max_steps=4, threads=1, latency_repeats=0))
    mem = r.details["memory"]
    params = 8 * 16 + 16 + 16 * 2 + 2
    assert mem["params_bytes"] == mem["grads_bytes"] == params * F32
    assert mem["optimizer_state_bytes"] == 2 * params * F32 + 4 * F32
    assert (32 * 8 + 32 * 16 + 32 * 2) * F32 <= mem["saved_activations_bytes"] <= 1.05 * (
        (32 * 8 + 32 * 16 + 32 * 2) * F32 + 32 * I64)
    assert r.peak_memory_mb > 0 and r.details["techniques"]["memory"]["checkpoint"] == "none"
    assert "memory" not in r.config  # the family is off: stored configs (and their hashes) read as before
