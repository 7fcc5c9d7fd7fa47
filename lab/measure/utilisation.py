"""How far a run is from this machine's limit: its step and its inference call against the card's GEMM peaks.

Why: "bf16 is 2.1x faster" says nothing about whether 2.1x is all this CPU can give, or whether the baseline
itself ran at 5 % of the peak, where no technique that speeds up matrix multiplies can pay. The machine card
(``python -m lab machine``, :mod:`lab.measure.machine`) measured the GEMM peak per dtype at 1 thread and at all
cores; the run knows its MACs per sample (fp32 and int8), its batch, its step and latency times, the dtype its
training ran in and its thread count. Utilisation is then the time the card's peak would need for the run's
multiply-accumulates (2 FLOPs each; forward + backward = 3 forwards) over the time measured: 1.0 would be a
step that is nothing but peak-speed GEMMs. A model whose work is not GEMMs (embedding lookups, elementwise ops,
an LSTM's small matmuls) sits far below 1 by nature; that is the finding, not an error.
"""

from __future__ import annotations

import os
from typing import Any

#: FLOPs per multiply-accumulate; a training step's forward + backward is about three forwards.
FLOPS_PER_MAC, TRAIN_FORWARDS = 2, 3


def peak_gflops(card: dict[str, Any], dtype: str, threads: int | None) -> tuple[float, str] | None:
    """The card's GEMM peak for ``dtype`` at the measured thread count nearest ``threads`` (``"1"`` or
    ``"all"``), with the key it read; ``None`` when the card has no such figure."""
    row = ((card or {}).get("peaks") or {}).get("gemm_gflops", {}).get(dtype) or {}
    cores = os.cpu_count() or 1
    key = "1" if (threads or cores) <= max(1, cores // 2) else "all"
    for k in (key, "1" if key == "all" else "all"):
        if row.get(k):
            return float(row[k]), k
    return None


def share_of_peak(macs: dict[str, float], time_ms: float, card: dict[str, Any], threads: int | None,
                forwards: int = 1) -> dict[str, Any] | None:
    """``{"share", "ideal_ms", "measured_ms", "achieved_gflops", "peaks"}`` for ``macs`` (``{dtype: MACs of one
    call}``, e.g. ``{"bf16": ..}`` or ``{"fp32": .., "int8": ..}``) done ``forwards`` times in ``time_ms``.
    ``share``: the peak-speed time of that work over the measured time. ``None`` without a time, work or peak."""
    work = {d: float(m) for d, m in macs.items() if m and m > 0}
    if not work or not time_ms or time_ms <= 0:
        return None
    ideal_s, peaks = 0.0, {}
    for dtype, m in work.items():
        peak = peak_gflops(card, dtype, threads)
        if peak is None:
            return None
        peaks[dtype] = {"gflops": round(peak[0], 2), "threads": peak[1]}
        ideal_s += FLOPS_PER_MAC * forwards * m / (peak[0] * 1e9)
    flops = FLOPS_PER_MAC * forwards * sum(work.values())
    return {"share": ideal_s * 1e3 / time_ms, "ideal_ms": ideal_s * 1e3, "measured_ms": time_ms,
            "achieved_gflops": flops / (time_ms * 1e-3) / 1e9, "peaks": peaks}


def run_utilisation(result: Any) -> dict[str, Any]:
    """A run's ``details["utilisation"]``: its training step (the median measured step, at the dtype its
    training resolved to) and its largest-batch inference call (fp32 and int8 MACs each at their own peak),
    against the card in its environment stamp; ``{"why": ...}`` instead where something is missing."""
    card = (result.env or {}).get("machine_card")
    if not card:
        return {"why": "no machine card for this hardware yet: `python -m lab machine` measures it (~30 s)"}
    threads = (result.env or {}).get("torch_threads")
    out: dict[str, Any] = {"hardware_id": card.get("hardware_id"), "card_measured_at": card.get("measured_at")}
    batch = int(result.batch_size or 0)
    dtype = (result.details.get("precision") or {}).get("resolved") or "fp32"
    fp32_macs = max(0, int(result.macs_per_sample) - int(result.int8_macs_per_sample or 0))
    if batch and result.median_step_ms:
        train = share_of_peak({dtype if dtype in ("bf16", "fp16") else "fp32": fp32_macs * batch},
                            result.median_step_ms, card, threads, forwards=TRAIN_FORWARDS)
        if train:
            out["train_step"] = {**train, "dtype": dtype, "batch": batch}
    keys = [k for k in result.latency_ms if k.startswith("batch_") and k[6:].isdigit() and result.latency_ms[k]]
    if keys:
        key = max(keys, key=lambda k: int(k[6:]))
        n, samples = int(key[6:]), sorted(result.latency_ms[key])
        infer = share_of_peak({"fp32": fp32_macs * n, "int8": int(result.int8_macs_per_sample or 0) * n},
                            samples[len(samples) // 2], card, threads)
        if infer:
            out["inference"] = {**infer, "batch": n}
    if "train_step" not in out and "inference" not in out:
        out["why"] = "no timed step or call with multiply-accumulates to compare with the card's peaks"
    return out


def map_utilisation(the_map: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rung's fp32 baseline, per axis, as a share of the GEMM peak of the card the map carries: the map's
    rows time the baseline beside each technique (``base_ms``, the same baseline per rung and axis), its rungs
    hold the MACs per sample and the batch. One row per workload x rung x axis: ``{"workload", "rung",
    "params", "axis", "share", "achieved_gflops", "ideal_ms", "measured_ms", "peaks"}``; empty without a card
    (an old map), so nothing is invented. The dispatch-bound rungs sit at a few per cent, the compute-bound
    ones near the peak: whether any technique that speeds up GEMMs can pay there."""
    card = the_map.get("machine_card")
    if not card:
        return []
    threads = the_map.get("threads")
    rungs = {(r["workload"], r["rung"]): r for r in the_map.get("rungs") or []}
    out, seen = [], set()
    for row in the_map.get("rows") or []:
        key = (row.get("workload"), row.get("rung"), row.get("axis"))
        rung = rungs.get(key[:2])
        if key in seen or rung is None or not row.get("base_ms"):
            continue
        seen.add(key)
        forwards = TRAIN_FORWARDS if key[2] == "train_step" else 1
        share = share_of_peak({"fp32": float(rung["macs_per_sample"]) * int(rung["batch_size"])}, row["base_ms"],
                              card, threads, forwards=forwards)
        if share:
            out.append({"workload": key[0], "rung": key[1], "params": rung["params"], "axis": key[2], **share})
    return out


def utilisation_line(details: dict[str, Any]) -> str | None:
    """``lab run``'s line: each share with the peak it is read against (``None`` when nothing was computed)."""
    u = details.get("utilisation") or {}
    parts = []
    for axis, label in (("train_step", "train step"), ("inference", "inference")):
        if axis in u:
            peaks = ", ".join(f"{d} {p['gflops']:.3g} GFLOP/s at {p['threads']} thread(s)" for d, p in
                              u[axis]["peaks"].items())
            parts.append(f"{label} {100 * u[axis]['share']:.2g} % ({u[axis]['achieved_gflops']:.3g} GFLOP/s "
                         f"of {peaks})")
    if parts:
        return "  utilisation of this machine's GEMM peak: " + "; ".join(parts)
    return f"  utilisation: {u['why']}" if u.get("why") else None


__all__ = ["FLOPS_PER_MAC", "TRAIN_FORWARDS", "map_utilisation", "peak_gflops", "run_utilisation", "share_of_peak",
           "utilisation_line"]
