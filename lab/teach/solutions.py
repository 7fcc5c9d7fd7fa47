"""Reference solutions of the notebooks' "your turn" cells, written by hand (torch / numpy only, no lab
helper): the checkers in :mod:`lab.teach.checks` hold them, like a learner's answer, against the library.

Each function keeps the name and signature of its notebook stub (:func:`lab.teach.use_solution` swaps by name).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch


# ------------------------------------------------------------------ 01 data loading
def prefetch(loader: Iterable, depth: int = 2) -> Iterator:
    """Yield ``loader``'s batches in order while a thread reads ahead, holding at most ``depth`` batches."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def fill() -> None:
        for batch in loader:
            q.put(batch)  # blocks while `depth` batches wait: the bound
        q.put(done)

    threading.Thread(target=fill, daemon=True).start()
    while (batch := q.get()) is not done:
        yield batch


def wait_fraction(step_times_ms: Mapping[str, Sequence[float]], skip: int = 1) -> float:
    """Share of the time spent waiting for data: data wait over wait + forward + backward + optimizer."""
    def total(phase: str) -> float:
        return float(sum(step_times_ms.get(phase, [])[skip:]))

    wait = total("data_wait")
    return wait / (wait + total("forward") + total("backward") + total("optimizer"))


# ------------------------------------------------------------------ 02 mixed precision
def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest bf16 (round half to even on the 16 dropped bits), returned as fp32 values."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    lsb = (bits >> 16) & 1  # the last kept bit: ties go to the even neighbour
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    nan = torch.isnan(x)
    out = (rounded & 0xFFFFFFFF).to(torch.int64)
    out = torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).view(torch.float32)
    return torch.where(nan, x.float(), out)


def next_loss_scale(scale: float, found_inf: bool, good_steps: int, growth_interval: int = 2000,
                    growth_factor: float = 2.0, backoff_factor: float = 0.5) -> tuple[float, int]:
    """One dynamic loss-scale update: back off and restart the count on an overflow, grow after
    ``growth_interval`` clean steps in a row. Returns ``(scale, good_steps)``."""
    if found_inf:
        return scale * backoff_factor, 0
    good_steps += 1
    if good_steps == growth_interval:
        return scale * growth_factor, 0
    return scale, good_steps


# ------------------------------------------------------------------ 03 pruning
def global_masks(weights: Mapping[str, torch.Tensor], amount: float) -> dict[str, torch.Tensor]:
    """One magnitude threshold over all tensors: zero the ``amount`` smallest |w| of the lot."""
    flat = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    k = round(amount * flat.numel())
    if k == 0:
        return {n: torch.ones_like(w) for n, w in weights.items()}
    drop = torch.zeros_like(flat)
    drop[torch.topk(flat, k, largest=False).indices] = 1
    out, at = {}, 0
    for n, w in weights.items():
        out[n] = 1 - drop[at:at + w.numel()].view_as(w)
        at += w.numel()
    return out


def per_layer_amounts(scan: Sequence[Mapping[str, Any]], sizes: Mapping[str, int], target: float = 0.70
                      ) -> dict[str, float]:
    """Scanned amounts that reach ``target`` sparsity over the scanned layers (weighted by ``sizes``, their
    weights) for the least harm the scan shows: start from nothing and, until the target is reached, take the
    next scanned amount of the layer whose scan loses the least metric per weight it zeroes."""
    metric = {(r["layer"], r["amount"]): r["metric"] for r in scan}
    steps = {n: sorted(a for ln, a in metric if ln == n) for n in sizes}
    out = {n: 0.0 for n in sizes}
    total = sum(sizes.values())

    def zeroed(choice: Mapping[str, float]) -> float:
        return sum(a * sizes[n] for n, a in choice.items()) / total

    def cost(n: str, a: float) -> float:  # metric lost per weight zeroed by going from out[n] to a
        now = metric.get((n, out[n]), max(metric[(n, b)] for b in steps[n]))
        return max(now - metric[(n, a)], 0.0) / ((a - out[n]) * sizes[n])

    while zeroed(out) < target:
        nxt = {n: next((a for a in steps[n] if a > out[n]), None) for n in sizes}
        options = [(cost(n, a), n, a) for n, a in nxt.items() if a is not None]
        if not options:
            break
        _, n, a = min(options)
        out[n] = a
    return out


