"""Part 3, pruning: 2:4 semi-structured sparse Linear (cuSPARSELt, else CUTLASS) against the dense Linear holding
the same masked weights: inference speedup and the kernel's numerical error.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _common import figure
from torch import nn

from lab.measure import median

from .common import (
    PartContext,
    error_text,
    free_memory,
    interleaved_ms,
    max_errors,
    median_figure,
    ratio_figure,
    skipped,
    sync,
)


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """Boolean 2:4 mask for a [out, in] weight: in every group of 4 consecutive inputs keep the 2 largest |w|
    (the pattern NVIDIA's sparse tensor cores execute; magnitude is the usual one-shot criterion)."""
    if weight.dim() != 2 or weight.shape[1] % 4:
        raise ValueError(f"2:4 sparsity needs a 2-D weight with in_features % 4 == 0, got {tuple(weight.shape)}")
    groups = weight.detach().abs().reshape(weight.shape[0], -1, 4)
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(weight.shape)


def part_pruning(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
    """2:4 sparse Linear vs the dense Linear holding the very same (masked) weights: the speed difference is
    the kernel's alone; the error vs that dense layer is the kernel's numerical error, not pruning's."""
    try:
        from torch.sparse import to_sparse_semi_structured
    except ImportError as exc:
        figs.append(skipped("2:4 sparse linear: all shapes", f"torch.sparse.to_sparse_semi_structured missing: "
                                                             f"{error_text(exc)}", "pruning"))
        return
    for tokens, k, n_out in ctx.sz.prune_shapes:
        for dname in ctx.sz.prune_dtypes:
            prune_case(ctx, tokens, k, n_out, dname, to_sparse_semi_structured, figs)
            ctx.checkpoint()
            free_memory()


def prune_case(ctx: PartContext, tokens: int, k: int, n_out: int, dname: str,
               to_sparse: Callable[[torch.Tensor], torch.Tensor], figs: list[dict[str, Any]]) -> None:
    """One shape and dtype: dense vs 2:4 sparse inference on ``tokens`` rows."""
    dev, sz, fam = ctx.device, ctx.sz, "pruning"
    label = f"2:4 linear {tokens}x{k}->{n_out} {dname}"
    if ctx.left_s() < 0:
        figs.append(skipped(f"{label} speedup vs dense", "time budget used up", fam))
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dname]
    torch.manual_seed(0)
    dense = nn.Linear(k, n_out).to(device=dev, dtype=dtype).eval()
    orig = dense.weight.detach().clone()
    with torch.no_grad():
        dense.weight.mul_(mask_2_4(dense.weight))
    x = torch.randn(tokens, k, device=dev, dtype=dtype)
    try:
        sparse, out_s, backend = sparse_linear(dense, x, to_sparse)
    except Exception as exc:  # noqa: BLE001 - CPU, old GPUs, shapes the kernels refuse
        figs.append(skipped(f"{label} speedup vs dense", error_text(exc), fam))
        return
    errors: dict[str, str] = {}
    with torch.inference_mode():
        ref = dense(x)
        abs_err, rel_err = max_errors(out_s, ref)
        _, prune_rel = max_errors(ref, F.linear(x, orig, dense.bias))
        samples = interleaved_ms({"dense": lambda: dense(x), "sparse": lambda: sparse(x)}, device=dev,
                                 repeats=sz.repeats + 2, iters=sz.prune_iters, warmup=sz.warmup,
                                 deadline=ctx.deadline, min_repeats=sz.min_repeats, errors=errors)
    if {"dense", "sparse"} <= samples.keys():
        ctx.log(f"  pruning {label}: dense {median(samples['dense']):.4f} ms, 2:4 {median(samples['sparse']):.4f} ms, "
                f"max abs err {abs_err:.3g}")
        figs.append(median_figure(f"{label} dense", samples["dense"], family=fam))
        figs.append(ratio_figure(f"{label} speedup vs dense", samples["dense"], samples["sparse"], family=fam,
                                 goal_min=1.1, goal=">= 1.1x (NVIDIA: ~1.3-1.6x on large GEMMs; 2x fewer MACs)",
                                 note=f"inference; backend {backend}"))
    else:
        figs.append(skipped(f"{label} speedup vs dense", "; ".join(f"{a}: {e}" for a, e in errors.items()), fam))
    figs.append(figure(f"{label} max abs error vs dense", abs_err, unit="abs", goal="<= 1 % of max |output|",
                       met=rel_err <= 0.01, family=fam,
                       note=f"relative {rel_err:.3g} (same 2:4 weights: kernel error only); pruning itself moves the "
                            f"output by {prune_rel:.3g} of max |output| vs the unpruned layer"))


def sparse_linear(dense: nn.Linear, x: torch.Tensor, to_sparse: Callable[[torch.Tensor], torch.Tensor]
                  ) -> tuple[nn.Linear, torch.Tensor, str]:
    """A copy of ``dense`` with its (2:4-masked) weight converted to a semi-structured sparse tensor, its output
    for ``x`` and the backend used: torch's default (cuSPARSELt) first, then the CUTLASS kernels, because a
    wheel built without cuSPARSELt still has CUTLASS's. Raises the first error when neither runs."""
    from torch.sparse import SparseSemiStructuredTensor

    first: Exception | None = None
    before = getattr(SparseSemiStructuredTensor, "_FORCE_CUTLASS", False)
    for force_cutlass in (before, not before):
        SparseSemiStructuredTensor._FORCE_CUTLASS = force_cutlass
        try:
            sparse = copy.deepcopy(dense)
            sparse.weight = nn.Parameter(to_sparse(sparse.weight.detach()), requires_grad=False)
            with torch.inference_mode():
                out = sparse(x)
            sync(x.device)
            return sparse, out, "CUTLASS" if force_cutlass else "cuSPARSELt"
        except Exception as exc:  # noqa: BLE001 - try the other backend
            first = first or exc
        finally:
            SparseSemiStructuredTensor._FORCE_CUTLASS = before
    assert first is not None
    raise first
