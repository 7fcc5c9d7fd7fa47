"""Dashboard page "Workers vs threads": the measured (compute threads, loader workers) grid on file-backed
data, the best pair, and the lab's rule for a run, over :mod:`lab.data.studies.threads` (the page only draws).

The grid comes from the committed ``benchmarks/data_threads.py`` figures for this machine's hardware id
(``benchmarks/results/<hardware id>/data_threads.json``); the rule calculator calls
:func:`lab.data.studies.threads.recommend` with the numbers the user types.
"""

from __future__ import annotations

import os

import _shared
import streamlit as st

from lab.data.studies.threads import grid_rows, load_grids, recommend
from lab.measure import environment_stamp

TITLE = "Workers vs threads"
TAB = "Threads"  # the tab row's label, short so the row fits at 1280 px (_pages)


def render() -> None:
    st.header(TITLE)
    grids, source = load_grids()
    hw = environment_stamp()["hardware_id"]
    if grids:
        st.markdown(f"Measured on this machine (**{hw}**), from `{source}`.")
    else:
        st.warning(f"No workers-vs-threads figures for this machine (**{hw}**) yet: run `python "
                   f"benchmarks/data_threads.py --quick --json benchmarks/results/{hw}/data_threads.json`; the rule "
                   "calculator below needs none.")
    st.caption("Loader workers decode on the same cores the step's threads compute on: which split is fastest "
               "here, measured on file-backed data (benchmarks/data_threads.py).")
    for g in grids:
        best = g["best"]
        st.subheader(f"{g['workload']}/{g['size']} on {g['storage']}")
        _shared.dataframe(grid_rows(g), hide_index=True, key=f"dt_grid_{g['workload']}")
        st.markdown(f"Best pair: **{best['threads']} thread(s) + {best['workers']} worker(s)** "
                    f"({best['throughput']:.0f} samples/s). Rule: {g['rule']['text']}.")
    if source:
        st.caption(f"from {source}")
    st.subheader("The rule for your run")
    cores = st.number_input("cores", min_value=1, max_value=256, value=os.cpu_count() or 1, key="dt_cores")
    loader_ms = st.number_input("read + decode ms per batch", min_value=0.0, value=30.0, key="dt_loader_ms")
    compute_ms = st.number_input("compute ms per step", min_value=0.01, value=40.0, key="dt_compute_ms")
    st.write(recommend(int(cores), float(loader_ms), float(compute_ms))["text"])
