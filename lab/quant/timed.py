"""The quantization family's timed arms: the int8 model of a rung, built once and shared by the arms that time it.

The crossover map times an int8 option as one inference call of its int8 model (:mod:`lab.timed`). A PT2E build
exports, calibrates and compiles (seconds to a minute), so each (method, flow, what it was made from) is built
once per rung and kept on the bench; the ``--quant-flow auto`` probe, the arms that time its candidates and the
option's own arm all read the same model.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lab.config import QuantConfig
from lab.measure import count_macs
from lab.quant.fair import amdahl_bound, int8_macs
from lab.quant.graph import graph_layer_bytes
from lab.quant.int8 import quantize_with_report
from lab.timed import Bench


def int8_built(bench: Bench, method: str, flow: str = "legacy", pruned: nn.Module | None = None,
               derived: tuple[str, ...] = ()) -> tuple[nn.Module, dict[str, Any]]:
    """The rung's int8 model and its record for ``method`` x ``flow`` (built once per rung), of ``pruned``
    instead of the rung's model when given (``derived`` says how it was made: the cache key). Calibration: up to
    4 batches of the training rows."""
    key: tuple[str, ...] = ("int8", method, flow, *derived) if pruned is not None else ("int8", method, flow)
    if key not in bench.built:
        n = max(1, len(bench.train_rows[0]) // bench.batch_size)
        calib = [tuple(t[i * bench.batch_size:(i + 1) * bench.batch_size] for t in bench.train_rows)
                 for i in range(n)]
        qc = QuantConfig(method=method, calibration_batches=min(4, n), flow=flow)
        source = pruned if pruned is not None else bench.model
        bench.built[key] = quantize_with_report(source, qc, calib, example_inputs=bench.inputs)
    return bench.built[key]


def int8_share_note(bench: Bench, model: nn.Module, info: dict[str, Any]) -> str:
    """The share of one forward's MACs that runs in int8 layers, and the speedup that share allows if only
    those MACs got faster (:func:`lab.quant.fair.amdahl_bound`): the ceiling a row's int8 speedup is read
    against (PT2E static >= 4x only where the int8 MAC share is >= 90 %). For a PT2E graph also how much smaller
    its int8 layers are as stored (int8 weights, fp32 scales, int8 zero points, fp32 biases, against the same
    layers in fp32): the format allows at most (4k + 4) / (k + 9) for k weights per output channel
    (:func:`lab.quant.size_bound`), so the wide layers of the top rungs show what small ones cannot."""
    from lab.quant.pt2e import converted_graph

    rows = tuple(t[: min(16, bench.batch_size)] for t in bench.inputs)
    total = count_macs(bench.model, rows)
    share = int8_macs(bench.model, list((info.get("swap") or {}).get("swapped") or ()), rows) / total if total else 0.0
    note = f"int8 MAC share {share:.0%} (MAC bound {amdahl_bound(share):.2f}x)"
    graph = converted_graph(model)
    if graph is not None:
        f_bytes, q_bytes = graph_layer_bytes(graph)
        if q_bytes:
            note += f"; int8 layers {f_bytes / q_bytes:.2f}x smaller as stored"
    return note


__all__ = ["int8_built", "int8_share_note"]
