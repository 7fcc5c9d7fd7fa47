"""RunResult: the one record type every run produces, whatever the technique.

Raw samples are kept (per-step phase times, losses, latency samples) and summaries are computed from
them on demand, so a later analysis can change its warm-up cut or statistic without re-running. Any arm
can be plotted against any other because they all share this shape (docs/architecture.md section 3). Taught in
``notebooks/00_tour`` and ``notebooks/06_ablations``.

JSON and non-finite floats: a NaN loss (fp16 overflow) or an infinite loss scale is information worth
keeping, but NaN/Infinity are not valid JSON (browsers, ``jq`` and strict parsers reject them).
``to_dict()`` keeps real ``float('nan')``; ``to_json()`` writes strict RFC 8259 JSON in which
non-finite floats become the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``; ``from_dict`` /
``from_json`` turn those strings back into floats inside the numeric fields, ``config`` and
``details`` (so those three exact strings are reserved there). Equality treats NaN as equal to NaN, so
``RunResult.from_json(r.to_json()) == r`` holds for every result.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.measure import median, spread, utilisation_line
from lab.result.sections import in_current_names
from lab.result.sections import section as section  # a family's figures in a record, old keys read too
from lab.result.timeline import format_timeline

_NONFINITE_TO_STR = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def new_run_id() -> str:
    return uuid.uuid4().hex


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types (NaN kept as float): tuples -> lists, numpy/torch scalars -> Python numbers,
    arrays/tensors -> lists, anything else -> ``str(obj)`` rather than failing a finished run."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    tolist = getattr(obj, "tolist", None)  # numpy arrays/scalars, torch tensors
    if callable(tolist):
        try:
            return to_jsonable(tolist())
        except Exception:  # fall through to str()
            pass
    return str(obj)


def _encode_nonfinite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else _NONFINITE_TO_STR[obj]
    if isinstance(obj, dict):
        return {k: _encode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode_nonfinite(v) for v in obj]
    return obj


def _decode_nonfinite(obj: Any) -> Any:
    if isinstance(obj, str):
        return _STR_TO_NONFINITE.get(obj, obj)
    if isinstance(obj, dict):
        return {k: _decode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_nonfinite(v) for v in obj]
    return obj


# Fields whose strings "NaN"/"Infinity"/"-Infinity" are decoded back to floats.
_NUMERIC_FIELDS = (
    "config", "details", "metric", "metric_before", "metrics", "train_time_s", "step_times_ms", "losses",
    "peak_memory_mb", "latency_ms",
)


def _flatten(prefix: str, obj: Any, out: dict[str, Any]) -> None:
    """Nested config -> ``cfg.precision.mode`` style scalar columns (lists as compact JSON)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(obj, (list, tuple)):
        out[prefix] = json.dumps(_encode_nonfinite(to_jsonable(obj)), separators=(",", ":"))
    else:
        out[prefix] = obj


