"""Where a step's time goes, by op class: a ``torch.profiler`` capture reduced to a breakdown the doctor reads.

Why op classes: a technique acts on a kind of work, not on a model. bf16 speeds up matmuls (where the ISA
has the kernels), a fused optimizer the optimizer's loop of small kernels, a prefetcher the data wait,
``torch.compile`` the time *between* ops. So a step's time split into matmul / conv, embedding, recurrent,
normalisation, elementwise, reductions, optimizer, data wait, communication and framework overhead is
what a prediction of "which technique pays here" needs (:mod:`lab.doctor`).

How it avoids double counting: each event contributes its *self* CPU time (its time minus its children's),
so ``aten::linear -> aten::addmm`` is counted once, at the leaf that did the work. An event below an
annotated range (``lab::data_wait`` around each ``next(loader)``, torch's own ``Optimizer.step#...``)
belongs to that range's class whatever its name. Framework overhead is the step's wall time (from the
loop's own timer, not the profiler) that no op covers: Python, dispatch between ops, the profiler's own
cost. Ops shorter than :data:`TINY_OP_US` are reported as a share too: they are dispatch-bound, so a
faster kernel for them buys nothing. Taught in ``notebooks/08_doctor.ipynb``.

Data-parallel steps (DDP; :func:`lab.profiling.capture_training_profile` profiles every rank and keeps rank 0's): the
communication class is the *exposed* part only, so the classes still sum to the step. DDP issues each
bucket's all-reduce from backward (``c10d::allreduce_`` inside ``AccumulateGrad``) and gloo runs it on a
background thread (``gloo:all_reduce``, an async event) while backward goes on. What the training thread
spends in comm ops (issuing the all-reduce, the reducer's bucket copies, ``copy_bucket_to_grad``) is comm;
so is the in-flight time during which the training thread ran no op at all (it was waiting for the last
buckets). The rest of the in-flight time overlaps compute: it costs nothing the step could save, is not a
class (it would count the same wall time twice) and is reported beside them as ``comm_inflight_ms``.
NCCL on CUDA (its ``nccl:`` ranges and kernels) goes through the same rules; it is untested here (no GPU).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: The classes of a breakdown, in display order. ``other`` holds ops no rule names (kept, never dropped).
OP_CLASSES = ("matmul", "embedding", "recurrent", "norm", "elementwise", "reduction", "optimizer", "data_wait",
              "comm", "overhead", "other")
#: An op whose inclusive time is below this is "tiny": its cost is dispatch, not arithmetic.
TINY_OP_US = 5.0
#: The range put around every ``next(loader)`` of a profiled fit (:class:`AnnotatedLoader`).
DATA_WAIT_RANGE = "lab::data_wait"

_RULES: tuple[tuple[str, str], ...] = (
    # (class, regex on the normalised op name); first match wins
    ("comm", r"c10d|allreduce|all_reduce|allgather|all_gather|^_?broadcast_?$|broadcast_coalesced|gloo|nccl|"
             r"record_param_comms|"
             r"reduce_scatter|reducer|ddp\.reducer|copy_bucket_to_grad"),
    ("optimizer", r"^_foreach_|^_fused_(adam|adamw|sgd)|^adam|^sgd|lerp"),
    ("recurrent", r"lstm|gru|rnn_(tanh|relu)|mkldnn_rnn|_cudnn_rnn"),
    ("embedding", r"embedding|index_select|index_add|index_put|index_copy|^index$|gather|scatter|take"),
    ("norm", r"batch_norm|layer_norm|group_norm|instance_norm|rms_norm|_norm_impl"),
    ("matmul", r"addmm|^mm$|^bmm|matmul|linear|baddbmm|addbmm|^dot$|^mv$|addmv|conv|einsum|"
               r"scaled_dot_product|_mkldnn_linear|qlinear|quantized::"),
    ("reduction", r"^sum$|^mean|^max|^min|amax|amin|argmax|argmin|^norm$|^var|^std|softmax|nll_loss|"
                  r"cross_entropy|binary_cross_entropy|mse_loss|cumsum|^prod|logsumexp|^all$|^any$|topk|sort"),
    ("overhead", r"^view|reshape|^t$|transpose|permute|expand|as_strided|unsqueeze|squeeze|^select|^slice|"
                 r"detach|^empty|^alias|unbind|^split|^chunk|^narrow|unfold|flatten|^lift|_reshape_alias|"
                 r"resolve_|set_|result_type|^item$|_local_scalar_dense|is_nonzero"),
    ("elementwise", r"."),  # any remaining aten op: add, mul, relu, gelu, copy_, to, cat, fill_, where, ...
)
_COMPILED = tuple((cls, re.compile(rx)) for cls, rx in _RULES)
#: torch.compile's own ranges around a compiled graph. Its generated kernels, named after the ops they fused
#: when Inductor records them (``graph_0_cpp_fused_..._index_add_...``; :mod:`lab.compute`), are classified by
#: those names like any op; these wrappers' self time is framework overhead.
COMPILE_WRAPPERS = ("Torch-Compiled Region", "TorchDynamo Cache Lookup", "CompiledFunction")


def normalise_op(name: str) -> str:
    """``aten::addmm`` -> ``addmm``; ``autograd::engine::evaluate_function: AddmmBackward0`` -> ``addmm``;
    ``EmbeddingBagBackward0`` -> ``embedding_bag``: backward nodes carry the forward op's name."""
    n = name.split(": ", 1)[-1] if name.startswith("autograd::engine::evaluate_function") else name
    n = n.split("::", 1)[-1] if "::" in n and not n.startswith("quantized::") else n
    n = re.sub(r"Backward\d*$", "", n)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() if n[:1].isupper() else n  # NativeBatchNorm -> native_batch_norm


