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
