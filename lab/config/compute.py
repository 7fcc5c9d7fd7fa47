"""How the same math is executed: the compute family's config (``RunConfig.compute``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_bool
from lab.config.family import _Family


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
