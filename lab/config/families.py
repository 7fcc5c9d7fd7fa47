"""The families' configs, one module each (``lab/config/<key>.py``), and the table ``RunConfig`` is built from:
``RunConfig.<key>`` holds that family's config; a family that is off is its no-op default."""

from __future__ import annotations

from lab.config.compute import ComputeConfig
from lab.config.data import DataConfig
from lab.config.ddp import DDPConfig
from lab.config.family import _Family
from lab.config.memory import MemoryConfig
from lab.config.precision import PrecisionConfig
from lab.config.prune import PruneConfig
from lab.config.quant import QuantConfig

#: Config key -> its family's config class, in ``RunConfig``'s field order.
FAMILIES: dict[str, type[_Family]] = {
    "data": DataConfig, "precision": PrecisionConfig, "prune": PruneConfig, "quant": QuantConfig,
    "ddp": DDPConfig, "compute": ComputeConfig, "memory": MemoryConfig,
}

__all__ = ["FAMILIES", "ComputeConfig", "DDPConfig", "DataConfig", "MemoryConfig", "PrecisionConfig", "PruneConfig",
           "QuantConfig"]
