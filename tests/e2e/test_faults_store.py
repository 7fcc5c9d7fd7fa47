"""The fault suite (issue 17; helpers in faults_common.py), the results store: a bad, foreign, read-only or newer-
schema database, read commands that write nothing, export and ablation CSV targets checked before any run."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from faults_common import assert_one_line, cli, snapshot, store_with_runs, stored_runs


def _foreign_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER, amount REAL)")
    conn.commit()
    conn.close()


def _wrong_runs_table(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()


def _newer_schema(path: Path) -> None:
    store_with_runs(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()


STORE_BAD = [  # (name, how to make the bad store file (None: put it under a plain file), needle)
    ("folder", lambda p: p.mkdir(), "is a folder"),
    ("not-sqlite", lambda p: p.write_text("these are my notes, not a database\n" * 20), "not a SQLite"),
    ("parent-is-a-file", None, "is a file, not a folder"),
    ("foreign-sqlite", _foreign_db, "another application's SQLite database"),
    ("runs-table-of-another-shape", _wrong_runs_table, "lacks column 'run_id'"),
    ("newer-schema", _newer_schema, "schema version 99"),
]


def _bad_store(tmp_path: Path, make) -> tuple[Path, Path]:
    """(the store path to give, the path whose content must not change)."""
    if make is None:
        blocker = tmp_path / "blocker"
        blocker.write_text("a plain file")
        return blocker / "lab.sqlite", blocker
    target = tmp_path / "lab.sqlite"
    make(target)
    return target, target


@pytest.mark.parametrize("command", ["run", "runs", "export", "ablate"])
@pytest.mark.parametrize(("name", "make", "needle"), STORE_BAD, ids=[n for n, _, _ in STORE_BAD])
def test_store_bad_path_is_one_line_exit_2_and_untouched(command, name, make, needle, tmp_path, capsys, no_work):
    path, watched = _bad_store(tmp_path, make)
    before = snapshot(watched)
    argv = {"run": ["run", "--size", "tiny", "--no-progress", "--store", str(path)],
            "runs": ["runs", "--store", str(path)],
            "export": ["export", "--store", str(path), "--out", str(tmp_path / "out.csv")],
            "ablate": ["ablate", "--size", "tiny", "--repeats", "1", "--store", str(path)]}[command]
    rc, _, err = cli(argv, capsys)
    if command == "runs" and name == "parent-is-a-file":  # nothing there to list: not an error
        assert rc == 0
    else:
        assert rc == 2
        assert_one_line(err, str(path) if name != "parent-is-a-file" else str(watched), needle)
    assert snapshot(watched) == before
    assert not (tmp_path / "out.csv").exists()


def test_store_read_only_file_is_refused_for_writing(tmp_path, capsys, monkeypatch, no_work):
    db = store_with_runs(tmp_path / "ro.sqlite")
    before = snapshot(db)
    real_access = os.access
    # chmod means nothing to root (these tests may run as root): the store asks os.access, so deny it here
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == db and mode & os.W_OK
                        else real_access(p, mode, **kw))
    rc, _, err = cli(["run", "--size", "tiny", "--no-progress", "--store", str(db)], capsys)
    assert rc == 2
    assert_one_line(err, str(db), "read-only")
    assert snapshot(db) == before


def test_store_read_only_commands_write_nothing(tmp_path, capsys):
    db = store_with_runs(tmp_path / "lab.sqlite", 3)
    before, runs_before = snapshot(db), stored_runs(db)
    rc, out, _ = cli(["runs", "--store", str(db)], capsys)
    assert rc == 0 and "(3 shown" in out
    rc, out, _ = cli(["export", "--store", str(db), "--out", str(tmp_path / "runs.csv")], capsys)
    assert rc == 0 and "wrote 3 runs" in out
    assert snapshot(db) == before and stored_runs(db) == runs_before


def test_store_empty_sqlite_file_lists_no_runs_and_stays_empty(tmp_path, capsys):
    db = tmp_path / "empty.sqlite"
    db.touch()
    rc, out, _ = cli(["runs", "--store", str(db)], capsys)
    assert rc == 0 and "no runs" in out
    assert db.stat().st_size == 0


def test_store_missing_database_is_not_created_by_read_commands(tmp_path, capsys):
    db = tmp_path / "none.sqlite"
    rc, out, _ = cli(["runs", "--store", str(db)], capsys)
    assert rc == 0 and "no runs" in out
    rc, _, err = cli(["export", "--store", str(db), "--out", str(tmp_path / "out.csv")], capsys)
    assert rc == 2
    assert_one_line(err, str(db), "no results database")
    assert not db.exists() and not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("where", ["folder", "under-a-file"])
def test_store_export_target_problems_are_named_and_nothing_written(where, tmp_path, capsys):
    db = store_with_runs(tmp_path / "lab.sqlite")
    before = snapshot(db)
    if where == "folder":
        out = tmp_path / "exports"
        out.mkdir()
        watched, needle = out, "is a folder"
    else:
        watched = tmp_path / "blocker"
        watched.write_text("x")
        out, needle = watched / "runs.csv", "is a file, not a folder"
    watched_before = snapshot(watched)
    rc, _, err = cli(["export", "--store", str(db), "--out", str(out)], capsys)
    assert rc == 2
    assert_one_line(err, str(out), needle)
    assert snapshot(db) == before and snapshot(watched) == watched_before


@pytest.mark.parametrize("where", ["folder", "under-a-file", "cannot-be-created"])
def test_ablate_csv_target_is_checked_before_any_run(where, tmp_path, capsys, no_work):
    """Including a folder the permission bits allow and the kernel refuses (``/proc`` as root): before, the
    ablation ran and then ended in an OSError traceback."""
    db = tmp_path / "abl.sqlite"
    if where == "folder":
        csv = tmp_path / "tables"
        csv.mkdir()
        needle = "is a folder"
    elif where == "cannot-be-created":
        csv, needle = Path("/proc/lab-no-such-folder/t.csv"), "cannot hold the folder /proc/lab-no-such-folder"
    else:
        (tmp_path / "blocker").write_text("x")
        csv, needle = tmp_path / "blocker" / "t.csv", "is a file, not a folder"
    rc, _, err = cli(["ablate", "--size", "tiny", "--repeats", "1", "--store", str(db), "--csv", str(csv)], capsys)
    assert rc == 2
    assert_one_line(err, "--csv", str(csv), needle)
    assert not db.exists()
