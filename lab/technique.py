"""One technique protocol: what a technique family plugs into a run, the ordered chain that runs them, and the
launcher that starts and ends the run's processes.

Why one protocol: every family (data loading, compute options, mixed precision, pruning, quantization,
data-parallel training) changes a run at the same few moments, so :class:`Technique` names those moments once,
each a no-op by default; a family overrides only the ones it needs, and :mod:`lab.train` reads top to bottom
without knowing any family by name. The stages of a run, in order (docs/architecture.md section 3)::

    check(cfg)                     before any work: what the config asks of this machine
    preflight(ctx, model)          what needs the data or a fresh model, refused before training
    before_training(ctx, model)    the model a run trains (fast kernels, masks) and its step hooks
    fit_options(ctx, model, plan)  every fit: the optimizer, policy, forward, DDP step it runs with
    loader_factory(ctx, make)      every fit's loader, each family wrapping the one before it
    after_training(ctx, model)     rank 0: prune + fine-tune, quantize, record (int8 of a pruned model)
    report(result) -> dict         the family's section of ``result.details["techniques"]``
    timed(option, bench, arm)      outside a run: the same change on one arm the crossover map times
    portable(cfg, run) -> Portable outside a run: the family's part of the plain-PyTorch script (lab.portable)

Why a launcher apart: starting the run's processes, joining and leaving their group and wrapping the model for
them concern the families that run on several processes (data-parallel; memory's FSDP2, which reuses the
data-parallel launcher and replaces its wrap), not every family's step, so they are not stages every family carries
(torchtitan keeps parallelism apart from its narrow ``ModelConverter`` protocol). A :class:`Launcher` is the
strategy the run uses for them; the run takes the one :meth:`TechniqueChain.launcher` picks::

    launch(cfg, run) -> result     after check: start the run in other processes instead (spawn); else None
    join(ctx)                      after prepare: enter the run's group of processes
    wrap(ctx, model)               after the untrained evaluation: the training wrapper (DDP)
    unwrap(ctx, model)             after the fit
    leave(ctx)                     after --profile: leave the group of processes

:class:`TechniqueChain` holds the techniques in an explicit order: :data:`lab.registry.FAMILY_ORDER` names it,
each package registers its technique in :data:`lab.registry.FAMILIES` (and a launcher, if it has one, in
:data:`lab.registry.LAUNCHERS` under the same name) when imported, and :func:`default_chain` builds the chain
that :func:`lab.train.run` passes to :func:`lab.context.prepare`. A new family is one package (``lab/<name>/``
with a :class:`Technique` subclass registered in ``FAMILIES``) and its name in ``FAMILY_ORDER``. A caller can
pass its own chain (a test adds a toy technique that way). Validation lives only in ``check`` and
``preflight``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lab.loop import DDPStep, FitStats, Loader, StepHook, StepPolicy
from lab.registry import FAMILIES, FAMILY_ORDER, LAUNCHERS, OPTIONS
from lab.result.failure import describe, tag
from lab.timed import NotTimed

if TYPE_CHECKING:
    from lab.config import RunConfig
    from lab.context import TrainContext
    from lab.result import RunResult
    from lab.timed import Bench, TimedArm


#: The phase of ``--profile``'s captured steps (``lab.profiling.capture_training_profile``): a probe that must take
#: the run's own step (its accumulation, all-reduces and, compiled, its compiled forward and backward).
PROFILE_PHASE = "profile"


@dataclass
class FitPlan:
    """What one ``ctx.fit`` call will run. Techniques fill in their part in chain order."""

    phase: str
    lr: float
    probe: bool  # a short measuring fit (the precision probe): no progress events, no DDP
    loader: Loader
    fused_optimizer: bool = False
    #: ``(parameters, lr) -> optimizer`` replacing the config's (``cfg.optimizer``) for this fit: low-bit Adam state
    optimizer: Callable[[list[nn.Parameter], float], torch.optim.Optimizer] | None = None
    policy: StepPolicy | None = None
    forward: Callable[..., torch.Tensor] | None = None
    ddp: DDPStep | None = None
    #: each batch run as this many micro-batches, gradients accumulated (the memory family's ``micro_batches``)
    micro_batches: int = 1
    finished: list[Callable[[FitStats], None]] = field(default_factory=list)  # called with the stats
    checkpoint: Any = None  # lab.loop.Checkpointer: the data family's checkpoint / resume of the main fit


class Technique:
    """A technique family's part in a run; every stage is a no-op until a subclass overrides it."""

    #: The family's name in :data:`lab.registry.FAMILIES` (also its key in ``details["techniques"]``).
    name: str = ""
    #: The ``RunConfig`` fields the family owns beyond those its options set (:func:`config_keys`): a family
    #: with no option string (data-parallel: ``ddp``) names its own.
    config_fields: tuple[str, ...] = ()

    def check(self, cfg: RunConfig) -> None:
        """Refuse what cannot run on this machine, before any data is made or any process started."""

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Refuse what the data or a fresh model makes impossible (a layer name that matches nothing)."""

    def loader_factory(self, ctx: TrainContext, make: Callable[[int], Loader] | None
                       ) -> Callable[[int], Loader] | None:
        """``batch size -> loader``, built on the previous family's factory (``None`` for the first)."""
        return make

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """Contribute to one fit: a fused optimizer, a precision policy, a compiled forward, the DDP step."""

    def before_training(self, ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
        """The model to train and the step hooks its loop calls."""
        return model, []

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Rank 0, after training: the final model (pruned, quantized) and the family's figures."""
        return model

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """Apply ``option`` (one of this family's) to one arm the crossover map times (:mod:`lab.timed`): the same
        change a run makes, on the arm's model, policy, optimizer, forward or batches. Raise
        :class:`lab.timed.NotTimed` with the reason where the option cannot change this arm."""
        raise NotTimed(f"the {self.name} family has no timed arm for {option.name}")

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """The family's part of ``cfg`` as plain PyTorch (:class:`Portable`, stitched into one script by
        :mod:`lab.portable`), ``None`` where the family is off in ``cfg``. ``run`` is a stored run of ``cfg``: where
        the family decides by measuring (``auto``), the code is of what that run chose. Raise :class:`NotPortable`
        with the reason where ``cfg`` asks for what the script cannot express. Here (a family that writes no part):
        refused where ``cfg`` changes a config its options set, so nothing is silently left out of a script
        (``tests/core/test_families.py`` holds every option to a part or a listed reason)."""
        default = type(cfg)()
        if any(getattr(cfg, k) != getattr(default, k) for k in config_keys(self.name)):
            raise NotPortable(f"the {self.name} family writes no plain-PyTorch part yet (Technique.portable)")
        return None

    def replaces_model(self, cfg: RunConfig) -> bool:
        """Whether :meth:`after_training` hands on another model than training produced (so the final metric
        is not training's own, and the divergence rules do not judge it)."""
        return False

    def report(self, result: RunResult) -> dict[str, Any] | None:
        """A short summary of what the family did in ``result`` (``None``: nothing to say)."""
        return None

    def tried(self, cfg: RunConfig) -> str:
        """What the family does in a run of ``cfg``, in the words of a failure's line (:mod:`lab.result.failure`):
        here its settings that differ from their defaults (``quant.method='static'``)."""
        return family_settings(cfg, self.name)


def config_keys(name: str) -> set[str]:
    """The ``RunConfig`` fields (``prune``, ``ddp``) the family ``name`` owns: those its registered options set and
    those its technique names (:attr:`Technique.config_fields`)."""
    own = FAMILIES.get(name).config_fields if name in FAMILIES else ()
    return {k.split(".")[0] for o in OPTIONS.values() if o.family == name for k in o.overrides if "." in k} | set(own)


def family_settings(cfg: RunConfig, name: str) -> str:
    """The family ``name``'s settings in ``cfg`` that differ from their defaults, as ``field=value`` pairs (the
    family's name alone where nothing differs)."""
    changed = []
    for key in sorted(config_keys(name)):
        family = getattr(cfg, key)
        default = type(family)()
        changed += [f"{key}.{f.name}={getattr(family, f.name)!r}" for f in dataclasses.fields(family)
                    if getattr(family, f.name) != getattr(default, f.name)]
    return ", ".join(changed) or name


class NotPortable(ValueError):
    """What a config asks for that a plain-PyTorch script cannot express (a workload's own model code, a schedule
    not written out yet): the message says why, and :mod:`lab.portable` refuses the script with it."""


def not_written_out(setting: str, what: str) -> NotPortable:
    """The refusal of a setting the lab runs but the recipe does not write out yet, in one wording for every
    family: ``raise not_written_out("ddp.grad_accum_steps=2", "gradient accumulation (no_sync ...)")``."""
    return NotPortable(f"{setting}: {what} is not written out by the recipe yet")


def refuse_accumulation(setting: str, micro_batches: int, how: str) -> None:
    """Raise :func:`not_written_out` for gradient accumulation over ``micro_batches`` > 1: two families run it
    (data parallel's ``no_sync`` on all but the last micro-batch, the memory family's batch kept over smaller
    ones) and the recipe writes out neither yet, said in one wording."""
    if micro_batches > 1:
        raise not_written_out(f"{setting}={micro_batches}", f"gradient accumulation {how}")


@dataclass(frozen=True)
class Portable:
    """One family's part of the plain-PyTorch training script that ``python -m lab recipe`` writes
    (:mod:`lab.portable`): lines of code that name no ``lab`` module, each put at one fixed place of the script.

    Why fixed places: the script is the user's own loop (``train`` builds the loader and calls ``fit``; ``fit`` is
    the step), and every family changes it at the same few points a run does (the loader, the optimizer, the step's
    autocast / backward / optimizer step, after training, for inference), so the families' parts stitch in
    :data:`lab.registry.FAMILY_ORDER` without knowing each other. A place that takes one expression (``autocast``,
    ``backward``, ``step``, ``loader_class``, ``optimizer``, ``placeholder``, ``inference``) may be filled by one
    family of a stack only.

    The script's names a part may use: in ``train``: ``model``, ``loss_fn``, ``train_set``, ``epochs``,
    ``batch_size``, ``lr``, ``seed``, ``shuffle``, ``device``, ``loader``, ``losses``, ``fit``; in ``fit``:
    ``model``, ``loader``, ``loss_fn``, ``lr``, ``device``, ``phase``, ``optimizer``, ``forward``, ``epoch``,
    ``loss``; in ``for_inference``: ``model``, ``calibration_set``, ``batch_size``."""

    comment: str  # one line: what this part does (the script's header lists them)
    imports: tuple[str, ...] = ()  # import lines at the top of the script
    requires: tuple[str, ...] = ()  # pip packages beyond torch (torch-pruning, torchao)
    helpers: tuple[str, ...] = ()  # module-level code (a function or class each) the lines below call
    setup: tuple[str, ...] = ()  # in train(), once the device is known, before the model moves there
    loader_kwargs: tuple[tuple[str, str], ...] = ()  # (keyword, expression) of the loader; replaces the base's
    loader_class: str | None = None  # a helper with DataLoader's keywords that replaces DataLoader
    wrap: tuple[str, ...] = ()  # in train(), after the loader, before the main fit (DDP)
    optimizer_kwargs: tuple[tuple[str, str], ...] = ()  # (keyword, expression) of the optimizer
    optimizer: str | None = None  # replaces the optimizer: an expression of ``{params}`` and ``lr`` (torchao's)
    fit_setup: tuple[str, ...] = ()  # in fit(), after the optimizer and ``forward = model`` (a scaler, a compile)
    epoch_start: tuple[str, ...] = ()  # in fit(), at the start of every epoch
    autocast: str | None = None  # the context manager of forward + loss (only those)
    backward: str | None = None  # replaces ``loss.backward()``
    step: tuple[str, ...] = ()  # replace ``optimizer.step()``
    unwrap: tuple[str, ...] = ()  # in train(), right after the main fit (before any family's after_training)
    after_training: tuple[str, ...] = ()  # in train(), after the main fit: prune + fine-tune, QAT
    inference: tuple[str, ...] = ()  # the body of for_inference(model, calibration_set, *, batch_size)
    launch: str | None = None  # how to start the script when it is not ``python FILE`` (``{file}``: its name)
    placeholder: str | None = None  # the ``__main__`` block's placeholder model where the base one cannot run
    notes: tuple[str, ...] = ()  # header lines: what the lab does that this part leaves out, and why


class Launcher:
    """How a run starts and ends its processes: a single process by default, every method a no-op.

    A family that runs on several processes registers one in :data:`lab.registry.LAUNCHERS` under its family
    name; :meth:`TechniqueChain.launcher` picks the first of the chain's whose :meth:`applies` to the config.
    One instance serves every run (keep a run's own state in ``ctx.state``)."""

    def applies(self, cfg: RunConfig) -> bool:
        """Whether this launcher runs ``cfg`` (read before any work, in the launching process and in each rank)."""
        return True

    def launch(self, cfg: RunConfig, run: Callable[[RunConfig], RunResult]) -> RunResult | None:
        """Run ``cfg`` elsewhere (e.g. one process per rank, each calling ``run``) and return rank 0's result;
        ``None``: this process runs it."""
        return None

    def join(self, ctx: TrainContext) -> None:
        """Enter the run's group of processes (every rank), after :func:`lab.context.prepare`."""

    def wrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """The training wrapper, applied after the untrained model was evaluated."""
        return model

    def unwrap(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """Undo :meth:`wrap` after training."""
        return model

    def leave(self, ctx: TrainContext) -> None:
        """Leave what :meth:`join` entered (every rank at the same point)."""


#: The launcher of a run no registered launcher applies to: one process, nothing to join, no wrapper.
SINGLE_PROCESS = Launcher()


#: The axes an option can change: the training step, end-to-end training, inference, stored size. An ablation arm
#: competes only on its options' axes (int8 after training never on the training step).
AXES: tuple[str, ...] = ("train_step", "train", "inference", "size")
TRAINING: tuple[str, ...] = ("train_step", "train")  # changes how training runs, not the model it produces
AFTER_TRAINING: tuple[str, ...] = ("inference", "size")  # changes the trained model (pruning, int8, QAT)


@dataclass(frozen=True)
class Option:
    """One option string of a technique family (``bf16``, ``prune_channels50``, ``int8_static``): the config
    overrides it means, the family that owns it, a one-line explanation and the axes it can change.

    Why one class: recipes, ablation arms, the crossover map's rows, the doctor's predictions and the dashboard's
    choices all name techniques by these strings, so a name means one technique everywhere (the map once called
    channel pruning ``prune50``, the recipes called L1 masks the same). Each family registers its own options
    next to its code (``lab/<family>/options.py``) with :func:`register_options`."""

    name: str
    overrides: dict[str, Any]
    family: str
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)  # e.g. ("cpu_only",) shown in the UI
    axes: tuple[str, ...] = AXES

    def __post_init__(self) -> None:
        bad = [a for a in self.axes if a not in AXES]
        if bad or not self.axes:
            raise ValueError(f"Option.axes={self.axes!r} is invalid: allowed: one or more of {', '.join(AXES)}")
        if not self.name or "+" in self.name:
            raise ValueError(f"Option.name={self.name!r} is invalid: a non-empty name without '+' (a stack of "
                             "options is named by joining theirs with '+')")


def register_option(option: Option, *, overwrite: bool = False, validate: bool = True) -> Option:
    """Add ``option`` to :data:`lab.registry.OPTIONS`. Its family must be a family's name
    (:data:`lab.registry.FAMILY_ORDER`) and every override a ``RunConfig`` field; with ``validate`` (a user's
    option) the values are validated too, so a typo fails here and not in the middle of an ablation. A family
    registers its own at import, before every registry its values name is filled, so it checks the fields only
    (``tests/core/test_families.py`` validates every registered option's values)."""
    from lab.config import RunConfig, check_override_keys

    if option.family not in FAMILY_ORDER:
        raise ValueError(f"Option {option.name!r}: family={option.family!r} is invalid: allowed: "
                         + ", ".join(FAMILY_ORDER))
    if option.name in OPTIONS and not overwrite:
        OPTIONS.register(option.name, option)  # raises: already registered
    check_override_keys(option.overrides)
    if validate:
        RunConfig().with_overrides(**option.overrides)
    return OPTIONS.register(option.name, option, overwrite=True)


def register_options(*options: Option) -> None:
    """A family's options, registered where the family is defined (re-registering an equal one is a no-op, so
    ``importlib.reload`` stays idempotent; another option under a taken name is refused)."""
    for option in options:
        same = option.name in OPTIONS and OPTIONS.get(option.name) == option
        register_option(option, overwrite=same, validate=False)


class TechniqueChain(Sequence[Technique]):
    """Techniques in the order their contributions apply; each stage runs them all. The one place a run reaches
    the families (and, through :meth:`launcher`, their launchers)."""

    def __init__(self, techniques: Iterable[Technique]) -> None:
        self._items = tuple(techniques)
        names = [t.name for t in self._items]
        for t in self._items:
            if not isinstance(t, Technique) or not t.name:
                raise TypeError(f"{t!r} is not a named lab.technique.Technique")
        if len(set(names)) != len(names):
            raise ValueError(f"a technique appears twice in the chain: {names}")

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - Sequence protocol
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Technique]:
        return iter(self._items)

    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._items)

    def without(self, *names: str) -> TechniqueChain:
        return TechniqueChain(t for t in self._items if t.name not in names)

    def check(self, cfg: RunConfig) -> None:
        for t in self._items:
            t.check(cfg)

    def launcher(self, cfg: RunConfig) -> Launcher:
        """The launcher ``cfg`` runs under: the first one registered in :data:`lab.registry.LAUNCHERS` under the
        name of a family in this chain (in chain order) that :meth:`Launcher.applies` to ``cfg``, else
        :data:`SINGLE_PROCESS`. A chain without the family runs without its launcher."""
        for t in self._items:
            if t.name in LAUNCHERS and LAUNCHERS.get(t.name).applies(cfg):
                return LAUNCHERS.get(t.name)
        return SINGLE_PROCESS

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Each technique's preflight. A ``ValueError`` is the technique's own refusal and passes as it is; any
        other exception (the user's model raised while a technique traced or tried it) is refused here too, as
        one line naming the technique and the line that raised (:func:`lab.result.failure.describe`)."""
        for t in self._items:
            try:
                t.preflight(ctx, model)
            except ValueError:
                raise
            except Exception as exc:
                failure = describe(exc, model=model, technique=t.name, stage="preflight", tried=t.tried(ctx.cfg),
                                   hint=f"run without {t.name}, or fix the model", status="refused")
                raise ValueError(failure.line()) from exc

    def loader_factory(self, ctx: TrainContext) -> Callable[[int], Loader]:
        make: Callable[[int], Loader] | None = None
        for t in self._items:
            with stage(t.name, "loader"):
                make = t.loader_factory(ctx, make)
        if make is None:
            raise RuntimeError(f"no technique in the chain {self.names()} builds loaders")
        return make

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        for t in self._items:
            with stage(t.name, f"fit_options ({plan.phase})"):
                t.fit_options(ctx, model, plan)

    def before_training(self, ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
        hooks: list[StepHook] = []
        for t in self._items:
            with stage(t.name, "before_training"):
                model, more = t.before_training(ctx, model)
            hooks.extend(more)
        return model, hooks

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        for t in self._items:
            with stage(t.name, "after_training"):
                model = t.after_training(ctx, model)
        return model

    def enabled(self, cfg: RunConfig) -> list[str]:
        """The techniques of this chain that ``cfg`` switches on (their config is not the no-op default)."""
        return [t.name for t in self._items if any(getattr(cfg, k).enabled for k in config_keys(t.name))]

    def tried(self, cfg: RunConfig, names: Sequence[str]) -> str:
        """What the techniques ``names`` of this chain do in ``cfg`` (:meth:`Technique.tried`), joined."""
        parts = [t.tried(cfg) for t in self._items if t.name in names]
        return "; ".join(parts) or "the plain run (no technique on)"

    def replaces_model(self, cfg: RunConfig) -> bool:
        return any(t.replaces_model(cfg) for t in self._items)

    def report(self, result: RunResult) -> dict[str, dict[str, Any]]:
        """``{family: summary}`` for the families that had something to say."""
        out = {}
        for t in self._items:
            with stage(t.name, "report"):
                summary = t.report(result)
            if summary is not None:
                out[t.name] = summary
        return out


@contextlib.contextmanager
def stage(technique: str, name: str) -> Iterator[None]:
    """Tag an exception leaving ``technique``'s stage ``name`` (:func:`lab.result.failure.tag`): the run turns it
    into one line naming both (:func:`lab.train.run`)."""
    try:
        yield
    except Exception as exc:
        tag(exc, technique, name)
        raise


def default_chain() -> TechniqueChain:
    """The families in :data:`lab.registry.FAMILY_ORDER`, each ``lab.<name>`` imported if it has not registered
    yet (``import lab`` imports them all; a new family needs no import line of its own)."""
    for name in FAMILY_ORDER:
        if name not in FAMILIES:
            importlib.import_module(f"lab.{name}")  # a technique package registers itself when imported
    registered, ordered = set(FAMILIES.names()), set(FAMILY_ORDER)
    if registered != ordered:
        missing, unordered = sorted(ordered - registered), sorted(registered - ordered)
        raise RuntimeError("the technique registry and lab.registry.FAMILY_ORDER disagree: "
                           + (f"not registered (import lab): {missing}; " if missing else "")
                           + (f"registered but not in FAMILY_ORDER: {unordered}" if unordered else ""))
    return TechniqueChain(FAMILIES.get(n) for n in FAMILY_ORDER)


__all__ = ["AFTER_TRAINING", "AXES", "PROFILE_PHASE", "SINGLE_PROCESS", "TRAINING", "FitPlan", "Launcher",
           "NotPortable", "Option", "Portable", "Technique", "TechniqueChain", "config_keys", "default_chain",
           "family_settings", "register_option", "register_options", "stage"]
