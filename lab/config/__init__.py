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
import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from lab.config.checks import check_bool, check_choice, check_float, check_int, fail
from lab.config.families import (
    FAMILIES,
    ComputeConfig,
    DataConfig,
    DDPConfig,
    PrecisionConfig,
    PruneConfig,
    QuantConfig,
)
from lab.config.memory import MemoryConfig
from lab.workloads import is_spec, list_workloads, load_spec, registered, spec_of

SIZES = ("tiny", "small", "full")
#: Model-size rungs of the built-in workloads (the crossover map's ladders): ``None`` keeps each workload's own
#: model; a rung grows width (and depth where natural) while the data stay the same
#: (:meth:`Workload.build_model`).
MODEL_SCALES = ("xs", "s", "m", "l", "xl")
#: Fields added after runs were first stored: left out of :meth:`RunConfig.to_dict` while at their default,
#: so a config (and the stored run's hash) that does not use them reads exactly as before.
_LATE_FIELDS = {"model_scale": None, "profile": False, "checkpoint_every": None, "resume": None, "eval_every": None,
                "target_metric": None}
_LATE_FAMILY_FIELDS = {"data": {"source": "memory", "ideal_replay": False}, "quant": {"flow": "pt2e"},
                       "memory": {"offload": "none"}}
#: Families added after runs were first stored: left out of :meth:`RunConfig.to_dict` while off (their default).
_LATE_FAMILIES = ("memory",)
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines one training run. ``None`` for epochs/batch_size/lr means the workload's
    default for the chosen size, so the same config works across sizes. ``workload`` is a registered name
    or a spec (``module:NAME``, ``file.py:NAME``). A spec is not imported here: a config is a value, built
    and compared without running anyone's code. :func:`load_workload`, called where a run is prepared (the
    CLI, :func:`lab.train.run`, :func:`lab.context.prepare`, an ablation), imports it and returns the config
    whose ``workload`` is the registered name and whose ``workload_spec`` keeps the spec, so any process (a
    spawned DDP rank) can load it again."""

    #: Field name -> one line saying what it means (unit where it has one): its flag's help; the CLI adds the
    #: allowed values and the default (:mod:`lab.config.flags`). A ClassVar: not a field, not in the config's hash.
    HELP: ClassVar[dict[str, str]] = {
        "workload": "what to train: a registered workload, or a spec module:NAME / file.py:NAME (loaded by "
                    "every process)",
        "workload_spec": "the spec the workload was loaded from (set by --workload SPEC; given alone, it reloads "
                         "a stored run's workload)",
        "size": "the workload's data size and schedule",
        "epochs": "training epochs (none: the workload's default for --size)",
        "max_steps": "stop after this many optimizer steps (none: every step of --epochs)",
        "batch_size": "training batch, per rank (none: the workload's default for --size)",
        "lr": "learning rate (none: the workload's default for --size)",
        "optimizer": "the optimizer",
        "seed": "seed of the model's initial weights and the batch order",
        "data_seed": "seed the workload's data and splits are generated from",
        "device": "where to train: auto (cuda if available, else cpu), cpu, cuda or cuda:N",
        "threads": "torch threads, at most this machine's cores (none: torch's default)",
        "warmup_steps": "first training steps left out of the step-time statistics (must be < --max-steps)",
        "eval_batch_size": "batch of the evaluation and of the inference-latency measurement",
        "latency_repeats": "timed repeats of the inference-latency measurement (0: not measured)",
        "model_scale": "model-size rung of the workload's ladder: wider (and deeper where natural), same data "
                       "(none: the workload's own model)",
        "profile": "profile training steps: the op-class breakdown and a Chrome trace",
        "checkpoint_every": "save a checkpoint every this many training steps (none: never; one process, no "
                            "pruning or quantization)",
        "resume": "resume training from a stored run id or a checkpoint path",
        "eval_every": "evaluate on the test split every this many steps, timed apart: the eval curve and time to "
                      "target (none: not during training, or once per epoch with --target-metric)",
        "target_metric": "eval metric value the run must reach: the time it first did is recorded (time to target)",
    }

    workload: str = "ctr"
    workload_spec: str | None = None
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
    model_scale: str | None = None
    profile: bool = False
    checkpoint_every: int | None = None
    resume: str | None = None
    #: Evaluate on the test split every this many steps of the main training phase (time counted apart from
    #: the steps and ``train_time_s``): the run's ``details["eval_curve"]`` and time to target.
    eval_every: int | None = None
    #: The eval metric a run must reach: ``details["time_to_target"]`` records when it first did (without
    #: ``eval_every`` the run evaluates once per epoch).
    target_metric: float | None = None
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def __post_init__(self) -> None:
        self._check_workload()
        check_choice("size", self.size, SIZES)
        check_int("epochs", self.epochs, lo=1, hi=10_000, optional=True)
        check_int("max_steps", self.max_steps, lo=1, optional=True)
        check_int("batch_size", self.batch_size, lo=1, hi=1 << 20, optional=True)
        check_float("lr", self.lr, lo=0.0, hi=10.0, lo_open=True, optional=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_int("seed", self.seed, lo=0, hi=2**32 - 1)
        check_int("data_seed", self.data_seed, lo=0, hi=2**32 - 1)
        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
                and self.device[5:].isdigit()):
            fail("device", self.device, "allowed: auto, cpu, cuda, cuda:N")
        check_int("threads", self.threads, lo=1, hi=1024, optional=True)
        cores = os.cpu_count() or 1
        if self.threads is not None and self.threads > cores:  # refused, not warned: it would skew every timing
            fail("threads", self.threads, f"must be <= the {cores} cores of this machine (more threads than "
                 "cores oversubscribe them and every timing measures the contention)")
        check_int("warmup_steps", self.warmup_steps, lo=0, hi=10_000)
        if self.max_steps is not None and self.warmup_steps >= self.max_steps:
            fail("warmup_steps", self.warmup_steps, f"must be < max_steps={self.max_steps}: no step would be measured")
        check_int("eval_batch_size", self.eval_batch_size, lo=1, hi=1 << 20)
        check_int("latency_repeats", self.latency_repeats, lo=0, hi=100_000)
        check_choice("model_scale", self.model_scale, MODEL_SCALES, optional=True)
        if self.model_scale is not None:
            wl = registered(self.workload)
            if wl is not None and self.model_scale not in wl.scales:
                fail("model_scale", self.model_scale, f"workload {self.workload!r} has "
                     + (f"rungs {', '.join(wl.rungs())}" if wl.scales else "no model-size ladder")
                     + " (workloads with one: " + ", ".join(n for n in list_workloads() if registered(n).scales) + ")")
        check_bool("profile", self.profile)
        check_int("checkpoint_every", self.checkpoint_every, lo=1, optional=True)
        check_int("eval_every", self.eval_every, lo=1, optional=True)
        check_float("target_metric", self.target_metric, lo=0.0, optional=True)
        if self.resume is not None and (not isinstance(self.resume, str) or not self.resume.strip()):
            fail("resume", self.resume, "must be a run id or a checkpoint path")
        for name, cls in FAMILIES.items():
            if not isinstance(getattr(self, name), cls):
                fail(name, getattr(self, name), f"must be a {cls.__name__}")
        if self.checkpoint_every is not None or self.resume is not None:
            what = "checkpoint_every" if self.checkpoint_every is not None else "resume"
            for on, why in ((self.ddp.world_size > 1, "data-parallel ranks"), (self.prune.enabled, "pruning"),
                            (self.quant.enabled, "quantization")):
                if on:
                    fail(what, getattr(self, what), f"is not supported with {why} yet (it checkpoints one "
                         "process's plain training phase)")

    def _check_workload(self) -> None:
        """A registered name, or a spec not loaded yet (:func:`load_workload` loads it): a spec in ``workload``,
        or a stored ``workload_spec`` whose workload this process has not registered. A name registered from a
        spec earlier in this process gets that spec (a registry lookup, no import): a spawned rank must load it
        too, and the config reads the same however it was built."""
        if not isinstance(self.workload, str):
            fail("workload", self.workload, "must be a workload name or a spec string (module:NAME / file.py:NAME)")
        if self.workload_spec is not None and not isinstance(self.workload_spec, str):
            fail("workload_spec", self.workload_spec, "must be a spec string or None")
        if is_spec(self.workload) or (self.workload_spec is not None and registered(self.workload) is None):
            return  # not loaded yet: checked by load_workload, where a run is prepared
        if self.workload_spec is None and spec_of(self.workload) is not None:  # named, but from a spec:
            object.__setattr__(self, "workload_spec", spec_of(self.workload))  # ranks must load it too
        # A registered name needs no lookup; anything else reads the registry now (user workloads, and
        # LAB_WORKLOADS loaded on that first lookup, so a broken entry is reported by a run, not an import).
        names = [] if registered(self.workload) else list_workloads()
        if names and self.workload not in names:
            fail("workload", self.workload, "registered workloads: " + ", ".join(names) + " (or a spec "
                  "module:NAME / file.py:NAME; a workload registered from Python is unknown to new processes "
                  "such as DDP ranks: give it as a spec or in LAB_WORKLOADS)")

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe dict (tuples become lists); :meth:`from_dict` restores an equal config. An unset
        ``workload_spec`` is left out, so configs (and the stored runs' hashes) read as before specs existed."""
        d = json.loads(json.dumps(dataclasses.asdict(self)))
        if d.get("workload_spec") is None:
            d.pop("workload_spec", None)
        for key, default in _LATE_FIELDS.items():
            if d.get(key) == default:
                d.pop(key, None)
        for fam, late in _LATE_FAMILY_FIELDS.items():
            for key, default in late.items():
                if d[fam].get(key) == default and not (fam == "quant" and self.quant.enabled):
                    d[fam].pop(key, None)  # an int8 run always names its flow: pt2e and legacy never share a hash
        for fam in _LATE_FAMILIES:
            if not getattr(self, fam).enabled:
                d.pop(fam)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict`. Unknown keys are an error, not silently dropped: a typo in a stored
        or hand-written config would otherwise run the baseline and look like a result."""
        if not isinstance(d, dict):
            raise ValueError(f"RunConfig.from_dict needs a mapping of RunConfig fields, got {type(d).__name__}")
        d = dict(d)
        kwargs: dict[str, Any] = {}
        quant = d.get("quant")
        if isinstance(quant, dict) and quant.get("method", "none") != "none" and "flow" not in quant:
            d["quant"] = {**quant, "flow": "legacy"}  # stored before PT2E existed: it ran the torch.ao flow
        for name, fam_cls in FAMILIES.items():
            if name in d:
                kwargs[name] = _family_from_dict(name, fam_cls, d.pop(name))
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(d) - known))
        if unknown:
            raise ValueError(f"unknown RunConfig field(s): {', '.join(unknown)}; fields: "
                             + ", ".join(f.name for f in fields(cls)))
        return cls(**d, **kwargs)

    def with_overrides(self, **changes: Any) -> RunConfig:
        """``dataclasses.replace`` that also accepts dotted family fields: ``cfg.with_overrides(
        **{"precision.dtype": "bf16"})``. Used by the CLI and ablation arms."""
        top = {k: v for k, v in changes.items() if "." not in k}
        unknown = sorted(set(top) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown RunConfig field(s): {', '.join(unknown)}; fields: "
                             + ", ".join(f.name for f in fields(self)))
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


def load_workload(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its workload loaded: a spec in ``workload`` imported and replaced by the name it registers
    (``workload_spec`` keeps the spec), a stored ``workload_spec`` imported when this process has not registered
    its workload; the same config when there is nothing to load. A spec that cannot be imported, or names no
    single workload, is one ``ValueError`` line, raised before any work.

    Why apart from :class:`RunConfig`: importing a user's file runs their code and fills a process-wide
    registry, which a value must not do when it is only built, compared or read back from a stored run (the
    dashboard lists stored runs without importing their workloads). Called where a run is prepared; idempotent."""
    if is_spec(cfg.workload):
        spec, names = cfg.workload, load_spec(cfg.workload)
        if len(names) != 1:
            fail("workload", spec, f"the spec names {len(names)} workloads ({', '.join(names)}); name one "
                  "Workload, or put the spec in LAB_WORKLOADS and pass --workload NAME")
        return dataclasses.replace(cfg, workload=names[0], workload_spec=spec)
    if cfg.workload_spec is not None and registered(cfg.workload) is None:
        load_spec(cfg.workload_spec)
        return dataclasses.replace(cfg)  # checked again, now that its workload is registered
    return cfg


def check_override_keys(overrides: dict[str, Any]) -> None:
    """Every key of ``overrides`` names a ``RunConfig`` field (``seed``) or a family field (``precision.dtype``):
    the structural half of :meth:`RunConfig.with_overrides`, checkable before the registries its values name
    are filled."""
    top = {f.name for f in fields(RunConfig)}
    for key in overrides:
        fam, _, attr = key.partition(".")
        if (not attr and key not in top) or (attr and (fam not in FAMILIES or attr not in
                                                        {f.name for f in fields(FAMILIES[fam])})):
            raise ValueError(f"override {key!r} is invalid: not a RunConfig field (seed) or a family field "
                             f"(precision.dtype); families: {', '.join(FAMILIES)}")


def _family_from_dict(name: str, cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} is invalid: must be a mapping of {cls.__name__} fields")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(map(str, set(value) - set(known)))
    if unknown:
        raise ValueError(f"unknown {name} field(s): {', '.join(unknown)}; fields: {', '.join(known)}")
    value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return cls(**value)
