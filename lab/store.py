"""Results store: one SQLite file, one row per run, the full RunResult as JSON.

Why SQLite: it ships with Python, one file is easy to copy between machines, and its transactions make
each finished run durable on its own: an ablation that is killed (or crashes) keeps every run it had
finished, and a resumed ablation skips them by ``config_hash``. WAL journal mode lets the dashboard read
while an ablation writes. Taught in ``notebooks/06_ablations``.

Durability: ``synchronous=NORMAL`` in WAL mode survives a killed process (committed runs are never lost
or torn); only an OS crash / power loss may drop the last few commits, and never corrupts the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.result import RunResult, to_jsonable

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    started_at  TEXT,
    workload    TEXT,
    status      TEXT,
    label       TEXT,
    config_hash TEXT,
    result_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_workload ON runs(workload);
CREATE INDEX IF NOT EXISTS runs_label ON runs(label);
CREATE INDEX IF NOT EXISTS runs_config_hash ON runs(config_hash);
"""


def default_store_path() -> Path:
    """``$LAB_RESULTS_DB``; else ``<checkout>/results/lab.sqlite`` when running from a source checkout
    (so notebooks, dashboard and CLI share one store); else ``~/.cache/lab/lab.sqlite`` for an install."""
    env = os.environ.get("LAB_RESULTS_DB")
    if env:
        return Path(env).expanduser()
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file():
        return root / "results" / "lab.sqlite"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "lab" / "lab.sqlite"


def check_file_target(path: Path, what: str, example: str) -> None:
    """Refuse a path that cannot become a file, as one line: a folder (``example`` is a file name to
    suggest) or a path under a regular file. Shared by the store, ``export`` and the CLI's output flags."""
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file path such as {path / example}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{what} {path}: {parent} is a file, not a folder")
            break


def _check_path(path: Path, read_only: bool) -> None:
    """The path problems sqlite3 reports late or cryptically, as one line each."""
    check_file_target(path, "results store", "lab.sqlite")
    if read_only:
        if not path.is_file():
            raise ValueError(f"no results database at {path} (nothing stored yet: `python -m lab run` stores runs)")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"results store {path}: cannot create {path.parent}: {exc.strerror}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"results store {path} is read-only; choose another path (--store or LAB_RESULTS_DB)")
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise ValueError(f"results store {path}: the folder {path.parent} is not writable")


#: Columns of the ``runs`` table (a database whose ``runs`` table lacks one is not a lab store).
RUN_COLUMNS = ("run_id", "started_at", "workload", "status", "label", "config_hash", "result_json")


def _check_schema(conn: sqlite3.Connection, path: Path, read_only: bool) -> bool:
    """Refuse a SQLite file that belongs to something else before anything is written into it: a ``runs``
    table without the lab's columns, another application's tables without one, a newer schema version.
    Returns whether the ``runs`` table exists."""
    tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                    if not r[0].startswith("sqlite_"))
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if "runs" in tables:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        missing = [c for c in RUN_COLUMNS if c not in cols]
        if missing:
            raise ValueError(f"results store {path} is not a lab results database: its table 'runs' lacks column "
                             f"{missing[0]!r}; give another file (--store or LAB_RESULTS_DB)")
    elif tables:
        raise ValueError(f"results store {path} is another application's SQLite database (tables: "
                         f"{', '.join(tables[:5])}{', ...' if len(tables) > 5 else ''}); the lab will not write into "
                         "it: give another file (--store or LAB_RESULTS_DB)")
    if version > SCHEMA_VERSION:
        raise ValueError(f"results store {path} has schema version {version}, newer than this lab's "
                         f"{SCHEMA_VERSION}: update the lab")
    return "runs" in tables