# ------------------------------------------------------------------ 04 quantization
def quantize_per_channel_symmetric(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes and one scale per output channel (row): ``scale = max|w_row| / 127.5``, zero point 0,
    codes ``clamp(round(w * (1 / scale)), -128, 127)``."""
    scales = w.detach().abs().amax(dim=tuple(range(1, w.dim()))).clamp_min(1e-12) / 127.5
    shape = (-1,) + (1,) * (w.dim() - 1)
    # times the reciprocal, as torch's kernels do: a row's extreme sits exactly on the +-127.5 tie, where
    # w / scale and w * (1 / scale) can round to different codes
    q = torch.clamp(torch.round(w * (1.0 / scales.view(shape))), -128, 127).to(torch.int8)
    return q, scales


def int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A Linear as int8 runs it: x per tensor (uint8, asymmetric), weight per channel (int8, symmetric),
    an integer matmul, then one rescale per output channel."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    sx = (hi - lo) / 255 if hi > lo else 1.0
    zx = int(min(max(-round(lo / sx), 0), 255))
    qx = torch.clamp(torch.round(x / sx) + zx, 0, 255).to(torch.int64)
    qw, sw = quantize_per_channel_symmetric(weight)
    acc = (qx - zx) @ qw.to(torch.int64).T  # int32 accumulation in the real kernel
    y = acc.to(torch.float32) * (sx * sw)
    return y + bias if bias is not None else y


# ------------------------------------------------------------------ 05 distributed
def fit_ring(sizes_bytes: Sequence[float], times_s: Sequence[float], p: int) -> tuple[float, float]:
    """alpha (s per hop) and beta (s per byte) of ``t = 2(p-1) alpha + 2(p-1)/p S beta``, least squares on
    relative errors (each row weighted by 1 / t), both kept >= 0."""
    s, t = np.asarray(sizes_bytes, float), np.asarray(times_s, float)
    a = np.column_stack([np.full_like(s, 2 * (p - 1)), 2 * (p - 1) / p * s]) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 1e-15)


def ddp_speedup(compute_s: float, grad_bytes: float, p: int, alpha_s: float, beta_s_per_byte: float,
                bucket_bytes: float = 25e6) -> float:
    """Speedup of p workers at a fixed per-worker batch: p * compute / (compute + comm), the gradients sent
    as ring all-reduces in buckets of ``bucket_bytes`` (each bucket pays the latency once), no overlap."""
    def ring(size: float) -> float:
        return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * size * beta_s_per_byte

    n_full, rest = divmod(grad_bytes, bucket_bytes)
    comm = n_full * ring(bucket_bytes) + (ring(rest) if rest > 0 else 0.0)
    return p * compute_s / (compute_s + comm)


# ------------------------------------------------------------------ 07 scale
def crossing_macs(base_overhead_ms: float, base_ms_per_mmac: float, tech_overhead_ms: float,
                  tech_ms_per_mmac: float) -> float | None:
    """MACs per sample where the technique's line meets the baseline's: 0.0 when the technique is at
    least as fast at every size, None when it never is."""
    extra = tech_overhead_ms - base_overhead_ms
    saved = base_ms_per_mmac - tech_ms_per_mmac
    if extra <= 0 and saved >= 0 and not (extra == 0 and saved == 0):
        return 0.0
    if saved <= 0:
        return None
    return extra / saved * 1e6


def regime_of(overhead_ms: float, step_ms: float, macs_per_step: float, weight_bytes: float) -> str:
    """dispatch-bound when the fixed overhead is at least half the step, memory-bound below 8 MACs per
    byte of weight traffic, else compute-bound."""
    if step_ms <= 0 or overhead_ms / step_ms >= 0.5:
        return "dispatch-bound"
    if macs_per_step / max(weight_bytes, 1.0) < 8.0:
        return "memory-bound"
    return "compute-bound"


# ------------------------------------------------------------------ 08 doctor
def amdahl_speedup(shares: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """1 / sum(share_c / rate_c): classes without a rate keep their time."""
    rest = 1.0 - sum(shares.get(c, 0.0) for c in rates)
    return 1.0 / (rest + sum(shares.get(c, 0.0) / r for c, r in rates.items()))


def best_technique(shares: Mapping[str, float], rates_by_technique: Mapping[str, Mapping[str, float]]) -> str:
    """The technique with the largest Amdahl speedup on this breakdown."""
    return max(rates_by_technique, key=lambda t: amdahl_speedup(shares, rates_by_technique[t]))


# ------------------------------------------------------------------ 09 memory
def step_bytes(widths: Sequence[int], batch: int) -> dict[str, int]:
    """Bytes of one Adam step by role for ``Linear(widths[0], widths[1]) -> ReLU -> ... -> Linear(.., widths[-1])``
    on a fp32 batch of ``batch`` rows with int64 targets and cross-entropy."""
    f32, i64 = 4, 8
    pairs = list(zip(widths, widths[1:], strict=False))
    params = sum(a * b + b for a, b in pairs)  # weight and bias of each Linear
    saved = (batch * widths[0] * f32  # the input: the first Linear's weight gradient needs it
             + sum(batch * h * f32 for h in widths[1:-1])  # each ReLU's output, also the next Linear's input: once
             + batch * widths[-1] * f32  # cross-entropy's log-probabilities
             + batch * i64 + f32)  # the targets, and nll_loss's total weight (a scalar)
    return {"params_bytes": params * f32, "grads_bytes": params * f32,
            "optimizer_state_bytes": 2 * params * f32 + 2 * len(pairs) * f32,  # two moments, a step per tensor
            "saved_activations_bytes": saved}


def quantize_blockwise(x: torch.Tensor, qmap: torch.Tensor, block_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise absmax quantization through a sorted map of 256 values: each block of ``block_size``
    consecutive values is divided by its largest magnitude (one fp32 scale per block), and each value becomes the
    index of the nearest map entry (a tie goes to the larger entry). Returns ``(codes uint8 shaped as x, scales)``."""
    blocks = x.reshape(-1, block_size)
    scales = blocks.abs().amax(dim=1).clamp_min(1e-12)
    scaled = (blocks / scales[:, None]).contiguous()
    n = qmap.numel()
    down = (torch.searchsorted(qmap, scaled, right=True) - 1).clamp(0, n - 1)  # last entry <= the value
    up = (down + 1).clamp(max=n - 1)
    lo, hi = qmap[down], qmap[up]
    codes = torch.where(scaled - lo >= (hi - lo) * 0.5, up, down)
    return codes.to(torch.uint8).reshape(x.shape), scales


def dequantize_blockwise(codes: torch.Tensor, scales: torch.Tensor, qmap: torch.Tensor) -> torch.Tensor:
    """The values back: each code's map entry times its block's scale, shaped as ``codes``."""
    return (qmap[codes.long()].reshape(scales.numel(), -1) * scales[:, None]).reshape(codes.shape)

# ------------------------------------------------------------------ your own loop
def train_bf16(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Iterable,
               loss_fn: Any) -> list[float]:
    """bf16 mixed precision as the recipe writes it: autocast around forward + loss only, backward and the step
    outside it, no GradScaler (bf16 has fp32's exponent range)."""
    losses = []
    model.train()
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------ 00 tour and 06 ablations
def median_step(total_ms: Sequence[float], warmup_steps: int) -> float:
    """The median of the step times after the warm-up steps (an even count: the mean of the two middle ones)."""
    return float(np.median(np.asarray(total_ms[warmup_steps:], dtype=float)))


def interaction(joint: float, a: float, b: float) -> float:
    """A 2-way interaction: the stack's speedup over the product of the singles' (above 1: they compound)."""
    return joint / (a * b)


# ------------------------------------------------------------------ 06 capstone
def capstone_table(models: Mapping[str, torch.nn.Module], test_set: Sequence[torch.Tensor], acc_budget_pt: float,
                   size_budget_mb: float, repeats: int = 20) -> Any:
    """One row per model (the first is the baseline): median latency of a 256-row batch in ms, ``torch.save`` size
    of its state dict in MB, test accuracy in %, and whether it is within both budgets."""
    import io
    import time

    import pandas as pd

    x, y = test_set
    rows = {}
    for arm, model in models.items():
        model.eval()
        with torch.no_grad():
            model(x[:256])  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(x[:256])
                times.append(1e3 * (time.perf_counter() - t0))
            acc = 100 * (model(x).argmax(1) == y).float().mean().item()
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        rows[arm] = {"latency_ms": float(np.median(times)), "size_mb": buf.getbuffer().nbytes / 1e6,
                     "accuracy_pct": acc}
    base = next(iter(rows.values()))["accuracy_pct"]
    for r in rows.values():
        r["within_budget"] = base - r["accuracy_pct"] <= acc_budget_pt and r["size_mb"] <= size_budget_mb
    return pd.DataFrame(rows).T
