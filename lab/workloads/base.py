"""Workload records and the registry every workload goes through.

A workload bundles what a run needs besides the techniques under test: data, a model factory, a loss and a
metric, at three sizes (``tiny`` for tests, ``small`` for notebooks/dashboard on a 2-core CPU, ``full`` for a
GPU). The built-ins (``ctr``, ``sequence``, ``vision``) register through the same ``register_workload`` a user
calls, so the dashboard's lists and the parametrised tests see user workloads exactly like built-in ones.
Notebook: ``notebooks/00_tour.ipynb``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import Dataset

from lab.registry import WORKLOADS

REQUIRED_SIZES: tuple[str, ...] = ("tiny", "small", "full")
#: The model-size rungs a ladder may name, smallest first; ``RunConfig.model_scale`` picks one.
SCALE_NAMES: tuple[str, ...] = ("xs", "s", "m", "l", "xl")


@dataclass(frozen=True)
class Rung:
    """One step of a model-size ladder: the ``SizeSpec.model`` keys it overrides (width, depth) while the
    data, batch and learning rate stay the workload's, so a speed figure along the ladder changes one
    thing: the model. ``speed_only`` rungs are too large to converge on a 2-core CPU in the size's epochs:
    their speed is measured, their accuracy is not compared."""

    model: dict
    speed_only: bool = False


def ladder(**models: dict) -> dict[str, Rung]:
    """A model-size ladder ``{rung: Rung}`` from each rung's ``SizeSpec.model`` overrides, named by
    :data:`SCALE_NAMES` and given smallest first; the largest rung (``xl``) is speed-only, as every
    built-in's is (it would not converge on a 2-core CPU in the size's epochs)."""
    unknown = sorted(set(models) - set(SCALE_NAMES))
    if unknown:
        raise ValueError(f"unknown model-scale rung(s) {unknown}; rungs are " + ", ".join(SCALE_NAMES))
    return {name: Rung(model, speed_only=name == SCALE_NAMES[-1]) for name, model in models.items()}


@dataclass(frozen=True)
class SizeSpec:
    """Everything that changes between sizes; the factories read ``model`` / ``data`` kwargs from here.

    The training defaults live next to the data size because a good learning rate and epoch count depend on
    how much data there is, and a technique must be compared against a baseline that was tuned, not guessed.
    """

    n_train: int
    n_test: int
    batch_size: int
    epochs: int
    lr: float
    model: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Fail at definition time, not an hour into an ablation.
        for name in ("n_train", "n_test", "batch_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SizeSpec.{name} must be a positive int, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"SizeSpec.lr must be a positive number, got {self.lr!r}")


def _materialize(split: str, ds: Dataset) -> tuple[torch.Tensor, ...]:
    """A map-style ``Dataset`` whose items are ``(input_1, ..., input_k, target)`` as stacked tensors."""
    try:
        n = len(ds)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"Datasets.{split}: an iterable-style dataset has no length; give a map-style Dataset "
                         "(with __len__ and __getitem__) or a tuple of tensors") from None
    if n == 0:
        raise ValueError(f"Datasets.{split} is empty")
    items = [ds[i] for i in range(n)]
    if not isinstance(items[0], (tuple, list)) or len(items[0]) < 2:
        raise ValueError(f"Datasets.{split}: each item must be a tuple (input_1, ..., input_k, target), got "
                         f"{type(items[0]).__name__}")
    return tuple(torch.stack([torch.as_tensor(item[k]) for item in items]) for k in range(len(items[0])))


@dataclass
class Datasets:
    """Train/test tensors as ``(input_1, ..., input_k, target)`` tuples plus JSON-serialisable facts.

    Plain tensors because the loaders under test in ``lab.data`` want to own batching; a map-style
    ``torch.utils.data.Dataset`` whose items are such tuples is accepted too and stacked once here (fine
    for the data sizes a lab run uses). ``info`` carries what a result needs to be read correctly (e.g. the
    best reachable AUC, the data source).
    """

    train: tuple[torch.Tensor, ...]
    test: tuple[torch.Tensor, ...]
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            if isinstance(getattr(self, split), Dataset):
                setattr(self, split, _materialize(split, getattr(self, split)))
            tensors = getattr(self, split)
            if len(tensors) < 2:
                raise ValueError(f"Datasets.{split} needs an input and a target, got {len(tensors)} tensors")
            lengths = {int(t.shape[0]) for t in tensors}
            if len(lengths) != 1:
                raise ValueError(f"Datasets.{split} tensors disagree on the first dim: {sorted(lengths)}")

    @property
    def n_inputs(self) -> int:
        """Number of model inputs (all tensors but the target)."""
        return len(self.train) - 1


@dataclass(frozen=True)
class Workload:
    """One model + data + loss + metric, at the sizes ``tiny`` / ``small`` / ``full``.

    ``make_model(spec)(*inputs)`` returns outputs; ``loss(outputs, target)`` is a scalar;
    ``evaluate(all_outputs, all_targets)`` returns metrics including ``metric_name``. ``sizes`` may be one
    :class:`SizeSpec` serving every size. ``chance`` is the metric of a guess (0.1 for 10 balanced classes),
    if known: a run whose trained metric is not clearly better than chance and than the untrained model is
    tagged "did not learn".
    """

    name: str
    description: str
    sizes: dict[str, SizeSpec]
    make_data: Callable[[SizeSpec, int], Datasets]
    make_model: Callable[[SizeSpec], nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
    metric_name: str
    higher_is_better: bool = True
    reference: dict[str, str] = field(default_factory=dict)
    #: Optional ``fn(model) -> model`` switching the model to a faster implementation of the same math
    #: (``compute.fast_kernels``); ``None`` means the workload has none, and asking for it is refused.
    fast_kernels: Callable[[nn.Module], nn.Module] | None = None
    #: Optional ``fn(model) -> [(prefix, sub-module, layers whose output width is fixed)]``: the parts that
    #: structured pruning traces separately, for a model whose graph cannot be traced as one (the ctr
    #: DLRM's embedding interaction). ``None``: the whole model, its output layer fixed.
    prune_scopes: Callable[[nn.Module], list[tuple[str, nn.Module, list[nn.Module]]]] | None = None
    chance: float | None = None
    #: Optional model-size ladder ``{rung: Rung}`` over :data:`SCALE_NAMES` (the built-ins have one; a user
    #: workload may add one): ``RunConfig.model_scale`` builds the rung's model on the same data.
    scales: dict[str, Rung] = field(default_factory=dict)
    #: Optional ``fn(model) -> [block modules]``: the blocks activation checkpointing recomputes in backward
    #: (``memory.checkpoint``); ``None``: :func:`default_blocks` finds them (:meth:`model_blocks`).
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sizes, SizeSpec):  # one spec serves every size
            object.__setattr__(self, "sizes", dict.fromkeys(REQUIRED_SIZES, self.sizes))
        unknown = sorted(set(self.scales) - set(SCALE_NAMES))
        if unknown:
            raise ValueError(f"workload {self.name!r}: unknown model-scale rung(s) {unknown}; rungs are "
                             + ", ".join(SCALE_NAMES))

    def model_blocks(self, model: nn.Module) -> list[nn.Module]:
        """The blocks of ``model`` that activation checkpointing recomputes one at a time: the workload's own
        :attr:`blocks` when it names them, else :func:`default_blocks`. Empty: the model has none."""
        return list(self.blocks(model)) if self.blocks is not None else default_blocks(model)

    def rungs(self) -> list[str]:
        """This workload's ladder rungs, smallest first (empty: no ladder)."""
        return [r for r in SCALE_NAMES if r in self.scales]

    def spec_at(self, size: str, model_scale: str | None = None) -> SizeSpec:
        """The spec for ``size`` with the model of rung ``model_scale`` (``None``: the size's own model,
        unchanged). Only the model keys change: data, batch, epochs and lr stay the size's."""
        spec = self.size(size)
        if model_scale is None:
            return spec
        if model_scale not in self.scales:
            have = ", ".join(self.rungs()) or "none: it has no model-size ladder"
            raise ValueError(f"model_scale={model_scale!r} is invalid for workload {self.name!r}: rungs {have}")
        return dataclasses.replace(spec, model={**spec.model, **self.scales[model_scale].model})

    def size(self, size: str) -> SizeSpec:
        """The spec for ``size``, with an error that lists the sizes this workload has."""
        try:
            return self.sizes[size]
        except KeyError:
            raise ValueError(
                f"workload {self.name!r} has no size {size!r}; available: {sorted(self.sizes)}"
            ) from None


