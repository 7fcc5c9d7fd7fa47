"""Streamlit dashboard: ``make dashboard`` (binds 127.0.0.1, port from PORT=, default 8501; a bare
``streamlit run dashboard/app.py`` too, through ``.streamlit/config.toml``).

Pick a workload and a recipe (or your own technique stack), press Run: the ablation runs in a background
worker process (:mod:`lab.ablation.worker`) under a per-key lock in the SQLite store (``results/lab.sqlite``),
so a reload re-attaches to it, a double click or a second tab joins it instead of starting it twice, Run is
disabled while it runs and Cancel stops it before the next step. Each finished run is stored as it ends
(pressing Run again resumes and reuses them), and the page shows which combination buys the most speed for
the least accuracy, with 95 % CIs. The app stays thin: choices come from ``lab.recipes``, numbers from
``lab.ablation``, figures and readable tables from ``lab.plots``.

Default: recipe ``stacked`` on ``ctr`` at size ``tiny``, 3 repeats (the smallest design with an interval):
10 arms on ctr (with the A/A arm and ctr's fast kernels) x 3 = 30 runs, about three minutes on 2 shared CPU
cores (105-257 s measured by tests/e2e/test_browser.py on a busy machine, before the fast-kernels arm); 1 repeat
is a labelled preview that crowns nothing; ``small`` with 3 repeats and 2 seeds is the meaningful one (tens of
minutes on 2 cores).

This file only draws the sidebar (``_sidebar``), the recommendation card above the tabs (``_card``: the one answer
for the sidebar's workload and size, measured first, predicted next, ending in a plain-PyTorch file) and one tab
per page module: every tab, the built-in ones too, is a ``dashboard/page_*.py`` with ``TITLE`` and ``render()``, a
short ``TAB`` label optional (``_pages``: the built-in ones first, grouped by what a person asks - what should I
use, where does the time go, how does it scale, this machine, stored runs - then the others by file name, then
those in ``LAB_DASHBOARD_PAGES``). Long work runs in the background worker (``_lifecycle``), never in
this script; every page shares one store handle (``_shared.store()``, ``st.cache_resource``).
"""

from __future__ import annotations

import _card
import _pages  # next to this file (Streamlit puts the script's folder on sys.path): dashboard/page_*.py
import _sidebar
import streamlit as st

st.set_page_config(page_title="Training-efficiency lab", layout="wide")
st.title("Training-efficiency lab")
st.caption("Which combination of techniques buys the most speed for the least accuracy, on *this* machine?")
choices = _sidebar.draw()
try:
    _card.draw(choices)  # the one answer, above every tab (lab.doctor.recommendation)
    PAGES = _pages.discover()
    for page, tab in zip(PAGES, st.tabs([p.tab for p in PAGES]), strict=True):
        with tab:
            _pages.show(page)
finally:
    _sidebar.forget()  # the next rerun draws the sidebar again: no page reads this one's snapshot
