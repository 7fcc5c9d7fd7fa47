"""Compute options: the same math executed faster. ``compute.fused_optimizer`` (one fused Adam/SGD kernel
instead of a loop of small ones), ``compute.fast_kernels`` (a workload's faster implementation of the same
model, its ``Workload.fast_kernels`` hook) and ``compute.compile`` (``torch.compile`` of the training forward,
compile time counted in the training time). None of them changes the parameters or the loss, so accuracy
may differ only by float rounding. Taught in ``notebooks/06_ablations.ipynb`` (the speed stack).

How compile is measured (docs/architecture.md section 5, rule 1): compilation runs inside the first step, which the
warm-up steps exclude from every per-step figure; the end-to-end training time keeps it, since a run pays it.
Each compiled run starts from ``torch._dynamo.reset()``: Dynamo caches graphs per code object for the whole
process, so without it the second compile arm of an ablation reused the first one's graphs and trained
seconds faster than the first, a repeat-to-repeat difference that was only the cache (inductor's on-disk
caches still make a later compile of the same graph cheaper, as they would for a user). The compile cost is
recorded apart, ``details["compute"]``: the first step's excess over the median step (``compile_s``), the
graphs compiled and the graph breaks; a recompile after the warm-up shows there as more graphs.

``--profile`` of a compiled run profiles the *compiled* step (:data:`PROFILE_KERNEL_OPTIONS`): before, it
profiled an eager copy and scaled that breakdown to the compiled step's time, which described another program.
On ctr small (fast kernels) the eager profile said matmul 56 %, while in the compiled backward two generated
kernels (a zero fill plus an atomic-add scatter, Inductor's lowering of ``index_select``'s gradient) took
5.9 ms of the 14 ms step, where eager's ATen ``index_add_`` took 1.3 ms: why compile read 0.7x there.
"""

from __future__ import annotations

import copy
import re
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext
from lab.loop import FitStats, StepHook
from lab.measure.kernel_guards import compile_guard
from lab.registry import FAMILIES
from lab.result import RunResult
from lab.technique import PROFILE_PHASE, FitPlan, NotPortable, Option, Portable, Technique
from lab.timed import TRAIN, Bench, NotTimed, TimedArm
from lab.workloads import get_workload, list_workloads


