"""Measurement: the one timer, memory, model counts, the environment stamp and the statistics.

Everything the lab reports goes through this package so that every technique is measured the same way
(docs/architecture.md section 5): a monotonic clock with a device sync (:mod:`.timing`), raw samples kept, warm-up
excluded, arms interleaved, speedups as ratios of medians with a bootstrap CI (:mod:`.stats`), and every
record stamped with the hardware it ran on (:mod:`.env`). Taught in ``notebooks/00_tour``.

Units are in the names: ``*_ms`` milliseconds, ``*_mb`` mebibytes (2**20 bytes), ``*_bytes`` bytes.
"""

from lab.measure import ceiling, contention, cpu, env, machine, memory, model, stats, timing, utilisation
from lab.measure.ceiling import *  # noqa: F403 - the names in its __all__
from lab.measure.contention import *  # noqa: F403 - the names in its __all__
from lab.measure.cpu import *  # noqa: F403 - the names in its __all__
from lab.measure.env import *  # noqa: F403 - the names in its __all__
from lab.measure.machine import *  # noqa: F403 - the names in its __all__
from lab.measure.memory import *  # noqa: F403 - the names in its __all__
from lab.measure.model import *  # noqa: F403 - the names in its __all__
from lab.measure.stats import *  # noqa: F403 - the names in its __all__
from lab.measure.timing import *  # noqa: F403 - the names in its __all__
from lab.measure.utilisation import *  # noqa: F403 - the names in its __all__

__all__ = [*ceiling.__all__, *contention.__all__, *cpu.__all__, *env.__all__, *machine.__all__, *memory.__all__,
           *model.__all__, *stats.__all__, *timing.__all__, *utilisation.__all__]



