"""Was the machine busy? Other processes' cores and steal over a region, from planted counters and from a real
CPU burner; a rank's siblings are part of its run; a record carries one sentence, replaced, never stacked."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lab.measure import contention as C
from lab.result import RunResult


def _planted(monkeypatch, machine, own, clock):
    seq = {"m": iter(machine), "o": iter(own), "t": iter(clock)}
    monkeypatch.setattr(C, "_machine_jiffies", lambda: next(seq["m"]))
    monkeypatch.setattr(C, "_own_cpu_s", lambda: next(seq["o"]))
    monkeypatch.setattr(C.time, "monotonic", lambda: next(seq["t"]))


def test_others_are_the_machines_busy_time_less_this_runs_own(monkeypatch):
    # 10 s of wall: the machine was busy 25 CPU s, this run used 10 of them -> others used 1.5 cores
    _planted(monkeypatch, [(100.0, 0.0, 400.0), (125.0, 0.0, 420.0)], [3.0, 13.0], [50.0, 60.0])
    c = C.ContentionMeter().start().stop()
    assert c.others_cores == pytest.approx(1.5) and c.own_cores == pytest.approx(1.0) and c.busy
    assert "other processes used 1.5 of" in c.sentence() and "rerun when idle" in c.sentence()
    assert c.without_siblings(1).others_cores == pytest.approx(0.5)  # one sibling rank like this one: still busy
    assert not c.without_siblings(2).busy


def test_a_quiet_region_and_a_stealing_hypervisor(monkeypatch):
    _planted(monkeypatch, [(0.0, 0.0, 0.0), (10.5, 0.0, 20.0)], [0.0, 10.0], [0.0, 10.0])
    quiet = C.ContentionMeter().start().stop()
    assert quiet.others_cores == pytest.approx(0.05) and not quiet.busy and quiet.sentence() == ""
    _planted(monkeypatch, [(0.0, 0.0, 0.0), (10.0, 2.0, 20.0)], [0.0, 10.0], [0.0, 10.0])
    stolen = C.ContentionMeter().start().stop()
    assert stolen.steal_share == pytest.approx(0.1) and stolen.busy and "stole 10%" in stolen.sentence()


def test_unreadable_counters_report_nothing_rather_than_a_guess(monkeypatch):
    monkeypatch.setattr(C, "_machine_jiffies", lambda: None)
    assert C.ContentionMeter().start().stop() is None


def test_attach_replaces_an_inner_sentence_and_reads_sibling_ranks_from_the_environment():
    r = RunResult(run_id="x", config={}, env={})
    loud = C.Contention(others_cores=1.5, steal_share=0.0, load1=3.0, cores=2, wall_s=5.0, own_cores=1.0)
    C.attach(r, loud)
    C.attach(r, loud)  # the launching process measured again over the same run: one sentence, not two
    assert r.why == [loud.sentence()] and r.details["contention"]["busy"]
    C.attach(r, loud, sibling_ranks=2)  # seen from one of 3 ranks an outside launcher started: quiet
    assert r.why == [] and not r.details["contention"]["busy"]
    assert C.sibling_ranks({"WORLD_SIZE": "4"}) == 3 and C.sibling_ranks({}) == 0


#: Two burners, orphaned at once (their parent exits): they are not this process's descendants, as another
#: program's processes are not.
_ORPHAN_BURNERS = """
import os, sys, time
for _ in range(2):
    if os.fork() == 0:
        end = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end:
            pass
        os._exit(0)
os._exit(0)
"""


@pytest.mark.skipif(C._machine_jiffies() is None, reason="no /proc/stat")
def test_a_real_cpu_burner_makes_the_region_busy():
    """Two processes outside this run's process tree keep the cores busy while this process sleeps: the meter
    sees them as others (this run's own CPU, ~0, is not counted against it)."""
    subprocess.run([sys.executable, "-c", _ORPHAN_BURNERS, "3.0"], check=True, timeout=30)
    time.sleep(0.5)  # the orphans are running
    meter = C.ContentionMeter().start()
    time.sleep(1.5)
    seen = meter.stop()
    assert seen is not None and seen.busy and seen.others_cores > 1.0 and seen.own_cores < 0.3, seen
