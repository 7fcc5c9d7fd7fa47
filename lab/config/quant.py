"""Int8 quantization: the quantization family's config (``RunConfig.quant``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.config.checks import check_bool, check_choice, check_float, check_int
from lab.config.family import _Family


@dataclass(frozen=True, kw_only=True)
class QuantConfig(_Family):
    """Post-training (dynamic / static with calibration) or quantization-aware int8.

    ``flow``: ``pt2e`` (default) is torchao PT2E with X86InductorQuantizer's default config, compiled by Inductor
    (freezing); ``legacy`` the deprecated torch.ao eager / FX path, kept for comparison; ``auto`` quantizes with
    both and keeps the faster on the run's own batch (a measured probe, rule in ``details["quant"]["auto"]``,
    :mod:`lab.quant.flow_auto`; not with QAT). ``observer`` picks how static calibration sets activation ranges
    and ``per_channel=False`` one weight scale per tensor: both are
    legacy-flow knobs (PT2E's default config is histogram + per-channel; other values are refused with it). QAT
    always uses moving-average fake-quant and fine-tunes ``qat_epochs`` at ``lr * qat_lr_factor`` after the float
    training. Dynamic int8 of a model holding an RNN takes the legacy flow (PT2E has no int8 LSTM).

    ``reduce_range``: ``auto`` quantizes activations to 7 bits where the CPU has no int8 dot-product instructions
    (no VNNI / AMX: x86 int8 kernels then multiply u8 x s8 through 16-bit *saturating* adds, and full-range
    activations overflow them: PT2E's output error 0.012 -> 0.121 on an MLP with oneDNN capped at AVX2) and to 8
    bits elsewhere (the legacy fbgemm / x86 engines always use 7, torch's own default); ``on`` / ``off`` force it."""

    family: ClassVar[str] = "quant"
    SWITCH: ClassVar[str] = "quant.method (--quant)"
    INT8_METHODS: ClassVar[tuple[str, ...]] = ("dynamic", "static", "qat")
    METHODS: ClassVar[tuple[str, ...]] = ("none", *INT8_METHODS)
    FLOWS: ClassVar[tuple[str, ...]] = ("pt2e", "legacy", "auto")
    OBSERVERS: ClassVar[tuple[str, ...]] = ("histogram", "minmax", "moving_average")
    REDUCE_RANGE: ClassVar[tuple[str, ...]] = ("auto", "on", "off")
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {
        "method": METHODS, "flow": FLOWS, "observer": OBSERVERS, "reduce_range": REDUCE_RANGE}
    HELP: ClassVar[dict[str, str]] = {
        "method": "int8 quantization: dynamic or static (calibrated) post-training, or qat (quantization-aware "
                  "fine-tuning); none: off",
        "calibration_batches": "training batches static quantization calibrates the activation ranges on",
        "backend": "torch's quantized engine (legacy flow): auto, x86, fbgemm or qnnpack (auto: x86 where torch "
                   "has it, else qnnpack)",
        "observer": "how static calibration sets the activation ranges (legacy flow; PT2E uses histogram)",
        "per_channel": "one weight scale per output channel (--no-quant-per-channel: one per tensor; legacy flow)",
        "qat_epochs": "QAT fine-tuning epochs after the float training",
        "qat_lr_factor": "QAT fine-tuning lr as a multiple of the training lr",
        "flow": "pt2e: torchao PT2E compiled by Inductor; legacy: the torch.ao eager / FX path; auto: both, the "
                "faster on the run's own batch is kept (not with qat)",
        "reduce_range": "7-bit activations: auto where the CPU has no int8 dot-product instructions (no VNNI / "
                        "AMX), 8-bit elsewhere; on / off force it",
    }

    method: str = "none"
    calibration_batches: int = 16
    backend: str = "auto"
    observer: str = "histogram"
    per_channel: bool = True
    qat_epochs: int = 1
    qat_lr_factor: float = 0.1
    flow: str = "pt2e"  # torchao PT2E + X86InductorQuantizer, compiled; "legacy": torch.ao eager / FX
    reduce_range: str = "auto"  # 7-bit activations where int8 has no VNNI (see the docstring)

    def __post_init__(self) -> None:
        check_choice(self._name("method"), self.method, self.METHODS)
        check_choice(self._name("flow"), self.flow, self.FLOWS)
        check_int(self._name("calibration_batches"), self.calibration_batches, lo=1, hi=100_000)
        check_choice(self._name("backend"), self.backend, ("auto", "x86", "fbgemm", "qnnpack"))
        check_choice(self._name("observer"), self.observer, self.OBSERVERS)
        check_choice(self._name("reduce_range"), self.reduce_range, self.REDUCE_RANGE)
        check_bool(self._name("per_channel"), self.per_channel)
        check_int(self._name("qat_epochs"), self.qat_epochs, lo=1, hi=1000)
        check_float(self._name("qat_lr_factor"), self.qat_lr_factor, lo=0.0, hi=10.0, lo_open=True)
        self._refuse_when_off()

    @property
    def enabled(self) -> bool:
        return self.method != "none"