#: Modules that only hold others: never a block themselves, their members may be.
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
#: The base class Hugging Face Transformers gives the layers it checkpoints itself (matched by name: importing
#: transformers here would make it a dependency of every workload).
HF_CHECKPOINT_LAYER = "GradientCheckpointingLayer"


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """A model's blocks, for activation checkpointing: the layers Hugging Face marks as checkpointable (its
    ``GradientCheckpointingLayer``: BERT's, GPT-2's, ViT's layers), else the outermost *composite* members of a
    container (a module with parameterised sub-modules of its own, held by an ``nn.Sequential`` /
    ``nn.ModuleList`` / ``nn.ModuleDict``): ``nn.TransformerEncoder``'s layers, a ResNet's residual blocks (the
    lab's, torchvision's, the stages of Hugging Face's), a user's ``nn.Sequential(Block(), Block())``. Why
    composite: checkpointing a lone ``nn.Linear`` keeps its input, which its backward needed anyway, and saves
    nothing; an MLP of ``Linear`` / ``ReLU`` or an LSTM has no block, and checkpointing refuses it."""
    marked: list[nn.Module] = []

    def visit_marked(m: nn.Module) -> None:
        for child in m.children():
            if any(c.__name__ == HF_CHECKPOINT_LAYER for c in type(child).__mro__):
                marked.append(child)
            else:
                visit_marked(child)

    visit_marked(model)
    if marked:
        return marked
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            composite = not isinstance(child, CONTAINERS) and any(
                any(True for _ in sub.parameters()) for sub in child.children())
            if isinstance(m, CONTAINERS) and composite:
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


