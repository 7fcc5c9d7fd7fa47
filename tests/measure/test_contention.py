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


def _windows(monkeypatch, others: list[float]):
    """Plant one reading per settle window: other processes' cores in each, in order; no real sleep."""
    seen = iter(others)
    clock = {"t": 0.0}
    monkeypatch.setattr(C.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    monkeypatch.setattr(C.time, "monotonic", lambda: clock["t"])

    class Meter:
        def start(self):
            return self

        def stop(self):
            return C.Contention(others_cores=next(seen), steal_share=0.0, load1=0.0, cores=2, wall_s=0.1)

    monkeypatch.setattr(C, "ContentionMeter", Meter)
    return clock


def test_settle_waits_out_a_burst_then_returns_the_quiet_window(monkeypatch):
    clock = _windows(monkeypatch, [1.2, 0.9, 0.05, 1.5])  # two busy windows (a page redrawing), then quiet
    seen = C.settle(max_wait_s=2.0, window_s=0.1)
    assert seen is not None and not seen.busy and seen.others_cores == 0.05
    assert clock["t"] == pytest.approx(0.3)  # three windows watched; the fourth (busy again) never read


def test_settle_gives_up_on_a_machine_that_stays_busy_and_says_so(monkeypatch):
    clock = _windows(monkeypatch, [1.0] * 100)
    seen = C.settle(max_wait_s=0.5, window_s=0.1)
    assert seen is not None and seen.busy  # the caller learns the wait was in vain
    assert clock["t"] == pytest.approx(0.5)
    assert C.settle(max_wait_s=0.0) is None and clock["t"] == pytest.approx(0.5)  # 0: no wait at all


def test_the_ablation_stops_waiting_after_three_waits_in_vain(monkeypatch):
    from lab.ablation import runner

    monkeypatch.setattr(C, "SETTLE_MAX_S", 2.0)
    calls = []
    busy = C.Contention(others_cores=1.0, steal_share=0.0, load1=0.0, cores=2, wall_s=0.1)
    quiet = C.Contention(others_cores=0.0, steal_share=0.0, load1=0.0, cores=2, wall_s=0.1)
    answers = iter([busy, quiet, busy, busy, busy])
    monkeypatch.setattr(C, "settle", lambda: calls.append(1) or next(answers))
    waits = runner._Settling()
    for _ in range(8):
        waits.before_run()
    assert len(calls) == 5 and not waits.on  # a quiet window resets the count; three in vain in a row end it


def _fake_runs(busy_cores: list[float]):
    """A run function whose n-th call's meter read ``busy_cores[n]`` other cores (the last one repeats)."""
    from lab.result import new_run_id, utc_now_iso

    calls = []

    def run_fn(cfg, progress=None, on_error="record"):
        others = busy_cores[min(len(calls), len(busy_cores) - 1)]
        calls.append(others)
        r = RunResult(run_id=new_run_id(), config=cfg.to_dict(), env={}, started_at=utc_now_iso(),
                      workload=cfg.workload, metric_name="acc", metric=0.5, train_time_s=1.0,
                      step_times_ms={"train_step": [1.0] * 5})
        C.attach(r, C.Contention(others_cores=others, steal_share=0.0, load1=0.0, cores=2, wall_s=1.0))
        return r

    return run_fn, calls


def test_a_run_spoiled_by_a_burst_is_measured_again_and_says_so(monkeypatch, private_store):
    from lab import RunConfig
    from lab.ablation import Ablation, runner
    from lab.store import ResultStore

    monkeypatch.setattr(C, "SETTLE_MAX_S", 2.0)
    monkeypatch.setattr(C, "settle", lambda: None)  # no wait; the redo is what is tested
    base = RunConfig(workload="mlp", size="tiny")
    ab = Ablation(name="t", baseline=base, arms={"bf16": base.with_overrides(**{"precision.dtype": "bf16"})},
                  aa=False)
    run_fn, calls = _fake_runs([1.2, 0.05])  # the first measurement caught a burst, the second was quiet
    runner.run_ablation(ab, repeats=1, store=ResultStore(private_store), run_fn=run_fn)
    seen = [r.details["contention"] for r in ResultStore(private_store).list_results()]
    assert calls == [1.2, 0.05, 0.05] and len(seen) == 2 and not any(c["busy"] for c in seen)
    assert sorted(len(c.get("discarded", [])) for c in seen) == [0, 1]  # the first run's burst, kept on it
    assert [c["discarded"][0]["others_cores"] for c in seen if c.get("discarded")] == [1.2]

    run_fn, calls = _fake_runs([1.2])  # busy every time: two redos, then the busy run is kept and says so
    ab2 = Ablation(name="t2", baseline=base, arms=ab.arms, aa=False)
    df = runner.run_ablation(ab2, repeats=1, run_fn=run_fn)
    assert calls == [1.2] * 6 and int(df["busy_runs"].sum()) == 2

    monkeypatch.setattr(C, "SETTLE_MAX_S", 0.0)  # off: measured once, busy or not
    run_fn, calls = _fake_runs([1.2])
    runner.run_ablation(ab2, repeats=1, run_fn=run_fn)
    assert calls == [1.2, 1.2]
