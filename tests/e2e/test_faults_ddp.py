"""The fault suite (issue 17; helpers in faults_common.py), data-parallel faults: the world-size bound, a faulty rank
named (never the waiting one), a killed, stopped or interrupted rank through the CLI, a dead launcher: one line and
nothing left behind."""

from __future__ import annotations

import os
import signal

import pytest
from faults_common import TRACEBACK, LabProcess, alive, assert_one_line, cli, store_with_runs, stored_runs, wait_gone

from lab.distributed import RankFailure, RankHung, RankValueError, max_local_ranks, spawn
from lab.distributed.checks import faulty_rank_worker


@pytest.mark.parametrize("case", ["over-the-bound", "env-bound", "env-not-a-number"])
def test_ddp_world_size_beyond_the_bound_is_refused_before_spawning(case, monkeypatch, capsys, no_work):
    if case == "over-the-bound":
        n, needle = max_local_ranks() + 1, "LAB_MAX_LOCAL_RANKS="
    elif case == "env-bound":
        monkeypatch.setenv("LAB_MAX_LOCAL_RANKS", "2")
        n, needle = 3, "LAB_MAX_LOCAL_RANKS=2"
    else:
        monkeypatch.setenv("LAB_MAX_LOCAL_RANKS", "lots")
        n, needle = 2, "LAB_MAX_LOCAL_RANKS='lots' is invalid"
    if n > 4096:
        pytest.skip("the config bound (4096) comes first on this machine")
    rc, _, err = cli(["run", "--size", "tiny", "--threads", "1", "--no-store", "--no-progress",
                      "--world-size", str(n)], capsys)
    assert rc == 2
    line = assert_one_line(err, needle)
    assert case != "over-the-bound" or f"ddp.world_size={n} is invalid: at most min(64, 4 x" in line


def test_ddp_explicitly_allowed_world_size_passes_the_check(monkeypatch):
    from lab.distributed import check_spawn_world_size

    n = max_local_ranks() + 1
    monkeypatch.setenv("LAB_MAX_LOCAL_RANKS", str(n))
    check_spawn_world_size(n)  # allowed: no error


@pytest.mark.parametrize(("fault", "cls", "needle"), [
    ("stop", RankHung, "rank 1 hung: no heartbeat"),
    ("exit", RankFailure, "rank 1 died: exit code 3"),
    ("raise", RankValueError, "rank 1 raised ValueError: rank 1 refuses its input"),
])
def test_ddp_faulty_rank_is_named_never_the_waiting_one(fault, cls, needle):
    with pytest.raises(cls) as err:
        spawn(faulty_rank_worker, 2, (fault, 3.0), timeout_s=120, hang_timeout_s=3.0)
    msg = str(err.value)
    assert msg.startswith(needle) and "\n" not in msg and err.value.rank == 1, msg
    assert fault != "stop" or "stopped" in msg


DDP_RUN = ["run", "--workload", "ctr", "--size", "small", "--world-size", "2", "--threads", "1", "--max-steps",
           "400", "--no-progress"]


@pytest.mark.parametrize(("fault", "rc", "needle"), [
    ("kill", 1, "lab: error: rank 1 died: killed by SIGKILL (exit code -9)"),
    ("stop", 1, "lab: error: rank 1 hung: no heartbeat for"),
    ("ctrl-c", 130, "lab: interrupted"),
])
def test_ddp_cli_fault_is_one_line_and_cleans_up(fault, rc, needle, tmp_path):
    db = store_with_runs(tmp_path / "lab.sqlite")
    kept = stored_runs(db)
    lab = LabProcess([*DDP_RUN, "--ddp-timeout-s", "3", "--store", str(db)])
    lab.wait_until(lambda: len(lab.ranks()) == 2)
    ranks, folders = lab.ranks(), lab.spawn_dirs()
    if fault == "kill":
        os.kill(ranks[1], signal.SIGKILL)
    elif fault == "stop":
        os.kill(ranks[1], signal.SIGSTOP)
    else:
        os.killpg(lab.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    code, _, err = lab.finish()
    assert code == rc, err
    assert TRACEBACK not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(needle), err
    wait_gone(ranks.values(), folders)
    assert not any(alive(p) for p in ranks.values()) and not lab.spawn_dirs()
    assert stored_runs(db) == kept  # the finished runs are intact, and no half-run was added


def test_ddp_dead_launcher_leaves_no_rank_and_no_spawn_folder():
    lab = LabProcess([*DDP_RUN, "--no-store"])
    lab.wait_until(lambda: len(lab.ranks()) == 2)
    ranks, folders = lab.ranks(), lab.spawn_dirs()
    assert folders
    os.kill(lab.proc.pid, signal.SIGKILL)  # no finally, no atexit: only the watchdog and the ranks' own checks
    lab.finish()
    wait_gone(ranks.values(), folders)
    assert not any(alive(p) for p in ranks.values())
    assert not lab.spawn_dirs()
