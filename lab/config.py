"""Run configuration: one frozen dataclass per run, one nested config per technique family.

Why a frozen, keyword-only dataclass: an ablation derives its arms with ``dataclasses.replace`` from one
base config, so a config must be a value (hashable, comparable, serialisable) that cannot drift after it
was validated. Every bad value fails here, early, with the field, the value and what is allowed, rather
than deep inside a training loop minutes later.

A family that is off keeps its no-op default (``loader="memory"``, ``dtype="fp32"``, ``method="none"``,
``world_size=1``), so ``RunConfig()`` is the plain fp32 baseline. Names a user types (workloads, loaders,
storage presets) are validated against their registries (:mod:`lab.registry`, :mod:`lab.workloads`), so a
name that is accepted here is one that a technique package actually implements. What can only be checked
against the machine (CUDA, a backend) is checked by :func:`lab.train.check` before any work.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from lab.registry import LOADERS, STORAGES
from lab.workloads import list_workloads

SIZES = ("tiny", "small", "full")
OPTIMIZERS = ("adam", "sgd")


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        _fail(name, value, "allowed: " + ", ".join(allowed))


def _check_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None,
               optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, value, "must be an integer" + (" or None" if optional else ""))
    if lo is not None and value < lo:
        _fail(name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        _fail(name, value, f"must be <= {hi}")


def _check_float(name: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(name, value, "must be a finite number" + (" or None" if optional else ""))
    if lo is not None and (value <= lo if lo_open else value < lo):
        _fail(name, value, f"must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        _fail(name, value, f"must be {'<' if hi_open else '<='} {hi}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(name, value, "must be True or False")


class _Family:
    """Shared behaviour of the per-family configs: a prefix for error messages and an on/off test."""

    family: ClassVar[str] = ""

    @property
    def enabled(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def _name(self, attr: str) -> str:
        return f"{self.family}.{attr}"


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Family):
    """How batches reach the model. ``loader`` names a builder in :data:`lab.registry.LOADERS` (``memory``
    slices in-memory tensors, the upper bound a loader can hit; ``dataloader`` is ``torch.utils.data.DataLoader``;
    the others are the data-loading lab's, notebook 01); ``storage`` a preset in :data:`lab.registry.STORAGES`."""

    family: ClassVar[str] = "data"

    loader: str = "memory"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    shuffle: bool = True
    drop_last: bool = True
    storage: str = "none"  # emulated storage preset (lab.registry.STORAGES); "none" = in-memory, no cost
    prefetch_depth: int = 2  # batches the thread prefetcher may hold ahead of the training loop

    def __post_init__(self) -> None:
        _check_choice(self._name("loader"), self.loader, LOADERS.names())
        _check_choice(self._name("storage"), self.storage, STORAGES.names())
        _check_int(self._name("prefetch_depth"), self.prefetch_depth, lo=1, hi=1024)
        _check_int(self._name("num_workers"), self.num_workers, lo=0, hi=64)
        _check_int(self._name("prefetch_factor"), self.prefetch_factor, lo=1, hi=1024, optional=True)
        for attr in ("pin_memory", "persistent_workers", "shuffle", "drop_last"):
            _check_bool(self._name(attr), getattr(self, attr))
        # These mirror DataLoader's own rules, but fail at config time with the field's name.
        if self.prefetch_factor is not None and self.num_workers == 0:
            _fail(self._name("prefetch_factor"), self.prefetch_factor, "needs num_workers > 0")
        if self.persistent_workers and self.num_workers == 0:
            _fail(self._name("persistent_workers"), True, "needs num_workers > 0")
        if self.loader != "memory" and self.num_workers and not LOADERS.get(self.loader).worker_processes:
            _fail(self._name("num_workers"), self.num_workers,
                  f"loader={self.loader!r} reads in the main process; worker processes need loader='dataloader'")
        if self.loader == "memory" and self.storage != "none":
            _fail(self._name("storage"), self.storage, "the in-memory loader is the no-storage limit; use 'naive'")
        if self.loader == "memory" and (self.num_workers or self.pin_memory):
            _fail(self._name("loader"), self.loader,
                  "the in-memory loader has no workers or pinned memory; use loader='dataloader'")

    @property
    def enabled(self) -> bool:
        return self.loader != "memory" or self.storage != "none"


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig(_Family):
    """Numeric precision of the forward pass (autocast); ``fp32_modules`` names modules kept in fp32."""

    family: ClassVar[str] = "precision"
    DTYPES: ClassVar[tuple[str, ...]] = ("fp32", "bf16", "fp16", "auto")

    dtype: str = "fp32"
    fp32_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_choice(self._name("dtype"), self.dtype, self.DTYPES)
        if not isinstance(self.fp32_modules, tuple) or not all(isinstance(m, str) and m
                                                               for m in self.fp32_modules):
            _fail(self._name("fp32_modules"), self.fp32_modules, "must be a tuple of module names or types")

    @property
    def enabled(self) -> bool:
        return self.dtype != "fp32" or bool(self.fp32_modules)


@dataclass(frozen=True, kw_only=True)
class PruneConfig(_Family):
    """Weight pruning applied to the trained model (then optionally fine-tuned at ``lr * finetune_lr_factor``).

    ``amount`` is the fraction of weights zeroed (unstructured) or of output channels removed per layer
    (``structured_channels``, ranked by their L``norm`` norm). ``layers`` names modules or module types
    (``"fc"``, ``"Conv2d"``); ``()`` means every prunable layer. ``gradual`` ramps sparsity with Zhu &
    Gupta's cubic schedule from ``start_fraction`` to ``end_fraction`` of the training steps, updating the
    masks every ``frequency_steps`` steps (unstructured methods only)."""

    family: ClassVar[str] = "prune"
    METHODS: ClassVar[tuple[str, ...]] = (
        "none", "l1_unstructured", "global_unstructured", "random_unstructured", "structured_channels")
    SCHEDULES: ClassVar[tuple[str, ...]] = ("oneshot", "gradual")

    method: str = "none"
    amount: float = 0.0
    schedule: str = "oneshot"
    finetune_epochs: int = 0
    finetune_lr_factor: float = 0.1
    layers: tuple[str, ...] = ()
    norm: int = 1
    start_fraction: float = 0.0
    end_fraction: float = 0.75
    frequency_steps: int = 10

    def __post_init__(self) -> None:
        _check_choice(self._name("method"), self.method, self.METHODS)
        _check_float(self._name("amount"), self.amount, lo=0.0, hi=1.0, hi_open=True)
        _check_choice(self._name("schedule"), self.schedule, self.SCHEDULES)
        _check_int(self._name("finetune_epochs"), self.finetune_epochs, lo=0, hi=1000)
        _check_float(self._name("finetune_lr_factor"), self.finetune_lr_factor, lo=0.0, hi=10.0, lo_open=True)
        if self.method != "none" and self.amount == 0.0:
            _fail(self._name("amount"), self.amount, f"must be > 0 when method={self.method!r}")
        if not isinstance(self.layers, tuple) or not all(isinstance(m, str) and m for m in self.layers):
            _fail(self._name("layers"), self.layers, "must be a tuple of module names or types")
        if isinstance(self.norm, bool) or not isinstance(self.norm, int) or self.norm not in (1, 2):
            _fail(self._name("norm"), self.norm, "allowed: 1, 2")
        _check_float(self._name("start_fraction"), self.start_fraction, lo=0.0, hi=1.0, hi_open=True)
        _check_float(self._name("end_fraction"), self.end_fraction, lo=0.0, hi=1.0, lo_open=True)
        if self.end_fraction <= self.start_fraction:
            _fail(self._name("end_fraction"), self.end_fraction, f"must be > start_fraction={self.start_fraction}")
        _check_int(self._name("frequency_steps"), self.frequency_steps, lo=1, hi=1_000_000)
        if self.schedule == "gradual" and self.method == "structured_channels":
            _fail(self._name("schedule"), self.schedule,
                  "gradual is for unstructured methods; structured_channels removes channels once (oneshot)")

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, kw_only=True)
class QuantConfig(_Family):
    """Post-training (dynamic / static with calibration) or quantization-aware int8.

    ``observer`` picks how static calibration sets activation ranges (QAT always uses moving-average
    fake-quant); ``per_channel`` one weight scale per output channel instead of one per tensor (static and
    QAT; dynamic int8 uses torch's per-tensor default, the one its LSTM kernel supports); QAT
    fine-tunes ``qat_epochs`` at ``lr * qat_lr_factor`` after the float training."""

    family: ClassVar[str] = "quant"
    METHODS: ClassVar[tuple[str, ...]] = ("none", "dynamic", "static", "qat")
    OBSERVERS: ClassVar[tuple[str, ...]] = ("histogram", "minmax", "moving_average")

    method: str = "none"
    calibration_batches: int = 16
    backend: str = "auto"
    observer: str = "histogram"
    per_channel: bool = True
    qat_epochs: int = 1
    qat_lr_factor: float = 0.1

    def __post_init__(self) -> None:
        _check_choice(self._name("method"), self.method, self.METHODS)
        _check_int(self._name("calibration_batches"), self.calibration_batches, lo=1, hi=100_000)
        _check_choice(self._name("backend"), self.backend, ("auto", "x86", "fbgemm", "qnnpack"))
        _check_choice(self._name("observer"), self.observer, self.OBSERVERS)
        _check_bool(self._name("per_channel"), self.per_channel)
        _check_int(self._name("qat_epochs"), self.qat_epochs, lo=1, hi=1000)
        _check_float(self._name("qat_lr_factor"), self.qat_lr_factor, lo=0.0, hi=10.0, lo_open=True)

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, kw_only=True)
class DDPConfig(_Family):
    """Data-parallel training: ranks, process-group backend, gradient bucketing and accumulation."""

    family: ClassVar[str] = "ddp"
    BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "gloo", "nccl")

    world_size: int = 1
    backend: str = "auto"
    bucket_cap_mb: float = 25.0
    grad_accum_steps: int = 1
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _check_int(self._name("world_size"), self.world_size, lo=1, hi=4096)
        _check_choice(self._name("backend"), self.backend, self.BACKENDS)
        _check_float(self._name("bucket_cap_mb"), self.bucket_cap_mb, lo=0.0, hi=4096.0, lo_open=True)
        _check_int(self._name("grad_accum_steps"), self.grad_accum_steps, lo=1, hi=4096)
        _check_float(self._name("timeout_s"), self.timeout_s, lo=0.0, hi=86_400.0, lo_open=True)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or self.grad_accum_steps > 1


