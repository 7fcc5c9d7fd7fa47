"""Training-efficiency lab: measure which technique makes *your* training faster, and what it costs.

Public API (re-exports only)::

    from lab import RunConfig, run
    result = run(RunConfig(workload="ctr", size="tiny"))
    print(result.summary())

Start with notebooks/00_tour.ipynb; ``python -m lab --help`` for the command line.
"""

from lab.ablation import Ablation, run_ablation
from lab.config import ComputeConfig, DataConfig, DDPConfig, PrecisionConfig, PruneConfig, QuantConfig, RunConfig
from lab.result import RunResult
from lab.store import ResultStore, default_store_path
from lab.train import NotImplementedYet, run
from lab.workloads import Datasets, SizeSpec, Workload, get_workload, list_workloads, register_workload

__all__ = [
    "Ablation", "ComputeConfig", "DDPConfig", "DataConfig", "Datasets", "NotImplementedYet", "PrecisionConfig",
    "PruneConfig",
    "QuantConfig", "ResultStore", "RunConfig", "RunResult", "SizeSpec", "Workload", "default_store_path",
    "get_workload", "list_workloads", "register_workload", "run", "run_ablation",
]
