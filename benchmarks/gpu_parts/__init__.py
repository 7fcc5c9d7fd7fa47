"""The five parts of ``benchmarks/gpu.py`` (the one-session GPU benchmark), one module each, plus what they share.

``common`` holds the measuring, the figure helpers, the ``gpu.json`` report and the device handling; ``settings``
the sizes and time budgets; ``precision``, ``data``, ``pruning``, ``distributed`` and ``quantization`` one part
each (``part_<name>(ctx, figs)``). ``benchmarks/gpu.py`` is the entry point that runs them in order.
"""

import _common  # noqa: F401 - first: puts the repository root on sys.path, so ``lab`` imports without installing
