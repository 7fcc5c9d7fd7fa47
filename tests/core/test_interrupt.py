"""A Ctrl-C that Python swallows (raised inside a DataLoader fork's at-fork handler, printed as "Exception ignored")
still stops the work: the flag the command line's handler sets is checked by the step loop and the ablation runner."""

from __future__ import annotations

import signal
import sys
import types

import pytest

from lab import RunConfig
from lab.ablation import Ablation, run_ablation
from lab.cli import catch_interrupts
from lab.loop import INTERRUPTED, raise_if_interrupted


@pytest.fixture
def handlers():
    saved = signal.getsignal(signal.SIGINT), sys.unraisablehook
    yield
    signal.signal(signal.SIGINT, saved[0])
    sys.unraisablehook = saved[1]
    INTERRUPTED.clear()


def test_a_swallowed_keyboard_interrupt_sets_the_flag_and_prints_nothing(handlers, capsys):
    catch_interrupts()
    sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=KeyboardInterrupt(),
                                             exc_traceback=None, err_msg="Exception ignored in", object=None))
    assert INTERRUPTED.is_set() and "Traceback" not in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        raise_if_interrupted()


def test_the_ablation_stops_before_its_next_run_once_interrupted(handlers, toy_workload):
    base = RunConfig(workload="toy", size="tiny", max_steps=4, warmup_steps=1, threads=1, latency_repeats=0)
    ran = []

    def run_fn(cfg, **kw):
        from lab.train import run

        ran.append(cfg)
        result = run(cfg, **kw)
        INTERRUPTED.set()  # the Ctrl-C arrived during this run and its own exception was lost
        return result

    arms = {"baseline": base, "fused": base.with_overrides(**{"compute.fused_optimizer": True})}
    with pytest.raises(KeyboardInterrupt):
        run_ablation(Ablation(name="t", baseline=base, arms=arms), repeats=3, run_fn=run_fn)
    assert len(ran) == 1
    INTERRUPTED.set()
    with pytest.raises(KeyboardInterrupt):  # and a run's step loop stops at its next step
        run_fn(base)
