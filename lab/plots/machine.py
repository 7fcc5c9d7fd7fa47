"""The machine card's peak table as a page reads it (the dashboard's Machine tab): every figure rounded the way
the other pages round theirs, from the same formatters (:func:`lab.ablation.record.fmt_ratio` for a ratio with
its 95 % interval, :func:`~lab.ablation.record.fmt_sig` for a figure without one).

Why not the card's raw floats: a GEMM peak read ``191.35539063212934`` and a ratio ``7.16x [6.31, 7.38]`` where
the ablation tab would print ``7.2x [6.3, 7.4]``; digits finer than the measurement's noise are not
information, and the same kind of figure should read the same on every page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lab.ablation.record import fmt_ratio, fmt_sig
from lab.measure.machine import peak_rows

if TYPE_CHECKING:
    from lab.measure.machine import MachineCard

#: The peak table's column that holds each dtype's GEMM ratio to fp32 with its interval (``peak_rows``).
VS_FP32 = "vs fp32 (1 thread, 95% CI)"
#: Its absolute figures (no interval: 3 significant digits).
FIGURES = ("1 thread", "all cores")


def peak_table(card: MachineCard) -> list[dict[str, Any]]:
    """:func:`lab.measure.machine.peak_rows` with each number as the pages print it (text, so no grid
    reformats it): the peaks at 3 significant digits, each GEMM ratio rounded to its interval's precision."""
    vs = card.peaks.get("gemm_vs_fp32", {})
    out = []
    for row in peak_rows(card):
        shown = dict(row)
        for col in FIGURES:
            shown[col] = fmt_sig(row.get(col)) or "-"
        dtype = str(row["figure"]).removeprefix("GEMM ")
        if str(row["figure"]).startswith("GEMM ") and dtype in vs and len(vs[dtype]) >= 3:
            shown[VS_FP32] = fmt_ratio(*vs[dtype][:3])
        out.append(shown)
    return out