def classify_op(name: str) -> str:
    """The op class of a profiler event name (one of :data:`OP_CLASSES` but ``data_wait`` / ``overhead``
    from time no op covers). Optimizer ranges and ``AccumulateGrad`` are recognised by name too."""
    if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
        return "optimizer"
    if "AccumulateGrad" in name:
        return "elementwise"  # adding a grad into .grad
    if name.startswith("ProfilerStep") or name.startswith("## ") or name == DATA_WAIT_RANGE:
        return "overhead"
    if name.startswith("DistributedDataParallel.forward"):
        return "overhead"  # its self time is the Python of the wrapped forward, as in an unwrapped step
    if name.startswith(COMPILE_WRAPPERS) or "CompiledFunction" in name:  # "in": autograd's node names prefix it
        return "overhead"  # torch.compile's guards and autograd wrappers; their generated kernels are children
    n = normalise_op(name)
    if n.startswith("quantized::"):
        return "matmul"
    for cls, rx in _COMPILED:
        if rx.search(n):
            return cls
    return "other"


@dataclass(frozen=True)
class OpEvent:
    """What the breakdown needs of one profiler event (tests build these by hand)."""

    name: str
    self_us: float
    total_us: float
    ancestors: tuple[str, ...] = ()  # names of enclosing events, innermost first
    top_level_op: bool = False  # an op the user's code called (its parent is no op): counted for "tiny"
    start_us: float = 0.0  # profiler clock; only the comm overlap needs it
    background: bool = False  # a collective in flight on a comm thread (gloo's async events): not a class