@dataclass(eq=False)
class RunResult:
    """Everything one run produced. Summaries (properties below) exclude the first ``warmup_steps``."""

    run_id: str  # uuid4 hex
    config: dict  # RunConfig.to_dict()
    env: dict  # environment_stamp()
    # "ok" | "diverged" (trained, but the metric or the loss went the wrong way) | "failed" / "refused" (a technique
    # or the model raised: ``error`` is one line, ``details["failure"]`` its parts; lab.result.failure) | "error"
    # (records stored before those two)
    status: str = "ok"
    error: str | None = None
    started_at: str = ""  # ISO-8601 UTC
    workload: str = ""
    metric_name: str = ""
    metric: float | None = None  # primary metric on the held-out split after training
    metric_before: float | None = None  # same metric of the untrained model
    metrics: dict[str, float] = field(default_factory=dict)  # all metrics (e.g. auc, logloss)
    higher_is_better: bool = True
    steps: int = 0
    warmup_steps: int = 0
    batch_size: int = 0
    train_time_s: float = 0.0  # wall time of the whole training loop (incl. warm-up)
    # phase -> per-step samples (all steps, warm-up included; summaries exclude the first warmup_steps)
    step_times_ms: dict[str, list[float]] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    peak_memory_mb: float | None = None
    memory_kind: str = ""  # "rss" | "cuda"
    param_count: int = 0
    nonzero_params: int = 0
    model_bytes: int = 0
    macs_per_sample: int = 0  # all multiply-accumulates of one sample's forward (fp32 + int8)
    int8_macs_per_sample: int = 0  # of which quantized layers run in int8 (the rest is fp32)
    # {"batch_1": [...], "batch_256": [...]} inference latency samples
    latency_ms: dict[str, list[float]] = field(default_factory=dict)
    why: list[str] = field(default_factory=list)  # "why" tags (e.g. "no native bf16 on this CPU")
    details: dict = field(default_factory=dict)  # family-specific extras, JSON-serialisable

    # ------------------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Deep, JSON-compatible copy (tuples become lists; NaN stays a float)."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """Inverse of ``to_dict`` (also accepts the string-encoded non-finite floats of ``to_json``).
        Unknown keys are ignored so records written by a newer version still load; a family's figures stored
        under an old key come back under the family's name (:mod:`lab.result.sections`)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in to_jsonable(d).items() if k in names}
        for k in _NUMERIC_FIELDS:
            if k in kwargs:
                kwargs[k] = _decode_nonfinite(kwargs[k])
        if isinstance(kwargs.get("details"), dict):
            kwargs["details"] = in_current_names(kwargs["details"])
        return cls(**kwargs)

    def to_json(self, **kwargs: Any) -> str:
        """Strict JSON (no NaN/Infinity tokens; see module docstring)."""
        return json.dumps(_encode_nonfinite(self.to_dict()), allow_nan=False, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunResult):
            return NotImplemented
        return self.to_json(sort_keys=True) == other.to_json(sort_keys=True)

    __hash__ = None  # type: ignore[assignment] - mutable record

    # ------------------------------------------------------------------------------ summaries

    def measured_ms(self, phase: str = "total") -> list[float]:
        """Samples of ``phase`` after the warm-up steps (empty if none were recorded)."""
        return list(self.step_times_ms.get(phase, []))[self.warmup_steps :]

    @property
    def n_measured_steps(self) -> int:
        return len(self.measured_ms())

    @property
    def median_step_ms(self) -> float | None:
        xs = self.measured_ms()
        return median(xs) if xs else None

    @property
    def step_spread_ms(self) -> float | None:
        """IQR of the step time: quote it next to the median."""
        xs = self.measured_ms()
        return spread(xs) if xs else None

    def phase_medians_ms(self) -> dict[str, float]:
        """Median per phase (and ``total``) over the measured steps; phases with no samples are left out."""
        out = {}
        for phase in self.step_times_ms:
            xs = self.measured_ms(phase)
            if xs:
                out[phase] = median(xs)
        return out

    @property
    def throughput_samples_per_s(self) -> float | None:
        """Training samples per second over the measured steps (assumes full batches)."""
        total_ms = sum(self.measured_ms())
        if total_ms <= 0 or self.batch_size <= 0:
            return None
        return self.batch_size * self.n_measured_steps / (total_ms / 1e3)

    @property
    def data_wait_fraction(self) -> float | None:
        """Share of measured step time spent waiting for data: the loader's bottleneck indicator."""
        total_ms = sum(self.measured_ms())
        wait = self.measured_ms("data_wait")
        if total_ms <= 0 or not wait:
            return None
        return sum(wait) / total_ms

    @property
    def ideal_step_ms(self) -> float | None:
        """Median step time with its data wait removed: the step a loader that costs nothing would give
        (the cheap ideal bound every run carries; ``--data-ideal-replay`` also measures it by replay)."""
        total, wait = self.measured_ms(), self.measured_ms("data_wait")
        if not total:
            return None
        wait = wait if len(wait) == len(total) else [0.0] * len(total)
        return median([t - w for t, w in zip(total, wait, strict=True)])

    def latency_median_ms(self, key: str) -> float | None:
        xs = self.latency_ms.get(key) or []
        return median(xs) if xs else None

    @property
    def hardware_id(self) -> str:
        return str(self.env.get("hardware_id", "unknown"))

    def summary(self) -> dict[str, Any]:
        """Flat scalars for tables/DataFrames; ``None`` where nothing was measured (never raises, so a
        failed run still gets its row). Config values appear as ``cfg.<field>[.<subfield>]``."""
        cfg = self.config or {}
        sparsity = 1.0 - self.nonzero_params / self.param_count if self.param_count else None
        delta = (
            self.metric - self.metric_before
            if self.metric is not None and self.metric_before is not None
            else None
        )
        row: dict[str, Any] = {
            "run_id": self.run_id,
            "workload": self.workload or cfg.get("workload", ""),
            "size": cfg.get("size"),
            "seed": cfg.get("seed"),
            "status": self.status,
            "error": self.error,
            "started_at": self.started_at,
            "hardware_id": self.hardware_id,
            "device_name": self.env.get("device_name"),
            "torch_threads": self.env.get("torch_threads"),
            "metric_name": self.metric_name,
            "metric": self.metric,
            "metric_before": self.metric_before,
            "metric_gain": delta,
            "higher_is_better": self.higher_is_better,
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "batch_size": self.batch_size,
            "train_time_s": self.train_time_s,
            "median_step_ms": self.median_step_ms,
            "step_spread_ms": self.step_spread_ms,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "data_wait_fraction": self.data_wait_fraction,
            "ideal_step_ms": self.ideal_step_ms,
            "peak_memory_mb": self.peak_memory_mb,
            "memory_kind": self.memory_kind,
            "param_count": self.param_count,
            "nonzero_params": self.nonzero_params,
            "sparsity": sparsity,
            "model_bytes": self.model_bytes,
            "macs_per_sample": self.macs_per_sample,
            "int8_macs_per_sample": self.int8_macs_per_sample,
            "final_loss": self.losses[-1] if self.losses else None,
            "why": "; ".join(self.why),
        }
        for phase, value in self.phase_medians_ms().items():
            if phase != "total":
                row[f"median_{phase}_ms"] = value
        for key in self.latency_ms:
            row[f"latency_{key}_ms"] = self.latency_median_ms(key)
        for name, value in self.metrics.items():
            row.setdefault(f"metric.{name}", value)
        for k, v in cfg.items():
            _flatten(f"cfg.{k}", v, row)
        return row


