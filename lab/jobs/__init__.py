"""A dashboard job's lock and progress: one job per key at a time, and where a running one stands: a row per
key in the store's ``jobs`` table (owner pid, token, heartbeat, status, progress state, cancel flag, the job's
spec). Its worker process is started by :func:`lab.jobs.launch.start`.

Why in the store: the dashboard reruns its script on every click and a browser reload starts a new
session, so nothing that lives in a session can tell whether a job is already running. The store is
the one place every process (the dashboard, its worker, a CLI run) shares: a second request for a live key
is refused (or joins it), a reload finds the live job and shows its progress, and Cancel is a flag the
worker reads between steps. A job whose owner died stops beating; after :data:`STALE_S` without a beat (or
at once when its pid is gone on this host) its lock expires and the next claim takes over.

Why a package of its own, below the ablation and the doctor: both run jobs this way (an ablation, a batch of
named runs, a machine card by :mod:`lab.ablation.worker`; a diagnosis and its verification by
:mod:`lab.doctor.jobs`), so the lock and the launcher belong to neither. A job has a kind (its spec's
``"kind"``): an ablation (the default), a batch of named runs (:data:`lab.ablation.worker.BATCH`, the dashboard's
data-loading measurement), a machine-card measurement (:data:`lab.ablation.worker.MACHINE`, the Machine page's)
or the doctor's; a page re-attaches only to jobs of its own kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from lab.store import ResultStore

#: Seconds without a heartbeat after which a job's lock has expired.
STALE_S = 30.0
#: Seconds between heartbeats (written by a thread, so a long compile still beats).
BEAT_S = 1.0
#: Job statuses that hold the lock while the heartbeat is fresh.
LIVE = ("starting", "running")
#: The kind of a job whose spec names none (every job before kinds existed was an ablation).
ABLATION = "ablation"

_SCHEMA = ("CREATE TABLE IF NOT EXISTS jobs (key TEXT PRIMARY KEY, token TEXT NOT NULL, pid INTEGER, host TEXT, "
           "status TEXT, started REAL, heartbeat REAL, cancel INTEGER DEFAULT 0, state_json TEXT, spec_json TEXT)")
_COLUMNS = ("key", "token", "pid", "host", "status", "started", "heartbeat", "cancel", "state_json", "spec_json")


class AlreadyRunning(ValueError):
    """Another live process holds this ablation's lock (its message says which, and what to do)."""


class Cancelled(BaseException):
    """Raised between steps or runs of a job whose Cancel was pressed. A BaseException, so a run's
    ``on_error="record"`` does not turn it into an error row: a cancelled run is never stored."""


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _row(values: tuple) -> dict[str, Any]:
    job = dict(zip(_COLUMNS, values, strict=True))
    job["state"] = json.loads(job.pop("state_json") or "{}")
    job["spec"] = json.loads(job.pop("spec_json") or "null")
    job["cancel"] = bool(job["cancel"])
    job["age_s"] = time.time() - (job["heartbeat"] or 0.0)
    job["live"] = is_live(job)
    job["kind"] = job["spec"].get("kind", ABLATION) if isinstance(job["spec"], dict) else ABLATION
    return job


def is_live(job: dict[str, Any], stale_s: float | None = None) -> bool:
    """Holds the lock: a live status, a fresh heartbeat, and (on this host) an owner that still exists."""
    stale_s = STALE_S if stale_s is None else stale_s
    if job["status"] not in LIVE or time.time() - (job["heartbeat"] or 0.0) > stale_s:
        return False
    return job["host"] != socket.gethostname() or _pid_alive(job["pid"])


def _select(conn_or_store: Any, where: str, params: tuple) -> list[dict[str, Any]]:
    sql = f"SELECT {', '.join(_COLUMNS)} FROM jobs {where}"
    try:
        rows = (conn_or_store.query(sql, params) if isinstance(conn_or_store, ResultStore)
                else conn_or_store.execute(sql, params).fetchall())
    except sqlite3.OperationalError:  # a store without the table (read-only, or never ran a job)
        return []
    return [_row(r) for r in rows]


def job(store: ResultStore, key: str) -> dict[str, Any] | None:
    """The job row of ``key`` (``state``, ``spec``, ``live``, ``age_s`` decoded), or None."""
    rows = _select(store, "WHERE key = ?", (key,))
    return rows[0] if rows else None


def live_jobs(store: ResultStore, kind: str | None = None) -> list[dict[str, Any]]:
    """Jobs that hold their lock now, newest first (what a reloaded page re-attaches to); only those of
    ``kind`` (the spec's ``"kind"``, :data:`ABLATION` when it names none) unless it is None."""
    return [j for j in _select(store, "ORDER BY started DESC", ()) if j["live"] and kind in (None, j["kind"])]


def latest_job(store: ResultStore, kind: str | None = None) -> dict[str, Any] | None:
    """The most recently started job (of ``kind``, unless None), whatever its status (what a page shows
    after a reload)."""
    if kind is None:
        rows = _select(store, "ORDER BY started DESC LIMIT 1", ())
    else:
        rows = [j for j in _select(store, "ORDER BY started DESC", ()) if j["kind"] == kind][:1]
    return rows[0] if rows else None


def recent_jobs(store: ResultStore, kind: str | None = None) -> list[dict[str, Any]]:
    """Every job (of ``kind``, unless None), the most recently started first, whatever its status."""
    return [j for j in _select(store, "ORDER BY started DESC", ()) if kind in (None, j["kind"])]


