"""The doctor's diagnoses kept in the results store, so a prediction outlives the page or the command that made
it: the dashboard's Doctor tab lost its diagnosis on every reload, and ``python -m lab recommend`` could not see
one made by ``python -m lab doctor``. One row per diagnosis (its workload, size, machine and time, and its
:meth:`~lab.doctor.diagnosis.Diagnosis.to_dict`); the recommendation card reads the newest of its workload and size
measured on this machine (:func:`last_diagnosis`), as a :class:`StoredDiagnosis`: what the card needs, not the
profiled run behind it. The Doctor page's background job (:mod:`lab.doctor.jobs`) stores its diagnosis here too and
keeps the row's id; the page reads it back whole (:func:`diagnosis_by_id`: breakdowns, skipped, advice, config) after
a reload, and the verification job verifies it."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lab.doctor.amdahl import Prediction
from lab.doctor.risk import prescription

if TYPE_CHECKING:
    from lab.doctor.diagnosis import Diagnosis
    from lab.store import ResultStore

_SCHEMA = ("CREATE TABLE IF NOT EXISTS diagnoses (id INTEGER PRIMARY KEY AUTOINCREMENT, workload TEXT NOT NULL, "
           "size TEXT NOT NULL, hardware_id TEXT NOT NULL, threads INTEGER, created REAL NOT NULL, "
           "diagnosis_json TEXT NOT NULL)")


@dataclass(frozen=True)
class StoredCfg:
    """The configuration a stored diagnosis was made for, as far as the card reads it."""

    workload: str
    size: str
    threads: int | None = None


@dataclass(frozen=True)
class StoredDiagnosis:
    """A diagnosis read back from the store: its predictions, rates' source and machine (the card's inputs)."""

    cfg: StoredCfg
    hardware_id: str
    rate_source: str
    predictions: list[Prediction] = field(default_factory=list)
    created: float = 0.0
    #: the rest of :meth:`~lab.doctor.diagnosis.Diagnosis.to_dict`, read by :func:`diagnosis_by_id` (the page's
    #: figures): the row's id, the breakdowns (``Breakdown.to_dict()``), what was left out and why, the advice, and
    #: the run's config (``RunConfig.to_dict()``; None for a diagnosis stored before it was kept)
    id: int | None = None
    train: dict[str, Any] | None = None
    inference: dict[str, Any] | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None
    #: the run its ranking is for (``{"steps", "step_ms", "what"}``; None for one stored before it was kept)
    run: dict[str, Any] | None = None
    #: the profiled baseline's contention warning ("" when it ran quiet): set, nothing was prescribed
    busy: str = ""

    def top(self, axis: str = "train_step") -> Prediction | None:
        """The prescribed pick on ``axis`` (None: nothing pays beyond noise), as ``Diagnosis.top``."""
        return prescription(self.predictions, axis)

    def age_text(self) -> str:
        minutes = max(0.0, time.time() - self.created) / 60
        return f"{minutes:.0f} min ago" if minutes < 120 else f"{minutes / 60:.0f} h ago"


def save_diagnosis(store: ResultStore, d: Diagnosis) -> int:
    """Keep ``d`` in ``store`` (its own table, created on first use); returns its row id."""
    row = (d.cfg.workload_spec or d.cfg.workload, d.cfg.size, d.hardware_id, d.cfg.threads, time.time(),
           json.dumps(d.to_dict(), default=str))
    with store.transaction() as conn:
        conn.execute(_SCHEMA)
        cur = conn.execute("INSERT INTO diagnoses (workload, size, hardware_id, threads, created, diagnosis_json) "
                           "VALUES (?, ?, ?, ?, ?, ?)", row)
        return int(cur.lastrowid)


def keep(d: Diagnosis, store_path: str | None = None) -> str | None:
    """Save ``d`` in the store at ``store_path`` (default: ``$LAB_RESULTS_DB`` or ``results/lab.sqlite``); a
    store that cannot be written is a warning (returned), never the end of a diagnosis that already ran."""
    from lab.store import ResultStore

    try:
        with ResultStore(store_path) as store:
            save_diagnosis(store, d)
    except (ValueError, OSError, sqlite3.Error) as exc:
        return f"the diagnosis was not stored ({exc}): the recommendation card will not see it"
    return None


def _prediction(data: dict[str, Any]) -> Prediction:
    known = {f.name for f in dataclasses.fields(Prediction)}
    return Prediction(**{k: v for k, v in data.items() if k in known})


def _stored(row: tuple) -> StoredDiagnosis:
    did, workload, size, hardware_id, threads, created, text = row
    data = json.loads(text)
    return StoredDiagnosis(cfg=StoredCfg(workload, size, threads), hardware_id=hardware_id,
                           rate_source=str(data.get("rate_source") or "stored"), created=float(created),
                           predictions=[_prediction(p) for p in data.get("predictions") or []], id=int(did),
                           train=data.get("train"), inference=data.get("inference"),
                           skipped=dict(data.get("skipped") or {}), advice=list(data.get("advice") or []),
                           config=data.get("config"), run=data.get("run"), busy=str(data.get("busy") or ""))


_FIELDS = "id, workload, size, hardware_id, threads, created, diagnosis_json"


def diagnosis_by_id(store: ResultStore, diagnosis_id: int) -> StoredDiagnosis | None:
    """The stored diagnosis with row id ``diagnosis_id`` (None: not in this store)."""
    try:
        rows = store.query(f"SELECT {_FIELDS} FROM diagnoses WHERE id = ?", (int(diagnosis_id),))
    except sqlite3.OperationalError:  # a store that never held a diagnosis
        return None
    return _stored(rows[0]) if rows else None


def last_diagnosis(store: ResultStore, workload: str, size: str, hardware_id: str) -> StoredDiagnosis | None:
    """The newest diagnosis of ``workload`` at ``size`` made on ``hardware_id`` (None: none stored)."""
    try:
        rows = store.query(f"SELECT {_FIELDS} FROM diagnoses WHERE workload = ? AND size = ? AND hardware_id = ? "
                           "ORDER BY created DESC LIMIT 1", (workload, size, hardware_id))
    except sqlite3.OperationalError:  # a store that never held a diagnosis
        return None
    return _stored(rows[0]) if rows else None


__all__ = ["StoredCfg", "StoredDiagnosis", "diagnosis_by_id", "keep", "last_diagnosis", "save_diagnosis"]
