"""Dashboard page "Machine": this machine's card — hardware id, ISA as the kernels see it, caches,
and the measured peaks (GEMM per dtype at 1 thread and all cores, triad bandwidth, one small op), with what
they allow bf16 / fp16 / int8 here.

Thin over :mod:`lab.measure.machine`, the same functions as ``python -m lab machine``: the cached card is shown
as it is (never measured on a rerun); the button starts the background worker (a ``machine_card`` job,
:func:`lab.ablation.worker.run_machine`, through :mod:`_lifecycle`), which measures and caches a new one while
the page shows its stage; a second click or tab joins it, a reload re-attaches to it.
"""

from __future__ import annotations

import _lifecycle
import _shared
import pandas as pd
import streamlit as st

from lab.ablation.worker import machine_spec
from lab.measure import machine
from lab.plots.machine import peak_table

TITLE = "Machine"
LANE = _lifecycle.MACHINE_CARD


def render() -> None:
    """The whole page."""
    st.header(TITLE)
    st.caption("What this CPU can do, measured: the GEMM peak of each dtype, memory bandwidth and the fixed cost "
               "of one op. The doctor and the crossover map cite it; every result's environment stamp carries it.")
    store = _shared.store()
    job = _lifecycle.attached_job(store, LANE)
    running = bool(job and job["live"])
    card = machine.load_card()
    quick = st.checkbox("quick (smaller sizes, fewer repeats)", key="machine_quick")
    label = "Measure again" if card else "Measure this machine"
    if st.button(f"{label} (about {machine.ESTIMATE_S[quick]} s)", key="machine_measure", disabled=running,
                 help="disabled while a measurement runs" if running else None) and not running:
        _lifecycle.start_or_join(store, *machine_spec(quick), LANE)
        st.rerun()  # redraw with the button disabled and the measurement's stage
    if running:
        _lifecycle.live_progress(job["key"], None, LANE.noun)  # which stage (a dtype's GEMM at a thread count ...)
    elif job is not None:
        _lifecycle.ended_badly(job, LANE.noun)
    if card is None:
        st.info(f"No machine card cached for this machine yet ({machine.card_path().name}): press the button, or "
                "run `python -m lab machine`.")
        return
    caps = card.capabilities
    st.subheader(card.hardware_id)
    st.caption(f"{card.cpu_model}; {card.usable_cores} of {card.logical_cores} cores usable; torch "
               f"{card.torch_version}; kernels {caps.get('aten_capability')}"
               + (f" (capped: {', '.join(caps.get('caps', []))})" if caps.get("caps") else "")
               + f"; measured {card.measured_at}{' (quick)' if card.quick else ''}; int8 kernel: {card.int8_kernel}")
    _shared.dataframe(pd.DataFrame(peak_table(card)), key="machine_peaks", hide_index=True)  # rounded as elsewhere
    for sentence in machine.limit_sentences(card):
        st.markdown(f"- {sentence}")
    for note in card.notes:
        st.caption(f"note: {note}")