def done_jobs(store: ResultStore, workload: str, size: str, kind: str = ABLATION) -> Iterator[dict[str, Any]]:
    """The jobs of ``kind`` that ended ``done`` with a baseline of ``workload`` at ``size``, the most recently
    started first (what the recommendation card chooses its measurement from)."""
    for j in _select(store, "WHERE status = 'done' ORDER BY started DESC", ()):
        base = (j["spec"] or {}).get("baseline") or {} if isinstance(j["spec"], dict) else {}
        if j["kind"] == kind and base.get("workload") == workload and base.get("size") == size:
            yield j


def latest_done(store: ResultStore, workload: str, size: str, kind: str = ABLATION) -> dict[str, Any] | None:
    """The first of :func:`done_jobs`, or None."""
    return next(done_jobs(store, workload, size, kind), None)


def claim(store: ResultStore, key: str, spec: dict[str, Any] | None = None) -> str:
    """Take ``key``'s lock for this process and return its token; :class:`AlreadyRunning` when a live job
    holds it. Check and write are one ``BEGIN IMMEDIATE`` transaction, so two claims never both win."""
    token = uuid.uuid4().hex
    now = time.time()
    with store.transaction() as conn:
        conn.execute(_SCHEMA)
        held = _select(conn, "WHERE key = ?", (key,))
        if held and held[0]["live"]:
            j = held[0]
            raise AlreadyRunning(f"{j['kind']} {key} is already running (pid {j['pid']} on {j['host']}, last heartbeat "
                                 f"{j['age_s']:.0f} s ago): wait for it, join it, or cancel it")
        conn.execute(f"INSERT OR REPLACE INTO jobs ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                     (key, token, os.getpid(), socket.gethostname(), "starting", now, now, "{}",
                      json.dumps(spec) if spec is not None else None))
    return token


def _update(store: ResultStore, key: str, token: str, sets: str, params: tuple) -> bool:
    with store.transaction() as conn:
        conn.execute(_SCHEMA)
        return conn.execute(f"UPDATE jobs SET {sets} WHERE key = ? AND token = ?",
                            (*params, key, token)).rowcount > 0


def adopt(store: ResultStore, key: str, token: str) -> None:
    """The worker process takes over the lock its launcher claimed (its pid now owns it)."""
    if not _update(store, key, token, "pid = ?, host = ?, status = 'running', heartbeat = ?",
                   (os.getpid(), socket.gethostname(), time.time())):
        raise AlreadyRunning(f"ablation {key}: the lock with token {token[:8]} is no longer held (expired and taken)")


def beat(store: ResultStore, key: str, token: str, state: dict[str, Any] | None = None) -> bool:
    """Refresh the heartbeat (and the progress state); returns whether Cancel was requested."""
    sets, params = "heartbeat = ?", (time.time(),)
    if state is not None:
        sets, params = sets + ", state_json = ?", (*params, json.dumps(state))
    _update(store, key, token, sets, params)
    rows = store.query("SELECT cancel FROM jobs WHERE key = ? AND token = ?", (key, token))
    return bool(rows and rows[0][0])


def finish(store: ResultStore, key: str, token: str, status: str, state: dict[str, Any] | None = None) -> None:
    """Release the lock with a final status (``done``, ``cancelled``, ``error``) and state."""
    sets, params = "status = ?, heartbeat = ?", (status, time.time())
    if state is not None:
        sets, params = sets + ", state_json = ?", (*params, json.dumps(state))
    _update(store, key, token, sets, params)


def request_cancel(store: ResultStore, key: str) -> bool:
    """Ask ``key``'s live job to stop (it stops before its next step); False if none is live."""
    j = job(store, key)
    if j is None or not j["live"]:
        return False
    return _update(store, key, j["token"], "cancel = 1", ())


class Heartbeat:
    """A thread that writes the latest ``state`` and the heartbeat every :data:`BEAT_S` (so a compile that
    emits no step still beats) and turns a Cancel request into ``cancelled`` (checked by :meth:`check`)."""

    def __init__(self, store: ResultStore, key: str, token: str, period_s: float = BEAT_S) -> None:
        self.store, self.key, self.token, self.period_s = store, key, token, period_s
        self.state: dict[str, Any] = {}
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat {key}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.write()

    def write(self) -> None:
        try:
            if beat(self.store, self.key, self.token, dict(self.state)):
                self.cancelled.set()
        except (sqlite3.Error, ValueError, RuntimeError):  # a busy or closed store: the next beat retries
            pass

    def check(self) -> None:
        """Raise :class:`Cancelled` if Cancel was pressed (called between steps and runs)."""
        if self.cancelled.is_set():
            raise Cancelled(self.key)

    def __enter__(self) -> Heartbeat:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def holding(store: ResultStore, key: str, token: str | None = None,
            spec: dict[str, Any] | None = None) -> Iterator[Heartbeat]:
    """Hold ``key``'s lock for the block (claimed here, or adopted when ``token`` came from a launcher),
    with a heartbeat; released as ``done``, ``cancelled`` (Cancel, Ctrl-C) or ``error`` with its message."""
    if token is None:
        token = claim(store, key, spec)
    adopt(store, key, token)
    hb = Heartbeat(store, key, token)
    status, error = "done", None
    try:
        with hb:
            yield hb
    except (Cancelled, KeyboardInterrupt):
        status = "cancelled"
        raise
    except BaseException as exc:
        status, error = "error", f"{type(exc).__name__}: {exc}"
        raise
    finally:
        finish(store, key, token, status, {**hb.state, **({"error": error} if error else {})})


__all__ = ["ABLATION", "AlreadyRunning", "Cancelled", "Heartbeat", "LIVE", "STALE_S", "adopt", "beat", "claim",
           "done_jobs", "finish", "holding", "is_live", "job", "latest_done", "latest_job", "live_jobs", "recent_jobs",
           "request_cancel"]
