"""Training-efficiency lab: measure which technique makes *your* training faster, and what it costs.

Public API (re-exports only)::

    from lab import RunConfig, run
    result = run(RunConfig(workload="ctr", size="tiny"))
    print(result.summary())

The layers, top to bottom, as import-linter checks them (``make quality``; the contracts are in pyproject.toml):
``cli`` -> ``plots`` -> ``doctor`` -> ``portable`` -> ``bench`` / ``recipes`` / ``crossover`` -> ``ablation`` ->
``train`` -> ``profiling`` -> the technique packages ``compute``, ``data``, ``distributed``, ``memory``,
``precision``, ``pruning``, ``quant`` -> ``context`` -> ``technique`` -> ``timed`` -> ``loop`` / ``jobs`` ->
``store`` -> ``result`` -> ``config`` -> ``workloads`` -> ``registry`` -> ``measure``. A module imports only from
its own layer or below; the modules of one layer (``/``, and the technique packages) do not import each other,
and no package's modules import in a circle.
``teach`` (the notebooks' helpers) is outside the layers and unchecked, as is ``dashboard`` outside the package.
Start with notebooks/00_tour.ipynb; ``python -m lab --help`` for the command line.
"""

# Each technique package registers its lab.technique.Technique in lab.registry.FAMILIES when imported.
from lab import compute, data, distributed, memory, precision, pruning, quant  # noqa: F401
from lab.ablation import Ablation, run_ablation
from lab.config import (
    ComputeConfig,
    DataConfig,
    DDPConfig,
    MemoryConfig,
    PrecisionConfig,
    PruneConfig,
    QuantConfig,
    RunConfig,
)
from lab.context import TrainContext, prepare
from lab.result import RunResult
from lab.store import ResultStore, default_store_path
from lab.train import run  # importing lab.train imports every technique package, which registers itself
from lab.workloads import Datasets, SizeSpec, Workload, get_workload, list_workloads, register_workload

__all__ = [
    "Ablation", "ComputeConfig", "DDPConfig", "DataConfig", "Datasets", "MemoryConfig", "PrecisionConfig",
    "PruneConfig", "QuantConfig", "ResultStore", "RunConfig", "RunResult", "SizeSpec", "TrainContext", "Workload",
    "default_store_path", "get_workload", "list_workloads", "prepare", "register_workload", "run", "run_ablation",
]
