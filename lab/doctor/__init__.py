"""lab doctor: profile one model, predict which technique pays on this machine, then check the prediction.

- :mod:`.rates`: this machine's per-class rates (the crossover map of its hardware id, or micro-benchmarks
  at the model's own shapes).
- :mod:`.model_rates`: the model's own forward + backward timed with and without mixed precision or a loader.
- :mod:`.compile_rate`: what ``torch.compile`` saves per op and costs per call.
- :mod:`.predict` (over :mod:`.amdahl`): a breakdown (:mod:`lab.measure.profile`) and rates become predicted
  speedups with intervals (Amdahl over op classes; a measured hand-off for loaders).
- :mod:`.predict_compile`: compile from the model's own measurement, the map, or a structural prior (attention,
  recurrent, tiny step) that says "prior, not measured".
- :mod:`.data_parallel`: what W ranks would buy and the share comm takes.
- :mod:`.diagnosis`: the profiled baseline and the ranked prescription.
- :mod:`.calibration`: every interval widened to the doctor's own error on other verified cases (split
  conformal) and to the A/A noise of a verification.
- :mod:`.verification`: the top predictions measured by an interleaved ablation, predicted vs measured kept
  per hardware id.
- :mod:`.hours`: the prescription in hours, the user's full run per top pick (``--full-epochs`` / ``--rows``,
  else per 1000 steps), through :mod:`lab.ablation.project`; imported on its own (``lab.doctor.hours``).
- :mod:`.scores`: how right it was (per technique error on the speedup and the step, coverage, top-1, regret,
  Spearman).

``python -m lab doctor --workload ctr --size small --verify 3``; taught in ``notebooks/08_doctor.ipynb``.
"""

from lab.doctor import amdahl as _amdahl  # the module; its function of the same name is exported below
from lab.doctor import (
                        calibration,
                        compile_rate,
                        data_parallel,
                        diagnosis,
                        model_rates,
                        predict,
                        rates,
                        scores,
                        verification,
)
from lab.doctor import predict_compile as _predict_compile  # the same
from lab.doctor.amdahl import *  # noqa: F403
from lab.doctor.calibration import *  # noqa: F403
from lab.doctor.compile_rate import *  # noqa: F403 - the names in its __all__
from lab.doctor.data_parallel import *  # noqa: F403
from lab.doctor.diagnosis import *  # noqa: F403
from lab.doctor.model_rates import *  # noqa: F403
from lab.doctor.predict import *  # noqa: F403
from lab.doctor.predict_compile import *  # noqa: F403
from lab.doctor.rates import *  # noqa: F403
from lab.doctor.scores import *  # noqa: F403
from lab.doctor.verification import *  # noqa: F403

__all__ = sorted({*_amdahl.__all__, *calibration.__all__, *compile_rate.__all__, *data_parallel.__all__,
                  *diagnosis.__all__, *model_rates.__all__, *predict.__all__, *_predict_compile.__all__,
                  *rates.__all__, *scores.__all__, *verification.__all__})
