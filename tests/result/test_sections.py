"""A family's figures are filed under its registered name (``details[<family>]``); records stored under the old
keys (``prune``, ``ddp``, ``compile``) read the same through the one alias table (lab.result.sections)."""

from __future__ import annotations

import copy
import re
import sqlite3
from pathlib import Path

import lab
from lab import RunConfig, run
from lab.registry import FAMILIES
from lab.result import RunResult, section
from lab.result.sections import OLD_SECTION_NAMES, in_current_names
from lab.result.timeline import one_off_costs
from lab.store import ResultStore

LAB = Path(lab.__file__).parent
#: A write of a top-level ``details`` key: ``details["x"] =``, ``details.setdefault("x"``, ``details[Cls.name] =``.
WRITE = re.compile(r"details(?:\[\"(\w+)\"\]\s*=(?!=)|\.setdefault\(\"(\w+)\")")

OLD = {  # a record's details as the code wrote them before the sections took the families' names
    "prune": {"method": "l1_unstructured", "amount": 0.5, "macs_ratio": 1.67, "finetune": {"time_s": 3.0},
              "inference": {"speedup": 1.02}},
    "ddp": {"world_size": 2, "effective_batch": 64, "rank": 0},
    "compile": {"compile_s": 2.0, "graphs": 1},
    "precision": {"auto": {"probe_s": 0.5}},
    "data": {"source": "memory"},
}


def _old_record() -> RunResult:
    return RunResult(run_id="old0", workload="toy", config={"workload": "toy"}, env={},
                     details=copy.deepcopy(OLD))


def test_an_old_stored_record_reads_the_same_under_the_family_names(private_store):
    store = ResultStore(private_store)
    store.add(_old_record())
    with sqlite3.connect(private_store) as db:  # the plant is real: the row holds the old keys
        (text,) = db.execute("SELECT result_json FROM runs").fetchone()
    assert '"prune": {' in text and '"ddp": {' in text and '"compile": {' in text
    (loaded,) = store.list_results()
    assert loaded.details["pruning"] == OLD["prune"] and loaded.details["distributed"] == OLD["ddp"]
    assert loaded.details["compute"] == OLD["compile"] and not set(OLD_SECTION_NAMES) & set(loaded.details)
    for old, family in OLD_SECTION_NAMES.items():  # the accessor: a loaded record, a raw old dict, the same
        assert section(loaded, family) == section(OLD, family) == OLD[old]
    assert one_off_costs(OLD) == one_off_costs(loaded.details) == {
        "compile": 2.0, "precision_probe": 0.5, "prune_finetune": 3.0, "total": 5.5}
    assert section(OLD, "quant") == {} and section(None, "pruning") == {}


def test_a_current_key_wins_over_an_old_one_and_other_keys_keep_their_order():
    both = {"data": 1, "prune": {"old": True}, "pruning": {"new": True}, "steps": 2}
    assert in_current_names(both) == {"data": 1, "pruning": {"new": True}, "steps": 2}
    assert section(both, "pruning") == {"new": True}


def test_the_alias_table_points_at_registered_families_and_shadows_none():
    assert set(OLD_SECTION_NAMES.values()) <= set(FAMILIES.names())
    assert not set(OLD_SECTION_NAMES) & set(FAMILIES.names())


def test_every_family_files_its_figures_under_its_registered_name_only():
    """Walks the registry: no module of a family's package writes a top-level ``details`` key that is an old
    section name or another family's name, and the keys the whole lab writes hold no old name."""
    families = set(FAMILIES.names())
    for name in FAMILIES.names():
        written = {k for path in (LAB / name).rglob("*.py") for m in WRITE.finditer(path.read_text())
                   for k in m.groups() if k}
        assert not written & (set(OLD_SECTION_NAMES) | (families - {name})), (name, written)
    everywhere = {k for path in LAB.rglob("*.py") for m in WRITE.finditer(path.read_text()) for k in m.groups() if k}
    assert everywhere and not everywhere & set(OLD_SECTION_NAMES), everywhere


def test_a_run_files_its_sections_under_the_registered_names(toy_workload):
    """A real run with pruning and (single-process) accumulation: its sections are the families' names."""
    cfg = RunConfig(workload="toy", size="tiny", max_steps=4, latency_repeats=0, threads=1, batch_size=16)
    r = run(cfg.with_overrides(**{"prune.method": "l1_unstructured", "prune.amount": 0.5,
                                  "prune.finetune_epochs": 0, "ddp.grad_accum_steps": 2}))
    assert r.status == "ok", r.error
    assert {"pruning", "distributed", "data"} <= set(r.details) and not set(OLD_SECTION_NAMES) & set(r.details)
    assert r.details["pruning"]["sparsity_prunable"] > 0.4 and r.details["distributed"]["effective_batch"] == 32
    assert r.details["techniques"]["pruning"]["macs_ratio"] == r.details["pruning"]["macs_ratio"]
    assert RunResult.from_json(r.to_json()) == r  # a current record round-trips unchanged
