"""Dashboard tab "Performance report": the benchmarks' figures (``benchmarks/results/<hardware-id>/`` or
``LAB_BENCH_RESULTS``), each on the hardware it was measured on, against the project's goals and anchors."""

from __future__ import annotations

import _shared
import _views
import streamlit as st

from lab.bench import ANCHORS
from lab.crossover.report import cross_hardware_table, load_maps
from lab.measure import environment_stamp, other_machine_note
from lab.plots.report import (
    hardware_caption,
    load_reports,
    ordered_families,
    report_figure,
    report_frame,
    report_table,
)

TITLE = "Performance report"
TAB = "Report"  # the tab row's label, short so the row fits at 1280 px (_pages)


def render() -> None:
    # read on every rerun (cheap: a few JSON files), so a report written while the app runs shows up
    bench_root = _shared.bench_root()
    reports, problems = load_reports(bench_root)
    for problem in problems:
        st.warning(problem)
    if not reports:
        st.info(f"No performance report under `{bench_root}` yet: run `make bench-quick` (or "
                "`bash benchmarks/gpu.sh` on a GPU box), then reload this page.")
        return
    report_rows = report_frame(reports)
    hw_ids = list(dict.fromkeys(report_rows["hardware"]))
    this_hw = environment_stamp()["hardware_id"]
    if this_hw not in hw_ids:  # the first line: none of these figures is this machine's
        st.warning(other_machine_note(", ".join(hw_ids), "Every report below", "make bench-quick (about 10 minutes)")
                   + " This machine has no report yet.")
    else:
        others = ", ".join(h for h in hw_ids if h != this_hw)
        st.markdown(f"This machine (**{this_hw}**) has a report below" + (f"; others: {others}." if others else "."))
    st.markdown("The benchmarks' figures, each on the hardware it was measured on: ratios with bootstrap "
                "95 % CIs against the project's goals; the anchors are other people's figures on other hardware.")
    families = ordered_families(report_rows["family"])
    rc1, rc2 = st.columns(2)
    chosen_hw = rc1.multiselect("Hardware", hw_ids, default=hw_ids, key="report_hw")
    chosen_fam = rc2.multiselect("Families", families, default=families, key="report_families")
    for folder, rep in reports.items():
        if set(report_rows.loc[report_rows["folder"] == folder, "hardware"]) & set(chosen_hw):
            st.caption(hardware_caption(folder, rep))
    view = report_rows[report_rows["hardware"].isin(chosen_hw) & report_rows["family"].isin(chosen_fam)]
    if view.empty:
        st.warning("Pick at least one hardware and one family.")
        return
    st.plotly_chart(report_figure(view), key="report_chart")
    table = report_table(view)
    _shared.dataframe(table, key="report_table", hide_index=True, width="stretch",
                      height=_views.table_height(len(table)),
                      column_config={"measured": st.column_config.NumberColumn(format="%.3g")})
    with st.expander("Techniques across machines (each machine's own crossover map)"):
        st.markdown(cross_hardware_table(load_maps(bench_root)))
    with st.expander("Anchors: the published figures each family is compared with"):
        for fam in ordered_families(view["family"]):
            anchor = ANCHORS.get(fam)
            st.markdown(f"**{fam}**: {anchor.claim} ({anchor.source})" if anchor else f"**{fam}**: no anchor")