def _sqlite_reason(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return "the file is not a SQLite results database"
    if "readonly" in text:
        return "it is read-only"
    return text


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of canonical JSON (sorted keys, compact, tuples as lists): equal configs -> equal hashes
    across processes and machines, which is what resume needs."""
    canonical = json.dumps(to_jsonable(config), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _where(**filters: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for column, value in filters.items():
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class ResultStore:
    """Append-mostly store of RunResults. Thread-safe within a process (one connection behind a lock);
    several processes may read and write the same file (WAL + busy timeout)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, timeout_s: float = 30.0,
                 read_only: bool = False) -> None:
        """Open (and, unless ``read_only``, create) the store. Every problem with the path (a folder, a
        file that is not SQLite, no write permission, a parent that is a file, no database to read) is a
        ``ValueError`` naming the path, raised here: a run opens its store before training, so a bad path
        never costs a finished result."""
        self.path = Path(path) if path is not None else default_store_path()
        self.read_only = read_only
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        in_memory = str(self.path) == ":memory:"
        if not in_memory:
            _check_path(self.path, read_only)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves so each run is exactly one transaction.
            target, uri = (f"file:{self.path}?mode=ro", True) if read_only else (str(self.path), False)
            self._conn = sqlite3.connect(target, timeout=timeout_s, isolation_level=None, check_same_thread=False,
                                         uri=uri)
            conn = self._conn
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            has_runs = in_memory or _check_schema(conn, self.path, read_only)  # not a database -> an error here
            if read_only:
                if not has_runs:  # an empty SQLite file: no runs; a TEMP table keeps the file untouched
                    conn.execute(_SCHEMA.split(";")[0].replace("CREATE TABLE", "CREATE TEMP TABLE"))
                return
            if not in_memory:
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            with self._transaction() as c:
                for statement in filter(str.strip, _SCHEMA.split(";")):  # executescript would COMMIT early
                    c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            self.close()
            raise ValueError(f"results store {self.path} cannot be {'read' if read_only else 'written'}: "
                             f"{_sqlite_reason(exc)}") from None

    # ------------------------------------------------------------------------------ plumbing

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"ResultStore({self.path}) is closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT under the lock; ROLLBACK on any error. IMMEDIATE takes the write
        lock up front so two writers queue on the busy timeout instead of failing at COMMIT."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One write transaction on the store's connection, for modules that keep their own small table
        next to ``runs`` (the dashboard jobs' lock, :mod:`lab.jobs`)."""
        return self._transaction()

    def query(self, sql: str, params: list[Any] | tuple = ()) -> list[tuple]:
        """Rows of one read statement under the store's lock."""
        return self._query(sql, params)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    def _query(self, sql: str, params: list[Any] | tuple = ()) -> list[tuple]:
        with self._lock:
            return self.conn.execute(sql, params).fetchall()

    # ------------------------------------------------------------------------------ writing

    def add(self, result: RunResult, label: str | None = None) -> None:
        """Write one run in one transaction (an upsert: re-adding a run_id replaces it)."""
        payload = result.to_json()  # serialise before touching the db: a bad record never half-writes
        row = (
            result.run_id,
            result.started_at,
            result.workload or (result.config or {}).get("workload", ""),
            result.status,
            label,
            config_hash(result.config or {}),
            payload,
        )
        with self._transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO runs (run_id, started_at, workload, status, label, config_hash,"
                " result_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )

    def delete(self, run_id: str) -> bool:
        """Remove one run; True if it existed."""
        with self._transaction() as c:
            return c.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount > 0

    # ------------------------------------------------------------------------------ reading

    def get(self, run_id: str) -> RunResult:
        rows = self._query("SELECT result_json FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        return RunResult.from_json(rows[0][0])

    def _rows(
        self, workload: str | None, label: str | None, status: str | None, config_hash: str | None = None
    ) -> list[tuple]:
        where, params = _where(workload=workload, label=label, status=status, config_hash=config_hash)
        return self._query(
            f"SELECT result_json, label, config_hash FROM runs{where} ORDER BY started_at, rowid", params
        )

    def list_results(
        self, workload: str | None = None, label: str | None = None, status: str | None = None
    ) -> list[RunResult]:
        """Runs matching all given filters, oldest first."""
        return [RunResult.from_json(r[0]) for r in self._rows(workload, label, status)]

    def iter_labelled(
        self, workload: str | None = None, label: str | None = None, status: str | None = None
    ) -> Iterator[tuple[RunResult, str | None, str]]:
        """(result, label, config_hash) triples, for callers that need the store's own columns."""
        for text, lab, h in self._rows(workload, label, status):
            yield RunResult.from_json(text), lab, h

    def count(
        self,
        workload: str | None = None,
        label: str | None = None,
        status: str | None = None,
        config_hash: str | None = None,
    ) -> int:
        where, params = _where(workload=workload, label=label, status=status, config_hash=config_hash)
        return int(self._query(f"SELECT COUNT(*) FROM runs{where}", params)[0][0])

    def has(self, config_hash: str, *, label: str | None = None, status: str | None = "ok") -> bool:
        """True if a run with this config hash (and label) finished with ``status`` (any if None):
        lets a resumed ablation skip work it already did."""
        return self.count(label=label, status=status, config_hash=config_hash) > 0

    def labels(self) -> list[str]:
        return [r[0] for r in self._query("SELECT DISTINCT label FROM runs WHERE label IS NOT NULL")]

    def load_runs(
        self, workload: str | None = None, label: str | None = None, status: str | None = None
    ) -> pd.DataFrame:
        """One row per run (``RunResult.summary()`` + ``label`` + ``config_hash``), oldest first. An empty
        store gives an empty DataFrame that still has the standard columns, so callers can filter it."""
        import pandas as pd  # lab core must import without pandas cost

        rows = []
        for result, lab, h in self.iter_labelled(workload, label, status):
            row = result.summary()
            row["label"] = lab
            row["config_hash"] = h
            rows.append(row)
        if not rows:
            return pd.DataFrame(columns=empty_columns())
        return pd.DataFrame(rows)

    def export_csv(
        self,
        path: str | os.PathLike[str],
        workload: str | None = None,
        label: str | None = None,
        status: str | None = None,
    ) -> Path:
        """Write ``load_runs(...)`` as CSV (for spreadsheets or another tool); returns the path. A target
        that is a folder or cannot be written is a ``ValueError`` naming it, checked before reading."""
        out = Path(path)
        check_file_target(out, "export target", "runs.csv")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "a"):
                pass
        except OSError as exc:
            raise ValueError(f"export target {out} cannot be written: {exc.strerror}") from None
        self.load_runs(workload, label, status).to_csv(out, index=False)
        return out


def empty_columns() -> list[str]:
    """Columns every ``load_runs`` frame has (config and per-phase columns depend on the runs)."""
    return [*RunResult(run_id="", config={}, env={}).summary(), "label", "config_hash"]
