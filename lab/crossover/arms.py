"""The arms of the crossover map: which options it times on which axis, and the arms they make on one rung.

Why steps and not runs: a crossover map needs dozens of (workload x rung x option) speed ratios, and a speed ratio
of the *step* is what an option changes; full training runs would cost hours and add data, evaluation and
compile time that the step ratio does not need (the ablation measures those). So every arm is one training
step (:func:`lab.loop.train_step`, the step a run takes) on a fixed batch, or one inference call, and each
option is applied to it by its own family (:meth:`lab.technique.Technique.timed`: the precision policy, a fused
optimizer, ``torch.compile``, channels removed, an int8 model, DataLoader workers), a ``+`` stack by each of its
families in turn. What stays here is the map's own: the options it times and on which axes, and the two
decisions read from other arms (``amp_auto`` from the bf16 / fp16 samples, ``int8_auto`` from the run's own
``--quant-flow auto`` probe).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from lab.config import QuantConfig
from lab.precision import capability
from lab.quant.flow_auto import probe_flows
from lab.quant.timed import int8_built
from lab.registry import FAMILIES, FAMILY_ORDER, OPTIONS
from lab.technique import Option
from lab.timed import INFER, TRAIN, Arm, Bench, NotTimed, TimedArm, timed

AXES = (TRAIN, INFER)

#: Every option the map times (names of :data:`lab.registry.OPTIONS`, or a ``+``-joined stack of them: one name
#: for one technique in recipes, arms, the map and the doctor), with the axes the map times it on. An option's
#: own axes say what it can change in a *run* (pruning and int8 happen after training); the map times the
#: model each produces, so channel pruning is also timed on the training step (what training a thinner model
#: costs) and a precision's inference in that precision. ``int8_static_legacy`` is the torch.ao flow (eager int8
#: kernels), ``int8_static`` torchao PT2E compiled by Inductor (its ratio against the eager fp32 call includes
#: what compiling alone gives: ``compile`` is that arm), ``int8_auto`` whichever of the two the run's
#: ``--quant-flow auto`` probe (:func:`lab.quant.flow_auto.probe_flows`) takes on this model and batch.
#: ``prune_channels50+int8_static`` stacks the two that shrink inference: channels 50 % removed, then PT2E static
#: int8 of the pruned model (the top-rung stack, for deployment; the map trains nothing, so no accuracy here:
#: ``benchmarks/stacked.py --part top`` measures that on a trained model).
TECHNIQUES: dict[str, tuple[str, ...]] = {
    "bf16": (TRAIN, INFER), "fp16": (TRAIN, INFER), "amp_auto": (TRAIN,), "int8_eager": (INFER,),
    "int8_static_legacy": (INFER,), "int8_static": (INFER,), "int8_auto": (INFER,), "prune_channels50": (TRAIN, INFER),
    "prune_channels50+int8_static": (INFER,), "compile": (TRAIN, INFER), "fused_optim": (TRAIN,), "workers1": (TRAIN,),
}
#: ``int8_auto``'s candidates: the flow -> the map's arm that times its int8 model.
INT8_FLOW_ARMS = {"legacy": "int8_static_legacy", "pt2e": "int8_static"}
#: The map's own decisions: no arm of their own, read from other arms' samples (:mod:`lab.crossover.measure`).
DECIDED = ("amp_auto", "int8_auto")


def parts(name: str) -> list[Option]:
    """The options of a map name (one option, or a ``+`` stack), in the order a run applies their families."""
    options = [OPTIONS.get(p) for p in name.split("+")]
    return sorted(options, key=lambda o: FAMILY_ORDER.index(o.family))


def apply_options(bench: Bench, arm: TimedArm, name: str) -> TimedArm:
    """``arm`` with every option of ``name`` applied by its family, in family order; ``NotTimed`` (or the
    family's own error) where one cannot change it. The arm's notes become the row's note."""
    for option in parts(name):
        FAMILIES.get(option.family).timed(option, bench, arm)
    return arm


def _int8_auto(bench: Bench) -> dict[str, str]:
    """Run the lab's own ``--quant-flow auto`` probe (static int8) on the rung's model and batch; the
    candidates it built become the arms that time them: ``{arm: flow}`` of every built candidate. Its record
    (chosen flow, paired ratio, why) is kept in ``bench.choices["int8_auto"]``."""
    _, info = probe_flows(bench.model, QuantConfig(method="static", flow="auto"),
                          lambda qc: int8_built(bench, qc.method, qc.flow), bench.inputs, repeats=5)
    bench.choices["int8_auto"] = info["auto"]
    return {arm: flow for flow, arm in INT8_FLOW_ARMS.items() if ("int8", "static", flow) in bench.built}


def _decided(bench: Bench, tech: str, axis: str, arms: dict[str, Arm], base: TimedArm,
             techniques: Sequence[str], requested: Sequence[str]) -> None:
    """The arms a decision needs: ``int8_auto`` times both flows' int8 models (its row is the chosen one's
    samples); ``amp_auto`` needs none of its own, but refuses to be decided from fp32 alone where a low precision
    runs natively and was not asked for."""
    if tech == "int8_auto":
        for arm, flow in _int8_auto(bench).items():
            if arm not in arms:
                arms[arm] = timed(bench, base.but(model=int8_built(bench, "static", flow)[0]))
        return
    dev = bench.device
    native = [d for d in ("bf16", "fp16") if capability(d, "cpu" if dev.type == "cpu" else dev).native]
    if native and not {"bf16", "fp16"} & {*techniques, *requested}:
        raise ValueError(f"amp_auto is decided from the bf16 / fp16 arms and {' / '.join(native)} runs natively "
                         "here; ask for them too")
    # Neither native: auto keeps fp32 here whatever it times, so it is decided from fp32 alone.


def build_arms(bench: Bench, techniques: list[str], axis: str,
               requested: Sequence[str] = ()) -> tuple[dict[str, Arm], dict[str, str]]:
    """``({arm: callable}, {technique: why skipped})`` for ``axis``: a ``base`` arm (the fp32 eager step or
    call) plus one arm per technique that applies and builds; a technique whose family feeds the step another way
    (DataLoader workers) brings its own baseline as ``<technique>_base``; ``amp_auto`` none (it is decided from the
    bf16 / fp16 / base samples afterwards; ``requested``: every technique asked for, so ``amp_auto`` whose
    low-precision candidates the caller skipped is decided from fp32 alone). A technique that fails to build is
    skipped with its reason."""
    arms: dict[str, Arm] = {}
    skipped: dict[str, str] = {}
    if any(o.overrides.get("compute.compile") for t in techniques for o in parts(t)):
        # Every rung's model runs the same forward code, and dynamo keeps at most 8 compiled versions of a code
        # object: without a reset the 9th compile of a ladder silently runs eager and times nothing compiled.
        torch._dynamo.reset()
    base = TimedArm(axis, bench.model if axis == TRAIN else copy.deepcopy(bench.model).eval())
    arms["base"] = timed(bench, base)
    for tech in techniques:
        if axis not in TECHNIQUES[tech]:
            skipped[tech] = (f"{tech} cannot change the {axis.replace('_', ' ')} "
                             f"(its axes: {', '.join(TECHNIQUES[tech])})")
            continue
        try:
            if tech in DECIDED:
                _decided(bench, tech, axis, arms, base, techniques, requested)
                continue
            arm = apply_options(bench, base.but(notes=[]), tech)
            if arm.notes:
                bench.notes[tech] = "; then ".join(arm.notes)
            if arm.own_baseline is not None:
                arms[f"{tech}_base"] = timed(bench, arm.own_baseline)
            arms[tech] = timed(bench, arm)
        except NotTimed as exc:
            skipped[tech] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a technique that cannot apply to this model is a stated skip
            skipped[tech] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return arms, skipped
