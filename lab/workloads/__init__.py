"""Workloads: the seeds' three models on data that needs no download, behind one registry.

Importing this package registers the built-ins ``ctr`` (DLRM on a planted click log), ``sequence`` (LSTM on
ordered events) and ``vision`` (ResNet on real MNIST digits) through ``register_workload``, the same door a
user's own workload goes through. Notebook: ``notebooks/00_tour.ipynb``.
"""

from __future__ import annotations

from . import ctr, sequence, vision
from .base import Datasets, SizeSpec, Workload, get_workload, list_workloads, register_workload

__all__ = ["Datasets", "SizeSpec", "Workload", "get_workload", "list_workloads", "register_workload"]

for _module in (ctr, sequence, vision):
    # overwrite=True keeps importlib.reload(lab.workloads) idempotent; a user's duplicate still raises.
    register_workload(_module.WORKLOAD, overwrite=True)
del _module
