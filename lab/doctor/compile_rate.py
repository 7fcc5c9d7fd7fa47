"""What ``torch.compile`` buys and costs on this machine, measured on the spot at the model's activation shape.

Why not a prior: compile's effect is two numbers of opposite sign, and on a small step the wrong one wins. It
*saves*, per fusable op (elementwise, normalisation, reduction, in forward and backward), that op's eager cost (its
kernel reading and writing memory, its dispatch and module call) minus its share of one fused kernel; it *adds*, per
step, a fixed price for calling compiled graphs (Dynamo's guards, AOTAutograd's wrappers, the generated code's
Python). On an MLP whose step takes 1 ms the second is larger than the first, and compile measured 0.7x per step.
Both are read off a chain of cheap elementwise modules at the shape of the model's largest Linear output, eager vs
compiled, forward + backward, at two lengths (1 and :data:`CHAIN_OPS`): the slope is the saving per op, the
intercept the fixed price (:func:`compile_cost`). What the intercept holds besides guards and wrappers: at a large
activation shape, the generated kernel's own pass over memory (here a compiled single ReLU over 2048 x 128 ran ~10x
slower than aten's), which a model pays once per fused kernel, not once per step; so on large activations the
prediction is rough. The compile time itself (caches off) gives a fixed and a per-op part, from which
:mod:`lab.doctor.predict` states the break-even steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lab.doctor.rates import _time_arms

#: Activation modules in the long chain (the short one has 1).
CHAIN_OPS = 32


@dataclass(frozen=True)
class CompileCost:
    """Per fusable op and per step, in ms, with 95 % intervals; compile seconds, fixed and per graph op."""

    op_saving_ms: float
    op_saving_lo: float
    op_saving_hi: float
    call_ms: float  # the fixed extra of a compiled forward + backward over the eager ones
    call_lo: float
    call_hi: float
    compile_s_fixed: float
    compile_s_per_op: float
    source: str


class _Scale(nn.Module):
    """``x * 0.9``: a cheap elementwise op with a backward, like a bias add or a scale in a real model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.9


def _chain(n: int) -> nn.Module:
    """``n`` cheap elementwise modules (ReLU, scale, ...): what a model's fusable ops mostly are. Transcendental
    activations (SiLU, Tanh) were tried first: their compiled chain at a large shape ran slower than eager
    here, which no model's handful of activations shows."""
    return nn.Sequential(*[_Scale() if i % 2 else nn.ReLU() for i in range(n)])


def _fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        fn(x).sum().backward()
        x.grad = None
    return call


@contextlib.contextmanager
def _cold_compile() -> Iterator[None]:
    """Inductor's on-disk caches off, so the compile time measured is a compile, not a cache hit."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


def _medians(samples: dict[str, Sequence[float]], rng: np.random.Generator | None) -> dict[str, float]:
    if rng is None:
        return {k: float(np.median(v)) for k, v in samples.items()}
    return {k: float(np.median(rng.choice(np.asarray(v), size=len(v)))) for k, v in samples.items()}


def fit_chain(samples: dict[str, Sequence[float]], n: int = CHAIN_OPS, n_boot: int = 400,
              seed: int = 0) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """``((saving, lo, hi), (call, lo, hi))`` in ms from interleaved samples of the arms ``e1``, ``eN``,
    ``c1``, ``cN`` (eager / compiled chain of 1 and ``n`` ops): saving per op = (eager slope - compiled slope),
    call = ``c1 - e1 + saving`` (what the compiled call costs beyond the one op it also fused); intervals by a
    bootstrap of the four medians. Pure: tests feed synthetic samples."""
    def point(m: dict[str, float]) -> tuple[float, float]:
        save = ((m["eN"] - m["e1"]) - (m["cN"] - m["c1"])) / (n - 1)
        return save, m["c1"] - m["e1"] + save

    s0, c0 = point(_medians(samples, None))
    rng = np.random.default_rng(seed)
    boots = np.array([point(_medians(samples, rng)) for _ in range(n_boot)])
    c0, boots[:, 1] = max(c0, 0.0), np.maximum(boots[:, 1], 0.0)  # a call is never cheaper than no call: noise
    (slo, clo), (shi, chi) = np.percentile(boots, 2.5, axis=0), np.percentile(boots, 97.5, axis=0)
    return ((float(s0), float(min(slo, s0)), float(max(shi, s0))),
            (float(c0), float(min(clo, c0)), float(max(chi, c0))))


def compile_cost(shape: Sequence[int], *, repeats: int = 25) -> CompileCost:
    """Measure :class:`CompileCost` at activation ``shape`` (rows, width): two chains compiled with the caches
    off (their first call's excess is the compile time), then eager and compiled forward + backward of both,
    interleaved. Seconds (two small compiles); Dynamo's state is reset before and after."""
    import torch._dynamo  # here, not at import: Dynamo costs ~4 s of a cold `import lab` (the dashboard's load)

    x = torch.randn(tuple(shape), requires_grad=True)
    eager = {1: _chain(1), CHAIN_OPS: _chain(CHAIN_OPS)}
    compiled: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}
    first_s: dict[int, float] = {}
    torch._dynamo.reset()
    try:
        with _cold_compile():
            for k, mod in eager.items():
                fn = torch.compile(mod)
                t0 = time.perf_counter()
                _fwd_bwd(fn, x)()
                first_s[k] = time.perf_counter() - t0
                compiled[k] = fn
        arms = {"e1": _fwd_bwd(eager[1], x), "eN": _fwd_bwd(eager[CHAIN_OPS], x),
                "c1": _fwd_bwd(compiled[1], x), "cN": _fwd_bwd(compiled[CHAIN_OPS], x)}
        samples = _time_arms(arms, budget_ms=4.0, repeats=repeats)
    finally:
        torch._dynamo.reset()
    (s, slo, shi), (c, clo, chi) = fit_chain(samples)
    steady = {k: float(np.median(samples["e1" if k == 1 else "eN"])) / 1e3 for k in first_s}
    t1, tn = first_s[1] - steady[1], first_s[CHAIN_OPS] - steady[CHAIN_OPS]
    per_op = max((tn - t1) / (CHAIN_OPS - 1), 0.0)
    return CompileCost(s, slo, shi, c, clo, chi, compile_s_fixed=max(t1 - per_op, 0.0), compile_s_per_op=per_op,
                       source=f"measured here: ReLU/scale chains of 1 and {CHAIN_OPS} at {tuple(shape)}, eager vs "
                              "compiled forward + backward")


def activation_shape(linear: tuple[nn.Linear, torch.Size] | None, batch_rows: int) -> tuple[int, int]:
    """(rows, width) of the model's largest Linear output (its activations), else (batch rows, 64)."""
    if linear is None:
        return (max(batch_rows, 1), 64)
    lin, shape = linear
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return (max(rows, 1), lin.out_features)


__all__ = ["CHAIN_OPS", "CompileCost", "activation_shape", "compile_cost", "fit_chain"]
