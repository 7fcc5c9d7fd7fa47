"""Shared by the fault suite (issue 17; tests/e2e/test_faults_*.py, one file per family): bad input and faults
give one clear line before any work, nothing is lost, nothing is silently ignored.

Every case asserts the exit status (or the exception type), that no traceback reached the user, that the
message names the field, path or rank, and that nothing was written (or that what was written is intact).
Families: CLI flags · API (RunConfig, with hypothesis properties) · user workloads · the results store ·
shards · data-parallel faults · signals. Most CLI cases run in-process (``lab.cli.main``); subprocesses only
where a real process is the point (signals, a killed rank, a dead launcher): each costs seconds (torch import).
The ``no_work`` fixture is in this folder's conftest.py.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch

from lab.cli import main
from lab.result import RunResult
from lab.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"
CUDA = torch.cuda.is_available()


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``main(argv)`` in-process; no traceback may reach stdout or stderr."""
    rc = main(argv)
    cap = capsys.readouterr()
    assert TRACEBACK not in cap.out + cap.err, cap.err
    return rc, cap.out, cap.err


def assert_one_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("lab: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(path: Path) -> object:
    """What is at ``path``: None, a file's hash, or a folder's files and hashes (to compare before/after)."""
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return sorted((str(p.relative_to(path)), snapshot(p)) for p in path.rglob("*"))


def fake_result(i: int = 0) -> RunResult:
    return RunResult(run_id=f"fault{i:04d}", config={"workload": "ctr", "seed": i}, env={"hardware_id": "test"},
                     started_at=f"2026-01-01T00:00:{i:02d}+00:00", workload="ctr", metric_name="auc", metric=0.7)


def store_with_runs(path: Path, n: int = 2) -> Path:
    with ResultStore(path) as store:
        for i in range(n):
            store.add(fake_result(i), label="kept")
    return path


def stored_runs(path: Path) -> list[tuple[str, str]]:
    """(run_id, result_json) of every stored run, read without writing."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return sorted(conn.execute("SELECT run_id, result_json FROM runs").fetchall())
    finally:
        conn.close()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class LabProcess:
    """``python -m lab ...`` in its own session (so a Ctrl-C can go to its whole group, as a terminal's
    does), TMPDIR private (so the spawn folder can be found and checked), stderr read as it comes.

    The private TMPDIR is a short folder in /tmp, not under the test's ``tmp_path``: a DataLoader worker hands
    its batches back through a Unix socket made in TMPDIR, and a socket's path has at most 107 bytes. Under
    pytest-xdist ``tmp_path`` is one folder deeper (``popen-gw0/``), which took it past that: the worker died
    with "AF_UNIX path too long" and the run never reached its first step. Removed when the object is."""

    def __init__(self, argv: list[str]) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="labf-", dir="/tmp" if os.path.isdir("/tmp") else None))
        weakref.finalize(self, shutil.rmtree, self.tmp, True)
        env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        # preexec: a job started in the background (as CI may start this suite) inherits SIGINT *ignored*, and
        # Python then installs no KeyboardInterrupt handler; a terminal's foreground job has the default.
        self.proc = subprocess.Popen([sys.executable, "-m", "lab", *argv], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_default_sigint)
        self._err = bytearray()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):
            self._err += chunk

    @property
    def err(self) -> str:
        return self._err.decode(errors="replace")

    def wait_until(self, predicate, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {self.err}"
            assert time.monotonic() < deadline, f"condition not reached within {timeout} s: {self.err}"
            time.sleep(0.05)

    def ranks(self) -> dict[int, int]:
        """rank -> pid, from the heartbeat files in the spawn folder."""
        out = {}
        for path in glob.glob(str(self.tmp / "lab-spawn-*" / "rank*.alive")):
            with contextlib.suppress(OSError, ValueError):  # being written
                out[int(Path(path).name[4:-6])] = int(Path(path).read_text())
        return out

    def spawn_dirs(self) -> list[str]:
        return glob.glob(str(self.tmp / "lab-spawn-*"))

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._pump.join(5)
        out = self.proc.stdout.read().decode(errors="replace")
        return self.proc.returncode, out, self.err


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids, folders, timeout: float = 30.0) -> None:
    """Bounded wait for cleanup that happens in other processes (not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while (any(alive(p) for p in pids) or any(os.path.exists(f) for f in folders)) and time.monotonic() < deadline:
        time.sleep(0.1)
