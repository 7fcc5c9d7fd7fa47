"""int8's numerics on this CPU: whether activations get 7 or 8 bits, and what error that step allows.

Why it depends on the CPU: x86 int8 GEMMs multiply u8 activations by s8 weights. With VNNI or AMX
(``vpdpbusd``, tile dot products) the products are summed in 32 bits; without them (AVX2-only CPUs such as
AMD Zen 3, or any CPU with ``ONEDNN_MAX_CPU_ISA=AVX2``) oneDNN uses ``vpmaddubsw``, which adds pairs of
products in *saturating* 16 bits: 2 x 255 x 127 overflows, so full-range activations are clipped. Measured
here on an MLP 64 -> 256 -> 8 through PT2E: relative output error 0.012 with VNNI, 0.121 with oneDNN capped at
AVX2, back to about 0.02 with 7-bit activations (``reduce_range``). Convolutions did not saturate there (the
ResNet: 0.0065 at 8 bits, 0.013 at 7), so the PT2E flow narrows only Linear / attention inputs
(:func:`lab.quant.pt2e.make_quantizer`). torchao's x86 quantizer leaves ``reduce_range`` off; the lab turns it on
where the instructions are missing and records why in ``details.quant.reduce_range``. Taught in
``notebooks/04_quantization.ipynb``.
"""

from __future__ import annotations

from typing import Any

from lab.measure import cpu_capabilities

#: Relative output error of a correctly quantized small model, in activation steps (step = range / quant_max):
#: 12.75 steps is 0.05 at 8 bits (the static bound the tests held before), 0.10 at 7 bits.
ERROR_STEPS = {"static": 12.75, "dynamic": 20.4, "qat": 25.5}


def activation_quant_max(reduce_range: bool) -> int:
    """The largest u8 activation code: 127 with ``reduce_range`` (7 bits), else 255."""
    return 127 if reduce_range else 255


def reduce_range_choice(setting: str, flow: str, engine: str = "x86") -> dict[str, Any]:
    """``{"used": bool, "why": str}`` for ``quant.reduce_range`` = ``setting`` in ``flow`` on this CPU."""
    if setting in ("on", "off"):
        return {"used": setting == "on", "why": f"quant.reduce_range={setting} (forced)"}
    if flow == "legacy":
        used = engine in ("x86", "fbgemm")
        bits = 7 if used else 8
        return {"used": used, "why": f"torch's default for the {engine} engine ({bits}-bit activations)"}
    caps = cpu_capabilities()
    if caps.int8_vnni:
        return {"used": False, "why": "int8 dot-product instructions present (VNNI / AMX): full 8-bit activations"}
    return {"used": True, "why": "7-bit activations into Linear / attention layers: no int8 dot-product "
                                 f"instructions ({caps.missing('int8_vnni')}), "
                                 "so u8 x s8 pairs are summed in saturating 16 bits and full-range activations "
                                 "overflow"}


def error_bound(method: str, reduce_range: bool) -> float:
    """The relative output error a correct int8 model of ``method`` stays under: :data:`ERROR_STEPS` activation
    steps of its range (the bound doubles when ``reduce_range`` halves the codes)."""
    return ERROR_STEPS[method] / activation_quant_max(reduce_range)


__all__ = ["activation_quant_max", "error_bound", "ERROR_STEPS", "reduce_range_choice"]
