"""The doctor as background jobs (``lab.doctor.jobs``): a diagnosis job profiles, calibrates and predicts, saying each
stage in its job row as it starts, and stores the diagnosis the recommendation card reads; its verification job
measures the stored diagnosis's top pick; a second start of a live job does no work; the doctor's tables read
rounded, with named columns. Run in this process (no worker spawned): the worker only calls :func:`run_job`."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pandas")

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    jobs,  # noqa: E402
)
from lab.ablation.record import fmt_ratio  # noqa: E402
from lab.doctor import jobs as doctor_jobs  # noqa: E402
from lab.doctor.diagnosis import diagnose  # noqa: E402
from lab.doctor.recommendation import card_from_store  # noqa: E402
from lab.doctor.stored import diagnosis_by_id, last_diagnosis  # noqa: E402
from lab.plots.doctor import diagnosis_table, verification_table  # noqa: E402

TECHS = ["fused_optim"]


def test_a_diagnosis_job_says_each_stage_stores_its_diagnosis_and_verifies_it(toy_workload, private_store):
    cfg = RunConfig(workload=toy_workload.name, size="tiny", threads=1)
    key, spec = doctor_jobs.diagnose_spec(cfg, TECHS)
    lines: list[str] = []
    with ResultStore(private_store) as store:
        def recorded(c, *, stage, progress, **kw):  # the real diagnose; each line read back from the job's row
            def said(name: str, message: str) -> None:
                stage(name, message)
                lines.append(doctor_jobs.progress(jobs.job(store, key))[1])

            def stepped(event: dict) -> None:
                progress(event)
                if event.get("step") in (1, event.get("total_steps")):
                    lines.append(doctor_jobs.progress(jobs.job(store, key))[1])
            return diagnose(c, stage=said, progress=stepped, **kw)

        did = doctor_jobs.run_diagnosis(store, key, spec=spec, diagnose_fn=recorded)
        row = jobs.job(store, key)
        assert row["status"] == "done" and row["kind"] == doctor_jobs.DIAGNOSE and row["state"]["diagnosis"] == did
        said = "\n".join(lines)
        assert "profiling the baseline: step 1/" in said, said
        assert "now profiling its step and inference" in said, said
        assert "calibrating this machine's rates: the fused optimizer step" in said, said
        assert "predicting **fused_optim** (1/1)" in said, said
        # stored whole: the page redraws it after a reload, the card reads the same row
        d = diagnosis_by_id(store, did)
        assert sorted(p.technique for p in d.predictions) == sorted(TECHS)
        assert d.train["step_ms"] > 0 and RunConfig.from_dict(d.config) == cfg
        assert row["state"]["top"] == (d.top().technique if d.top() else None)
        here = d.hardware_id
        assert last_diagnosis(store, toy_workload.name, "tiny", here).id == did
        card = card_from_store(store, toy_workload.name, "tiny", here=here)
        assert any("stored one" in n for n in card.notes), card.notes
        # the verification job: the top pick against the baseline and the A/A arm, one repeat each
        vkey, vspec = doctor_jobs.verify_spec(d, 1, repeats=1)
        rows = doctor_jobs.run_verify(store, vkey, spec=vspec)
        vrow = jobs.job(store, vkey)
        assert vrow["status"] == "done" and vrow["state"]["rows"] == rows
        assert [r["technique"] for r in rows] == [d.predictions[0].technique] and rows[0]["measured"] > 0
        # what the pick is scored over: the stored run length and the arm's measured one-off beyond the baseline's
        assert rows[0]["run_steps"] == d.run["steps"] and rows[0]["measured_one_off_s"] >= 0
        assert doctor_jobs.progress(vrow)[1].startswith("verifying: run 3/3: A/A (the baseline again")
    # the tables: named columns, ratios at their interval's precision, no snake_case headers
    table = diagnosis_table(d.predictions)
    assert list(table["Technique"]) == [p.technique for p in d.predictions]
    assert all("_" not in c for c in table.columns)
    first = d.predictions[0]
    assert table.iloc[0]["Predicted speedup per step (x, 90 % interval; above 1 is faster)"] == fmt_ratio(
        first.speedup, first.lo, first.hi)  # rounded as the ablation's table rounds
    assert not [c for c in table.drop(columns="Why").to_numpy().ravel() if re.search(r"\.\d{4}", str(c))]
    checked = verification_table(rows)
    assert checked.iloc[0]["Measured (x, 95 % CI)"].endswith("x (too few repeats for an interval)")
    assert all("_" not in c for c in checked.columns)


def test_a_second_start_of_a_live_diagnosis_does_no_work(toy_workload, private_store):
    key, spec = doctor_jobs.diagnose_spec(RunConfig(workload=toy_workload.name, size="tiny", threads=1), TECHS)
    calls = []
    with ResultStore(private_store) as store:
        jobs.claim(store, key, spec=spec)  # as if a worker were diagnosing it now
        with pytest.raises(jobs.AlreadyRunning, match="doctor diagnose@"):
            doctor_jobs.run_diagnosis(store, key, spec=spec, diagnose_fn=lambda *a, **kw: calls.append(a))
        assert calls == [] and diagnosis_by_id(store, 1) is None
        assert [j["key"] for j in jobs.live_jobs(store, doctor_jobs.DIAGNOSE)] == [key]  # still the one job
        assert jobs.live_jobs(store, jobs.ABLATION) == []  # the Ablation tab never takes it for its own


def test_progress_lines_of_each_stage():
    line = lambda state: doctor_jobs.progress({"state": {"started_at": 100.0, **state}}, now=165.0)  # noqa: E731
    assert line({})[1].startswith("starting the worker")
    assert line({"stage": "profile", "arm": "the baseline", "step": 12, "total_steps": 40}) == pytest.approx(
        (0.15, "profiling the baseline: step 12/40; elapsed 1:05"))
    assert line({"stage": "predict", "arm": "bf16 (3/9)"})[1] == "predicting **bf16** (3/9); elapsed 1:05"
    frac, text = line({"stage": "verify", "arm": "bf16", "done": 4, "total": 9, "repeat": 1, "repeats": 3,
                       "step": 5, "total_steps": 10, "eta_s": 30.0, "published_at": 160.0})
    assert frac == pytest.approx(4.5 / 9)
    assert text == "verifying: run 5/9, arm **bf16** (repeat 2/3), step 5/10; elapsed 1:05, about 0:25 left"
    between = line({"stage": "verify", "ended": "bf16", "done": 4, "total": 9, "eta_s": 30.0, "published_at": 160.0})
    assert between == (4 / 9, "verifying: run 5/9: building it (run 4, bf16, ended); elapsed 1:05, about 0:25 left")


def test_cancel_stops_a_diagnosis_at_its_next_stage_and_stores_nothing(private_store):
    key, spec = doctor_jobs.diagnose_spec(RunConfig(workload="ctr", size="tiny", threads=1), TECHS)
    reached = []
    with ResultStore(private_store) as store:
        def cancelled_midway(cfg, *, stage, progress, **kw):  # Cancel pressed while it profiles
            stage("profile", "the baseline")
            jobs.request_cancel(store, key)
            reached.append("profiled")
            stage("calibrate", "the fused optimizer step")
            reached.append("calibrated")

        with pytest.raises(jobs.Cancelled):
            doctor_jobs.run_diagnosis(store, key, spec=spec, diagnose_fn=cancelled_midway)
        assert reached == ["profiled"] and jobs.job(store, key)["status"] == "cancelled"
        assert diagnosis_by_id(store, 1) is None


def test_the_doctor_worker_ends_a_job_it_cannot_run_with_its_reason(private_store):
    with ResultStore(private_store) as store:
        token = jobs.claim(store, "verify@ctr/tiny/t1", spec={"kind": doctor_jobs.VERIFY, "diagnosis": 7, "k": 1})
    argv = ["--store", str(private_store), "--key", "verify@ctr/tiny/t1"]
    assert doctor_jobs.main([*argv, "--token", "nope"]) == 2  # not the launcher's token: refused, untouched
    assert doctor_jobs.main([*argv, "--token", token]) == 1
    with ResultStore(private_store) as store:
        row = jobs.job(store, "verify@ctr/tiny/t1")
    assert row["status"] == "error" and "diagnosis 7 is not in" in row["state"]["error"]
