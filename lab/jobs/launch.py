"""Start a claimed job's worker process (``python -m MODULE --store DB --key KEY --token TOKEN``), and where its
stderr goes.

Why a process of its own rather than a thread of the Streamlit server: a click or a reload reruns the app's
script, never this process, so a job is neither lost nor started twice; Cancel is a flag it reads between steps
(:mod:`lab.jobs`). Each kind of job names the module that runs it: :mod:`lab.ablation.worker` (ablations,
batches of runs, the machine card), :mod:`lab.doctor.jobs` (a diagnosis, its verification).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.store import ResultStore


def log_path(store_path: str | os.PathLike[str], token: str) -> Path:
    """Where the worker of the job with ``token`` writes its stderr (what a page shows when it died):
    ``logs/worker-<token>.log`` beside the results store (``results/logs/`` for ``results/lab.sqlite``).

    Why beside the store and not the system temp folder: the log belongs to the results it explains (it
    travels, and is cleaned, with them; a temp folder is emptied at reboot and shared by every user), and the
    store's path is the one thing the dashboard and its worker already agree on. An in-memory store has no
    folder: its workers' logs go to the temp folder."""
    where = str(store_path)
    folder = Path(tempfile.gettempdir()) if where in ("", ":memory:") else Path(where).resolve().parent / "logs"
    return folder / f"worker-{token[:12]}.log"


def start(store_path: str | os.PathLike[str], key: str, token: str, *, module: str) -> subprocess.Popen:
    """Launch ``python -m module`` for a claimed job (the caller holds ``token``) in its own session, so it
    outlives a script rerun; its stderr goes to :func:`log_path`. ``module``: the entry that runs the job's kind
    (``lab.ablation.worker``, ``lab.doctor.jobs``)."""
    log = log_path(store_path, token)
    log.parent.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])  # the checkout (or site-packages) that holds ``lab``
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", module, "--store", str(store_path),
                                 "--key", key, "--token", token], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)


def serve(argv: list[str] | None, *, prog: str, description: str,
          run: Callable[[ResultStore, str, str, dict[str, Any]], Any]) -> int:
    """A worker process's ``main``: read ``--store --key --token``, check that the token holds the claimed job,
    and ``run(store, key, token, row)``. Exit 0 when it ends or was cancelled, 2 for a job it does not hold (or one
    already running), 1 when ``run`` raised: the job row then says "error" with the message (if ``run`` never
    took the lock, this marks it), and stderr says it too. Every kind of worker ends the same way, so the pages
    read one set of endings."""
    from lab import jobs

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--store", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args(argv)
    with ResultStore(args.store) as store:
        row = jobs.job(store, args.key)
        if row is None or row["token"] != args.token or row["spec"] is None:
            print(f"no claimed job {args.key} with this token in {args.store}", file=sys.stderr)
            return 2
        try:
            run(store, args.key, args.token, row)
        except jobs.Cancelled:
            return 0
        except jobs.AlreadyRunning as exc:
            print(exc, file=sys.stderr)
            return 2
        except Exception as exc:  # the job row says "error" with this message (or: refused before it held the lock)
            if row["status"] == "starting" and jobs.job(store, args.key)["status"] == "starting":
                jobs.finish(store, args.key, args.token, "error", {"error": f"{type(exc).__name__}: {exc}"})
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


__all__ = ["log_path", "serve", "start"]
