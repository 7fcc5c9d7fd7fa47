"""The recommendation card above the tabs (issue 44 item 2): the sidebar's workload and size, the last finished
ablation of them (planted timings: tests/planted.py), the same object ``python -m lab recommend`` prints; a busy
ablation crowns nothing on the card; the pick ends in a plain-PyTorch file to download."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from planted import planted_ablation  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore  # noqa: E402
from lab.doctor.recommendation import card_from_store  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _card_text(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown) + "\n" + "\n".join(c.value for c in at.caption)


@pytest.mark.parametrize("busy", [False, True])
def test_the_card_leads_with_the_stored_ablations_answer_and_its_code(private_store, toy_workload, busy):
    """A new session opens on the last ablation's workload and size (the sidebar says what the page shows), skips
    a later Doctor verification as "the last ablation", and draws the card ``python -m lab recommend`` prints."""
    from lab import jobs

    with ResultStore(private_store) as store:
        ab = planted_ablation(store, toy_workload.name, busy=busy)
        expected = card_from_store(store, toy_workload.name, "tiny")
        token = jobs.claim(store, "doctor@sequence/tiny/t1#0", {"name": "doctor", "baseline": {"workload": "sequence"}})
        jobs.finish(store, "doctor@sequence/tiny/t1#0", token, "done")  # a verification, newer than the ablation
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert at.selectbox(key="workload").value == toy_workload.name and at.selectbox(key="size").value == "tiny"
    assert any(ab.key in info.value for info in at.info), [i.value for i in at.info]  # not the doctor@ job
    text = _card_text(at)
    assert f"**{expected.headline()}**" in text  # the object the CLI prints, drawn as it is
    assert expected.holds_at() in text
    downloads = [el for el in at.get("download_button") if "plain-PyTorch" in el.proto.label]
    if busy:
        assert expected.headline().startswith("No recommendation: measured while this machine was busy")
        assert downloads == []
    else:
        assert expected.headline().startswith("Use fused_optim: ")
        assert len(downloads) == 1 and "fused_optim.py" in downloads[0].proto.label
    at.selectbox(key="workload").select("ctr").run()  # another workload: nothing measured, the card says what to run
    assert "No recommendation yet for ctr at size tiny" in _card_text(at)


def _first_page() -> None:
    # AppTest runs this function's source as its own script: the sidebar and the card, as app.py draws them
    import sys
    from pathlib import Path

    root = Path.cwd()
    sys.path[:0] = [str(root / "dashboard"), str(root / "tests")]
    import _card
    import _sidebar
    from toy_workload import TOY

    from lab.workloads import register_workload

    register_workload(TOY, overwrite=True)
    _card.draw(_sidebar.draw())
    _sidebar.forget()


@pytest.fixture
def diagnose_fn():
    """The card's diagnosis predicts one technique, so it takes a fraction of a second (the worker launches run
    here: ``launched``, tests/dashboard/conftest.py)."""
    from lab.doctor.diagnosis import diagnose

    return lambda cfg, techniques, **kw: diagnose(cfg, techniques=["fused_optim"], **kw)


def test_with_nothing_stored_the_card_diagnoses_then_verifies_and_then_reads_the_verification(private_store, launched):
    """No ablation, no diagnosis: the card's one button starts the Doctor tab's diagnosis job (same key, the Doctor
    tab's lane); while one runs (started from the Doctor tab) the card shows its progress in the button's place and a
    click drawn before it started joins it; once the diagnosis is stored, its button verifies the top pick (3 repeats:
    a verdict), and then the card reads that verification as its measurement and offers nothing more."""
    from lab import RunConfig, jobs
    from lab.doctor import jobs as doctor_jobs

    at = AppTest.from_function(_first_page, default_timeout=60)
    at.session_state["workload"] = "toy"
    at.run()
    assert not at.exception, at.exception
    assert "No recommendation yet for toy at size tiny" in _card_text(at)
    assert at.button(key="card_next").label == "Diagnose toy at size tiny"
    key, spec = doctor_jobs.diagnose_spec(RunConfig(workload="toy", size="tiny", threads=1))
    with ResultStore(private_store) as store:  # the Doctor tab starts it meanwhile; it is between two predictions
        token = jobs.claim(store, key, spec=spec)
        jobs.beat(store, key, token, {"stage": "predict", "arm": "bf16 (3/9)"})
    at.button(key="card_next").click().run()  # a click drawn before it started: it joins, never starts a second
    assert not at.exception, at.exception
    assert launched == [] and not [b for b in at.button if b.key == "card_next"]
    assert any(m.value.startswith("predicting **bf16** (3/9)") for m in at.markdown), [m.value for m in at.markdown]
    with ResultStore(private_store) as store:
        jobs.finish(store, key, token, "cancelled")
    at.run()
    at.button(key="card_next").click().run()
    assert not at.exception, at.exception
    assert launched == [key] and at.session_state["doc_job_key"] == key  # the Doctor tab's job, shown there too
    assert "fused_optim" in _card_text(at)
    assert at.button(key="card_next").label == "Verify the doctor's top picks: fused_optim"
    at.button(key="card_next").click().run()
    assert not at.exception, at.exception
    assert launched[1] == "verify@toy/tiny/t1" and at.session_state["ver_job_key"] == launched[1]
    text = _card_text(at)
    assert "from the Doctor's verification doctor@toy/tiny/t1#" in text and "3 run(s) per arm" in text, text
    assert not [b for b in at.button if b.key == "card_next"]  # measured: the card's answer stands, no next step
