"""Data-parallel training and gradient accumulation: the distributed family's config (``RunConfig.ddp``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_choice, check_float, check_int, fail
from lab.config.family import _Family


@dataclass(frozen=True, kw_only=True)
class DDPConfig(_Family):
    """Data-parallel training: ranks, process-group backend, gradient bucketing and accumulation."""

    family: ClassVar[str] = "ddp"
    SWITCH: ClassVar[str] = "ddp.world_size > 1 (--world-size) or ddp.grad_accum_steps > 1"
    BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "gloo", "nccl")
    #: ``batch``: every rank slices the same shuffled global batch (the default); the others give each rank its
    #: own shard of the training split (:data:`lab.data.sharding.STRATEGIES`), shuffled inside it.
    SHARDS: ClassVar[tuple[str, ...]] = ("batch", "contiguous", "strided", "hash")
    #: The order the shards are cut from: the split as stored (time order for ctr) or sorted by label.
    SHARD_ORDERS: ClassVar[tuple[str, ...]] = ("stored", "label")
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {
        "backend": BACKENDS, "shard": SHARDS, "shard_order": SHARD_ORDERS}
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