class Compute(Technique):
    """Fused optimizer, fast kernels and ``torch.compile``: the same math, executed faster."""

    name = "compute"

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """A fused optimizer for the arm's step; ``torch.compile`` of its forward (training) or of a copy of its
        model (inference; dynamo's cache is reset by the map once per rung, see :func:`lab.crossover.build_arms`).
        Fast kernels are a workload's other implementation, not a change of the rung's model: not timed here."""
        o = option.overrides
        if o.get("compute.fast_kernels"):
            raise NotTimed("fast kernels are the workload's other implementation; the map times each rung's model")
        if o.get("compute.fused_optimizer"):
            if arm.axis != TRAIN:
                raise NotTimed(f"{option.name} changes the optimizer step: training only")
            arm.fused = True
        if o.get("compute.compile"):
            compile_guard(bench.device)  # a native oneDNN bug on AVX2 CPUs (lab.measure.kernel_guards)
            if arm.axis == TRAIN:
                arm.forward = torch.compile(arm.model)
            else:
                arm.derive(torch.compile(copy.deepcopy(arm.model)), "compiled")

    def check(self, cfg: RunConfig) -> None:
        """Refuse what cannot run before any work: fast kernels for a workload without them; compile with DDP."""
        if cfg.compute.fast_kernels and get_workload(cfg.workload).fast_kernels is None:
            raise ValueError(f"compute.fast_kernels=True is invalid for workload {cfg.workload!r}: it has no "
                             "faster implementation (workloads with one: "
                             + ", ".join(n for n in list_workloads() if get_workload(n).fast_kernels) + ")")
        if cfg.compute.compile and cfg.ddp.enabled:
            raise ValueError("compute.compile=True is invalid with ddp: compiling the DDP-wrapped model is not "
                             "wired up in this lab yet; compare compile on a single process")

    def before_training(self, ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
        """Switch to the workload's fast kernels (same parameters, same math)."""
        if ctx.cfg.compute.fast_kernels:
            model = ctx.workload.fast_kernels(model)
        return model, []

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """Fused optimizer for every fit; ``torch.compile`` for the main training phase only (fine-tunes after
        pruning or QAT change the module structure and run eagerly). Compilation happens in the first step,
        inside the timing. ``--profile``'s steps of a compiled run are compiled too, with the generated kernels
        named in the trace (:data:`PROFILE_KERNEL_OPTIONS`), so the breakdown is the compiled step's."""
        plan.fused_optimizer = ctx.cfg.compute.fused_optimizer
        if ctx.cfg.compute.compile and plan.phase == PROFILE_PHASE:
            import torch._dynamo  # noqa: F401 - binds torch; here, not at import (a cold `import lab` stays fast)

            # no dynamo reset: the timed run is over, and a reset would drop other compiled graphs of this
            # process (a frozen int8 model's) for nothing; the profiled copy is a new module, compiled anew
            plan.forward = torch.compile(model, options=dict(PROFILE_KERNEL_OPTIONS))
            return
        if ctx.cfg.compute.compile and plan.phase == "train":
            import torch._dynamo  # here, not at import: it costs ~4 s of a cold `import lab` (dashboard load)

            torch._dynamo.reset()  # this run pays its own compile (module docstring)
            before = compile_counters()
            guard = compile_guard(ctx.device)  # a native oneDNN bug on AVX2-class CPUs (lab.measure.kernel_guards)
            plan.forward = torch.compile(model)

            dropout = dropout_modules(model)

            def record(stats: FitStats) -> None:
                ctx.result.details["compute"] = compile_record(stats.step_times_ms["total"], before,
                                                               compile_counters())
                if guard:
                    ctx.result.details["compute"]["guard"] = guard
                if dropout:
                    ctx.result.why.append(RNG_STREAM_WHY.format(n=dropout))

            plan.finished.append(record)

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """``fused=True`` on the optimizer and ``torch.compile`` of the main training's forward, written out (the
        recipe, :mod:`lab.portable`). Fast kernels are refused: a workload's own model code, not a change of the
        loop."""
        cc = cfg.compute
        if cc.fast_kernels:
            raise NotPortable("compute.fast_kernels is the workload's own faster model code (ctr: index_select "
                              "lookups, lab/workloads/ctr/model.py), not a change of the training loop: a model of "
                              "your own brings its own")
        if not cc.enabled:
            return None
        optimizer = "Adam" if cfg.optimizer == "adam" else "SGD"
        said = [f"fused {optimizer}: one kernel per dtype instead of a loop of small ones"] if cc.fused_optimizer \
            else []
        said += ["torch.compile of the main training's forward (compiled in its first step)"] if cc.compile else []
        return Portable(comment="; ".join(said),
                        optimizer_kwargs=(("fused", "True"),) if cc.fused_optimizer else (),
                        fit_setup=("if phase == \"train\":  # fine-tunes after pruning / QAT run eagerly: their layers "
                                   "changed", "    forward = torch.compile(model)") if cc.compile else ())

    def report(self, result: RunResult) -> dict[str, Any]:
        """Which compute options ran."""
        cfg = (result.config or {}).get("compute", {})
        return {k: bool(cfg.get(k, False)) for k in ("fused_optimizer", "fast_kernels", "compile")}


#: Inductor options for ``--profile``'s compiled steps: each generated C++ kernel records a profiler range named
#: after the ops it fused (``graph_0_cpp_fused_..._index_add_new_zeros_...``), which :mod:`lab.measure.profile`
#: classifies like the ops themselves. Without it a compiled graph's kernels are one opaque ``## Call
#: CompiledFxGraph`` range. (CUDA's Triton kernels are profiler events of their own either way.)
PROFILE_KERNEL_OPTIONS: dict[str, Any] = {"cpp.enable_kernel_profile": True}


#: A compiled run's ``--profile`` says why when Inductor's generated gradient scatters take at least this share of
#: the profiled step (:func:`compiled_scatter_why`).
SCATTER_WHY_SHARE = 0.2
_SCATTER_KERNEL = re.compile(r"cpp_fused.*(index_add|scatter|index_put)")


def compiled_scatter_why(top_ops: Sequence[tuple[str, str, float]], profiled_step_ms: float | None) -> str | None:
    """The reason a compiled training step can be slower than eager, read from its profile (``Breakdown.top_ops``:
    op name, class, ms per profiled step): Inductor lowers a gather's gradient (``index_select`` / embedding ->
    ``index_add``) on CPU to a generated zero fill plus an atomic-add scatter, several times slower than ATen's
    ``index_add_`` (ctr small: 5.9 ms against 1.3 ms per step). ``None`` below :data:`SCATTER_WHY_SHARE`. One
    sentence without ``;``: an ablation's row joins its runs' tags with ``;``."""
    if not profiled_step_ms or profiled_step_ms <= 0:
        return None
    ms = sum(t for op, _, t in top_ops if _SCATTER_KERNEL.search(op))
    share = ms / profiled_step_ms
    if share < SCATTER_WHY_SHARE:
        return None
    return (f"compiled step: Inductor's generated gradient scatters (index_add of a gather's gradient, atomic adds on "
            f"CPU) take {ms:.2f} ms, {share:.0%} of the profiled step, where eager's ATen index_add_ is several "
            "times faster (ctr small: 1.3 ms against 5.9 ms): compile can lose on embedding-heavy models")


#: Said on a compiled run of a model with active dropout: Inductor draws its own dropout masks, so the run
#: trains on another random stream than eager at the same seed, and its accuracy delta is that stream's as
#: much as compile's (HF BERT with dropout 0.1, 8 seeds: a 6.4 pt loss, CI [-24, 27], seed noise 22.6 pt).
RNG_STREAM_WHY = ("compile draws its own dropout masks ({n} active dropout modules): another random stream "
                  "than eager at the same seed, so its accuracy delta is real only against seed noise over "
                  ">= 3 seeds (--seeds)")


def dropout_modules(model: nn.Module) -> int:
    """How many dropout modules with p > 0 ``model`` has (the ones a compiled forward re-draws)."""
    return sum(1 for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)


def compile_counters() -> dict[str, int]:
    """Dynamo's process-wide counts of graphs compiled and graph breaks (deltas tell one run's)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def compile_record(step_ms: list[float], before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """The compile cost of one fit: ``compile_s``, the first step's time beyond the median step (the
    compilation itself; the per-step figures exclude it as warm-up), and the graphs / graph breaks it made."""
    steady = statistics.median(step_ms[1:]) if len(step_ms) > 1 else 0.0
    return {"compile_s": max(step_ms[0] - steady, 0.0) / 1e3 if step_ms else 0.0,
            "graphs": after["graphs"] - before["graphs"],
            "graph_breaks": after["graph_breaks"] - before["graph_breaks"]}


TECHNIQUE = FAMILIES.register(Compute.name, Compute(), overwrite=True)  # overwrite: importlib.reload stays idempotent
from lab.compute import options  # noqa: E402, F401 - the family's option strings, registered with it

__all__ = ["PROFILE_KERNEL_OPTIONS", "RNG_STREAM_WHY", "SCATTER_WHY_SHARE", "TECHNIQUE", "Compute", "compile_counters",
           "compile_record", "compiled_scatter_why", "dropout_modules"]
