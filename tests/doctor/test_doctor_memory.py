"""``lab doctor --memory-budget MB`` (issue 43 item 4): the prescription says memory first, the fastest measured
lever under the budget with its time cost, or that nothing fits; a planted measurement (peaks and times as a
function of the config) pins what it must say, and a planted diagnosis where it is said."""

from __future__ import annotations

import pytest

from lab.cli import main
from lab.config import RunConfig
from lab.doctor.amdahl import Prediction, Rates
from lab.doctor.diagnosis import Diagnosis, format_diagnosis
from lab.doctor.memory import format_memory_prescription, memory_prescription
from lab.measure.profile import Breakdown
from lab.result import RunResult

BASE = RunConfig(workload="mlp", size="tiny")


def planted(cfg: RunConfig) -> dict:
    """100 MB at 10 ms; accumulation saves 20 / 30 MB for 1 / 4 ms, checkpointing 30 MB for 3 ms."""
    m = cfg.memory
    peak = 100 - {1: 0, 2: 20, 4: 30}[m.micro_batches] - (30 if m.checkpoint == "blocks" else 0) \
        - {"fp32": 0, "int8": 15, "int4": 20}[m.optimizer_state]
    ms = 10 + {1: 0, 2: 1, 4: 4}[m.micro_batches] + (3 if m.checkpoint == "blocks" else 0) \
        + {"fp32": 0, "int8": 8, "int4": 9}[m.optimizer_state]
    return {"peak_mb": peak, "step_ms": ms}


def test_the_memory_prescription_is_the_fastest_measured_lever_that_fits_or_says_nothing_does():
    p = memory_prescription(BASE, 75, measure="roles", measure_fn=planted)
    assert p["fits"] and p["option"] == "checkpoint_blocks" and p["peak_mb"] == 70  # accum4 fits too, at 1.4x
    assert p["step_time_ratio"] == pytest.approx(1.3)
    text = format_memory_prescription(p)
    assert text.splitlines()[1] == ("  1. checkpoint_blocks peak 70 MB (budget-free 100 MB), 1.30x the time per step "
                                    "(5-step tries, no interval)")
    assert "`--techniques checkpoint_blocks,...`" in text
    free = format_memory_prescription(memory_prescription(BASE, 100, measure="roles", measure_fn=planted))
    assert free.endswith("the budget-free configuration fits (peak 100 MB): no memory lever needed")
    none = memory_prescription(BASE, 5, measure="roles", measure_fn=planted)
    assert not none["fits"] and none["option"] is None
    assert "nothing fits: memory budget 5 MB cannot be met: the smallest peak reached is" in \
        format_memory_prescription(none)


def test_the_diagnosis_says_memory_before_speed_and_a_bad_budget_is_one_line(capsys, monkeypatch):
    import lab.doctor

    base = RunResult(run_id="0" * 32, config={}, env={"torch_threads": 1}, metric_name="accuracy")
    d = Diagnosis(cfg=BASE, baseline=base, train=Breakdown(step_ms=10.0, ms={"matmul": 10.0}), infer=None,
                  rates=Rates(), rate_source="planted", predictions=[
                      Prediction("bf16", "train_step", 1.2, 1.1, 1.3, "planted", prescribed=True)])
    memory = format_memory_prescription(memory_prescription(BASE, 75, measure="roles", measure_fn=planted))
    lines = format_diagnosis(d, memory=memory).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("prescription, memory budget 75 MB"))
    assert lines[first + 1].startswith("  1. checkpoint_blocks")
    assert first < next(i for i, line in enumerate(lines) if line.startswith("prescription, training step"))
    assert "memory budget" not in format_diagnosis(d)
    monkeypatch.setattr(lab.doctor, "diagnose", lambda *a, **k: pytest.fail("diagnosed despite a bad budget"))
    assert main(["doctor", "--workload", "mlp", "--size", "tiny", "--memory-budget", "-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--memory-budget=-3 is invalid" in err
