"""The quantization family's option strings. Quantization runs on CPU engines (x86 / fbgemm / qnnpack), so its
options pin the device; on a CPU box that equals the baseline's ``auto`` device (on a GPU box compare int8
arms against a cpu baseline). The flow is part of the name where two flows are measured side by side:
``int8_static`` is the default flow (torchao PT2E, compiled), ``int8_static_legacy`` the torch.ao eager one."""

from __future__ import annotations

from lab.technique import AFTER_TRAINING, Option, register_options


def _int8(name: str, method: str, description: str, flow: str | None = None) -> Option:
    """An int8 option: ``quant.method`` (and ``quant.flow`` where it is not the default), on the CPU."""
    overrides = {"quant.method": method, **({"quant.flow": flow} if flow else {}), "device": "cpu"}
    return Option(name, overrides, "quant", description, ("cpu_only",), AFTER_TRAINING)


register_options(
    _int8("int8_dynamic", "dynamic", "dynamic int8 (weights ahead of time, activations on the fly)"),
    _int8("int8_eager", "dynamic", "dynamic int8, torch.ao eager (no compile: seconds, not a minute; int8 "
          "EmbeddingBag weights)", flow="legacy"),
    _int8("int8_static", "static", "static int8 with calibration (torchao PT2E, compiled by Inductor)"),
    _int8("int8_static_legacy", "static", "static int8 with calibration, torch.ao eager kernels", flow="legacy"),
    _int8("int8_auto", "static", "static int8 through whichever flow (PT2E or eager) a probe on the run's own "
          "batch times faster", flow="auto"),
    _int8("int8_qat", "qat", "quantization-aware fine-tuning, then int8"),
)
