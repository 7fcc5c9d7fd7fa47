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
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

import torch
from _common import emit, figure, parse_args, ratio_figure, skipped

from lab.ablation.memory_budget import BudgetNotMet, largest_fitting
from lab.crossover.arms import apply_options
from lab.crossover.measure import make_bench
from lab.loop import make_optimizer, train_step
from lab.measure import count_params, error_text, interleaved_ms
from lab.measure.contention import ContentionMeter
from lab.measure.memory import (
    MIB,
    SavedTensorBytes,
    StepPeak,
    optimizer_state_bytes,
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


if __name__ == "__main__":
    main()
