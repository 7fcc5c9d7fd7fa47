"""Checkers of the notebooks' "your turn" cells: each holds a learner's answer against the library's own
result and raises ``AssertionError`` with a hint when it differs; on success it prints one line and returns
what it compared (the tests read it). Each takes the learner's function (or answer) as its first argument.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune as tprune


def _ok(msg: str) -> None:
    print("correct:", msg)


# ------------------------------------------------------------------ 01 data loading
class _CountingLoader:
    """12 batches; records how many the reader had taken when the consumer received each one."""

    def __init__(self, n: int = 12) -> None:
        self.n, self.taken, self.lock = n, 0, threading.Lock()

    def __iter__(self):
        for i in range(self.n):
            with self.lock:
                self.taken += 1
            yield (torch.full((2,), float(i)),)


def prefetch(fn: Callable, depth: int = 2) -> list[int]:
    """Same batches in the same order as lab's ThreadPrefetcher, lazily (a generator), reading ahead, and
    never more than ``depth`` batches ahead of the consumer."""
    from lab.data import ThreadPrefetcher

    loader = _CountingLoader()
    out = fn(loader, depth)
    assert not isinstance(out, (list, tuple)), "return a generator (yield each batch), not a list of batches"
    ahead = []
    got = []
    for batch in out:
        got.append(int(batch[0][0]))
        want = min(depth, loader.n - len(got))
        deadline = time.monotonic() + 1.0  # a slow training step: the reader has time to fill the queue
        while loader.taken - len(got) < want and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.005)  # and a little more, in which an unbounded reader runs further ahead
        with loader.lock:
            ahead.append(loader.taken - len(got))
    ref = [int(b[0][0]) for b in ThreadPrefetcher(_CountingLoader(), depth=depth)]
    assert got == ref, f"batches {got} differ from lab.data.ThreadPrefetcher's {ref} (all of them, in order)"
    # a queue of `depth` plus the one batch the reader holds while it waits to put it
    assert max(ahead) <= depth + 1, f"the reader ran {max(ahead)} batches ahead: bound the queue at depth={depth}"
    assert max(ahead) >= 1, "nothing was read ahead of the consumer: read in a background thread"
    _ok(f"same {len(got)} batches as ThreadPrefetcher, at most {max(ahead)} read ahead (depth {depth})")
    return ahead


def wait_fraction(fn: Callable, step_times_ms: Mapping[str, Sequence[float]]) -> float:
    """The data-wait share of a run's step times, against lab.data.studies.stalls.data_wait_fraction."""
    from lab.data.studies.stalls import data_wait_fraction

    mine, ref = float(fn(step_times_ms)), data_wait_fraction(dict(step_times_ms))
    assert abs(mine - ref) < 1e-9, f"{mine:.4f} vs the lab's {ref:.4f}: skip the first step, divide by all phases"
    _ok(f"data wait {mine:.1%} of the step, as lab's data_wait_fraction")
    return mine


# ------------------------------------------------------------------ 02 mixed precision
def bf16_round(fn: Callable) -> torch.Tensor:
    """Bit-exact against ``x.to(torch.bfloat16)`` on random values, ties, subnormals, huge values and inf."""
    g = torch.Generator().manual_seed(0)
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130, 3.4e38, float("inf"), -0.0, 0.0])
    x = torch.cat([torch.randn(4096, generator=g) * torch.logspace(-30, 30, 4096), ties])
    mine = fn(x.clone())
    ref = x.to(torch.bfloat16).float()
    assert mine.shape == x.shape, f"shape {tuple(mine.shape)}, expected {tuple(x.shape)}"
    bad = ~((mine.float() == ref) | (mine.float().isnan() & ref.isnan()))
    assert not bad.any(), (f"{int(bad.sum())} values differ from x.to(torch.bfloat16), e.g. "
                           f"{x[bad][0].item()!r} -> {mine[bad][0].item()!r}, torch gives {ref[bad][0].item()!r} "
                           "(round half to even; keep fp32's 8 exponent bits)")
    _ok(f"{x.numel()} values rounded exactly as x.to(torch.bfloat16)")
    return mine


