"""The recommendation card above the tabs: one answer for the sidebar's workload and size on this machine,
built by :func:`lab.doctor.recommendation.card_from_store` (the newest stored ablation of that workload and size
that can give a verdict, a Doctor verification included, and the newest diagnosis stored for them on this machine:
the Doctor tab's job stores its own there), the same object ``python -m lab recommend`` prints. It ends in code: the
pick's plain-PyTorch file (:mod:`lab.portable`), to download.

With nothing measured, the card offers the doctor's next step itself (:func:`lab.doctor.jobs.next_step`): one
button that diagnoses the workload (nothing predicted either) or verifies the diagnosis's top picks, started as the
Doctor tab starts it (:mod:`_lifecycle`'s lanes: the same job, so both show its progress and a double click joins
it), and the job's progress line in its place while it runs.

Thin on purpose: the rule lives in ``lab``; this draws its lines. Drawn once per rerun by ``app.py`` before the
tabs, and kept in the session (:func:`current`), so the Doctor tab says the same thing the card says."""

from __future__ import annotations

import _lifecycle
import _shared
import _sidebar
import streamlit as st

from lab import RunConfig
from lab.doctor.jobs import DIAGNOSE, next_step
from lab.doctor.recommendation import Recommendation, card_from_store
from lab.portable import from_techniques

_STATE = "_recommendation_card"


def _recipe_download(card: Recommendation) -> None:
    try:
        recipe = from_techniques(card.options, RunConfig(workload=card.workload, size=card.size),
                                 measured=[card.headline(), card.holds_at()],
                                 command=f"python -m lab recommend --workload {card.workload} --size {card.size}")
    except ValueError as exc:  # a stack the script cannot express: the card still stands, its code does not
        st.caption(f"No plain-PyTorch file for {' + '.join(card.options)}: {exc}")
        return
    name = "_".join(card.options) + ".py"
    st.download_button(f"Download the plain-PyTorch file ({name})", data=recipe.text, file_name=name,
                       mime="text/x-python", key="card_recipe",
                       help=f"{recipe.title}, no lab import; run it: {recipe.how_to_run(name)}")


def _bullets(lines: list[str]) -> str:
    """The card's text lines as markdown bullets, a header's indented lines nested under it."""
    out, under = [], False
    for line in lines:
        if line.endswith(":"):
            out.append(f"- {line}")
            under = True
        elif under and line.startswith("  "):
            out.append(f"    - {line.strip()}")
        else:
            out.append(f"- {line.strip()}")
            under = False
    return "\n".join(out)


def draw(c: _sidebar.Choices) -> Recommendation | None:
    """The card for the sidebar's choices (None, with a one-line warning, when it cannot be built)."""
    try:
        card = card_from_store(_shared.store(), c.workload, c.size, None, speed=c.speed,
                               budget_pt=c.budget_pt)
    except ValueError as exc:
        st.warning(f"No recommendation: {exc}")
        return None
    st.session_state[_STATE] = card
    with st.container(border=True, key="recommendation"):
        st.markdown(f"**{card.headline()}**")
        lines = card.lines()[1:-1]
        if c.running:
            lines.append("An ablation is running: the card reads the last finished one until it ends.")
        if lines:
            st.markdown(_bullets(lines))
        st.caption(card.lines()[-1])
        if card.options:
            _recipe_download(card)
        _next_step(card, c)
    return card


def _next_step(card: Recommendation, c: _sidebar.Choices) -> None:
    """The doctor's next step when nothing is measured: its button, or its job's progress while it runs."""
    store = _shared.store()
    step = next_step(store, card.workload, card.size, measured=card.read is not None, here=card.hardware_id,
                     threads=c.threads or None)
    if step is None:
        return
    lane = _lifecycle.DOCTOR if (step.running or {}).get("kind", step.kind) == DIAGNOSE else _lifecycle.VERIFY
    if step.running is not None:
        _lifecycle.live_progress(step.running["key"], None, lane.noun, lead="Next step, running: ")
        return
    if st.button(step.label, key="card_next", type="primary", disabled=c.running,
                 help="an ablation is running: its timings and the doctor's would disturb each other" if c.running
                 else None):
        _lifecycle.start_or_join(store, step.key, step.spec, lane)
        st.rerun()  # redraw with the job's progress in the button's place
    st.caption("Waits for the running ablation: its timings and the doctor's would disturb each other." if c.running
               else step.why)


def current() -> Recommendation | None:
    """The card this rerun drew (None before ``app.py`` drew it, or when it could not be built)."""
    return st.session_state.get(_STATE)
