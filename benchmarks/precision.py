"""Mixed precision on each workload: fp32 vs bf16 vs fp16 vs auto (and TF32 / channels_last on CUDA).

    python benchmarks/precision.py [--quick] [--json PATH]

Arms run interleaved (A B C D, A B C D, ...) so drift on a shared machine hits every arm alike; repeat i uses
seed i, so the accuracy comparison is against the seed-to-seed spread (``precision.accuracy_verdict``). Figures
per workload and arm: step-time speedup vs fp32 (ratio of medians over all measured steps, bootstrap 95 % CI),
peak memory ratio (process RSS on CPU, ``max_memory_allocated`` on CUDA) and the metric delta. Goals: ``auto`` is
never more than 5 % slower than fp32; the fp32 policy adds <= 1 % to a step. Sizes: ``--quick`` uses ``tiny``
(seconds on a laptop CPU); the full setting uses ``small`` and fits in 5 minutes on one H200.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
from _common import emit, figure, parse_args

from lab import RunConfig, run
from lab.measure import bootstrap_ratio_ci, median
from lab.precision import FP32, accuracy_verdict, capability, tf32
from lab.workloads import get_workload, register_workload

CPU_ARMS = ("fp32", "bf16", "fp16", "auto")


def channels_last_workload(name: str) -> str:
    """Register ``<name>_cl``: the same workload with the model in channels_last memory format (conv nets)."""
    wl = get_workload(name)

    def make_model(spec):  # noqa: ANN001, ANN202 - same signature as the wrapped factory
        return wl.make_model(spec).to(memory_format=torch.channels_last)

    register_workload(dataclasses.replace(wl, name=f"{name}_cl", make_model=make_model), overwrite=True)
    return f"{name}_cl"


def fp32_policy_cost_us(n: int = 20_000) -> float:
    """Per-step cost of the no-op fp32 policy (autocast null context + step dispatch), on empty steps."""

    class _NoOpt:
        def step(self) -> None:
            pass

    opt = _NoOpt()
    t0 = time.perf_counter()
    for _ in range(n):
        with FP32.autocast():
            pass
        FP32.step(opt)  # type: ignore[arg-type]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    size, steps, repeats = ("tiny", 30, 2) if args.quick else ("small", 60, 3)
    device = "cuda" if cuda else "cpu"
    arms: list[tuple[str, str, str, bool]] = [(a, w, a, False) for w in ("ctr", "sequence", "vision")
                                              for a in CPU_ARMS]  # (label, workload, dtype, tf32)
    if cuda:
        arms += [("tf32", w, "fp32", True) for w in ("ctr", "sequence", "vision")]
        cl = channels_last_workload("vision")
        arms += [("channels_last", cl, "fp32", False), ("channels_last+bf16", cl, "bf16", False)]
    runs: dict[tuple[str, str], list] = {}
    for rep in range(repeats):
        for label, workload, dtype, use_tf32 in arms:
            # fp16 convolutions on a CPU run ~30x slower than fp32 (no fast kernels): a few steps give the ratio.
            n_steps = min(steps, 8 if args.quick else 15) \
                if dtype == "fp16" and not cuda and workload.startswith("vision") else steps
            cfg = RunConfig(workload=workload, size=size, max_steps=n_steps, threads=1, latency_repeats=0,
                            warmup_steps=5, seed=rep, device=device).with_overrides(**{"precision.dtype": dtype})
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            with tf32(use_tf32) if cuda else contextlib.nullcontext():
                res = run(cfg)
            runs.setdefault((workload, label), []).append(res)
            print(f"  rep {rep} {workload:12s} {label:20s} {res.median_step_ms:8.2f} ms/step  {res.why}")

    figures, decisions = [], {}
    for (workload, label), rs in runs.items():
        base_wl = workload.removesuffix("_cl")
        base = runs[(base_wl, "fp32")]
        if label == "fp32" and workload == base_wl:
            figures.append(figure(f"{workload}/fp32 median step", median([r.median_step_ms for r in rs]), unit="ms"))
            continue
        est, lo, hi = bootstrap_ratio_ci([t for r in base for t in r.measured_ms()],
                                         [t for r in rs for t in r.measured_ms()])
        goal = ">= 0.95 (never >5 % slower)" if label == "auto" else None
        resolved = ",".join(r.details.get("precision", {}).get("resolved", "fp32") for r in rs)  # per repeat
        figures.append(figure(f"{workload}/{label} speedup vs fp32", est, unit="x", ci=(lo, hi), goal=goal,
                              met=(est >= 0.95) if goal else None,
                              note=f"ran {resolved}; " + ("auto ran fp32 in every repeat, so any gap to fp32 is "
                                                          "measurement noise; " if set(resolved.split(",")) == {"fp32"}
                                                          and label == "auto" else "") + "; ".join(rs[0].why)[:200]))
        mem = median([r.peak_memory_mb for r in rs]) / median([r.peak_memory_mb for r in base])
        figures.append(figure(f"{workload}/{label} peak memory vs fp32", mem, unit="x",
                              note=f"{rs[0].memory_kind} (CPU RSS includes interpreter and data)"))
        if rs[0].steps != base[0].steps:  # a step-capped arm (CPU fp16 convs): its accuracy is not comparable
            figures.append(figure(f"{workload}/{label} {rs[0].metric_name} delta", float("nan"),
                                  unit=rs[0].metric_name, note=f"not compared: this arm trained {rs[0].steps} "
                                  f"steps against fp32's {base[0].steps} (speed only)"))
        else:
            verdict = accuracy_verdict([r.metric for r in base], [r.metric for r in rs],
                                       higher_is_better=rs[0].higher_is_better)
            figures.append(figure(f"{workload}/{label} {rs[0].metric_name} delta", verdict["delta"],
                                  unit=rs[0].metric_name, goal="< 1 % relative loss (seed claim)",
                                  met=verdict["claim_lt_1pct_holds"],
                                  note=f"{verdict['label']} (seed spread {verdict['seed_spread']:.4g})"))
        if label == "auto":
            decisions[workload] = rs[0].details["precision"].get("auto", {}).get("why")

    cost_us = median([fp32_policy_cost_us() for _ in range(3)])
    step_ms = median([r.median_step_ms for r in runs[("ctr", "fp32")]])
    figures.append(figure("fp32 policy cost per step", cost_us / (step_ms * 1e3) * 100, unit="% of ctr step",
                          goal="<= 1 %", met=cost_us / (step_ms * 1e3) <= 0.01, note=f"{cost_us:.2f} us"))
    gate = {d: dataclasses.asdict(capability(d, device)) for d in ("bf16", "fp16")}
    emit("precision", args, figures, gate=gate, auto_decisions=decisions, size=size, steps=steps, repeats=repeats)


if __name__ == "__main__":
    main()