def next_loss_scale(fn: Callable, overflows: Sequence[bool] = (False, False, True, False, False, False, True, True,
                                                               False, False, False, False),
                    init_scale: float = 2.0**10, growth_interval: int = 3) -> list[float]:
    """The scale history over ``overflows`` against torch.amp.GradScaler's own updates on CPU."""
    lin = nn.Linear(2, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    ref, mine, scale, good = [], [], init_scale, 0
    for inf in overflows:
        loss = lin(torch.ones(1, 2)).sum()
        scaler.scale(loss).backward()
        if inf:
            lin.weight.grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        ref.append(float(scaler.get_scale()))
        scale, good = fn(scale, inf, good, growth_interval)
        mine.append(float(scale))
    assert mine == ref, f"scales {mine} vs GradScaler's {ref} (overflows {list(overflows)})"
    _ok(f"{len(ref)} updates match torch.amp.GradScaler: {ref}")
    return mine


# ------------------------------------------------------------------ 03 pruning
def global_masks(fn: Callable, amount: float = 0.9) -> dict[str, torch.Tensor]:
    """Masks identical to torch.nn.utils.prune.global_unstructured (L1) over three layers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 2))
    layers = [model[0], model[2], model[4]]
    weights = {f"{i}": m.weight.detach().clone() for i, m in zip((0, 2, 4), layers, strict=True)}
    mine = fn(weights, amount)
    tprune.global_unstructured([(m, "weight") for m in layers], pruning_method=tprune.L1Unstructured, amount=amount)
    for (name, _), m in zip(weights.items(), layers, strict=True):
        assert torch.equal(mine[name].float(), m.weight_mask), (
            f"layer {name}: {int((mine[name] == 0).sum())} zeros vs global_unstructured's "
            f"{int((m.weight_mask == 0).sum())}: one threshold over all layers, not one per layer")
    _ok(f"masks equal torch's global_unstructured at {amount:.0%}")
    return mine


def per_layer_amounts(amounts: Mapping[str, float], study: Any, target: float = 0.70, budget_pt: float = 1.0
                      ) -> dict[str, Any]:
    """Every chosen amount is one the scan measured; applied with masks, the scanned layers reach ``target``
    sparsity (weighted by their weights; the most the scan allows if that is less); and the model, fine-tuned with
    those masks (:meth:`lab.pruning.report.SensitivityStudy.finetuned`, the lab's own ``ctx.fit``), loses at most
    ``budget_pt`` points against the dense one. The fine-tune's result is returned."""
    layers = sorted(study.sizes)
    scanned = {(r["layer"], r["amount"]) for r in study.rows}
    assert set(amounts) <= set(layers), f"unknown layers {sorted(set(amounts) - set(layers))}; scanned: {layers}"
    for name, a in amounts.items():
        assert a == 0 or (name, a) in scanned, f"{name}: amount {a} was not scanned; pick one of the scan's amounts"
    reach = min(target, study.sparsity({n: max(a for ln, a in scanned if ln == n) for n in layers}))
    got = study.sparsity(amounts)
    assert got >= reach - 1e-3, (f"{got:.1%} sparsity over the scanned layers, short of {reach:.1%}: raise the amounts "
                                 "of the large layers whose scan stays flat")
    res = study.finetuned(amounts)
    drift = {n: (s, amounts.get(n, 0.0)) for n, s in res["sparsity"].items() if abs(s - amounts.get(n, 0.0)) > 0.01}
    assert not drift, f"the fine-tune moved the masks (sparsity read back, asked): {drift}"
    loss, before = 100 * (study.dense - res["metric_finetuned"]), 100 * (study.dense - res["metric_pruned"])
    assert loss <= budget_pt, (
        f"after the fine-tune the model is {loss:.2f} pt below the dense one (> {budget_pt} pt; {before:.2f} pt "
        "before it): move sparsity from the layers whose scan falls first to the flat ones")
    _ok(f"{got:.1%} sparsity over the scanned layers (goal {reach:.1%}); accuracy {study.dense:.3f} dense -> "
        f"{res['metric_pruned']:.3f} pruned -> {res['metric_finetuned']:.3f} fine-tuned ({loss:+.2f} pt, budget "
        f"{budget_pt} pt)")
    return res


# ------------------------------------------------------------------ 04 quantization
def quantize_per_channel_symmetric(fn: Callable) -> torch.Tensor:
    """Scales equal to torch's PerChannelMinMaxObserver (qint8, symmetric), codes to quantize_per_channel's."""
    from torch.ao.quantization import PerChannelMinMaxObserver

    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3, 16)[:, None]
    q, scales = fn(w)
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    obs(w)
    ref_scales, zps = obs.calculate_qparams()
    assert torch.allclose(torch.as_tensor(scales).float(), ref_scales, rtol=1e-6), (
        f"scales {torch.as_tensor(scales)[:3].tolist()} vs the observer's {ref_scales[:3].tolist()}: "
        "max |w_row| / 127.5, one per output channel")
    with warnings.catch_warnings():  # torch deprecates quantized tensors; the op is still the reference
        warnings.simplefilter("ignore", UserWarning)
        ref = torch.quantize_per_channel(w, ref_scales, zps, 0, torch.qint8)
    assert torch.equal(torch.as_tensor(q).to(torch.int8), ref.int_repr()), "codes differ from quantize_per_channel's"
    _ok("per-channel scales and int8 codes equal torch's observer and quantize_per_channel")
    return ref_scales


def int8_linear(fn: Callable) -> float:
    """Matches torch's quantize ops (per-tensor uint8 activations, per-channel int8 weights) to 1e-4."""
    from lab.quant import affine_qparams

    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(32, 8)
    x = torch.randn(64, 32, generator=g) * 2 + 0.5
    mine = fn(x, lin.weight.detach(), lin.bias.detach())
    sx, zx = affine_qparams(x)
    sw = lin.weight.detach().abs().amax(dim=1) / 127.5
    with warnings.catch_warnings():  # torch deprecates quantized tensors; the ops are still the reference
        warnings.simplefilter("ignore", UserWarning)
        # quantize_* round half to even, like torch.round; the fake_quantize_* ops multiply by 1 / scale and can
        # land a row's extreme (exactly +-127.5 codes) on the other side of the tie
        fx = torch.quantize_per_tensor(x, sx, zx, torch.quint8).dequantize()
        fw = torch.quantize_per_channel(lin.weight.detach(), sw, torch.zeros(8, dtype=torch.int64), 0,
                                        torch.qint8).dequantize()
    ref = fx @ fw.T + lin.bias.detach()
    err = float((mine - ref).abs().max())
    assert mine.shape == ref.shape and err < 1e-4, f"max difference {err:.3g} from torch's quantized Linear"
    with torch.no_grad():
        vs_float = float((ref - lin(x)).abs().max())
    _ok(f"int8 Linear by hand equals torch's quantized one (max diff {err:.1e}); vs float {vs_float:.3g}")
    return err


# ------------------------------------------------------------------ 05 distributed
def fit_ring(fn: Callable, sizes_bytes: Sequence[float], times_s: Sequence[float], p: int = 2) -> tuple[float, float]:
    """alpha and beta against lab.distributed.scaling.calibrate on the same measurements."""
    from lab.distributed import scaling

    alpha, beta = fn(sizes_bytes, times_s, p)
    link = scaling.calibrate(sizes_bytes, times_s, p)
    assert np.isclose(alpha, link.alpha_s, rtol=1e-6, atol=1e-12), \
        f"alpha {alpha:.3g} s vs the lab's {link.alpha_s:.3g} s"
    assert np.isclose(beta, link.beta_s_per_byte, rtol=1e-6), \
        f"beta {beta:.3g} s/B vs the lab's {link.beta_s_per_byte:.3g}"
    _ok(f"alpha {alpha * 1e6:.1f} us per hop, bandwidth {1 / beta / 1e9:.2f} GB/s, as scaling.calibrate")
    return alpha, beta


def ddp_speedup(fn: Callable, compute_s: float, grad_bytes: float) -> list[float]:
    """Speedups at 2..1024 workers on each preset link against lab.distributed.scaling.project."""
    from lab.distributed import scaling

    ps = scaling.powers_of_two(1024)
    got = []
    for link in scaling.LINK_PRESETS.values():
        for row in scaling.project(compute_s, grad_bytes, ps, link):
            mine = fn(compute_s, grad_bytes, row["p"], link.alpha_s, link.beta_s_per_byte)
            assert np.isclose(mine, row["speedup"], rtol=1e-9), (
                f"{link.name}, p={row['p']}: {mine:.3f} vs the lab's {row['speedup']:.3f} (25 MB buckets, "
                "each paying 2(p-1) alpha)")
            got.append(mine)
    _ok(f"{len(got)} projections equal scaling.project's")
    return got


# ------------------------------------------------------------------ 07 scale
def crossing_macs(fn: Callable, fits: Sequence[Mapping[str, Any]] = ()) -> int:
    """Where two fitted lines cross, against lab.crossover.fit.crossover_macs, on the map's fits and on cases
    where the technique always or never pays."""
    from lab.crossover.fit import Line, crossover_macs

    cases = [(0.5, 0.1, 0.8, 0.05), (0.5, 0.1, 0.4, 0.05), (0.5, 0.05, 0.8, 0.1), (0.5, 0.1, 0.5, 0.1),
             (1.0, 0.2, 1.0, 0.1)]
    cases += [(f["base_overhead_ms"], f["base_ms_per_mmac"], f["tech_overhead_ms"], f["tech_ms_per_mmac"])
              for f in fits]
    for c in cases:
        mine, ref = fn(*c), crossover_macs(Line(c[0], c[1]), Line(c[2], c[3]))
        same = (mine is None and ref is None) or (mine is not None and ref is not None and np.isclose(mine, ref))
        assert same, f"lines {c}: {mine} vs the lab's {ref} (0.0: pays at every size, None: at none)"
    _ok(f"{len(cases)} crossings equal lab.crossover.fit.crossover_macs")
    return len(cases)


def regime_of(fn: Callable) -> int:
    """The regime tag of a grid of steps against lab.crossover.fit.regime (inference axis: 4 B per weight)."""
    from lab.crossover.fit import Line, regime

    n = 0
    for overhead, step in ((0.1, 1.0), (0.6, 1.0), (0.5, 1.0), (0.05, 2.0)):
        for macs, batch, params in ((1e3, 8, 1e5), (1e5, 64, 1e5), (1e4, 32, 1e6), (3.2e4, 1, 1e3)):
            ref, _ = regime(Line(overhead, 0.0), step, macs, batch, int(params), "inference")
            mine = fn(overhead, step, macs * batch, params * 4.0)
            assert mine == ref, f"overhead {overhead} of {step} ms, {macs * batch:.3g} MACs, {params:.3g} params: " \
                                f"{mine!r} vs the lab's {ref!r}"
            n += 1
    _ok(f"{n} steps tagged as lab.crossover.fit.regime tags them")
    return n


# ------------------------------------------------------------------ 08 doctor
def amdahl_speedup(fn: Callable, shares: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """1 / sum(share / rate) against lab.doctor.amdahl's point estimate."""
    from lab.doctor import Rate, amdahl

    mine = float(fn(shares, rates))
    ref, _, _ = amdahl(shares, {c: Rate(r, r * 0.9, r * 1.1, "exercise") for c, r in rates.items()})
    assert np.isclose(mine, ref, rtol=1e-9), f"{mine:.4f}x vs lab.doctor.amdahl's {ref:.4f}x"
    _ok(f"{mine:.3f}x, as lab.doctor.amdahl")
    return mine


def best_technique(fn: Callable, shares: Mapping[str, float],
                   rates_by_technique: Mapping[str, Mapping[str, float]]) -> str:
    """The technique whose lab.doctor.amdahl speedup is largest on ``shares``; then a case the notebook's numbers
    may not hold, where the largest class is not the one to speed up (a rule "speed up the largest class" passes
    the first case and fails this one)."""
    from lab.doctor import Rate, amdahl

    def point(on: Mapping[str, float], rates: Mapping[str, float]) -> float:
        return amdahl(on, {c: Rate(r, r * 0.9, r * 1.1, "exercise") for c, r in rates.items()})[0]

    mine = fn(shares, rates_by_technique)
    ref = max(rates_by_technique, key=lambda t: point(shares, rates_by_technique[t]))
    assert mine == ref, f"{mine!r} ({point(shares, rates_by_technique[mine]):.3f}x) vs {ref!r} " \
                        f"({point(shares, rates_by_technique[ref]):.3f}x): weigh each rate by its class's share"
    trap_shares = {"matmul": 0.6, "elementwise": 0.3, "optimizer": 0.1}
    trap = {"bf16": {"matmul": 1.1}, "fused": {"elementwise": 3.0, "optimizer": 3.0}}
    got = fn(trap_shares, trap)
    assert got == "fused", (f"{got!r} on matmul 60 %, elementwise 30 %, optimizer 10 %: bf16 (matmul x1.1) gives "
                            f"{point(trap_shares, trap['bf16']):.3f}x, fused (elementwise and optimizer x3) "
                            f"{point(trap_shares, trap['fused']):.3f}x: the largest class is not always the one to "
                            "speed up")
    _ok(f"{ref} first, predicted {point(shares, rates_by_technique[ref]):.3f}x; and fused over bf16 where matmul is "
        "the largest class")
    return mine


# ------------------------------------------------------------------ 09 memory
ROLES = ("params_bytes", "grads_bytes", "optimizer_state_bytes", "saved_activations_bytes")
_ROLE_HINTS = {
    "params_bytes": "each Linear holds a x b weights and b biases, 4 bytes each in fp32",
    "grads_bytes": "one fp32 gradient per parameter",
    "optimizer_state_bytes": "Adam keeps two fp32 moments per parameter (exp_avg, exp_avg_sq) and a step count per "
                             "tensor",
    "saved_activations_bytes": "the input batch, each ReLU's output (also the next Linear's input: one tensor, "
                               "counted once), the log-probabilities and the int64 targets",
}


def _measured_roles(widths: Sequence[int], batch: int) -> dict[str, int]:
    """One Adam step on ``Linear -> ReLU -> ... -> Linear`` of ``widths``, counted by lab.memory.roles.CountingStep
    (the count a run records in ``details["memory"]``)."""
    import itertools

    from lab.loop import train_step
    from lab.memory.roles import CountingStep

    g = torch.Generator().manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    counting = CountingStep(None, model)
    rows = (torch.randn(batch, widths[0], generator=g), torch.randint(0, widths[-1], (batch,), generator=g))
    train_step(model, optimizer, nn.functional.cross_entropy, itertools.repeat(rows), torch.device("cpu"),
               policy=counting)
    return {role: int(counting.record[role]) for role in ROLES}


def step_bytes(fn: Callable, widths: Sequence[int] = (256, 64, 64, 10), batch: int = 64,
               rel: float = 0.05) -> dict[str, tuple[int, int]]:
    """Each role of the learner's count within ``rel`` of the measured one (lab.memory.roles.CountingStep) on the
    notebook's MLP, and on two shapes of the checker's: one where the batch's activations dominate, one deeper
    and narrow-batched where the parameters and Adam's state do."""
    cases = [(tuple(widths), batch), ((32, 512, 10), 256), ((128, 300, 200, 100, 5), 8)]
    got: dict[str, tuple[int, int]] = {}
    for w, b in cases:
        ref = _measured_roles(w, b)
        mine = fn(list(w), b)
        for role in ROLES:
            assert role in mine, f"no {role!r} in your answer: return a dict with {list(ROLES)}"
            err = abs(float(mine[role]) - ref[role]) / ref[role]
            assert err <= rel, (f"widths {list(w)}, batch {b}: {role} {int(mine[role])} vs {ref[role]} measured "
                                f"({err:.1%} off, more than {rel:.0%}): {_ROLE_HINTS[role]}")
        got[f"{list(w)} x {b}"] = (sum(int(mine[r]) for r in ROLES), sum(ref.values()))
    _ok(f"{len(cases)} MLPs: every role within {rel:.0%} of lab.memory.roles' count of one Adam step")
    return got


def _moments(block_size: int) -> list[tuple[str, torch.Tensor, bool]]:
    """Adam-moment-like tensors: a signed first moment spread over five decades (blocks mix large and tiny
    values), and the second moment, its square (unsigned, ten decades)."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(64, 2 * block_size, generator=g) * torch.logspace(-6, -1, 2 * block_size)
    return [("exp_avg", m, True), ("exp_avg_sq", m.square(), False)]


def quantize_blockwise(fn: Callable, block_size: int = 256) -> dict[str, float]:
    """Codes and scales equal to torchao's 8-bit optimizer state (``OptimState8bit.copy_``: what AdamW8bit stores
    each step) for a signed and an unsigned moment; a value exactly halfway between two map entries may go either
    way. Returns each moment's mean relative round-trip error."""
    from torchao.optim.subclass_8bit import OptimState8bit

    errors = {}
    for name, x, signed in _moments(block_size):
        ref = OptimState8bit.zeros(x.shape, signed=signed, block_size=block_size)
        ref.copy_(x)
        qmap = ref.qmap.clone()
        codes, scales = fn(x.clone(), qmap.clone(), block_size)
        codes, scales = torch.as_tensor(codes), torch.as_tensor(scales)
        assert codes.dtype == torch.uint8, f"{name}: codes are {codes.dtype}: one byte each, .to(torch.uint8)"
        assert scales.numel() == ref.scale.numel(), (
            f"{name}: {scales.numel()} scales for {x.numel()} values: one per block of {block_size} consecutive "
            f"values (x.reshape(-1, {block_size})), {ref.scale.numel()} here")
        assert torch.allclose(scales.float().flatten(), ref.scale, rtol=1e-6, atol=0), (
            f"{name}: scales {scales.flatten()[:2].tolist()} vs torchao's {ref.scale[:2].tolist()}: each block's "
            "largest |value|")
        codes, want = codes.reshape(x.shape).long(), ref.codes.long()
        scaled = (x.reshape(-1, block_size) / ref.scale[:, None]).reshape(x.shape)
        # equally near two entries up to float rounding (relative to the value): either code is right
        tie = ((scaled - qmap[codes]).abs() - (scaled - qmap[want]).abs()).abs() <= 1e-6 * scaled.abs().clamp_min(1e-6)
        bad = (codes != want) & ~tie
        if bad.any():
            i = bad.flatten().nonzero()[0, 0]
            v, c, w = scaled.flatten()[i].item(), codes.flatten()[i].item(), want.flatten()[i].item()
            raise AssertionError(f"{name}: {int(bad.sum())} of {x.numel()} codes differ from torchao's, e.g. "
                                 f"x / scale = {v:.6g} -> code {c} ({qmap[c].item():.6g}), torchao {w} "
                                 f"({qmap[w].item():.6g}): the index of the map entry nearest to x / scale")
        back = ref.dequantize()
        errors[name] = float(((back - x).abs() / x.abs().clamp_min(1e-30)).mean())
    _ok(f"codes and scales equal torchao's 8-bit optimizer state (block {block_size}); mean relative error "
        + ", ".join(f"{k} {v:.2%}" for k, v in errors.items()))
    return errors


def dequantize_blockwise(fn: Callable, block_size: int = 256) -> float:
    """The values back from torchao's own codes and scales, against its ``OptimState8bit.dequantize``."""
    from torchao.optim.subclass_8bit import OptimState8bit

    worst = 0.0
    for name, x, signed in _moments(block_size):
        ref = OptimState8bit.zeros(x.shape, signed=signed, block_size=block_size)
        ref.copy_(x)
        mine = torch.as_tensor(fn(ref.codes.clone(), ref.scale.clone(), ref.qmap.clone()))
        want = ref.dequantize()
        assert mine.numel() == want.numel(), f"{name}: {mine.numel()} values back for {want.numel()} codes"
        mine = mine.reshape(want.shape).float()
        err = float(((mine - want).abs() / want.abs().clamp_min(1e-30)).max())
        assert torch.allclose(mine, want, rtol=1e-6, atol=0), (
            f"{name}: {mine.flatten()[:2].tolist()} vs torchao's {want.flatten()[:2].tolist()}: each code's map "
            "entry (qmap[code]) times its block's scale")
        worst = max(worst, err)
    _ok(f"values equal torchao's OptimState8bit.dequantize (max relative difference {worst:.1e})")
    return worst

# ------------------------------------------------------------------ 00 tour and 06 ablations
def median_step(fn: Callable, result: Any) -> float:
    """The learner's ``fn(total_ms, warmup_steps)`` against :attr:`lab.result.RunResult.median_step_ms` on
    ``result`` (a run of the notebook), then on a series where the warm-up steps are slow and the count of measured
    steps is even: leaving the warm-up in, or taking one middle value instead of the mean of the two, fails there."""
    total = list(result.step_times_ms["total"])
    mine, ref = float(fn(total, result.warmup_steps)), float(result.median_step_ms)
    assert abs(mine - ref) < 1e-9, f"{mine:.4f} ms vs the lab's {ref:.4f} ms: drop the first warmup_steps, then median"
    slow_start = [50.0, 40.0, 3.0, 1.0, 2.0, 4.0]
    got = float(fn(slow_start, 2))
    assert abs(got - 2.5) < 1e-9, (f"{got} on {slow_start} with 2 warm-up steps: the median of [3, 1, 2, 4] is 2.5 "
                                   "(leave the warm-up out; an even count averages the two middle values)")
    _ok(f"median step {mine:.3f} ms over {len(total) - result.warmup_steps} measured steps, as the lab's")
    return mine


def interaction(fn: Callable, df: Any, pair: Sequence[str], speed: str = "train_speedup") -> float:
    """The learner's ``fn(joint, a, b)`` (the speedups of the stack and of each technique alone) against the 2-way
    term of :func:`lab.ablation.interaction_effects` on the ablation table ``df`` for ``pair``, then on two made-up
    squares: one that compounds and one that cancels (a difference of speedups or a ratio to one single fails).
    Returns the learner's value on the first square (``df``'s where given)."""
    import pandas as pd

    from lab.ablation import interaction_effects

    def by_stack(table: Any) -> dict[frozenset, float]:
        return {frozenset(t.split("+")) if t else frozenset(): float(s)
                for t, s in zip(table["techniques"], table[speed], strict=True)}

    cases = []
    if df is not None:
        sub = df[df["techniques"].fillna("").map(lambda t: bool(t) and set(t.split("+")) <= set(pair))]
        cases.append(("the notebook's ablation", sub))
    for joint, sa, sb in ((1.8, 1.2, 1.1), (1.05, 1.3, 1.2)):
        cases.append((f"joint {joint}, alone {sa} and {sb}", pd.DataFrame({
            "techniques": [pair[0], pair[1], "+".join(pair)], "status": "ok", speed: [sa, sb, joint],
            "acc_loss_pt": 0.0})))
    first = None
    for name, table in cases:
        s = by_stack(table)
        a, b, joint = s[frozenset([pair[0]])], s[frozenset([pair[1]])], s[frozenset(pair)]
        effects = interaction_effects(table, speed)
        ref = float(effects[effects["term"] == "2-way"]["effect"].iloc[0])
        mine = float(fn(joint, a, b))
        assert abs(mine - ref) < 1e-9, (f"{name}: {mine:.4f} vs lab.ablation.interaction_effects' {ref:.4f}: what the "
                                        "stack gives over what the two would give if they simply multiplied")
        first = mine if first is None else first
    _ok(f"interaction of {'+'.join(pair)} {first:.3f}, as lab.ablation.interaction_effects, on {len(cases)} squares")
    return first


# The own-loop and capstone checkers live in their own modules; the notebooks call them as checks.<name>.
from lab.teach.capstone import capstone_table  # noqa: E402, F401
from lab.teach.own_loop import LOOP_SIZE, LOOP_WORKLOAD, ArmStart, amp_loop, train_bf16, watch_linears  # noqa: E402, F401
