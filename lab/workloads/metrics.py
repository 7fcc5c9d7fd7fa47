"""Metrics the workloads share: rank-based AUC and top-1 accuracy, on CPU tensors or numpy arrays; and
:func:`classifier`, the workload every built-in but ``ctr`` is: top-1 accuracy under cross-entropy."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .base import Workload


def roc_auc(scores: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> float:
    """Rank-based (Mann-Whitney) AUC with average ranks for ties; NaN when only one class is present."""
    s = (scores.detach().float().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores))
    y = (labels.detach().float().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels))
    s, pos = s.astype(np.float64).ravel(), y.ravel() > 0.5
    n_pos = int(pos.sum())
    n_neg = pos.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each tie group
    rank_sum = avg_rank[inverse][pos].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def top1_accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
    """Share of rows whose arg-max class is the target."""
    return float((logits.argmax(dim=1) == target).float().mean())


def classification_loss(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on fp32 logits (autocast may hand back bf16/fp16 ones)."""
    return F.cross_entropy(outputs.float(), target)


def classification_metrics(outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 accuracy and the cross-entropy loss over a whole split."""
    logits = outputs.detach().float()
    return {"accuracy": top1_accuracy(logits, target), "loss": float(F.cross_entropy(logits, target))}


def classifier(**fields: object) -> Workload:
    """A :class:`~lab.workloads.base.Workload` that classifies: cross-entropy loss, scored by top-1
    ``accuracy`` (higher is better); ``fields`` are the rest of the workload (name, data, model, sizes ...)."""
    return Workload(metric_name="accuracy", loss=classification_loss, evaluate=classification_metrics,
                    **fields)  # type: ignore[arg-type]
