"""What a pruned run records: theory (parameters, non-zeros, bytes, MACs) beside measured speed.

Why both, side by side: "50 % of the weights removed" is a statement about storage. Speed depends on
whether the kernels skip the work: masks on dense kernels do not (expect ~1.0x), narrower layers do but
lose to fixed per-layer costs (dispatch, BatchNorm, activations, memory traffic) when the layers are
small. Each shortfall gets a "why" tag in ``result.why`` (docs/architecture.md §5 rule 5).
Notebook: ``notebooks/03_pruning.ipynb``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune as tprune

from lab import measure
from lab.config import RunConfig
from lab.context import TrainContext, prepare
from lab.pruning.masks import (
    SHORTFALL,
    UNSTRUCTURED,
    layer_report,
    layer_sparsity,
    prunable_weights,
    sensitivity_scan,
    sparse_size_bytes,
)

WHY_MASKS = "masks do not skip work on dense kernels"
WHY_SMALL = ("layers too small to be compute-bound: fixed per-layer costs and non-MAC work (dispatch, BatchNorm, "
             "activations, embedding lookups, memory traffic) do not shrink with channels")
#: Accuracy a pruned, fine-tuned model may lose against its dense self, in points of the metric x 100: the
#: ablation's default ``--budget-pt`` (the verdict's budget), so one run says what the ablation would.
ACCURACY_BUDGET_PT = 1.0


def accuracy_why(info: dict[str, Any], higher_is_better: bool, budget_pt: float = ACCURACY_BUDGET_PT) -> str | None:
    """The "why" tag for a fine-tuned metric more than ``budget_pt`` points below the dense one (None when it is
    within the budget, nothing was fine-tuned or the metric is lower-is-better). It names the fine-tune's
    steps and learning rate: a structured prune changes the function (channels, heads, their BatchNorm
    statistics), and 1 epoch at ``0.1 x lr`` from a fresh optimizer barely moved the weights (HF BERT at 50 %:
    0.996 dense, 0.742 pruned, 0.742 after 16 steps at 2e-4; 1.000 after 16 steps at 2e-3), which is why the
    default factor is 1 now; a run that still misses the budget says so."""
    ft, dense, tuned = info.get("finetune"), info.get("metric_dense"), info.get("metric_finetuned")
    if not (ft and higher_is_better and dense is not None and tuned is not None):
        return None
    lost = 100.0 * (dense - tuned)
    info["accuracy_loss_pt"], info["accuracy_budget_pt"] = lost, budget_pt
    if lost <= budget_pt:
        return None
    return (f"the fine-tune did not recover the pruned model: {lost:.1f} pt below dense (budget {budget_pt:g} pt) "
            f"after {ft['steps']} steps at lr {ft['lr']:.3g}; a longer or faster fine-tune "
            "(--prune-finetune-epochs, --prune-finetune-lr-factor) or a smaller --prune-amount")


def speed_why(method: str, macs_ratio: float, speedup: float) -> str | None:
    """The "why" tag for a measured ``speedup`` below ``SHORTFALL`` x the theoretical ``macs_ratio``
    (None when it holds or theory promises nothing)."""
    if macs_ratio <= 1.05 or speedup >= SHORTFALL * macs_ratio:
        return None
    base = WHY_MASKS if method in UNSTRUCTURED else WHY_SMALL
    return f"{base} ({macs_ratio:.2f}x fewer MACs, {speedup:.2f}x measured)"


def record(ctx: TrainContext, dense: nn.Module, model: nn.Module, example: tuple, info: dict[str, Any]) -> None:
    """Fill ``ctx.result.details["pruning"]`` (and ``why``) comparing ``dense`` (the trained, unpruned
    architecture) with the final ``model``; ``example`` is one training batch on the run's device."""
    cfg, res, device = ctx.cfg, ctx.result, ctx.device
    n_example = len(example[0])
    layers = layer_report(model, example)
    dense_macs = measure.count_macs(dense, example) / n_example
    macs = measure.count_macs(model, example) / n_example
    skipped = sum(r["macs"] - r["macs_if_skipped"] for r in layers.values()) / n_example
    effective = max(macs - skipped, 1.0)
    info.update({
        "layers": layers,
        "params_dense": measure.count_params(dense),
        "params": measure.count_params(model),
        "nonzero_params": measure.count_nonzero_params(model),
        "bytes_dense": measure.serialized_size_bytes(dense),
        "bytes": measure.serialized_size_bytes(model),
        "bytes_sparse_format": sparse_size_bytes(model),
        "macs_per_sample_dense": dense_macs,
        "macs_per_sample": macs,
        "macs_per_sample_if_zeros_skipped": effective,
        "macs_ratio": dense_macs / effective,
    })
    total = sum(r["params"] for r in layers.values())
    info["sparsity_prunable"] = 1 - sum(r["nonzero"] for r in layers.values()) / max(total, 1)
    ft = info.get("finetune")
    train_ms = res.median_step_ms
    if ft and train_ms:
        info["train_step_speedup"] = train_ms / ft["median_step_ms"]
        info["train_step_note"] = "main-training vs fine-tune median step; not interleaved"
    if cfg.latency_repeats:
        n = min(cfg.eval_batch_size, len(ctx.data.test[0]))
        batch = tuple(t[:n] for t in ctx.data.test[:-1])
        repeats = max(5, cfg.latency_repeats // 2)
        lat = measure.inference_latency_ms({"dense": dense, "pruned": model},
                                           tuple(t.to(device) for t in batch), repeats=repeats, warmup=2)
        a, b = lat["dense"], lat["pruned"]
        ratio, lo, hi = measure.bootstrap_ratio_ci(a, b)
        info["inference"] = {"batch": n, "dense_ms": a, "pruned_ms": b, "speedup": ratio, "ci95": [lo, hi],
                             "threads": torch.get_num_threads()}
        why = speed_why(cfg.prune.method, info["macs_ratio"], ratio)
        if why:
            res.why.append(why)
    why = accuracy_why(info, ctx.workload.higher_is_better)
    if why:
        res.why.append(why)
    res.details["pruning"] = info


@dataclass
class SensitivityStudy:
    """A trained dense model's per-layer sensitivity scan (``rows``: ``{"layer", "amount", "metric"}``, no
    fine-tune), its dense ``metric``, the number of weights of each scanned layer (``sizes``), and the trained
    weights, so that a choice of per-layer amounts can be fine-tuned and scored (:meth:`finetuned`). Why the
    fine-tune: a scan without one overstates what pruning costs (at the notebook's default size no scanned layer
    stays within a point past 50 %, so a sparsity target was out of reach), and a pruned model is shipped only
    after one."""

    cfg: RunConfig
    rows: list[dict[str, Any]]
    dense: float
    sizes: dict[str, int]
    state: dict[str, torch.Tensor] = field(repr=False)

    def sparsity(self, amounts: Mapping[str, float]) -> float:
        """Share of the scanned layers' weights that ``amounts`` (``{layer: amount}``) zeroes."""
        return sum(round(a * self.sizes[n]) for n, a in amounts.items()) / sum(self.sizes.values())

    def finetuned(self, amounts: Mapping[str, float], epochs: int = 1) -> dict[str, Any]:
        """The trained model with ``amounts`` applied as L1 masks (``torch.nn.utils.prune``), fine-tuned
        ``epochs`` epoch(s) at ``lr * prune.finetune_lr_factor`` through the run's own ``ctx.fit``, the masks in
        place: its metric right after the masks and after the fine-tune, and each layer's sparsity read back."""
        unknown = sorted(set(amounts) - set(self.sizes))
        if unknown:
            raise ValueError(f"layers {unknown} were not scanned; scanned: {sorted(self.sizes)}")
        with prepare(self.cfg) as ctx:
            name = ctx.workload.metric_name
            model = ctx.new_model()
            model.load_state_dict(self.state)
            for layer, a in amounts.items():
                if a > 0:
                    module_name, weight = layer.rsplit(".", 1)
                    tprune.l1_unstructured(model.get_submodule(module_name), weight, amount=a)
            pruned = ctx.evaluate(model)[name]
            ctx.fit(model, epochs=epochs, lr=ctx.resolved.lr * self.cfg.prune.finetune_lr_factor, phase="finetune")
            return {"metric_pruned": pruned, "metric_finetuned": ctx.evaluate(model)[name],
                    "sparsity": {n: s for n, s in layer_sparsity(model).items() if n in self.sizes}}


def sensitivity_study(cfg: RunConfig, amounts: tuple[float, ...] = (0.5, 0.8, 0.95),
                      layers: tuple[str, ...] = ()) -> SensitivityStudy:
    """Train ``cfg``'s dense model once (the run's own ``ctx.fit``, no pruning) and scan each layer's
    sensitivity on the test split (:func:`~lab.pruning.masks.sensitivity_scan`), keeping the trained weights for
    :meth:`SensitivityStudy.finetuned`. Choosing per-layer amounts from this is how a sparsity budget is spent
    where it hurts least."""
    with prepare(cfg) as ctx:
        metric = ctx.workload.metric_name
        model = ctx.new_model()
        ctx.fit(model, epochs=ctx.resolved.epochs, lr=ctx.resolved.lr, max_steps=cfg.max_steps)
        dense = ctx.evaluate(model)[metric]
        rows = sensitivity_scan(model, lambda m: ctx.evaluate(m)[metric], amounts, layers)
        sizes = {f"{n}.{w}": getattr(m, w).numel() for n, m, w in prunable_weights(model, layers)}
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return SensitivityStudy(cfg=cfg, rows=rows, dense=dense, sizes=sizes, state=state)


def trained_sensitivity(cfg: RunConfig, amounts: tuple[float, ...] = (0.5, 0.8, 0.95),
                        layers: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], float]:
    """``(rows of sensitivity_scan, dense metric)`` of :func:`sensitivity_study`."""
    study = sensitivity_study(cfg, amounts, layers)
    return study.rows, study.dense

__all__ = [
    "accuracy_why", "ACCURACY_BUDGET_PT", "record", "SensitivityStudy", "sensitivity_study", "speed_why",
    "trained_sensitivity", "WHY_MASKS", "WHY_SMALL",
]