def events_from_profiler(events: Iterable[Any]) -> list[OpEvent]:
    """:class:`OpEvent` records from a ``torch.profiler`` EventList (CPU-side events; CUDA kernels are
    accounted through the CPU op that launched them)."""
    out = []
    for ev in events:
        start = float(getattr(getattr(ev, "time_range", None), "start", 0.0) or 0.0)
        if getattr(ev, "is_async", False):
            if classify_op(ev.name) == "comm":  # gloo:all_reduce on its worker thread: in flight, overlapping
                out.append(OpEvent(ev.name, 0.0, float(ev.cpu_time_total), (), False, start, True))
            continue
        chain, parent = [], ev.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        is_op = "::" in ev.name and not ev.name.startswith(("lab::", "ProfilerStep"))
        top = is_op and not any("::" in c and not c.startswith(("lab::", "Optimizer")) for c in chain[:1])
        out.append(OpEvent(ev.name, float(ev.self_cpu_time_total), float(ev.cpu_time_total), tuple(chain), top,
                           start))
    return out


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def comm_overlap_us(events: Sequence[OpEvent]) -> tuple[float, float]:
    """``(in_flight_us, exposed_us)``: the union of background collectives' in-flight intervals, and the part of
    it during which the training threads ran no op (a wait the step pays; the rest overlapped compute)."""
    flight = _union((e.start_us, e.start_us + e.total_us) for e in events if e.background)
    if not flight:
        return 0.0, 0.0
    busy = _union((e.start_us, e.start_us + e.total_us) for e in events
                  if not e.background and not e.name.startswith("ProfilerStep")
                  and all(a.startswith("ProfilerStep") for a in e.ancestors))
    covered, j = 0.0, 0
    for a, b in flight:
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < b:
            covered += min(b, busy[k][1]) - max(a, busy[k][0])
            k += 1
    total = sum(b - a for a, b in flight)
    return total, max(total - covered, 0.0)


#: A composite op of these classes owns what runs inside it (``aten::lstm``'s matmuls are recurrent work,
#: the ``sort`` inside ``EmbeddingBagBackward0`` is embedding work): the technique acts on the composite.
_OWNING = ("embedding", "recurrent", "norm", "comm")  # comm: the aten ops inside DDP's bucket copies


def _owner(ev: OpEvent) -> str:
    """The class an event's self time goes to: an enclosing data-wait or optimizer range wins, then an
    enclosing embedding / recurrent / normalisation op (forward or backward node), then its own name."""
    for name in ev.ancestors:
        if name == DATA_WAIT_RANGE:
            return "data_wait"
        if name.startswith(("Optimizer.step", "Optimizer.zero_grad")):
            return "optimizer"
    if ev.name == DATA_WAIT_RANGE:
        return "data_wait"
    for name in ev.ancestors:
        cls = classify_op(name)
        if cls in _OWNING:
            return cls
    return classify_op(ev.name)


