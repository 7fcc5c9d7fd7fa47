"""Human-readable text for one RunResult (the CLI's output). Plain text, no plotting imports."""

from __future__ import annotations

from pathlib import Path

from lab.result import RunResult


def _fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}{unit}"


def format_result(result: RunResult, stored_at: Path | str | None = None) -> str:
    """A compact table: what ran, quality before/after, where the time went, model facts, environment."""
    cfg, env = result.config, result.env
    lines = [f"run {result.run_id[:8]}  {result.workload}/{cfg.get('size')}  seed={cfg.get('seed')}  "
             f"status={result.status}"]
    if result.status != "ok":
        lines.append(f"  error: {result.error}")
    resolved = result.details.get("resolved", {})
    if resolved:
        lines.append(f"  device {resolved.get('device')}  epochs {resolved.get('epochs')}  batch "
                     f"{resolved.get('batch_size')}  lr {resolved.get('lr')}  steps {result.steps} "
                     f"(warm-up {result.warmup_steps} excluded)")
    if result.metric is not None:
        lines.append(f"  {result.metric_name}: {_fmt(result.metric_before)} untrained -> "
                     f"{_fmt(result.metric)} trained   " + "  ".join(
                         f"{k}={_fmt(v)}" for k, v in result.metrics.items() if k != result.metric_name))
        reference = result.details.get("data_info", {})
        if "bayes_auc" in reference:
            lines.append(f"  best reachable auc (planted model): {_fmt(reference['bayes_auc'])}")
    if result.steps > result.warmup_steps:
        phases = result.phase_medians_ms()
        total = phases.get("total") or 0.0
        breakdown = "  ".join(f"{k} {v:.3g}" + (f" ({100 * v / total:.0f}%)" if total else "")
                              for k, v in phases.items() if k != "total" and v > 0)
        lines.append(f"  train {result.train_time_s:.2f} s   median step {_fmt(total, ' ms')}   "
                     f"{_fmt(result.throughput_samples_per_s, ' samples/s', 5)}   data-wait "
                     f"{100 * result.data_wait_fraction:.1f}%")
        lines.append(f"  step phases (median ms): {breakdown}")
    lines.append(f"  params {result.param_count:,} (non-zero {result.nonzero_params:,})   size "
                 f"{result.model_bytes / 1e6:.3f} MB   MACs/sample {result.macs_per_sample:,}   peak memory "
                 f"{_fmt(result.peak_memory_mb, ' MB')} ({result.memory_kind})")
    if result.latency_ms:
        lines.append("  inference latency (median): " + "  ".join(
            f"{k.replace('_', ' ')} {_fmt(result.latency_median_ms(k), ' ms')}" for k in result.latency_ms))
    if result.why:
        lines.append("  why: " + "; ".join(result.why))
    if env:
        lines.append(f"  env: torch {env.get('torch_version')}  {env.get('cpu_model') or env.get('device_name')}  "
                     f"isa {','.join(env.get('isa_flags', [])) or '?'}  threads {env.get('torch_threads')}  "
                     f"git {str(env.get('git_sha'))[:10]}")
    if stored_at:
        lines.append(f"  stored in {stored_at}")
    return "\n".join(lines)