_REGISTRY = WORKLOADS  # lab.registry.WORKLOADS: the one registry of workload names


def _validate(workload: Workload) -> None:
    if not isinstance(workload, Workload):
        raise TypeError(f"register_workload expects a Workload, got {type(workload).__name__}")
    if not workload.name or not isinstance(workload.name, str):
        raise ValueError(f"workload name must be a non-empty string, got {workload.name!r}")
    missing = [s for s in REQUIRED_SIZES if s not in workload.sizes]
    if missing:
        raise ValueError(
            f"workload {workload.name!r} lacks sizes {missing}; every workload needs {list(REQUIRED_SIZES)} "
            "(or pass one SizeSpec as sizes= to serve them all)"
        )
    for size, spec in workload.sizes.items():
        if not isinstance(spec, SizeSpec):
            raise TypeError(
                f"workload {workload.name!r} size {size!r} must be a SizeSpec, got {type(spec).__name__}"
            )
    for attr in ("make_data", "make_model", "loss", "evaluate"):
        if not callable(getattr(workload, attr)):
            raise TypeError(f"workload {workload.name!r}: {attr} must be callable")
    if not workload.metric_name:
        raise ValueError(f"workload {workload.name!r} needs a metric_name")


def register_workload(workload: Workload, *, overwrite: bool = False) -> Workload:
    """Add ``workload`` to the registry and return it (so it can be used as ``X = register_workload(...)``).

    Duplicates raise unless ``overwrite`` because two modules silently fighting over one name would make
    results depend on import order.
    """
    _validate(workload)
    if workload.name in _REGISTRY and not overwrite:
        raise ValueError(
            f"workload {workload.name!r} is already registered; pass overwrite=True to replace it"
        )
    _REGISTRY.register(workload.name, workload, overwrite=True)
    return workload


def get_workload(name: str) -> Workload:
    """The workload registered as ``name``; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown workload {name!r}; available: {list_workloads()}")
    return _REGISTRY.get(name)


def registered(name: str) -> Workload | None:
    """The workload registered as ``name``, or ``None`` (no error, no environment loading)."""
    return _REGISTRY.get(name) if name in _REGISTRY else None


def list_workloads() -> list[str]:
    """Registered workload names, sorted (stable order for UIs and parametrised tests)."""
    return sorted(_REGISTRY)
