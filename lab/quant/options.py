"""The quantization family's option strings. Quantization runs on CPU engines (x86 / fbgemm / qnnpack), so its
options pin the device; on a CPU box that equals the baseline's ``auto`` device (on a GPU box compare int8
arms against a cpu baseline). The flow is part of the name where two flows are measured side by side:
``int8_static`` is the default flow (torchao PT2E, compiled), ``int8_static_legacy`` the torch.ao eager one."""

from __future__ import annotations

from lab.technique import AFTER_TRAINING, Option, register_options

_CPU = ("cpu_only",)

register_options(
    Option("int8_dynamic", {"quant.method": "dynamic", "device": "cpu"}, "quant",
           "dynamic int8 (weights ahead of time, activations on the fly)", _CPU, AFTER_TRAINING),
    Option("int8_eager", {"quant.method": "dynamic", "quant.flow": "legacy", "device": "cpu"}, "quant",
           "dynamic int8, torch.ao eager (no compile: seconds, not a minute; int8 EmbeddingBag weights)",
           _CPU, AFTER_TRAINING),
    Option("int8_static", {"quant.method": "static", "device": "cpu"}, "quant",
           "static int8 with calibration (torchao PT2E, compiled by Inductor)", _CPU, AFTER_TRAINING),
    Option("int8_static_legacy", {"quant.method": "static", "quant.flow": "legacy", "device": "cpu"}, "quant",
           "static int8 with calibration, torch.ao eager kernels", _CPU, AFTER_TRAINING),
    Option("int8_auto", {"quant.method": "static", "quant.flow": "auto", "device": "cpu"}, "quant",
           "static int8 through whichever flow (PT2E or eager) a probe on the run's own batch times faster",
           _CPU, AFTER_TRAINING),
    Option("int8_qat", {"quant.method": "qat", "device": "cpu"}, "quant",
           "quantization-aware fine-tuning, then int8", _CPU, AFTER_TRAINING),
)