@dataclass(frozen=True, kw_only=True)
class ComputeConfig(_Family):
    """How the same math is executed: ``fused_optimizer`` (one fused Adam/SGD kernel instead of a loop of
    small ones), ``fast_kernels`` (a workload's faster implementation of the same model, e.g. the ctr model's
    gather-based lookups instead of EmbeddingBag's sort-based backward) and ``compile`` (``torch.compile`` of
    the training forward; its compile time counts in the training time). None of them changes the model's
    parameters or the loss, so accuracy may differ only by float rounding."""

    family: ClassVar[str] = "compute"

    fused_optimizer: bool = False
    fast_kernels: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        for attr in ("fused_optimizer", "fast_kernels", "compile"):
            _check_bool(self._name(attr), getattr(self, attr))

    @property
    def enabled(self) -> bool:
        return self.fused_optimizer or self.fast_kernels or self.compile


FAMILIES: dict[str, type[_Family]] = {
    "data": DataConfig, "precision": PrecisionConfig, "prune": PruneConfig, "quant": QuantConfig,
    "ddp": DDPConfig, "compute": ComputeConfig,
}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines one training run. ``None`` for epochs/batch_size/lr means the workload's
    default for the chosen size, so the same config works across sizes."""

    workload: str = "ctr"
    size: str = "small"
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str = "adam"
    seed: int = 0
    data_seed: int = 0
    device: str = "auto"
    threads: int | None = None
    warmup_steps: int = 3
    eval_batch_size: int = 256
    latency_repeats: int = 20
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)

    def __post_init__(self) -> None:
        names = list_workloads()  # read now: the registry may hold user workloads
        if not isinstance(self.workload, str) or self.workload not in names:
            _fail("workload", self.workload, "registered workloads: " + ", ".join(names))
        _check_choice("size", self.size, SIZES)
        _check_int("epochs", self.epochs, lo=1, hi=10_000, optional=True)
        _check_int("max_steps", self.max_steps, lo=1, optional=True)
        _check_int("batch_size", self.batch_size, lo=1, hi=1 << 20, optional=True)
        _check_float("lr", self.lr, lo=0.0, hi=10.0, lo_open=True, optional=True)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_int("seed", self.seed, lo=0, hi=2**32 - 1)
        _check_int("data_seed", self.data_seed, lo=0, hi=2**32 - 1)
        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
                and self.device[5:].isdigit()):
            _fail("device", self.device, "allowed: auto, cpu, cuda, cuda:N")
        _check_int("threads", self.threads, lo=1, hi=1024, optional=True)
        _check_int("warmup_steps", self.warmup_steps, lo=0, hi=10_000)
        _check_int("eval_batch_size", self.eval_batch_size, lo=1, hi=1 << 20)
        _check_int("latency_repeats", self.latency_repeats, lo=0, hi=100_000)
        for name, cls in FAMILIES.items():
            if not isinstance(getattr(self, name), cls):
                _fail(name, getattr(self, name), f"must be a {cls.__name__}")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe dict (tuples become lists); :meth:`from_dict` restores an equal config."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict`. Unknown keys are an error, not silently dropped: a typo in a stored
        or hand-written config would otherwise run the baseline and look like a result."""
        d = dict(d)
        kwargs: dict[str, Any] = {}
        for name, fam_cls in FAMILIES.items():
            if name in d:
                kwargs[name] = _family_from_dict(name, fam_cls, d.pop(name))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown RunConfig field(s): {', '.join(unknown)}")
        return cls(**d, **kwargs)

    def with_overrides(self, **changes: Any) -> RunConfig:
        """``dataclasses.replace`` that also accepts dotted family fields: ``cfg.with_overrides(
        **{"precision.dtype": "bf16"})``. Used by the CLI and ablation arms."""
        top = {k: v for k, v in changes.items() if "." not in k}
        per_family: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            if "." not in key:
                continue
            fam, attr = key.split(".", 1)
            if fam not in FAMILIES:
                raise ValueError(f"{key}: unknown family {fam!r}; families: {', '.join(FAMILIES)}")
            if attr not in {f.name for f in fields(FAMILIES[fam])}:
                raise ValueError(f"{key}: {fam} has no field {attr!r}")
            per_family.setdefault(fam, {})[attr] = value
        # One replace per family, so fields that must change together (method + amount) validate together.
        for fam, attrs in per_family.items():
            top[fam] = dataclasses.replace(top.get(fam, getattr(self, fam)), **attrs)
        return dataclasses.replace(self, **top)

    def enabled_families(self) -> list[str]:
        """Names of the technique families this config switches on."""
        return [name for name in FAMILIES if getattr(self, name).enabled]


def _family_from_dict(name: str, cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} is invalid: must be a mapping of {cls.__name__} fields")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"unknown {name} field(s): {', '.join(unknown)}")
    value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return cls(**value)
