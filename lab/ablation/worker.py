"""The background worker of a dashboard ablation: ``python -m lab.ablation.worker --store DB --key KEY
--token TOKEN`` rebuilds the ablation from its job row (:mod:`lab.ablation.jobs`), adopts the lock its
launcher claimed and runs it; progress, heartbeat, cancel and the final status go through the store.

Why a separate process rather than a thread of the Streamlit server: a click or a reload reruns the app's
script, never this process, so a run is neither lost nor started twice; Cancel is a flag read between steps;
and a DDP arm's spawned ranks re-import *this* module as their ``__main__`` (multiprocessing's spawn
re-imports the parent's main module) instead of the dashboard's ``app.py``, which Streamlit runs as
``__main__``: the ranks never execute the app.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lab.ablation import jobs
from lab.ablation.runner import from_spec, run_ablation
from lab.store import ResultStore


def log_path(token: str) -> Path:
    """Where the worker of the job with ``token`` writes its stderr (what a page shows when it died)."""
    return Path(tempfile.gettempdir()) / f"lab-ablation-{token[:12]}.log"


def start(store_path: str | os.PathLike[str], key: str, token: str) -> subprocess.Popen:
    """Launch the worker for a claimed job (the caller holds ``token``) in its own session, so it
    outlives a script rerun; its stderr goes to :func:`log_path`."""
    log = log_path(token)
    root = str(Path(__file__).resolve().parents[2])  # the checkout (or site-packages) that holds ``lab``
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "lab.ablation.worker", "--store", str(store_path),
                                 "--key", key, "--token", token], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.ablation.worker", description=__doc__.splitlines()[0])
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
            ablation, repeats, seeds = from_spec(row["spec"])
            run_ablation(ablation, repeats=repeats, seeds=seeds, store=store, job_token=args.token)
        except jobs.Cancelled:
            return 0
        except jobs.AlreadyRunning as exc:
            print(exc, file=sys.stderr)
            return 2
        except Exception as exc:  # the job row already says "error" with this message; say it here too
            if row["status"] == "starting" and jobs.job(store, args.key)["status"] == "starting":
                jobs.finish(store, args.key, args.token, "error", {"error": f"{type(exc).__name__}: {exc}"})
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
