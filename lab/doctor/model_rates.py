"""Whole-model micro-benchmarks: rates the doctor measures on the user's model itself, one batch, seconds.

Why not per layer (:mod:`lab.doctor.rates`): some techniques change every op of a step, not one class. Mixed
precision adds casts around each low-precision op. A loader's cost is the GIL and the hand-off it shares with
the training thread. A per-layer rate scaled by a class share missed both by up to 2x (doctor benchmark,
git 7249e84), so these time the model's own forward + backward, with and without the technique.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lab.doctor.rates import Rate, _ratio_rate, _time_arms
from lab.measure.kernel_guards import compile_guard

#: Interleaved rounds, at least, of a whole-model micro-benchmark (one forward + backward per sample).
MODEL_ROUNDS = 8


def model_precision_rates(model: nn.Module, inputs: Sequence[torch.Tensor], target: torch.Tensor,
                          loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], dtypes: Sequence[str], *,
                          device_type: str = "cpu", fp32_modules: tuple[str, ...] = ()) -> dict[str, Rate]:
    """``{dtype: Rate}``: this model's forward + loss + backward on one batch, fp32 vs the lab's own
    :class:`lab.precision.PrecisionPolicy` for ``dtype`` (autocast, fp32 islands, fp16's loss scaling).

    Why the whole forward + backward and not its largest layer: autocast changes every op of a step, not
    only the matmuls. It casts weights and activations around each low-precision op, runs the elementwise
    ops between them in the low dtype, and casts the gradients back. On a dispatch-bound model those extra
    ops cost more than the faster matmul saves. The doctor benchmark (git 7249e84) measured bf16 at 0.50x
    on mlp xs and 0.88x on transformer m, where the largest layer scaled by the matmul share predicted 1.00x
    and 1.10x. The optimizer step is left out: mixed precision keeps fp32 weights and an fp32 update."""
    from lab.precision import PrecisionPolicy

    def arm(pol: PrecisionPolicy | None, m: nn.Module) -> Callable[[], None]:
        def call() -> None:
            m.zero_grad(set_to_none=True)
            if pol is None:
                loss_fn(m(*inputs), target).backward()
                return
            with pol.autocast():
                loss = loss_fn(m(*inputs), target)
            pol.backward(loss)
        return call

    out: dict[str, Rate] = {}
    with contextlib.ExitStack() as stack:
        arms = {"fp32": arm(None, copy.deepcopy(model).train())}
        for d in dtypes:
            pol = PrecisionPolicy(dtype=d, device_type=device_type, fp32_modules=fp32_modules)
            arms[d] = arm(pol, stack.enter_context(pol.applied(copy.deepcopy(model).train())))
        errors: dict[str, str] = {}
        # A whole step is one call per sample: 3 rounds (the time box's floor) gave transformer m (0.8 M
        # parameters, ~250 ms per call) bf16 at 0.86x in one diagnosis and 1.12x in the next; it measured 0.84x.
        times = _time_arms(arms, budget_ms=6.0, repeats=8, errors=errors, min_repeats=MODEL_ROUNDS)
    for d in dtypes:
        if times.get(d) and times.get("fp32"):
            out[d] = _ratio_rate(times["fp32"], times[d], f"this model's forward + backward, fp32 vs {d} autocast, "
                                                          "one batch")
    return out


def model_compile_rate(model: nn.Module, inputs: Sequence[torch.Tensor], target: torch.Tensor,
                       loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]) -> tuple[Rate, float]:
    """``(rate, compile_s)``: this model's forward + loss + backward on one batch, eager vs ``torch.compile`` of
    the model as the lab's compile technique builds it (the forward compiled, Dynamo reset first and after);
    the first compiled call (the compile) is timed apart.

    Why the model itself: the chain micro-benchmark and the crossover map stand in for the model's ops, and
    missed by 2.5x on a Hugging Face BERT built from its config (1.71x predicted, 0.67x measured): what
    compile fuses, breaks on, or wraps in guards is the model's own. Seconds to a minute: the user opts in
    (``--measure compile``). Not the default: one batch under load read 0.82x and 1.06x for the same gallery
    transformer whose training step measured 1.29-1.36x compiled (docs/doctor.md, "Where it is wrong")."""
    import time

    def arm(m: nn.Module) -> Callable[[], None]:
        def call() -> None:
            m.zero_grad(set_to_none=True)
            loss_fn(m(*inputs), target).backward()
        return call

    torch._dynamo.reset()
    try:
        compile_guard(inputs[0].device)  # a native oneDNN bug on AVX2-class CPUs (lab.measure.kernel_guards)
        eager, compiled = copy.deepcopy(model).train(), torch.compile(copy.deepcopy(model).train())
        t0 = time.perf_counter()
        arm(compiled)()
        compile_s = time.perf_counter() - t0
        times = _time_arms({"eager": arm(eager), "compiled": arm(compiled)}, budget_ms=6.0, repeats=8,
                           min_repeats=MODEL_ROUNDS)
    finally:
        torch._dynamo.reset()
    rate = _ratio_rate(times["eager"], times["compiled"], "this model's forward + backward, eager vs "
                       f"torch.compile, one batch (its compile took {compile_s:.0f} s)")
    return rate, compile_s


def _cycle(loader: Any) -> Callable[[], Any]:
    """``next`` over ``loader`` that starts a new pass at the end; ``.close()`` closes the pass in flight, so
    a prefetcher's thread stops when the timing stops mid-pass."""
    state: dict[str, Any] = {"it": iter(loader)}

    def nxt() -> Any:
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    nxt.close = lambda: getattr(state["it"], "close", lambda: None)()  # type: ignore[attr-defined]
    return nxt


def loader_extra_ms(model: nn.Module, inputs: Sequence[torch.Tensor], target: torch.Tensor,
                    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], loader: Any, what: str) -> Rate | None:
    """What a batch from ``loader`` adds to a forward + backward, in ms: ``next(loader)`` then this model's
    forward + backward on one fixed batch, vs the forward + backward alone, interleaved. The interval comes
    from a bootstrap of the per-round differences.

    Why measure it: a thread prefetcher overlaps reading with compute only where the reader releases the
    GIL. The training thread's own Python dispatch waits while the reader thread runs, and each batch costs
    a hand-off between threads. The doctor benchmark (git 7249e84) measured a prefetcher at 0.72-1.01x on
    models whose data wait was 1-9 % of the step, where the overlap model with a 50-microsecond hand-off
    prior predicted 1.00-1.05x. This number holds all three costs for this model's dispatch pattern.
    A ``Rate`` in ms, not a speedup: ``value`` is the extra ms per batch (at least a nanosecond)."""
    m = copy.deepcopy(model).train()

    def work() -> None:
        m.zero_grad(set_to_none=True)
        loss_fn(m(*inputs), target).backward()

    nxt = _cycle(loader)

    def both() -> None:
        nxt()
        work()

    try:
        times = _time_arms({"work": work, "loader": both}, budget_ms=6.0, repeats=10, min_repeats=MODEL_ROUNDS)
    finally:
        nxt.close()  # type: ignore[attr-defined]
    if not times.get("work") or not times.get("loader"):
        return None
    diffs = np.array(times["loader"]) - np.array(times["work"])
    rng = np.random.default_rng(0)
    boots = np.median(rng.choice(diffs, (500, diffs.size)), axis=1)
    floor = 1e-6
    value = max(float(np.median(diffs)), floor)
    lo, hi = (max(float(x), floor) for x in np.percentile(boots, [2.5, 97.5]))
    return Rate(value, min(lo, value), max(hi, value), f"measured here: {what}")


__all__ = ["MODEL_ROUNDS", "loader_extra_ms", "model_compile_rate", "model_precision_rates"]
