"""What the Ablation and Stored-runs tabs draw for one ablation table: the verdict, the figures one under
the other (a half-width column cuts titles and squashes bars), the humanised table and the "why" as
sentences, the factorial effects, and each family's details for the chosen arm (selection kept across
reruns by its widget key; no expander, which collapsed on every selection)."""

from __future__ import annotations

import streamlit as st

from lab.ablation import interaction_effects, pareto_front, verdict
from lab.plots import (
    ablation_table,
    effects_table,
    phase_breakdown,
    speedup_bars,
    speedup_vs_accuracy,
    technique_figures,
    technique_notes,
)
from lab.plots.tables import why_lines


def table_height(n_rows: int, cap: int = 720) -> int:
    """Pixels that show every row of a dataframe (a scroll bar only beyond ``cap``)."""
    return min(38 + 35 * max(n_rows, 1), cap)


def show_table(df, key: str) -> None:
    st.dataframe(ablation_table(df), key=key, hide_index=True, width="stretch",
                 height=table_height(len(df)))


def show_ablation(df, runs_by_arm: dict | None, *, speed: str, speed_name: str, budget_pt: float) -> None:
    said = verdict(df, budget_pt, speed=speed)
    (st.success if said["winner"] else st.warning)(f"Verdict ({speed_name}): {said['text']}")
    st.caption("An arm competes only on the axes its techniques can change (post-training int8 and pruning: "
               "inference and size; precision, loaders, compile: training); the A/A arm reruns the baseline "
               "and shows the noise floor. Hover a point or a bar for its interval and why.")
    for _, row in df[df["status"] != "ok"].iterrows():
        st.error(f"Arm {row['arm']}: {row['error']}")
    st.plotly_chart(speedup_vs_accuracy(df, speed=speed, front=pareto_front(df, speed), budget_pt=budget_pt),
                    key="pareto_chart")
    st.plotly_chart(speedup_bars(df), key="speedup_chart")
    show_table(df, "ablation_table")
    lines = why_lines(df)
    if lines:
        st.markdown("**Why** (what the measurements say about each arm)\n\n" + "\n".join(f"- {w}" for w in lines))
    effects = interaction_effects(df, speed=speed)
    if not effects.empty:
        st.subheader("Do they compound or cancel?")
        st.caption("Factorial effects on the speed axis with 95 % intervals: main effects, 2-way and 3-way terms.")
        st.dataframe(effects_table(effects), key="interactions", hide_index=True, width="stretch",
                     height=table_height(len(effects)))
    if runs_by_arm:
        show_details(runs_by_arm)
    st.download_button("Download CSV (every column, full precision)", df.to_csv(index=False),
                       file_name="ablation.csv", mime="text/csv", key="download")


def show_details(runs_by_arm: dict) -> None:
    firsts = {arm: next((r for r in rs if r.status == "ok"), None) for arm, rs in runs_by_arm.items()}
    firsts = {a: r for a, r in firsts.items() if r is not None}
    if not firsts:
        return
    st.plotly_chart(phase_breakdown(list(firsts.values()), labels=list(firsts)), key="phases_chart")
    st.subheader("Technique details")
    arm = st.selectbox("Arm", list(firsts), key="detail_arm",
                       help="each family's own figures for this arm's first finished run")
    result = firsts[arm]
    notes = technique_notes(result)
    if notes:
        st.markdown("\n".join(f"- {n}" for n in notes))
    figs = technique_figures(result)
    if not figs and not notes:
        st.caption("Nothing technique-specific to show for this arm (the baseline trains plain fp32).")
    for name, fig in figs.items():
        st.plotly_chart(fig, key=f"detail_{name}")
