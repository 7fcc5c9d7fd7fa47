"""Start a claimed job's worker process (``python -m MODULE --store DB --key KEY --token TOKEN``), and where its
stderr goes.

Why a process of its own rather than a thread of the Streamlit server: a click or a reload reruns the app's
script, never this process, so a job is neither lost nor started twice; Cancel is a flag it reads between steps
(:mod:`lab.jobs`). Each kind of job names the module that runs it: :mod:`lab.ablation.worker` (ablations,
batches of runs, the machine card), :mod:`lab.doctor.jobs` (a diagnosis, its verification).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


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


__all__ = ["log_path", "start"]
