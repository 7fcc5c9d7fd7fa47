"""A run as a user pays for it: one-off costs as their own phase, and the time to a target quality.

The per-step ratio is what the lab measures best; the user's question is end to end. So every record carries
``details["one_off_s"]``: what the run paid once, whatever its length, read from where each family measures it:

- ``compile``: ``torch.compile``'s first step beyond the median step (``details["compute"]["compile_s"]``); it is
  paid inside the training loop, so it is already in ``train_time_s`` (listed in :data:`IN_LOOP`);
- ``optimizer_compile``: low-bit Adam's first-step compile (torchao), the first optimizer step beyond the median one
  (``details["memory"]["optimizer_compile_s"]``); inside the loop too;
- ``precision_probe``: the ``auto`` precision probe (``details["precision"]["auto"]["probe_s"]``), before training;
- ``prune_finetune``: the fine-tune after pruning (``details["pruning"]["finetune"]["time_s"]``);
- ``qat_finetune``: the fake-quant fine-tune of QAT (``details["quant"]["qat"]["time_s"]``);
- ``quantize``: PT2E export + prepare + calibration + convert (``details["quant"]["quantize_s"]``, QAT's
  fine-tune taken out), and ``int8_compile``: Inductor's compile of the int8 graph per batch size it met;
- ``checkpoint_writes``: the loop's checkpoint saves (taken out of ``train_time_s``);
- ``ddp_spawn``: a spawned rank's start (process creation to the start of its run, rank 0's).

``end_to_end_s`` = training loop + evaluations + the one-off costs outside the loop. Time to target: the
training time at the first evaluation (``cfg.eval_every``) whose metric reaches the target, plus what was paid
before it (probe, spawn); for a run whose delivered model is made after training (pruned, quantized) it is the
whole end-to-end time, and only if that final model reaches the target.
"""

from __future__ import annotations

import math
from typing import Any

from lab.result.sections import section

#: One-off parts already inside the training loop's wall time (``train_time_s``).
IN_LOOP = ("compile", "optimizer_compile")
#: One-off parts paid before the first training step (in a time to target whenever the target is reached).
BEFORE = ("precision_probe", "ddp_spawn")


def _get(d: Any, *keys: str) -> float:
    for k in keys:
        if not isinstance(d, dict):
            return 0.0
        d = d.get(k)
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) else 0.0


def one_off_costs(details: dict[str, Any]) -> dict[str, float]:
    """Seconds per one-off part that the run paid (parts it did not pay are left out) and ``total``."""
    quant = section(details, "quant")
    qat = _get(quant, "qat", "time_s")
    int8 = (quant.get("compile_s") or {}).get("int8") or {}
    optimizer_compile = _get(section(details, "memory"), "optimizer_compile_s")
    parts = {
        # a compiled forward's first-step excess holds a low-bit optimizer's compile too: counted once, as that
        "compile": max(_get(section(details, "compute"), "compile_s") - optimizer_compile, 0.0),
        "optimizer_compile": optimizer_compile,
        "precision_probe": _get(section(details, "precision"), "auto", "probe_s"),
        "prune_finetune": _get(section(details, "pruning"), "finetune", "time_s"),
        "qat_finetune": qat,
        # PT2E's timer runs around QAT's fine-tune as well: that part is qat_finetune's
        "quantize": max(_get(quant, "quantize_s") - (qat if quant.get("flow") == "pt2e" else 0.0), 0.0),
        "int8_compile": sum(float(v) for v in int8.values()) if isinstance(int8, dict) else 0.0,
        "checkpoint_writes": _get(details, "checkpoint_s"),
        "ddp_spawn": _get(details, "ddp_spawn_s"),
    }
    out = {k: v for k, v in parts.items() if v > 0}
    out["total"] = sum(out.values())
    return out


def outside_loop_s(one_off: dict[str, float]) -> float:
    """The one-off seconds not already in ``train_time_s``."""
    return sum(v for k, v in one_off.items() if k != "total" and k not in IN_LOOP)


