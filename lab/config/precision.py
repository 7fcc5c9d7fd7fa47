"""Numeric precision of the step: the mixed-precision family's config (``RunConfig.precision``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_choice, fail
from lab.config.family import _Family


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig(_Family):
    """Numeric precision of the forward pass (autocast); ``fp32_modules`` names modules kept in fp32."""

    family: ClassVar[str] = "precision"
    SWITCH: ClassVar[str] = "precision.dtype other than 'fp32' (--precision)"
    DTYPES: ClassVar[tuple[str, ...]] = ("fp32", "bf16", "fp16", "auto")
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {"dtype": DTYPES}
    HELP: ClassVar[dict[str, str]] = {
        "dtype": "forward-pass precision under autocast (auto: decided on the run's own first steps)",
        "fp32_modules": "comma-separated module names or types kept in fp32 under autocast (e.g. head,LSTM)",
    }

    dtype: str = "fp32"
    fp32_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice(self._name("dtype"), self.dtype, self.DTYPES)
        if not isinstance(self.fp32_modules, tuple) or not all(isinstance(m, str) and m
                                                               for m in self.fp32_modules):
            fail(self._name("fp32_modules"), self.fp32_modules, "must be a tuple of module names or types")
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.dtype != "fp32"
