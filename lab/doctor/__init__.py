"""lab doctor: profile one model, predict which technique pays on this machine, then check the prediction.

:mod:`.rates` gathers this machine's per-class rates (the crossover map of its hardware id, or
micro-benchmarks at the model's own shapes); :mod:`.compile_rate` measures what ``torch.compile`` saves per
op and costs per call; :mod:`.predict` turns a breakdown (:mod:`lab.measure.profile`) and rates into
predicted speedups with intervals (Amdahl over op classes; an overlap model for loaders); :mod:`.data_parallel`
says what W ranks would buy and the share comm takes; :mod:`.diagnosis` runs the profiled baseline and ranks
the prescription; :mod:`.verification` measures the top predictions with an interleaved ablation and keeps
predicted vs measured per hardware id. ``python -m lab doctor --workload ctr --size small --verify 3``;
taught in ``notebooks/08_doctor.ipynb``.
"""

from lab.doctor import compile_rate, data_parallel, diagnosis, predict, rates, verification
from lab.doctor.compile_rate import *  # noqa: F403 - the names in its __all__
from lab.doctor.data_parallel import *  # noqa: F403
from lab.doctor.diagnosis import *  # noqa: F403
from lab.doctor.predict import *  # noqa: F403
from lab.doctor.rates import *  # noqa: F403
from lab.doctor.verification import *  # noqa: F403

__all__ = [*compile_rate.__all__, *data_parallel.__all__, *diagnosis.__all__, *predict.__all__, *rates.__all__,
           *verification.__all__]
