"""The fault suite (issue 17; helpers in faults_common.py), signals: Ctrl-C during a run, an ablation, or while the lab
is still importing: exit 130, nothing half-stored, every finished run kept."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest
from faults_common import TRACEBACK, LabProcess, store_with_runs, stored_runs

from lab.result import RunResult


@pytest.mark.parametrize("loader", [[], ["--loader", "dataloader", "--num-workers", "2"]],
                         ids=["in-memory", "dataloader-workers"])  # worker processes get the Ctrl-C too
def test_ctrl_c_during_a_single_process_run_is_exit_130_and_stores_nothing(loader, tmp_path):
    db = store_with_runs(tmp_path / "lab.sqlite")
    kept = stored_runs(db)
    lab = LabProcess(["run", "--workload", "sequence", "--size", "small", "--store", str(db), *loader])
    lab.wait_until(lambda: "sequence/small" in lab.err)  # the progress bar: training has started
    os.killpg(lab.proc.pid, signal.SIGINT)
    code, out, err = lab.finish()
    assert code == 130, err
    assert TRACEBACK not in err + out and err.rstrip().endswith("lab: interrupted")
    assert stored_runs(db) == kept


def test_ctrl_c_during_an_ablation_keeps_every_finished_run(tmp_path):
    db = tmp_path / "ablation.sqlite"

    def finished() -> int:
        try:
            return len(stored_runs(db))
        except sqlite3.Error:
            return 0

    lab = LabProcess(["ablate", "--recipe", "data_loading", "--workload", "ctr", "--size", "tiny", "--repeats", "3",
                      "--store", str(db)])
    lab.wait_until(lambda: finished() >= 2, timeout=180)
    before = stored_runs(db)
    os.killpg(lab.proc.pid, signal.SIGINT)
    code, out, err = lab.finish()
    assert code == 130, err
    assert TRACEBACK not in err + out and err.rstrip().endswith("lab: interrupted")
    after = stored_runs(db)
    assert set(before) <= set(after) and len(after) < 12  # kept, and the ablation did stop
    for _, payload in after:
        result = RunResult.from_json(payload)
        assert result.status == "ok" and result.steps > 0  # every stored run is a finished one


@pytest.mark.xfail(strict=True, reason="`python -m lab` imports lab/__init__.py (torch, every package) before "
                   "lab.cli.main can catch KeyboardInterrupt; the fix belongs in lab/__init__.py / lab/__main__.py "
                   "(lazy imports, or a SIGINT handler first), which this suite's owner does not edit")
def test_ctrl_c_while_the_lab_is_still_importing_is_exit_130():
    lab = LabProcess(["runs"])
    time.sleep(0.5)  # inside `import torch` (about 2 s here); not a timing assertion
    os.killpg(lab.proc.pid, signal.SIGINT)
    code, out, err = lab.finish()
    assert code == 130 and TRACEBACK not in err, err