# ------------------------------------------------------------------------------------------- as text

def _fmt_value(value: float | None, unit: str = "", digits: int = 4) -> str:
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
        lines.append(f"  {result.metric_name}: {_fmt_value(result.metric_before)} untrained -> "
                     f"{_fmt_value(result.metric)} trained   " + "  ".join(
                         f"{k}={_fmt_value(v)}" for k, v in result.metrics.items() if k != result.metric_name))
        reference = result.details.get("data_info", {})
        if "bayes_auc" in reference:
            lines.append(f"  best reachable auc (planted model): {_fmt_value(reference['bayes_auc'])}")
    if result.measured_ms() and result.data_wait_fraction is not None:  # (a resume may add no step)
        phases = result.phase_medians_ms()
        total = phases.get("total") or 0.0
        breakdown = "  ".join(f"{k} {v:.3g}" + (f" ({100 * v / total:.0f}%)" if total else "")
                              for k, v in phases.items() if k != "total" and v > 0)
        lines.append(f"  train {result.train_time_s:.2f} s   median step {_fmt_value(total, ' ms')}   "
                     f"{_fmt_value(result.throughput_samples_per_s, ' samples/s', 5)}   data-wait "
                     f"{100 * result.data_wait_fraction:.1f}%")
        lines.append(f"  step phases (median ms): {breakdown}")
        used = utilisation_line(result.details)
        if used:
            lines.append(used)
        data = result.details.get("data") or {}
        if data.get("source") == "files":
            lines.append(f"  data from files: {data.get('files_read')} shard reads, "
                         f"{data.get('bytes_read', 0) / 1e6:.3g} MB, read {data.get('read_ms_per_batch', 0):.3g} ms + "
                         f"decode {data.get('decode_ms_per_batch', 0):.3g} ms per batch")
            if data.get("recommendation"):
                lines.append(f"  workers vs threads: {data['recommendation']}")
        if result.ideal_step_ms is not None and data:
            replay = data.get("replay_step_ms")
            lines.append(f"  ideal step (no data wait) {_fmt_value(result.ideal_step_ms, ' ms')}"
                         + (f", replayed {_fmt_value(replay, ' ms')}" if replay is not None else "")
                         + f"   data-bound share {100 * (data.get('data_bound_share') or 0):.1f}%")
    ck = result.details.get("checkpoint") or {}
    if ck.get("resumed_from"):
        lines.append(f"  resumed from {ck['resumed_from']} at step {ck.get('start_step')}")
    if ck.get("saved"):
        lines.append(f"  {ck['saved']} checkpoint(s) in {ck['folder']}: continue with --resume {result.run_id[:8]}")
    lines.extend(format_timeline(result))  # one-off costs as their own phase, time to target
    int8 = f" ({result.int8_macs_per_sample:,} int8)" if result.int8_macs_per_sample else ""
    lines.append(f"  params {result.param_count:,} (non-zero {result.nonzero_params:,})   size "
                 f"{result.model_bytes / 1e6:.3f} MB   MACs/sample {result.macs_per_sample:,}{int8}   peak memory "
                 f"{_fmt_value(result.peak_memory_mb, ' MB')} ({result.memory_kind})")
    if result.latency_ms:
        lines.append("  inference latency (median): " + "  ".join(
            f"{k.replace('_', ' ')} {_fmt_value(result.latency_median_ms(k), ' ms')}" for k in result.latency_ms))
    if result.why:
        lines.append("  why: " + "; ".join(result.why))
    if env:
        lines.append(f"  env: torch {env.get('torch_version')}  {env.get('cpu_model') or env.get('device_name')}  "
                     f"isa {','.join(env.get('isa_flags', [])) or '?'}  threads {env.get('torch_threads')}  "
                     f"git {str(env.get('git_sha'))[:10]}")
    if stored_at:
        lines.append(f"  stored in {stored_at}")
    return "\n".join(lines)
