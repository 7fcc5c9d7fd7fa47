"""The performance report in the dashboard: reading every ``benchmarks/results/<hardware-id>/report.json``,
the ratio figure, the display table and the hardware caption.

Why here and not in :mod:`lab.bench`: that module runs on the GPU box, which has neither plotly nor
pandas; this one is only for the dashboard and notebooks. The figure is a forest plot (points with 95 % CI
whiskers) rather than bars from zero, because a ratio is read against 1x, not against 0.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.bench import FAMILY_ORDER, REPORT_JSON, ceiling_cell

MET_COLORS = {"met": "#2ca02c", "met, point only": "#ff7f0e", "not met": "#d62728", "no goal": "#7f7f7f"}
TABLE_COLUMNS = ["hardware", "family", "figure", "measured", "unit", "CI", "goal", "met", "of ceiling", "reproduced",
                 "note"]


def _finite(x: Any) -> bool:
    # numbers.Real: a DataFrame hands back numpy scalars; a bool is not a measurement
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _ci(row: dict[str, Any]) -> tuple[float, float] | None:
    ci = row.get("ci95")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(map(_finite, ci)):
        return float(ci[0]), float(ci[1])
    return None


def _text(x: Any) -> str:
    # pandas stores a missing string as NaN (truthy), not None
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _met(row: dict[str, Any]) -> str:
    # a DataFrame turns a missing ``met`` into None or NaN depending on its neighbours: both mean "no goal"
    met = row.get("met")
    if met is None or (isinstance(met, float) and math.isnan(met)):
        return "no goal"
    if not bool(met):
        return "not met"
    # met on the point estimate while the CI's unfavourable end misses the goal (lab.bench.met_beyond_noise)
    return "met, point only" if row.get("met_beyond_noise") is False else "met"


def load_reports(root: str | Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every ``root/<folder>/report.json``, keyed by folder name, and one message per report that could not
    be read (a broken file must not hide the others' figures). A missing ``root`` is no report, not an error."""
    reports: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for path in sorted(Path(root).glob(f"*/{REPORT_JSON}")):
        try:
            rep = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: unreadable ({exc}); re-render it with `python -m lab bench --report-only`")
            continue
        if not isinstance(rep, dict) or not isinstance(rep.get("rows"), list):
            problems.append(f"{path}: not a performance report (no 'rows')")
            continue
        reports[path.parent.name] = rep
    return reports, problems


