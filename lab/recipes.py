"""Named ablation recipes over the families' option strings (taught in ``notebooks/06_ablations``).

An *option* is one user-facing string (Accelerate-style) mapped to ``RunConfig`` overrides, e.g.
``"bf16" -> {"precision.dtype": "bf16"}``; each family registers its own (``lab/<family>/options.py``,
:class:`lab.technique.Option`) in :data:`lab.registry.OPTIONS`, the one table the dashboard, the CLI, the
crossover map and the doctor read. A *recipe* is a plain function ``base RunConfig -> Ablation``, registered in
:data:`lab.registry.RECIPES`, so a technique that lands later is one ``register_option`` call in its family, never
an app change.

Options that set the same config key to different values cannot be stacked (``combine`` raises), so a
factorial over, say, ``bf16`` and ``fp16`` is refused instead of silently keeping one of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lab.ablation import AXES, Ablation
from lab.config import RunConfig
from lab.pruning.options import masks
from lab.registry import OPTIONS, RECIPES
from lab.technique import Option, register_option


def list_options(family: str | None = None) -> list[str]:
    """The registered option names, of one family (``lab.registry.FAMILY_ORDER``'s name) when given."""
    return [n for n, t in OPTIONS.items() if family is None or t.family == family]


def get_option(name: str) -> Option:
    """The option registered as ``name``; an unknown one is a ``ValueError`` listing the known ones."""
    return OPTIONS.get(name)


def combine(names: Iterable[str]) -> dict[str, Any]:
    """Merged overrides of several techniques; conflicting values for one key raise ValueError."""
    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for name in names:
        for key, value in get_option(name).overrides.items():
            if key in merged and merged[key] != value:
                raise ValueError(f"techniques {owner[key]!r} and {name!r} conflict on {key}: "
                                 f"{merged[key]!r} vs {value!r}; stack techniques that set different fields")
            merged[key], owner[key] = value, name
    return merged


def arm_name(techniques: Sequence[str]) -> str:
    return "+".join(techniques) if techniques else "baseline"


def from_techniques(name: str, base: RunConfig, arms: Iterable[Sequence[str]]) -> Ablation:
    """An Ablation whose arms are technique stacks (the baseline is always added first)."""
    stacks: dict[str, tuple[str, ...]] = {"baseline": ()}
    for techs in arms:
        stacks[arm_name(tuple(techs))] = tuple(techs)
    configs = {arm: base.with_overrides(**combine(techs)) for arm, techs in stacks.items()}
    axes = {arm: stack_axes(techs) for arm, techs in stacks.items()}
    return Ablation(name=name, baseline=base, arms=configs, techniques=stacks, axes=axes)


def stack_axes(techniques: Sequence[str]) -> tuple[str, ...]:
    """The axes a stack can change: the union of its techniques' (every axis for the baseline)."""
    if not techniques:
        return AXES
    have = {a for t in techniques for a in get_option(t).axes}
    return tuple(a for a in AXES if a in have)


# ---------------------------------------------------------------------------------------------- recipes

def data_loading(base: RunConfig) -> Ablation:
    """In-memory batches vs a DataLoader with workers (loader variants join via ``register_option``)."""
    return from_techniques("data_loading", base, [[t] for t in list_options("data")])


def mixed_precision(base: RunConfig) -> Ablation:
    """fp32 vs bf16 vs fp16 vs auto: on a CPU without native bf16 the low-precision arms are slower."""
    return from_techniques("mixed_precision", base, [[t] for t in list_options("precision")])


def pruning_sweep(base: RunConfig, amounts: Sequence[float] = (0.3, 0.5, 0.7)) -> Ablation:
    """Unstructured L1 at several sparsities: masks alone buy no dense-kernel speed, only size."""
    arms = []
    for amount in amounts:
        option = masks(amount)
        if option.name not in OPTIONS:
            register_option(option)
        arms.append([option.name])
    return from_techniques("pruning_sweep", base, arms)


#: The quantization recipe's arms: one per method, the dynamic method in both flows. ``int8_static_legacy`` and
#: ``int8_auto`` (the map's flow comparison) are left out: each adds a PT2E or eager static build per run.
QUANTIZATION_ARMS: tuple[str, ...] = ("int8_dynamic", "int8_eager", "int8_static", "int8_qat")


def quantization(base: RunConfig) -> Ablation:
    """dynamic vs static vs QAT int8 against the fp32 baseline (inference speed, size, accuracy)."""
    return from_techniques("quantization", base, [[t] for t in QUANTIZATION_ARMS])


def distributed(base: RunConfig, world_sizes: Sequence[int] = (2,)) -> Ablation:
    """DDP arms by world size (each spawns its ranks; the per-rank batch stays the baseline's, so the
    effective batch grows with the world size: the table reports time per epoch, not per step)."""
    arms = {f"ddp{w}": base.with_overrides(**{"ddp.world_size": int(w)}) for w in world_sizes}
    return Ablation(name="distributed", baseline=base, arms={"baseline": base, **arms},
                    techniques={"baseline": (), **{a: (a,) for a in arms}}, axes=dict.fromkeys(arms, ("train",)))


def factorial(base: RunConfig, techniques: Sequence[str], name: str = "factorial") -> Ablation:
    """Every subset of ``techniques`` (2^k arms): the data ``interaction_effects`` needs to tell whether
    two techniques compound or cancel."""
    if not techniques:
        raise ValueError("techniques=[] is invalid: allowed: one or more of " + ", ".join(OPTIONS))
    combine(techniques)  # conflicts fail before 2^k configs are built
    subsets = [c for k in range(1, len(techniques) + 1) for c in itertools.combinations(techniques, k)]
    return from_techniques(name, base, subsets)


def cannot_pay(techniques: Sequence[str], base: RunConfig, caps: Any = None) -> str | None:
    """Why the stack ``techniques`` cannot pay on this machine, or ``None``: a low precision
    (``precision.dtype`` bf16 / fp16) that the CPU's capabilities (:func:`lab.measure.cpu_capabilities`, or
    ``caps`` planted by a test) say runs emulated, i.e. a reference path at 0.02-0.45x fp32 that made an
    AVX2 box's stacked ablation run past 30 minutes. ``auto`` is never refused: it measures and keeps fp32.
    A run on a GPU is not judged by the CPU's flags."""
    from lab.measure import cpu_capabilities

    if base.device not in ("cpu", "auto") or (base.device == "auto" and _has_cuda()):
        return None
    caps = cpu_capabilities() if caps is None else caps
    for name in techniques:
        dtype = get_option(name).overrides.get("precision.dtype")
        if dtype in ("bf16", "fp16") and not getattr(caps, f"native_{dtype}"):
            return f"{name}: {dtype} is emulated on this CPU ({caps.missing(dtype)}), so it cannot pay"
    return None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def payable(name: str, base: RunConfig, arms: Iterable[Sequence[str]], *, include_emulated: bool = False,
            caps: Any = None) -> Ablation:
    """:func:`from_techniques` less the arms :func:`cannot_pay` refuses on this machine, each kept in
    ``Ablation.skipped`` with its reason (the CLI prints them, the job spec records them); with
    ``include_emulated`` every arm runs."""
    arms = [tuple(a) for a in arms]
    skipped = {} if include_emulated else {arm_name(a): why for a in arms if (why := cannot_pay(a, base, caps))}
    ablation = from_techniques(name, base, [a for a in arms if arm_name(a) not in skipped])
    ablation.skipped.update(skipped)
    return ablation


def stacked(base: RunConfig, *, include_emulated: bool = False, caps: Any = None) -> Ablation:
    """The interviews' combined recipes: AMP + pruning, loader workers + AMP, pruning + int8, each alone too, and
    the workload's fast kernels where it has them. Those because the doctor prescribes them, so the default
    ablation that the recommendation card reads must measure them: a card cannot recommend what it cannot see.
    The dashboard's default, so its int8 is the eager torch.ao flow: every PT2E arm compiles four graphs (about
    a minute per run on 2 cores), which would make the default take ten minutes; the ``quantization`` recipe
    compares the flows, and ``compile`` (tens of seconds of compile per run) is the doctor's to verify. bf16 arms
    are skipped where bf16 is emulated (:func:`payable`)."""
    arms = [["bf16"], ["prune50"], ["int8_eager"], ["workers2"], ["bf16", "prune50"], ["workers2", "bf16"],
            ["prune50", "int8_eager"]]
    if _has_fast_kernels(base.workload):
        arms.insert(4, ["fast_kernels"])
    return payable("stacked", base, arms, include_emulated=include_emulated, caps=caps)


def _has_fast_kernels(workload: str) -> bool:
    """The workload offers a faster implementation of its own model (``Workload.fast_kernels``)."""
    from lab.workloads import get_workload

    try:
        return get_workload(workload).fast_kernels is not None
    except ValueError:  # an unknown workload: the ablation's own check names it
        return False


#: The top-rung stack: what pays on a large model. Training: fused Adam with ``auto`` precision (it
#: keeps a native low precision only when a probe on the run's own steps measures it faster, so never an
#: emulated one) or with bf16 outright (left out where bf16 is emulated). Inference: half the channels removed,
#: then static int8 of the thinner model. The two halves do not share one run: int8 refuses a run trained under
#: autocast (``lab.quant.int8.check_supported``: it calibrates and converts an fp32 model), so the deployable
#: stack trains in fp32 with fused Adam, and the low-precision training gain is its own arm.
TOP_TRAINING: tuple[str, ...] = ("fused_optim", "amp_auto")
TOP_INFERENCE: tuple[str, ...] = ("prune_channels50", "int8_static")
#: The top stack's pruning fine-tune, in epochs (``prune_channels50`` alone fine-tunes 1). On vision small at
#: scale m one epoch at lr/10 left a seed 28 pt below the dense model (median -5 pt, seed spread 15 pt); three
#: recovered all three seeds to within noise of dense (0.935-0.938 against 0.932).
TOP_PRUNE_FINETUNE_EPOCHS = 3


def top_stack(base: RunConfig, *, include_emulated: bool = False, caps: Any = None,
              prune_finetune_epochs: int = TOP_PRUNE_FINETUNE_EPOCHS) -> Ablation:
    """The top-rung stack: the training half, channel pruning alone and the deployable whole, each against the
    plain fp32 baseline. The training half is fused Adam + ``auto`` (and fused Adam + bf16); the deployable whole
    is fused Adam + channels 50 % + static int8 (one int8 arm: a PT2E conversion compiles four graphs, about a
    minute per run on 2 cores). Training time is end to end:
    the ``auto`` probe and the pruning fine-tune (``prune_finetune_epochs``, :data:`TOP_PRUNE_FINETUNE_EPOCHS`)
    count; inference is the final model's latency. bf16 arms are skipped where bf16 is emulated
    (:func:`payable`)."""
    arms = [list(TOP_TRAINING), ["fused_optim", "bf16"], ["prune_channels50"], ["fused_optim", *TOP_INFERENCE]]
    ablation = payable("top_stack", base, arms, include_emulated=include_emulated, caps=caps)
    for arm, cfg in ablation.arms.items():
        if cfg.prune.method != "none":
            ablation.arms[arm] = cfg.with_overrides(**{"prune.finetune_epochs": prune_finetune_epochs})
    return ablation


#: The performance report's stack (benchmarks/stacked.py): ``SPEED_STACK`` is added cumulatively, in the
#: order a user would try it; each of ``SPEED_EXTRAS`` is then tried on top of the whole stack. Parallel reads
#: come last: once fused Adam and the fast kernels make the step shorter than one read from network_fs (ctr
#: small: a 540 kB batch, 5 ms + 5.4 ms), a single reader cannot keep up and a quarter of the step waited.
SPEED_STACK: tuple[str, ...] = ("prefetch", "fused_optim", "fast_kernels", "parallel_reads")
SPEED_EXTRAS: tuple[str, ...] = ("amp_auto", "bf16", "compile", "prune_channels50")


def speed_stack(base: RunConfig, storage: str = "network_fs", extras: Sequence[str] = SPEED_EXTRAS) -> Ablation:
    """A naive baseline (main-thread reads from ``storage``, fp32, eager, torch's default optimizer), arms
    that add ``SPEED_STACK`` one technique at a time, and arms that add one of ``SPEED_EXTRAS`` to the full
    stack. Cumulative arms show what each addition buys on top of the previous ones; the end-to-end training
    time includes compile, the ``auto`` probe and the pruning fine-tune. Techniques the workload cannot run
    (fast kernels outside ctr) are left out, not failed. The compile arm is profiled after its timed steps
    (``--profile`` of a compiled step, :mod:`lab.compute`), so its record can say why compile lost (ctr small:
    Inductor's generated gradient scatters, 0.7x the stack without it)."""
    from lab.workloads import get_workload

    if storage not in ("local_ssd", "network_fs", "object_store"):
        raise ValueError(f"storage={storage!r} is invalid for speed_stack: the naive baseline reads from storage; "
                         "allowed: local_ssd, network_fs, object_store")
    naive = base.with_overrides(**{"data.loader": "naive", "data.num_workers": 0, "data.pin_memory": False,
                                   "data.prefetch_factor": None, "data.persistent_workers": False,
                                   "data.storage": storage})
    usable = [t for t in SPEED_STACK if t != "fast_kernels" or get_workload(base.workload).fast_kernels]
    arms: list[list[str]] = [usable[:k] for k in range(1, len(usable) + 1)]
    arms += [[*usable, extra] for extra in extras]
    ablation = from_techniques("speed_stack", naive, arms)
    for arm, cfg in ablation.arms.items():
        if cfg.compute.compile:  # profiled after its timed steps (never in them): its record says why compile lost
            ablation.arms[arm] = cfg.with_overrides(profile=True)
    return ablation


for _recipe in (stacked, top_stack, speed_stack, mixed_precision, pruning_sweep, quantization, data_loading,
                distributed):
    RECIPES.register(_recipe.__name__, _recipe, overwrite=True)  # overwrite: importlib.reload stays idempotent


def get_recipe(name: str) -> Callable[[RunConfig], Ablation]:
    """The recipe registered as ``name``; an unknown one is a ``ValueError`` listing the known ones."""
    return RECIPES.get(name)
