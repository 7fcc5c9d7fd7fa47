"""Pure functions from results to plotly figures, shared by the notebooks and the dashboard.

Plotly is imported only inside this package, so ``import lab`` stays free of plotting packages (the GPU box
that runs the benchmarks has none). One module per family (:mod:`.data`, :mod:`.precision`, :mod:`.pruning`,
:mod:`.quant`, :mod:`.distributed`) plus :mod:`.run` (single runs), :mod:`.ablation` and :mod:`.report`
(the performance report); :mod:`.common` holds the phase colours and the one ratio-with-CI bar chart.
Used by every notebook and the dashboard. Each function takes records (RunResults, ``summarize``'s table,
plain rows) and returns a Figure; nothing is shown or written as a side effect.
"""

from lab.plots.ablation import speedup_bars, speedup_vs_accuracy
from lab.plots.common import PHASE_COLORS, ratio_bars
from lab.plots.details import technique_notes
from lab.plots.run import DETAIL_FIGURES, loss_curves, phase_breakdown, technique_figures
from lab.plots.tables import ablation_table, effects_table

__all__ = ["DETAIL_FIGURES", "PHASE_COLORS", "ablation_table", "effects_table", "loss_curves", "phase_breakdown",
           "ratio_bars", "speedup_bars", "speedup_vs_accuracy", "technique_figures", "technique_notes"]