def report_frame(reports: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """All rows of all reports in one table, with a ``hardware`` column: the row's own hardware id (a GPU
    figure carries the GPU's), else its report's, else the folder name, so every figure is labelled."""
    rows = []
    for folder, rep in reports.items():
        for r in rep["rows"]:
            rows.append({**r, "hardware": r.get("hardware_id") or rep.get("hardware_id") or folder, "folder": folder})
    return pd.DataFrame(rows, columns=None if rows else ["hardware", "folder", "family", "name", "value", "unit"])


def ordered_families(families: Sequence[str]) -> list[str]:
    """The report's family order (headline first), then any family it does not know, alphabetically."""
    present = set(families)
    return [f for f in FAMILY_ORDER if f in present] + sorted(present - set(FAMILY_ORDER))


def hardware_caption(folder: str, report: dict[str, Any]) -> str:
    """One line saying what a report was measured on and with what, so a figure is never read without it."""
    env = report.get("env") or {}
    cores = env.get("usable_cores", env.get("logical_cores"))
    parts = [f"**{report.get('hardware_id') or folder}**: {env.get('device_name') or 'unknown device'}"]
    if env.get("gpu_count"):
        gpu = f"{env['gpu_count']} GPU, CUDA {env.get('cuda_version') or '?'}"
        if env.get("gpu_compute_capability"):
            gpu += f", sm {env['gpu_compute_capability']}"
        parts.append(f"{gpu}; host {env.get('cpu_model') or 'CPU'}, {cores} cores")
    else:
        parts.append(f"{cores} cores")
    parts.append(f"torch {env.get('torch_version') or '?'}")
    quick = report.get("quick") or []
    parts.append("quick" if quick == [True] else "full" if quick == [False] else "quick and full")
    shas = sorted({str(r.get("git_sha"))[:10] for r in report.get("rows", []) if r.get("git_sha")})
    parts.append("git " + (", ".join(shas) or "?") + (" (dirty tree)" if env.get("git_dirty") else ""))
    return "; ".join(parts)


def _reproduced(row: dict[str, Any]) -> str:
    prev = row.get("previous")
    if prev is None or (isinstance(prev, float) and math.isnan(prev)):
        return ""
    rel = row.get("rel_change")
    change = f"{rel:+.0%}" if _finite(rel) else ""
    within = row.get("within_ci")
    if within is None or (isinstance(within, float) and math.isnan(within)):
        return f"no CI; {change}"
    return ("yes" if within else "NO") + f" ({change})"


def report_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows as the dashboard shows them: the number stays numeric (sortable; NaN = skipped, the note
    says why), the CI and the verdicts as text."""
    out = []
    for r in df.to_dict("records"):
        ci = _ci(r)
        out.append({"hardware": r["hardware"], "family": r["family"], "figure": r["name"],
                    "measured": float(r["value"]) if _finite(r.get("value")) else math.nan,
                    "unit": _text(r.get("unit")),
                    "CI": f"[{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "", "goal": _text(r.get("goal")),
                    "met": "" if _met(r) == "no goal" else _met(r), "of ceiling": ceiling_cell(r),
                    "reproduced": _reproduced(r), "note": _text(r.get("note"))})
    return pd.DataFrame(out, columns=TABLE_COLUMNS)


def _short(text: Any, n: int = 160) -> str:
    text = _text(text).replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


#: Ratio kinds, each on its own axis (a 7x speedup and a 2x size ratio are different quantities).
RATIO_KINDS = {"speed": "speedup (x, 1 = no change)", "size": "size ratio (x smaller)",
               "memory": "memory ratio (x less)", "MACs": "MACs ratio (x fewer)"}
#: Longest figure label on the axis; the full name is in the hover text.
LABEL_CHARS = 48


def ratio_kind(row: dict[str, Any]) -> str:
    """Which ratio a figure is, from its name: size, memory, MACs, else speed."""
    name = f"{_text(row.get('name'))}".lower()
    if "macs" in name:
        return "MACs"
    if "size" in name or "bytes" in name:
        return "size"
    if "peak" in name or ("memory" in name.replace("in-memory", "")):  # "in-memory" names a loader
        return "memory"
    return "speed"


def report_figure(rows: list[dict[str, Any]] | pd.DataFrame) -> go.Figure:
    """The ratio figures (unit ``x``) as points with asymmetric 95 % CI whiskers, one per figure, labelled
    ``<family>: <name>``, coloured by whether the goal is met; 1x (no change) marked. One column of panels
    per hardware (titled with it) and one row per ratio kind (:data:`RATIO_KINDS`: speed, size, memory and
    MACs ratios never share an axis); whiskers clipped per row, the clipping in the hover text. Skipped
    figures (NaN) are left out: the table says why."""
    from lab.plots.common import clipped_whiskers, fig_title, ratio_range

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "hardware" not in df.columns:
        df["hardware"] = df["hardware_id"] if "hardware_id" in df.columns else "unknown hardware"
    if df.empty or "unit" not in df.columns:
        ratios = df.iloc[0:0]
    else:
        ratios = df[(df["unit"] == "x") & df["value"].map(_finite)]
    recs = ratios.to_dict("records")
    hardware = list(dict.fromkeys(r["hardware"] for r in recs))
    if not recs:
        fig = go.Figure()
        fig.add_annotation(text="no ratio figures to plot (none measured, or all skipped)", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(title="Measured ratios", height=200, xaxis_visible=False, yaxis_visible=False)
        return fig
    family_rank = {f: i for i, f in enumerate(ordered_families([r["family"] for r in recs]))}
    for r in recs:
        full = f"{r['family']}: {r['name']}"
        r["label"] = full if len(full) <= LABEL_CHARS else full[: LABEL_CHARS - 1] + "…"
        r["kind"] = ratio_kind(r)
    kinds = [k for k in RATIO_KINDS if any(r["kind"] == k for r in recs)]
    labels = {k: list(dict.fromkeys(r["label"] for r in sorted(recs, key=lambda r: family_rank[r["family"]])
                                    if r["kind"] == k)) for k in kinds}
    device = {hw: next((_text(r.get("device_name")) for r in recs if r["hardware"] == hw), "") for hw in hardware}
    width = max(12, 66 // max(len(hardware), 1))  # characters a column's title may take on a line (~540 px of dots)
    titles = [_wrapped(hw, width) + "<br>" + _wrapped(f"({device[hw] or '?'})", width) if i == 0 else ""
              for i in range(len(kinds)) for hw in hardware]
    title_lines = max((t.count("<br>") + 1 for t in titles if t), default=1)
    n_labels = [len(labels[k]) for k in kinds]
    fig = make_subplots(rows=len(kinds), cols=len(hardware), shared_yaxes=True, subplot_titles=titles,
                        horizontal_spacing=0.02, vertical_spacing=0.12 if len(kinds) > 1 else 0.0,
                        row_heights=[max(n, 1) for n in n_labels])
    shown: set[str] = set()
    for row_i, kind in enumerate(kinds, start=1):
        mine_kind = [r for r in recs if r["kind"] == kind]
        cis_kind = [_ci(r) for r in mine_kind]
        bounds = ratio_range([float(r["value"]) for r in mine_kind], [c[0] for c in cis_kind if c],
                             [c[1] for c in cis_kind if c], floor=None)
        for col, hw in enumerate(hardware, start=1):
            for status, color in MET_COLORS.items():
                mine = [r for r in mine_kind if r["hardware"] == hw and _met(r) == status]
                if not mine:
                    continue
                cis = [_ci(r) for r in mine]
                values = [float(r["value"]) for r in mine]
                plus, minus, clipped = clipped_whiskers(values, [c[0] if c else math.nan for c in cis],
                                                        [c[1] if c else math.nan for c in cis], bounds)
                fig.add_scatter(
                    x=values, y=[r["label"] for r in mine], mode="markers", name=status, legendgroup=status,
                    showlegend=status not in shown,
                    marker={"color": color, "size": 9, "symbol": ["diamond" if c else "circle" for c in clipped]},
                    error_x={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
                    customdata=[[hw, (f"[{c[0]:.3g}, {c[1]:.3g}]" if c else "no CI") + (" (clipped)" if k else ""),
                                 _text(r.get("goal")) or "none", _short(r.get("note")), status,
                                 f"{r['family']}: {r['name']}"]
                                for r, c, k in zip(mine, cis, clipped, strict=True)],
                    hovertemplate="<b>%{customdata[5]}</b><br>hardware: %{customdata[0]}<br>%{x:.3g}x, 95 % CI "
                                  "%{customdata[1]}<br>goal: %{customdata[2]} (%{customdata[4]})<br>%{customdata[3]}"
                                  "<extra></extra>",
                    row=row_i, col=col)
                shown.add(status)
            fig.add_vline(x=1.0, line_dash="dot", line_color="grey", row=row_i, col=col)
            fig.update_xaxes(range=list(bounds), row=row_i, col=col,
                             title_text=RATIO_KINDS[kind] if col == 1 or len(hardware) == 1 else None)
        fig.update_yaxes(categoryorder="array", categoryarray=labels[kind][::-1], automargin=True, row=row_i)
    fig.update_annotations(font_size=12)  # the facets' titles, each wrapped to its column (they printed over each
    # other at 1280 px: three hardware ids with their CPU names on one line each)
    fig.update_layout(title=fig_title("Measured ratios", "95 % CI; diamond: CI clipped (hover); colour: goal"),
                      legend_title="goal", height=170 + 16 * title_lines + 60 * len(kinds) + 26 * sum(n_labels),
                      margin={"l": 10, "t": 90 + 16 * title_lines})
    return fig


def _wrapped(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (``<br>``, plotly's break), at a space or after a
    hyphen (a hardware id is one hyphenated word), so a facet's title stays within its column."""
    words = [w for part in text.split(" ") for w in re.findall(r"[^-]+-?", part) or [part]]
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + len(word) + (0 if lines[-1].endswith("-") else 1) <= width:
            lines[-1] += word if lines[-1].endswith("-") else " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)