def end_to_end_s(train_time_s: float, details: dict[str, Any]) -> float:
    """Training loop + evaluations during it + the one-off costs outside the loop: the time to a trained model."""
    one_off = details.get("one_off_s") or one_off_costs(details)
    return float(train_time_s) + _get(details, "eval_s") + outside_loop_s(one_off)


def reaches(metric: float | None, target: float, higher_is_better: bool) -> bool:
    if metric is None or not math.isfinite(metric):
        return False
    return metric >= target if higher_is_better else metric <= target


def transformed_after_training(config: dict[str, Any]) -> bool:
    """Whether the delivered model is made after training (pruned or quantized): then only the final metric,
    at the end-to-end time, can reach a target."""
    return any((config.get(fam) or {}).get("method", "none") != "none" for fam in ("prune", "quant"))


def time_to_target(*, target: float, higher_is_better: bool, curve: list[dict[str, float]], final_metric: float | None,
                   train_time_s: float, details: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``{"target", "reached", "s", "step", "how"}``: when the run first reached ``target`` (``s`` None and
    ``reached`` False when it never did, or when it has no evaluation curve to say)."""
    one_off = details.get("one_off_s") or one_off_costs(details)
    out: dict[str, Any] = {"target": float(target), "higher_is_better": bool(higher_is_better), "reached": False,
                           "s": None, "step": None}
    if transformed_after_training(config):
        out["how"] = "final model (made after training): end-to-end time if it reaches the target"
        if reaches(final_metric, target, higher_is_better):
            out.update(reached=True, s=end_to_end_s(train_time_s, {**details, "one_off_s": one_off}))
        return out
    if not curve:
        out["how"] = "no evaluation curve (set eval_every or target_metric)"
        return out
    out["how"] = "first evaluation reaching the target: training time so far + one-off costs paid before it"
    for point in curve:
        if reaches(point.get("metric"), target, higher_is_better):
            before = sum(one_off.get(k, 0.0) for k in BEFORE)
            out.update(reached=True, s=float(point["train_s"]) + before, step=int(point["step"]))
            break
    return out


def finalize(result: Any) -> None:
    """Write ``details["one_off_s"]`` (every record) and, when the config names a ``target_metric``,
    ``details["time_to_target"]`` into ``result`` (a :class:`lab.result.RunResult`)."""
    details = result.details
    details["one_off_s"] = one_off_costs(details)
    target = (result.config or {}).get("target_metric")
    if target is not None and result.status == "ok":
        details["time_to_target"] = time_to_target(
            target=float(target), higher_is_better=result.higher_is_better, curve=details.get("eval_curve") or [],
            final_metric=result.metric, train_time_s=result.train_time_s, details=details, config=result.config)


def format_timeline(result: Any) -> list[str]:
    """``lab run``'s lines for the one-off costs and the time to target (none when there is nothing to say)."""
    details, lines = result.details, []
    one_off = details.get("one_off_s") or {}
    parts = {k: v for k, v in one_off.items() if k != "total"}
    e2e = end_to_end_s(result.train_time_s, details)
    evals = details.get("eval_curve") or []
    if result.status == "ok":
        shown = "  ".join(f"{k.replace('_', ' ')} {v:.3g} s" + (" (in train)" if k in IN_LOOP else "")
                          for k, v in parts.items()) or "none"
        lines.append(f"  one-off costs: {shown}   evaluations {_get(details, 'eval_s'):.3g} s ({len(evals)})   "
                     f"end to end {e2e:.3g} s")
    ttt = details.get("time_to_target")
    if ttt:
        sign = ">=" if ttt.get("higher_is_better", True) else "<="
        lines.append(f"  time to target {result.metric_name} {sign} {ttt['target']:.4g}: "
                     + (f"{ttt['s']:.3g} s" + (f" (step {ttt['step']})" if ttt.get("step") is not None else "")
                        if ttt["reached"] else "never reached") + f"   [{ttt.get('how')}]")
    return lines


__all__ = ["BEFORE", "IN_LOOP", "end_to_end_s", "finalize", "format_timeline", "one_off_costs", "outside_loop_s",
           "reaches", "time_to_target", "transformed_after_training"]
