"""The mixed-precision family's option strings (what a recipe, an ablation arm or a map row names)."""

from __future__ import annotations

from lab.technique import TRAINING, Option, register_options

register_options(
    Option("bf16", {"precision.dtype": "bf16"}, "precision", "autocast to bfloat16 (no loss scaling)", axes=TRAINING),
    Option("fp16", {"precision.dtype": "fp16"}, "precision", "autocast to float16 + GradScaler", axes=TRAINING),
    Option("amp_auto", {"precision.dtype": "auto"}, "precision",
           "measure a few steps, keep a low precision only if it is faster", axes=TRAINING),
)
