"""One frozen config per technique family; a family that is off is its no-op default."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import ClassVar

from lab.config.checks import check_bool, check_choice, check_float, check_int, fail
from lab.registry import LOADERS, STORAGES


class _Family:
    """Shared behaviour of the per-family configs: a prefix for error messages, an on/off test, and the
    rule that a family flag given while its family is off is an error (it would be silently ignored)."""

    family: ClassVar[str] = ""
    #: What switches the family on, for the "needs ..." message.
    SWITCH: ClassVar[str] = ""
    #: Fields that still mean something while the family is off.
    OFF_OK: ClassVar[tuple[str, ...]] = ()
    #: Field name -> one line saying what it means (unit where it has one): its flag's help; the CLI adds the
    #: allowed values and the default (:mod:`lab.config.flags`).
    HELP: ClassVar[dict[str, str]] = {}

    @property
    def enabled(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def _name(self, attr: str) -> str:
        return f"{self.family}.{attr}"

    def _refuse_when_off(self) -> None:
        if self.enabled:
            return
        for f in fields(self):  # type: ignore[arg-type]
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            if f.name not in self.OFF_OK and getattr(self, f.name) != default:
                fail(self._name(f.name), getattr(self, f.name),
                     f"needs {self.SWITCH}: the family is off, so the value would be silently ignored")


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Family):
    """How batches reach the model. ``loader`` names a builder in :data:`lab.registry.LOADERS` (``memory``
    slices in-memory tensors, the upper bound a loader can hit; ``dataloader`` is ``torch.utils.data.DataLoader``;
    the others are the data-loading lab's, notebook 01); ``storage`` a preset in :data:`lab.registry.STORAGES`."""

    family: ClassVar[str] = "data"
    SWITCH: ClassVar[str] = "data.loader other than 'memory' (--loader)"
    OFF_OK: ClassVar[tuple[str, ...]] = ("shuffle", "drop_last", "source", "ideal_replay")
    SOURCES: ClassVar[tuple[str, ...]] = ("memory", "files")
    HELP: ClassVar[dict[str, str]] = {
        "loader": "how batches reach the model: memory slices in-memory tensors (the upper bound a loader can hit), "
                  "dataloader is torch's DataLoader, the others are the data-loading lab's (notebook 01)",
        "num_workers": "DataLoader worker processes (loader dataloader only; 0: read in the main process)",
        "prefetch_factor": "batches each DataLoader worker loads ahead (needs --num-workers > 0; none: torch's "
                           "default)",
        "pin_memory": "DataLoader copies batches into pinned memory, for faster host-to-GPU copies (loader "
                      "dataloader only)",
        "persistent_workers": "keep the DataLoader's workers alive between epochs (needs --num-workers > 0)",
        "shuffle": "shuffle the training split every epoch",
        "drop_last": "drop each epoch's last, incomplete batch",
        "storage": "emulated storage preset: every read pays its latency and bandwidth cap (none: in memory, no "
                   "cost; needs a loader other than memory)",
        "prefetch_depth": "batches the thread prefetcher may hold ahead of the training loop (loader thread or "
                          "device_prefetch)",
        "prefetch_readers": "reads the thread prefetcher keeps in flight at once, in threads, to hide read latency "
                            "(loader thread or device_prefetch)",
        "source": "where the training split is read from: memory, or files (written once to shard files and read "
                  "back; needs a loader that reads files)",
        "ideal_replay": "also replay cached batches through the same step: the ideal-loader bound for the data wait",
    }

    loader: str = "memory"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    shuffle: bool = True
    drop_last: bool = True
    storage: str = "none"  # emulated storage preset (lab.registry.STORAGES); "none" = in-memory, no cost
    prefetch_depth: int = 2  # batches the thread prefetcher may hold ahead of the training loop
    prefetch_readers: int = 1  # the thread prefetcher's reads in flight at once (threads; hides read latency)
    source: str = "memory"  # "files": the training split written once to shard files and read back (issue 18)
    ideal_replay: bool = False  # also replay cached batches through the same step: the ideal-loader bound

    def __post_init__(self) -> None:
        check_choice(self._name("source"), self.source, self.SOURCES)
        check_bool(self._name("ideal_replay"), self.ideal_replay)
        check_choice(self._name("loader"), self.loader, LOADERS.names())
        check_choice(self._name("storage"), self.storage, STORAGES.names())
        check_int(self._name("prefetch_depth"), self.prefetch_depth, lo=1, hi=1024)
        check_int(self._name("prefetch_readers"), self.prefetch_readers, lo=1, hi=64)
        check_int(self._name("num_workers"), self.num_workers, lo=0, hi=64)
        check_int(self._name("prefetch_factor"), self.prefetch_factor, lo=1, hi=1024, optional=True)
        for attr in ("pin_memory", "persistent_workers", "shuffle", "drop_last"):
            check_bool(self._name(attr), getattr(self, attr))
        # These mirror DataLoader's own rules, but fail at config time with the field's name.
        if self.prefetch_factor is not None and self.num_workers == 0:
            fail(self._name("prefetch_factor"), self.prefetch_factor, "needs num_workers > 0")
        if self.persistent_workers and self.num_workers == 0:
            fail(self._name("persistent_workers"), True, "needs num_workers > 0")
        if self.loader != "memory" and self.num_workers and not LOADERS.get(self.loader).worker_processes:
            fail(self._name("num_workers"), self.num_workers,
                  f"loader={self.loader!r} reads in the main process; worker processes need loader='dataloader'")
        if self.loader == "memory" and self.storage != "none":
            fail(self._name("storage"), self.storage, "the in-memory loader is the no-storage limit; use 'naive'")
        if self.loader == "memory" and (self.num_workers or self.pin_memory):
            fail(self._name("loader"), self.loader,
                  "the in-memory loader has no workers or pinned memory; use loader='dataloader'")
        if self.source == "files" and self.loader == "memory":
            fail(self._name("source"), self.source, "needs a loader that reads files: --loader naive, thread, "
                 "device_prefetch or dataloader (the in-memory loader reads none)")
        spec = LOADERS.get(self.loader)
        if self.prefetch_depth != 2 and not spec.prefetch_depth:
            fail(self._name("prefetch_depth"), self.prefetch_depth,
                 f"loader={self.loader!r} holds no prefetch queue; it needs loader='thread' or 'device_prefetch'")
        if self.prefetch_readers != 1 and not spec.prefetch_depth:
            fail(self._name("prefetch_readers"), self.prefetch_readers,
                 f"loader={self.loader!r} has no prefetch reader; it needs loader='thread' or 'device_prefetch' "
                 "(DataLoader reads in parallel with num_workers)")
        if self.prefetch_readers != 1 and self.source == "files":
            fail(self._name("prefetch_readers"), self.prefetch_readers,
                 "is in-memory batches only for now: the file reader keeps one shard cache and one byte count per "
                 "process, which concurrent reads would share; with data.source='files' use loader='dataloader' "
                 "with num_workers")
        if self.pin_memory and not spec.worker_processes:
            fail(self._name("pin_memory"), True, f"loader={self.loader!r} does not pin; use loader='dataloader'")
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.loader != "memory" or self.storage != "none"


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig(_Family):
    """Numeric precision of the forward pass (autocast); ``fp32_modules`` names modules kept in fp32."""

    family: ClassVar[str] = "precision"
    SWITCH: ClassVar[str] = "precision.dtype other than 'fp32' (--precision)"
    DTYPES: ClassVar[tuple[str, ...]] = ("fp32", "bf16", "fp16", "auto")
    HELP: ClassVar[dict[str, str]] = {
        "dtype": "forward-pass precision under autocast (auto: decided on the run's own first steps)",
        "fp32_modules": "comma-separated module names or types kept in fp32 under autocast (e.g. head,LSTM)",
    }

    dtype: str = "fp32"
    fp32_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice(self._name("dtype"), self.dtype, self.DTYPES)
        if not isinstance(self.fp32_modules, tuple) or not all(isinstance(m, str) and m
                                                               for m in self.fp32_modules):
            fail(self._name("fp32_modules"), self.fp32_modules, "must be a tuple of module names or types")
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.dtype != "fp32"


@dataclass(frozen=True, kw_only=True)
class PruneConfig(_Family):
    """Weight pruning applied to the trained model (then optionally fine-tuned at ``lr * finetune_lr_factor``).

    ``amount`` is the fraction of weights zeroed (unstructured) or of output channels removed per layer
    (``structured_channels``, ranked by their L``norm`` norm). ``layers`` names modules or module types
    (``"fc"``, ``"Conv2d"``); ``()`` means every prunable layer. ``gradual`` ramps sparsity with Zhu &
    Gupta's cubic schedule from ``start_fraction`` to ``end_fraction`` of the training steps, updating the
    masks every ``frequency_steps`` steps (unstructured methods only)."""

    family: ClassVar[str] = "prune"
    SWITCH: ClassVar[str] = "prune.method (--prune)"
    #: Methods that mask weights in place (no layer gets smaller), and every method: the one list of names.
    MASK_METHODS: ClassVar[tuple[str, ...]] = ("l1_unstructured", "global_unstructured", "random_unstructured")
    METHODS: ClassVar[tuple[str, ...]] = ("none", *MASK_METHODS, "structured_channels")
    SCHEDULES: ClassVar[tuple[str, ...]] = ("oneshot", "gradual")
    HELP: ClassVar[dict[str, str]] = {
        "method": "weight pruning of the trained model, then optionally fine-tuned; none: off",
        "amount": "fraction of weights zeroed (unstructured methods) or of output channels removed per layer "
                  "(structured_channels), in [0, 1)",
        "schedule": "oneshot: prune once, after training; gradual: ramp the sparsity up during training (Zhu & "
                    "Gupta's cubic schedule; unstructured methods only)",
        "finetune_epochs": "epochs of fine-tuning after pruning (0: none)",
        "finetune_lr_factor": "fine-tuning lr as a multiple of the training lr",
        "layers": "comma-separated module names or types to prune (e.g. fc,Conv2d; empty: every prunable layer)",
        "norm": "Lp norm (1 or 2) that ranks output channels for structured_channels",
        "start_fraction": "gradual schedule: fraction of the training steps at which pruning starts",
        "end_fraction": "gradual schedule: fraction of the training steps at which the full amount is reached",
        "frequency_steps": "gradual schedule: the masks are updated every this many training steps",
    }

    method: str = "none"
    amount: float = 0.0
    schedule: str = "oneshot"
    finetune_epochs: int = 0
    #: 1 (the training lr), not the textbook 0.1: the lab's fine-tune is an epoch or two from a fresh optimizer,
    #: and at 0.1 x lr it barely moved the weights (50 % channels, 1 epoch: HF ResNet 11.7 pt below dense at
    #: 0.1, 0.4 pt at 1; HF BERT 25.4 pt vs -0.4 pt; the built-in vision 0.41 vs 0.69 accuracy).
    finetune_lr_factor: float = 1.0
    layers: tuple[str, ...] = ()
    norm: int = 1
    start_fraction: float = 0.0
    end_fraction: float = 0.75
    frequency_steps: int = 10

    def __post_init__(self) -> None:
        check_choice(self._name("method"), self.method, self.METHODS)
        check_float(self._name("amount"), self.amount, lo=0.0, hi=1.0, hi_open=True)
        check_choice(self._name("schedule"), self.schedule, self.SCHEDULES)
        check_int(self._name("finetune_epochs"), self.finetune_epochs, lo=0, hi=1000)
        check_float(self._name("finetune_lr_factor"), self.finetune_lr_factor, lo=0.0, hi=10.0, lo_open=True)
        if self.method != "none" and self.amount == 0.0:
            fail(self._name("amount"), self.amount, f"must be > 0 when method={self.method!r}")
        if not isinstance(self.layers, tuple) or not all(isinstance(m, str) and m for m in self.layers):
            fail(self._name("layers"), self.layers, "must be a tuple of module names or types")
        if isinstance(self.norm, bool) or not isinstance(self.norm, int) or self.norm not in (1, 2):
            fail(self._name("norm"), self.norm, "allowed: 1, 2")
        check_float(self._name("start_fraction"), self.start_fraction, lo=0.0, hi=1.0, hi_open=True)
        check_float(self._name("end_fraction"), self.end_fraction, lo=0.0, hi=1.0, lo_open=True)
        if self.end_fraction <= self.start_fraction:
            fail(self._name("end_fraction"), self.end_fraction, f"must be > start_fraction={self.start_fraction}")
        check_int(self._name("frequency_steps"), self.frequency_steps, lo=1, hi=1_000_000)
        if self.schedule == "gradual" and self.method == "structured_channels":
            fail(self._name("schedule"), self.schedule,
                  "gradual is for unstructured methods; structured_channels removes channels once (oneshot)")
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, kw_only=True)
class QuantConfig(_Family):
    """Post-training (dynamic / static with calibration) or quantization-aware int8.

    ``flow``: ``pt2e`` (default) is torchao PT2E with X86InductorQuantizer's default config, compiled by Inductor
    (freezing); ``legacy`` the deprecated torch.ao eager / FX path, kept for comparison; ``auto`` quantizes with
    both and keeps the faster on the run's own batch (a measured probe, rule in ``details["quant"]["auto"]``,
    :mod:`lab.quant.flow_auto`; not with QAT). ``observer`` picks how static calibration sets activation ranges
    and ``per_channel=False`` one weight scale per tensor: both are
    legacy-flow knobs (PT2E's default config is histogram + per-channel; other values are refused with it). QAT
    always uses moving-average fake-quant and fine-tunes ``qat_epochs`` at ``lr * qat_lr_factor`` after the float
    training. Dynamic int8 of a model holding an RNN takes the legacy flow (PT2E has no int8 LSTM).

    ``reduce_range``: ``auto`` quantizes activations to 7 bits where the CPU has no int8 dot-product instructions
    (no VNNI / AMX: x86 int8 kernels then multiply u8 x s8 through 16-bit *saturating* adds, and full-range
    activations overflow them: PT2E's output error 0.012 -> 0.121 on an MLP with oneDNN capped at AVX2) and to 8
    bits elsewhere (the legacy fbgemm / x86 engines always use 7, torch's own default); ``on`` / ``off`` force it."""

    family: ClassVar[str] = "quant"
    SWITCH: ClassVar[str] = "quant.method (--quant)"
    INT8_METHODS: ClassVar[tuple[str, ...]] = ("dynamic", "static", "qat")
    METHODS: ClassVar[tuple[str, ...]] = ("none", *INT8_METHODS)
    FLOWS: ClassVar[tuple[str, ...]] = ("pt2e", "legacy", "auto")
    OBSERVERS: ClassVar[tuple[str, ...]] = ("histogram", "minmax", "moving_average")
    REDUCE_RANGE: ClassVar[tuple[str, ...]] = ("auto", "on", "off")
    HELP: ClassVar[dict[str, str]] = {
        "method": "int8 quantization: dynamic or static (calibrated) post-training, or qat (quantization-aware "
                  "fine-tuning); none: off",
        "calibration_batches": "training batches static quantization calibrates the activation ranges on",
        "backend": "torch's quantized engine (legacy flow): auto, x86, fbgemm or qnnpack (auto: x86 where torch "
                   "has it, else qnnpack)",
        "observer": "how static calibration sets the activation ranges (legacy flow; PT2E uses histogram)",
        "per_channel": "one weight scale per output channel (--no-quant-per-channel: one per tensor; legacy flow)",
        "qat_epochs": "QAT fine-tuning epochs after the float training",
        "qat_lr_factor": "QAT fine-tuning lr as a multiple of the training lr",
        "flow": "pt2e: torchao PT2E compiled by Inductor; legacy: the torch.ao eager / FX path; auto: both, the "
                "faster on the run's own batch is kept (not with qat)",
        "reduce_range": "7-bit activations: auto where the CPU has no int8 dot-product instructions (no VNNI / "
                        "AMX), 8-bit elsewhere; on / off force it",
    }

    method: str = "none"
    calibration_batches: int = 16
    backend: str = "auto"
    observer: str = "histogram"
    per_channel: bool = True
    qat_epochs: int = 1
    qat_lr_factor: float = 0.1
    flow: str = "pt2e"  # torchao PT2E + X86InductorQuantizer, compiled; "legacy": torch.ao eager / FX (issue 19)
    reduce_range: str = "auto"  # 7-bit activations where int8 has no VNNI (see the docstring)

    def __post_init__(self) -> None:
        check_choice(self._name("method"), self.method, self.METHODS)
        check_choice(self._name("flow"), self.flow, self.FLOWS)
        check_int(self._name("calibration_batches"), self.calibration_batches, lo=1, hi=100_000)
        check_choice(self._name("backend"), self.backend, ("auto", "x86", "fbgemm", "qnnpack"))
        check_choice(self._name("observer"), self.observer, self.OBSERVERS)
        check_choice(self._name("reduce_range"), self.reduce_range, self.REDUCE_RANGE)
        check_bool(self._name("per_channel"), self.per_channel)
        check_int(self._name("qat_epochs"), self.qat_epochs, lo=1, hi=1000)
        check_float(self._name("qat_lr_factor"), self.qat_lr_factor, lo=0.0, hi=10.0, lo_open=True)
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, kw_only=True)
class DDPConfig(_Family):
    """Data-parallel training: ranks, process-group backend, gradient bucketing and accumulation."""

    family: ClassVar[str] = "ddp"
    SWITCH: ClassVar[str] = "ddp.world_size > 1 (--world-size) or ddp.grad_accum_steps > 1"
    BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "gloo", "nccl")
    #: ``batch``: every rank slices the same shuffled global batch (the default); the others give each rank its
    #: own shard of the training split (:data:`lab.data.sharding.STRATEGIES`), shuffled inside it (issue 18).
    SHARDS: ClassVar[tuple[str, ...]] = ("batch", "contiguous", "strided", "hash")
    #: The order the shards are cut from: the split as stored (time order for ctr) or sorted by label.
    SHARD_ORDERS: ClassVar[tuple[str, ...]] = ("stored", "label")
    HELP: ClassVar[dict[str, str]] = {
        "world_size": "data-parallel ranks (processes) the run spawns (1: no data parallelism)",
        "backend": "process-group backend (auto: gloo on CPU, nccl on CUDA)",
        "bucket_cap_mb": "DDP's gradient bucket size in MB: larger buckets mean fewer, larger all-reduces",
        "grad_accum_steps": "micro-batches per optimizer step (gradient accumulation, also in one process; all but "
                            "the last skip the all-reduce): effective batch = batch x ranks x this",
        "timeout_s": "seconds any collective may wait: a dead or hung rank ends the job with one line naming it",
        "shard": "how ranks split the training data: batch (every rank slices the same shuffled global batch) or "
                 "a shard of the split per rank, cut contiguous, strided or by hash (needs --world-size > 1)",
        "shard_order": "the order the shards are cut from: the split as stored (time order for ctr) or sorted by "
                       "label (needs --ddp-shard other than batch)",
    }

    world_size: int = 1
    backend: str = "auto"
    bucket_cap_mb: float = 25.0
    grad_accum_steps: int = 1
    timeout_s: float = 300.0
    shard: str = "batch"
    shard_order: str = "stored"

    def __post_init__(self) -> None:
        check_int(self._name("world_size"), self.world_size, lo=1, hi=4096)
        check_choice(self._name("backend"), self.backend, self.BACKENDS)
        check_float(self._name("bucket_cap_mb"), self.bucket_cap_mb, lo=0.0, hi=4096.0, lo_open=True)
        check_int(self._name("grad_accum_steps"), self.grad_accum_steps, lo=1, hi=4096)
        check_float(self._name("timeout_s"), self.timeout_s, lo=0.0, hi=86_400.0, lo_open=True)
        check_choice(self._name("shard"), self.shard, self.SHARDS)
        check_choice(self._name("shard_order"), self.shard_order, self.SHARD_ORDERS)
        if self.shard != "batch" and self.world_size < 2:
            fail(self._name("shard"), self.shard, "needs ddp.world_size > 1 (--world-size): one rank has no shards")
        if self.shard_order != "stored" and self.shard == "batch":
            fail(self._name("shard_order"), self.shard_order, "needs ddp.shard other than 'batch': a sliced "
                 "global batch is shuffled over the whole split, so the order it is cut from does not matter")
        self._refuse_when_off()

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
    HELP: ClassVar[dict[str, str]] = {
        "fused_optimizer": "one fused Adam / SGD kernel instead of a loop of small ones",
        "fast_kernels": "the workload's faster implementation of the same model (e.g. ctr's gather-based "
                        "embedding lookups)",
        "compile": "torch.compile the training forward (its compile time counts in the training time)",
    }

    fused_optimizer: bool = False
    fast_kernels: bool = False
    compile: bool = False

    def __post_init__(self) -> None:
        for attr in ("fused_optimizer", "fast_kernels", "compile"):
            check_bool(self._name(attr), getattr(self, attr))

    @property
    def enabled(self) -> bool:
        return self.fused_optimizer or self.fast_kernels or self.compile


#: Family name -> its config class. A family whose config lives in a module of its own registers it there
#: (lab/config/memory.py).
FAMILIES: dict[str, type[_Family]] = {
    "data": DataConfig, "precision": PrecisionConfig, "prune": PruneConfig, "quant": QuantConfig,
    "ddp": DDPConfig, "compute": ComputeConfig,
}
