"""Ablations: a baseline plus named arms (and an A/A arm), run interleaved with repeats and seeds,
summarised with CIs, read conservatively.

:mod:`.runner` runs and stores them (resumable), :mod:`.summary` builds the one-row-per-arm table,
:mod:`.verdicts` reads it (Pareto front, best within budget beyond noise, the verdict sentence, factorial
effects with intervals). Taught in ``notebooks/06_ablations``; the dashboard and ``lab.recipes`` build on it.
"""

from lab.ablation import runner, summary, verdicts
from lab.ablation.runner import *  # noqa: F403 - the names in its __all__
from lab.ablation.summary import *  # noqa: F403
from lab.ablation.verdicts import *  # noqa: F403

__all__ = [*runner.__all__, *summary.__all__, *verdicts.__all__]