@dataclass
class Breakdown:
    """Milliseconds per step by op class (``ms``) summing to ``step_ms``; ``tiny_ms`` is the time of ops
    shorter than :data:`TINY_OP_US` per class; ``top_ops`` the costliest op names with their ms per step."""

    step_ms: float
    ms: dict[str, float]
    tiny_ms: dict[str, float] = field(default_factory=dict)
    conv_ms: float = 0.0  # the part of ``matmul`` spent in convolutions (their rates differ from Linear's)
    ops_per_step: float = 0.0
    top_ops: list[tuple[str, str, float]] = field(default_factory=list)  # (op, class, ms per step)
    profiled_step_ms: float | None = None  # the wall time of a step while the profiler ran
    note: str = ""
    comm_inflight_ms: float = 0.0  # collectives in flight on comm threads per step, overlapped part included
    op_counts: dict[str, float] = field(default_factory=dict)  # ops the model's code called, per step, by class

    def share(self, cls: str) -> float:
        return self.ms.get(cls, 0.0) / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def tiny_share(self) -> float:
        return sum(self.tiny_ms.values()) / self.step_ms if self.step_ms > 0 else 0.0

    def shares(self) -> dict[str, float]:
        return {c: self.share(c) for c in OP_CLASSES}

    def to_dict(self) -> dict[str, Any]:
        return {"step_ms": self.step_ms, "ms": dict(self.ms), "tiny_ms": dict(self.tiny_ms),
                "shares": self.shares(), "tiny_share": self.tiny_share, "conv_ms": self.conv_ms,
                "ops_per_step": self.ops_per_step,
                "top_ops": [list(t) for t in self.top_ops], "profiled_step_ms": self.profiled_step_ms,
                "note": self.note, "comm_inflight_ms": self.comm_inflight_ms, "op_counts": dict(self.op_counts)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Breakdown:
        return cls(step_ms=float(d["step_ms"]), ms={k: float(v) for k, v in d["ms"].items()},
                   tiny_ms={k: float(v) for k, v in d.get("tiny_ms", {}).items()},
                   conv_ms=float(d.get("conv_ms", 0.0)), ops_per_step=float(d.get("ops_per_step", 0.0)),
                   top_ops=[(str(a), str(b), float(c)) for a, b, c in d.get("top_ops", [])],
                   profiled_step_ms=d.get("profiled_step_ms"), note=str(d.get("note", "")),
                   comm_inflight_ms=float(d.get("comm_inflight_ms", 0.0)),
                   op_counts={k: float(v) for k, v in d.get("op_counts", {}).items()})


def breakdown(events: Sequence[OpEvent], *, n_steps: int, step_ms: float, data_wait_ms: float | None = None,
              profiled_step_ms: float | None = None, tiny_us: float = TINY_OP_US) -> Breakdown:
    """Reduce ``n_steps`` profiled steps' events to ms per step by class, summing exactly to ``step_ms``.

    ``step_ms`` is the reference step (the loop's median of *unprofiled* steps, or the profiled one);
    ``data_wait_ms``, when given, is the loop's own data-wait figure and replaces the profiler's. Overhead is
    the time no op covers: ``profiled_step_ms`` (the wall time of a step under the profiler) minus the ops,
    or ``step_ms`` minus the ops without it. The compute classes (ops and overhead) are then scaled to
    ``step_ms`` minus the data wait, so the profiler's own cost is spread proportionally and the classes
    sum to ``step_ms`` exactly; ``note`` says by how much they were scaled. Background collectives
    (:attr:`OpEvent.background`) add only their exposed wait to ``comm`` (:func:`comm_overlap_us`)."""
    if n_steps < 1:
        raise ValueError(f"n_steps={n_steps} is invalid: allowed: >= 1")
    ms = dict.fromkeys(OP_CLASSES, 0.0)
    tiny = dict.fromkeys(OP_CLASSES, 0.0)
    per_op: dict[str, list[Any]] = {}
    counts: dict[str, float] = {}
    n_ops, conv = 0, 0.0
    inflight_us, exposed_us = comm_overlap_us(events)
    ms["comm"] += exposed_us / 1e3 / n_steps  # the training thread idle, waiting for the last buckets
    for ev in events:
        if ev.name.startswith("ProfilerStep") or ev.background:
            continue  # its self time is Python between ops: overhead, computed from the wall time below
        cls = _owner(ev)
        if cls == "overhead" and ev.name == DATA_WAIT_RANGE:
            cls = "data_wait"
        ms[cls] += ev.self_us / 1e3 / n_steps
        if cls == "matmul" and "conv" in ev.name.lower():
            conv += ev.self_us / 1e3 / n_steps
        slot = per_op.setdefault(normalise_op(ev.name), [cls, 0.0])
        slot[1] += ev.self_us / 1e3 / n_steps
        if ev.top_level_op:
            n_ops += 1
            if "AccumulateGrad" not in ev.name:  # autograd's own grad accumulation, outside the model's graph
                counts[cls] = counts.get(cls, 0.0) + 1.0 / n_steps
            if ev.total_us < tiny_us and cls not in ("data_wait",):
                tiny[cls] += ev.total_us / 1e3 / n_steps
    wait_profiled = ms["data_wait"]
    if data_wait_ms is not None:
        ms["data_wait"] = float(data_wait_ms)
    note = ""
    op_ms = sum(v for k, v in ms.items() if k not in ("overhead", "data_wait"))
    room = max(step_ms - ms["data_wait"], 0.0)
    if profiled_step_ms is not None and profiled_step_ms > 0:
        # Overhead as it was under the profiler, then every compute class scaled to the unprofiled step:
        # the profiler's own cost is spread over the classes instead of being charged to one of them.
        ms["overhead"] = max(profiled_step_ms - wait_profiled - op_ms, 0.0)
    else:
        ms["overhead"] = max(room - op_ms, 0.0)
    if op_ms + ms["overhead"] == 0.0:  # nothing but data wait under the profiler: the rest is unexplained
        ms["overhead"] = room
    measured = op_ms + ms["overhead"]
    scale = room / measured if measured > 0 else 0.0
    if abs(scale - 1) > 1e-9:
        for k in OP_CLASSES:
            if k != "data_wait":
                ms[k] *= scale
                tiny[k] *= scale
        conv *= scale
        note = f"profiled compute {measured:.3g} ms per step scaled by {scale:.2f} to the unprofiled {room:.3g} ms"
    if room == 0.0 and op_ms > 0:
        note = "the step is all data wait"
    top = sorted(((op, c, t) for op, (c, t) in per_op.items()), key=lambda x: -x[2])[:8]
    return Breakdown(step_ms=float(step_ms), ms=ms, tiny_ms={k: v for k, v in tiny.items() if v > 0},
                     conv_ms=conv, ops_per_step=n_ops / n_steps, top_ops=top, profiled_step_ms=profiled_step_ms,
                     note=note, comm_inflight_ms=inflight_us / 1e3 / n_steps, op_counts=counts)


# --------------------------------------------------------------------------------------------- capture

class AnnotatedLoader:
    """A loader whose every ``next`` runs inside a ``lab::data_wait`` profiler range, so the ops a loader
    runs in the training thread (slicing, decoding, a copy) are counted as data wait, not as compute."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.inner)
        while True:
            with torch.profiler.record_function(DATA_WAIT_RANGE):
                batch = next(it, None)
            if batch is None:
                return
            yield batch


class StepCapture:
    """A ``torch.profiler`` session over a fit: skip ``warmup`` steps, record ``active`` ones; ``hook`` is the
    fit's step hook (``prof.step()`` after each optimizer step). ``events`` and the Chrome trace (``trace_path``,
    viewable in https://ui.perfetto.dev) are there after the active steps."""

    def __init__(self, *, warmup: int, active: int, trace_path: Path | None = None, cuda: bool = False) -> None:
        self.warmup, self.active, self.trace_path = warmup, active, trace_path
        self.events: list[OpEvent] = []
        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=acts, schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._ready, record_shapes=False)

    def _ready(self, prof: torch.profiler.profile) -> None:
        self.events = events_from_profiler(prof.events())
        if self.trace_path is not None:
            self.trace_path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(self.trace_path))

    def hook(self, step: int, model: Any) -> None:
        self._prof.step()

    @contextlib.contextmanager
    def running(self) -> Iterator[StepCapture]:
        with self._prof:
            yield self


def profile_calls(fn: Callable[[], Any], *, calls: int, warmup: int = 2) -> tuple[list[OpEvent], float]:
    """Events of ``calls`` calls of ``fn`` after ``warmup`` untimed ones (an inference breakdown), and the
    wall ms per call under the profiler."""
    for _ in range(warmup):
        fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    return events_from_profiler(prof.events()), wall_ms


__all__ = ["AnnotatedLoader", "Breakdown", "COMPILE_WRAPPERS", "DATA_WAIT_RANGE", "OP_CLASSES", "OpEvent",
           "StepCapture", "TINY_OP_US", "breakdown", "classify_op", "comm_overlap_us", "events_from_profiler",
           "normalise_op", "profile_calls"]
