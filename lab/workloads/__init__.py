"""Workloads: the seeds' three models and a Transformer, on data that needs no download, behind one registry.

Importing this package registers the built-ins ``ctr`` (DLRM on a planted click log), ``sequence`` (LSTM on
ordered events), ``vision`` (ResNet on real MNIST digits), ``transformer`` (an encoder on ordered token
streams) and ``mlp`` (a plain MLP on teacher-labelled rows: the crossover map's dense reference) through
``register_workload``, the same door a user's own workload goes through, from Python, from a spec
(``module:NAME`` / ``file.py:NAME``, see :mod:`.spec`), from ``LAB_WORKLOADS`` or from a ``lab.workloads``
entry point. Each built-in has a model-size ladder (``Workload.scales``).
Notebooks: ``notebooks/00_tour.ipynb``, ``notebooks/07_scale.ipynb``; docs/workloads.md "Bring your own workload".
"""

from __future__ import annotations

from . import base, ctr, mlp, sequence, transformer, vision
from .base import SCALE_NAMES, Datasets, Rung, SizeSpec, Workload, register_workload, registered
from .contract import FirstOutput
from .spec import ENV_VAR, is_spec, load_environment, load_spec, spec_of

__all__ = ["ENV_VAR", "SCALE_NAMES", "Datasets", "FirstOutput", "Rung", "SizeSpec", "Workload", "get_workload",
           "is_spec", "list_workloads", "load_spec",
           "register_workload", "registered", "spec_of"]


def get_workload(name: str) -> Workload:
    """The workload registered as ``name`` (``LAB_WORKLOADS`` and entry points loaded first), or the one a
    spec ``module:NAME`` / ``file.py:NAME`` names; an unknown name raises ``ValueError`` listing the known."""
    load_environment()
    if is_spec(name) and base.registered(name) is None:
        names = load_spec(name)
        if len(names) != 1:
            raise ValueError(f"workload spec {name!r} names {len(names)} workloads ({', '.join(names)}); "
                             "name one: MODULE:NAME of a single Workload")
        name = names[0]
    return base.get_workload(name)


def list_workloads() -> list[str]:
    """Registered workload names, sorted (``LAB_WORKLOADS`` and entry points loaded first)."""
    load_environment()
    return base.list_workloads()

for _module in (ctr, mlp, sequence, transformer, vision):
    # overwrite=True keeps importlib.reload(lab.workloads) idempotent; a user's duplicate still raises.
    register_workload(_module.WORKLOAD, overwrite=True)
del _module
