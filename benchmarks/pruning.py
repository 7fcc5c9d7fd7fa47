"""Does pruning make anything faster, and what does it cost in accuracy? Theory (MACs) beside measurement.

    python benchmarks/pruning.py [--quick] [--json PATH]

On ``vision`` (ResNet) and ``ctr`` (DLRM), arms run interleaved (base, L1 50 %, L1 90 %, channels, one-shot
80 %, gradual 80 %, then again) for ``repeats`` seeds, threads=1. Speed figures come from inside each run:
the trained dense model and the pruned one are timed alternately at batch 256 (eval batch), ratio of medians
with a bootstrap 95 % CI (lab.pruning.report). Goals (issue 5):
- unstructured: reported honestly, expected ~1.0x (masks skip no work on dense kernels);
- structured at ~2x fewer MACs: measured speedup >= 0.7 x the MACs ratio, accuracy within 1 pt after fine-tune;
- gradual >= 1 pt better than one-shot at 80 % sparsity on equal epochs.
On CUDA, also 2:4 semi-structured sparsity of a large fp16 Linear (torch.sparse.to_sparse_semi_structured).
``--quick`` uses the tiny sizes and one seed: its accuracy figures are noise-level, its speed figures are not.

GPU part (``gpu_part``, run by ``benchmarks/gpu.py``, not by this script): 2:4 semi-structured sparsity
(``torch.sparse.to_sparse_semi_structured``, fp16 / bf16 Linear) against the dense layer with the same weights:
inference speedup and max abs error. Anchor: NVIDIA's 2:4 sparse tensor cores, ~1.3-1.6x on large GEMMs (2x
fewer MACs in theory). Goal: >= 1.1x.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _common import emit, figure, median_figure, parse_args, ratio_figure, skipped
from _gpu import PartContext, free_memory, max_errors
from torch import nn

from lab import RunConfig, run
from lab.measure import bootstrap_ratio_ci, error_text, interleaved_ms, median, sync_for
from lab.result import section

#: Channel fraction giving ~2x fewer MACs: a conv's cost scales with (1-a)^2; in DLRM only the MLPs shrink.
STRUCTURED_AMOUNT = {"vision": 0.3, "ctr": 0.6}
ARMS = {
    "base": {},
    "l1_50": {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "l1_90": {"prune.method": "l1_unstructured", "prune.amount": 0.9, "prune.finetune_epochs": 1},
    "channels": {"prune.method": "structured_channels", "prune.finetune_epochs": 1},
    "oneshot_80": {"prune.method": "global_unstructured", "prune.amount": 0.8, "prune.finetune_epochs": 1},
    "gradual_80": {"prune.method": "global_unstructured", "prune.amount": 0.8, "prune.schedule": "gradual",
                   "prune.finetune_epochs": 1},
}


def run_arms(workload: str, size: str, seeds: int) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in ARMS}
    for seed in range(seeds):  # interleaved: every arm once per seed, in the same order
        base = RunConfig(workload=workload, size=size, threads=1, seed=seed, latency_repeats=20)
        for name, over in ARMS.items():
            over = dict(over)
            if name == "channels":
                over["prune.amount"] = STRUCTURED_AMOUNT[workload]
            out[name].append(run(base.with_overrides(**over)))
    return out


def _pt(x: float) -> float:
    return 100 * x


def workload_figures(workload: str, res: dict[str, list]) -> list[dict]:
    metric = res["base"][0].metric_name
    base_m = median([r.metric for r in res["base"]])
    figs = []
    for arm, label in (("l1_50", "L1 50 %"), ("l1_90", "L1 90 %")):
        pruned = [section(r, "pruning") for r in res[arm]]
        inf = [p["inference"] for p in pruned]
        a = [x for i in inf for x in i["dense_ms"]]
        b = [x for i in inf for x in i["pruned_ms"]]
        s, lo, hi = bootstrap_ratio_ci(a, b)
        figs.append(figure(f"{workload}: {label} inference speedup", s, unit="x", ci=(lo, hi),
                           goal="~1.0x, reported honestly (0.8-1.25)", met=0.8 <= s <= 1.25,
                           note=f"MACs ratio if zeros were skipped {pruned[0]['macs_ratio']:.2f}x"))
    p90 = section(res["l1_90"][0], "pruning")
    figs.append(figure(f"{workload}: L1 90 % CSR checkpoint / dense", p90["bytes_sparse_format"] / p90["bytes"],
                       unit="x", note="int32-index CSR; dense checkpoint unchanged by masks"))
    ch = [section(r, "pruning") for r in res["channels"]]
    macs = median([c["macs_ratio"] for c in ch])
    s, lo, hi = bootstrap_ratio_ci([x for c in ch for x in c["inference"]["dense_ms"]],
                                   [x for c in ch for x in c["inference"]["pruned_ms"]])
    amount = STRUCTURED_AMOUNT[workload]
    figs.append(figure(f"{workload}: channels {amount:.0%} MACs ratio", macs, unit="x"))
    figs.append(figure(f"{workload}: channels {amount:.0%} inference speedup", s, unit="x", ci=(lo, hi),
                       goal=">= 0.7 x MACs ratio", met=s >= 0.7 * macs,
                       note=f"batch {ch[0]['inference']['batch']}; " + "; ".join(res["channels"][0].why)))
    drop = _pt(base_m - median([r.metric for r in res["channels"]]))
    figs.append(figure(f"{workload}: channels {amount:.0%} {metric} loss after fine-tune", drop, unit="pt",
                       goal="<= 1 pt", met=drop <= 1.0, note=f"baseline {base_m:.4f}, {len(ch)} seed(s)"))
    gain = _pt(median([r.metric for r in res["gradual_80"]]) - median([r.metric for r in res["oneshot_80"]]))
    figs.append(figure(f"{workload}: gradual - one-shot at 80 % ({metric})", gain, unit="pt", goal=">= 1 pt",
                       met=gain >= 1.0, note="equal epochs: training + 1 fine-tune epoch"))
    steps = [section(r, "pruning").get("train_step_speedup") for r in res["channels"]]
    if all(steps):
        figs.append(figure(f"{workload}: channels training-step speedup", median(steps), unit="x",
                           note="fine-tune step vs main-training step, same run, not interleaved"))
    return figs


def semi_structured_figures() -> list[dict]:
    """2:4 sparsity on a large fp16 Linear, CUDA only (needs sm80+ sparse tensor cores)."""
    if not torch.cuda.is_available():
        return [figure("2:4 semi-structured", float("nan"), unit="x", note="skipped: no CUDA device")]
    from torch.sparse import to_sparse_semi_structured

    n = 8192
    w = torch.randn(n, n, dtype=torch.float16, device="cuda")
    mask = torch.tensor([1, 1, 0, 0], dtype=torch.bool, device="cuda").tile(n, n // 4)
    w = w * mask
    x = torch.randn(n, 128, dtype=torch.float16, device="cuda")
    ws = to_sparse_semi_structured(w)
    torch.testing.assert_close(ws @ x, w @ x, rtol=1e-2, atol=1e-1)
    ms = interleaved_ms({"dense": lambda: w @ x, "sparse": lambda: ws @ x}, repeats=15, warmup=5, iters=50,
                        sync=sync_for("cuda"))
    s, lo, hi = bootstrap_ratio_ci(ms["dense"], ms["sparse"])
    return [figure(f"2:4 semi-structured fp16 {n}x{n} @ {n}x128 speedup", s, unit="x", ci=(lo, hi), goal="> 1.0x",
                   met=s > 1.0, note=f"{torch.cuda.get_device_name()}; 15 interleaved blocks of 50 calls")]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    # One seed at small keeps the full report inside 20 minutes on 2 cores; the seed-to-seed spread of each
    # workload is stated in docs/workloads.md and measured by benchmarks/stacked.py.
    size, seeds = ("tiny", 1) if args.quick else ("small", 1)
    t0 = time.perf_counter()  # the whole benchmark's wall time, one event: a figure of its own, not a timing loop
    figs: list[dict] = []
    samples = {}
    for workload in ("vision", "ctr"):
        res = run_arms(workload, size, seeds)
        figs += workload_figures(workload, res)
        samples[workload] = {arm: [r.summary() for r in rs] for arm, rs in res.items()}
    figs += semi_structured_figures()
    figs.append(figure("benchmark wall time", time.perf_counter() - t0, unit="s", note=f"size {size}"))
    emit("pruning", args, figs, samples=samples)


# ------------------------------------------------------------------------------------------------ GPU part

def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """Boolean 2:4 mask for a [out, in] weight: in every group of 4 consecutive inputs keep the 2 largest |w|
    (the pattern NVIDIA's sparse tensor cores execute; magnitude is the usual one-shot criterion)."""
    if weight.dim() != 2 or weight.shape[1] % 4:
        raise ValueError(f"2:4 sparsity needs a 2-D weight with in_features % 4 == 0, got {tuple(weight.shape)}")
    groups = weight.detach().abs().reshape(weight.shape[0], -1, 4)
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(weight.shape)


def gpu_part(ctx: PartContext, figs: list[dict[str, Any]]) -> None:
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
        samples = interleaved_ms({"dense": lambda: dense(x), "sparse": lambda: sparse(x)}, sync=dev,
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
            wait = sync_for(x.device)
            if wait:
                wait()  # a kernel error surfaces here, inside the try, not later in the timing loop
            return sparse, out, "CUTLASS" if force_cutlass else "cuSPARSELt"
        except Exception as exc:  # noqa: BLE001 - try the other backend
            first = first or exc
        finally:
            SparseSemiStructuredTensor._FORCE_CUTLASS = before
    assert first is not None
    raise first


if __name__ == "__main__":
    main()
