"""``auto`` on a run too short to probe: decided from a stored probe of the same model, the machine card, or fp32.

Why: on a 62-step MNIST-example run ``auto`` measured 0.72x while bf16 measured 1.45x: a probe on a
run that short cannot repay the first steps of its candidates (:func:`lab.precision.inrun.probe_pays`), so it
only costs. Such a run does not probe. It takes, in this order:

1. **a stored probe of the same model** (:func:`save_probe`, written whenever a probe of a run decided on whole
   rounds while the machine was quiet): same workload, size, rung, batch, threads, device and fp32 islands on
   this hardware id, kept beside the results store (``<store dir>/auto_probes/<hardware-id>.json``). Its choice
   is taken when it is still a candidate here;
2. **the machine card** (``python -m lab machine``): a candidate whose GEMM peak is not above fp32's cannot pay
   on any step here; a card that allows a gain says how much at most, but a step is not all GEMM (casts,
   elementwise ops, dispatch), so the card alone never picks a low precision;
3. **fp32**, said with what would let ``auto`` decide next time (a longer run of this model stores its probe).

The crossover map is not read: it sits above the technique packages (``lab.crossover``), and its rates are per
workload along a ladder, not this model's. ``details["precision"]["auto"]["decided_by"]`` names the source.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lab.context import TrainContext
from lab.measure import load_card
from lab.measure.machine import ratio_limit
from lab.result import utc_now_iso
from lab.store import default_store_path

#: ``details["precision"]["auto"]["decided_by"]`` values of an unprobed decision.
SOURCES = ("stored probe", "machine card", "kept fp32")


def probe_key(ctx: TrainContext) -> str:
    """What makes two runs "the same model" for a probe: the workload and its size / rung, the batch, the threads,
    the device type and the fp32 islands (the step the probe timed)."""
    cfg = ctx.cfg
    threads = cfg.threads or torch.get_num_threads()
    islands = ",".join(sorted(cfg.precision.fp32_modules or ()))
    return (f"{cfg.workload}|{cfg.size}|{cfg.model_scale or ''}|batch {ctx.resolved.batch_size}|threads {threads}|"
            f"{ctx.device.type}|fp32 {islands}")


def probes_path(hardware_id: str) -> Path:
    return default_store_path().parent / "auto_probes" / f"{hardware_id}.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_probe(ctx: TrainContext, record: dict[str, Any]) -> Path | None:
    """Keep a probe's decision for later short runs of the same model; only one decided on >= its minimum rounds on
    a quiet machine (the caller checks). ``None`` when the file cannot be written (a read-only store: the run goes
    on without it)."""
    path = probes_path(ctx.result.hardware_id)
    compare = {k: {f: v.get(f) for f in ("speedup", "ci_lo", "ci_hi", "verdict")}
               for k, v in (record.get("compare") or {}).items()}
    entry = {"choice": record["choice"], "compare": compare, "rounds": record.get("rounds"),
             "run_steps": (record.get("plan") or {}).get("run_steps"), "at": utc_now_iso(),
             "in_run": bool(record.get("in_run"))}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path)
        data[probe_key(ctx)] = entry
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def load_probe(ctx: TrainContext) -> dict[str, Any] | None:
    return _read(probes_path(ctx.result.hardware_id)).get(probe_key(ctx))


def decide_unprobed(ctx: TrainContext, arms: list[str], short: str) -> tuple[str, str, str]:
    """``(choice, why, decided_by)`` without probing (module docstring); ``short``: why the run is not probed."""
    stored = load_probe(ctx)
    if stored is not None and stored.get("choice") in arms:
        choice = stored["choice"]
        row = (stored.get("compare") or {}).get(choice) or {}
        fig = (f" x{row['speedup']:.2f} [{row['ci_lo']:.2f}, {row['ci_hi']:.2f}]"
               if all(isinstance(row.get(k), (int, float)) for k in ("speedup", "ci_lo", "ci_hi")) else "")
        return choice, (f"auto chose {choice} without a probe ({short}): a stored probe of this model on this machine "
                        f"chose {choice}{fig} over {stored.get('rounds')} rounds of a {stored.get('run_steps')}-step "
                        f"run ({stored.get('at')})"), "stored probe"
    card = load_card(ctx.result.hardware_id)
    limits = {a: ratio_limit(card, a) for a in arms if a != "fp32"} if card is not None else {}
    known = {a: r for a, r in limits.items() if r is not None}
    if known and all(r <= 1.0 for r in known.values()):
        peaks = ", ".join(f"{a} {r:.2g}x" for a, r in known.items())
        return "fp32", (f"auto chose fp32 without a probe ({short}): the machine card's GEMM peaks ({peaks} fp32's) "
                        "leave nothing to gain"), "machine card"
    card_says = ("; the machine card allows at most " + ", ".join(f"{a} {r:.1f}x" for a, r in known.items())
                 + " on a GEMM-bound step, which no step is wholly") if known else ""
    return "fp32", (f"auto chose fp32 without a probe ({short}): no stored probe of this model{card_says}; a run of "
                    "this model long enough to be probed stores one for the next short run"), "kept fp32"


__all__ = ["SOURCES", "decide_unprobed", "load_probe", "probe_key", "probes_path", "save_probe"]
