"""Data-loading studies that train through :func:`lab.context.prepare`: the stall analysis and ideal-loader
bound (:mod:`.stalls`), the accuracy cost of skewed shards (:mod:`.skew`) and the loader auto-tuner
(:mod:`.autotune`). Taught in ``notebooks/01_data_loading.ipynb``."""
