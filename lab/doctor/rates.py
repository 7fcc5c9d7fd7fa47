"""This machine's per-class rates: how much faster each technique makes each kind of work, with an interval.

Why rates per op class and not one speedup per technique: the same bf16 that runs a large matmul 1.9x
faster leaves an embedding lookup or a 3-microsecond op as it is, so a model's speedup depends on its mix
(:mod:`lab.measure.profile`). Two sources, in this order:

1. The crossover map of this hardware id (``benchmarks/results/<hardware-id>/crossover.json``):
   each technique's fitted time against model size, evaluated at this model's MACs per sample
   (:func:`load_crossover`, :meth:`CrossoverMap.rate`). The map's speedups are whole-step ratios of the
   built-in workloads, so applied to a class alone they are conservative (diluted by those workloads' other
   classes); the reason line says the rate came from the map.
2. Otherwise micro-benchmarks on the spot, at the shapes this model uses (:func:`calibrate`): fp32 vs
   bf16 / fp16 forward + backward of its largest Linear, convolution and RNN; its optimizer's step,
   default vs fused, on its own parameters; dynamic int8 of its largest Linear at the eval batch; its
   workload's fast kernels on one batch; the cost of one tiny op. Seconds, not minutes.

``torch.compile`` is calibrated in :mod:`lab.doctor.compile_rate` (a saving per fusable op and a price per
call, not one rate). What neither covers (static int8, channel pruning without a map) uses a stated prior
with a wide interval, labelled ``prior`` in every reason that uses it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lab.bench import BENCH_DIR
from lab.crossover.mapping import MAP_FILE
from lab.crossover.names import in_current_names
from lab.distributed.scaling import Link
from lab.measure import bootstrap_ratio_ci, environment_stamp, hooks_removed, interleaved_ms, module_device
from lab.precision import PrecisionPolicy

CROSSOVER_AXES = ("train_step", "inference")
#: An option the map has no row of its own for -> the map's row nearest to it, tried after its own name: PT2E
#: dynamic int8 has no map row, the eager dynamic flow does; a map from before PT2E rows has only the eager static
#: flow; the map times one loader worker, the lab's option two.
NEAREST_MAP_ROW = {"int8_static": "int8_static_legacy", "int8_dynamic": "int8_eager", "workers2": "workers1"}


def map_names(technique: str) -> tuple[str, ...]:
    """The map's rows that stand for the option ``technique``, preferred first: its own name (the map and the lab
    share one vocabulary, :data:`lab.registry.OPTIONS`), then :data:`NEAREST_MAP_ROW`'s. Never another option's
    row otherwise: ``prune50`` (masks) has no map row, and reading channel pruning's rate for it would be a
    confident wrong prediction."""
    return (technique, NEAREST_MAP_ROW[technique]) if technique in NEAREST_MAP_ROW else (technique,)


@dataclass(frozen=True)
class Rate:
    """A speedup of one kind of work (>1 faster) with its 95 % interval and where it came from."""

    value: float
    lo: float
    hi: float
    source: str  # "measured here: ...", "crossover map: ...", "prior: ..."

    def __post_init__(self) -> None:
        if not (self.value > 0 and self.lo > 0 and self.hi > 0) or not self.lo <= self.value <= self.hi:
            raise ValueError(f"Rate({self.value}, [{self.lo}, {self.hi}]) is invalid: need 0 < lo <= value <= hi")


ONE = Rate(1.0, 1.0, 1.0, "unchanged")


def prior(value: float, lo: float, hi: float, why: str) -> Rate:
    return Rate(value, lo, hi, f"prior: {why}")


# ----------------------------------------------------------------------------------------- crossover map

@dataclass
class CrossoverMap:
    """The parts of ``crossover.json`` the doctor reads: rows (measured speedups with CIs) and fits."""

    env: dict[str, Any]
    rows: list[dict[str, Any]]
    fits: list[dict[str, Any]]
    path: str = ""
    #: workload -> the batch its ladder was timed at (the map's ``rungs``): each fit is per call at that batch.
    batches: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:  # a map stored under the old names reads in today's (one vocabulary)
        renamed = in_current_names({"rows": self.rows, "fits": self.fits})
        self.rows, self.fits = renamed["rows"], renamed["fits"]

    def rate(self, technique: str, axis: str, macs_per_sample: float, workload: str | None = None,
             batch: int | None = None) -> Rate | None:
        """The map's speedup of ``technique`` (a lab name) on ``axis`` at ``macs_per_sample``: each fit's
        ``(base_overhead + base_per_mmac * MMACs) / (tech_overhead + tech_per_mmac * MMACs)``, the median over
        the fits of ``workload`` when it has any, else over every workload; the interval from the nearest
        measured row's CI widened by the fits' leave-one-out error. ``None`` when the map has no fit.

        ``batch``: the call's batch. A fit is per call at its ladder's batch, so its fixed overhead is shared by
        that many samples; at another batch the work per call is ``MMACs x batch / map batch`` (a 256-row eval
        call does 8x the work of the map's 32-row one, and its fixed overhead weighs 8x less). Without it, or
        for a map that does not say its batch, the per-sample MMACs are read as they are."""
        name = next((n for n in map_names(technique) if any(f["technique"] == n and f["axis"] == axis
                                                             for f in self.fits)), None)
        fits = [f for f in self.fits if f["technique"] == name and f["axis"] == axis]
        same = [f for f in fits if f["workload"] == workload]
        fits = same or fits
        if not fits:
            return None
        mmac = max(float(macs_per_sample), 0.0) / 1e6

        def work(f: dict[str, Any]) -> float:
            map_batch = self.batches.get(f["workload"])
            return mmac * (batch / map_batch) if batch and map_batch else mmac

        values = sorted((f["base_overhead_ms"] + f["base_ms_per_mmac"] * work(f))
                        / max(f["tech_overhead_ms"] + f["tech_ms_per_mmac"] * work(f), 1e-9) for f in fits)
        value = values[len(values) // 2]
        wl = {f["workload"] for f in fits}
        rows = [r for r in self.rows if r["technique"] == name and r["axis"] == axis and r["workload"] in wl
                and r.get("speedup")]
        rel_lo, rel_hi = 0.8, 1.25
        if rows:
            here = math.log(max(macs_per_sample, 1))
            near = min(rows, key=lambda r: abs(math.log(max(r["macs_per_sample"], 1)) - here))
            if near.get("ci_lo") and near.get("ci_hi"):
                rel_lo, rel_hi = near["ci_lo"] / near["speedup"], near["ci_hi"] / near["speedup"]
        loo = max((abs(float(f.get("loo_error") or 0.0)) for f in fits), default=0.0)
        lo, hi = value * min(rel_lo, 1.0) * (1 - min(loo, 0.9)), value * max(rel_hi, 1.0) * (1 + loo)
        where = "same workload" if same else f"{len(wl)} workload(s)"
        scaled = [f["workload"] for f in fits if batch and self.batches.get(f["workload"])]
        at = (f", batch {batch} vs the map's {', '.join(str(self.batches[w]) for w in sorted(set(scaled)))}"
              if scaled else "")
        return Rate(value, min(lo, value), max(hi, value),
                    f"crossover map ({where}, {mmac:.3g} MMACs/sample{at})")


def _need(d: dict, keys: Sequence[str], where: str, path: Path) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{path}: {where} lacks {', '.join(missing)} (not a crossover map)")


def load_crossover(path: str | Path) -> CrossoverMap:
    """Read and check a ``crossover.json``; a file of another shape is one clear ``ValueError``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a crossover map ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a crossover map is a JSON object with env, rows, fits")
    _need(data, ("rows", "fits"), "the file", path)
    for row in data["rows"]:
        _need(row, ("workload", "technique", "axis", "speedup", "macs_per_sample"), "a row", path)
    for fit in data["fits"]:
        _need(fit, ("workload", "technique", "axis", "base_overhead_ms", "base_ms_per_mmac", "tech_overhead_ms",
                    "tech_ms_per_mmac"), "a fit", path)
        if fit["axis"] not in CROSSOVER_AXES:
            raise ValueError(f"{path}: a fit has axis {fit['axis']!r}: allowed: {', '.join(CROSSOVER_AXES)}")
    batches = {r["workload"]: int(r["batch_size"]) for r in data.get("rungs") or []
               if isinstance(r, dict) and r.get("workload") and r.get("batch_size")}
    return CrossoverMap(env=data.get("env", {}), rows=list(data["rows"]), fits=list(data["fits"]), path=str(path),
                        batches=batches)


#: The environment variable that points "this machine's map" at another file (a map measured elsewhere, a test's
#: synthetic one); the file's own name is :data:`lab.crossover.mapping.MAP_FILE`.
MAP_ENV_VAR = "LAB_CROSSOVER_JSON"
#: The threads study's (:mod:`lab.crossover.threads_study`), kept beside the map and found the same way.
THREADS_FILE, THREADS_ENV_VAR = "crossover_threads.json", "LAB_CROSSOVER_THREADS_JSON"


def crossover_path(hardware_id: str | None = None, root: Path | None = None, *, name: str = MAP_FILE,
                   env_var: str = MAP_ENV_VAR) -> Path:
    """Where the stored crossover map of ``hardware_id`` is: ``<root>/<hardware-id>/crossover.json`` (``root``:
    ``benchmarks/results``). ``hardware_id=None`` asks for this machine's map, and then ``$LAB_CROSSOVER_JSON``,
    when set, names the file instead; a caller that names a hardware id (the doctor, for the run's machine) reads
    that machine's file. ``name`` / ``env_var``: another study kept the same way (the threads study).

    Why one function: the doctor, ``lab ablate``'s map-against-measured lines and the dashboard's pages all read
    this file; each once computed the path itself, and a change to where maps live had five places to agree."""
    if hardware_id is None:
        if os.environ.get(env_var):
            return Path(os.environ[env_var])
        hardware_id = environment_stamp()["hardware_id"]
    return (root or BENCH_DIR / "results") / hardware_id / name


def stored_maps(root: Path | None = None, *, name: str = MAP_FILE) -> list[Path]:
    """Every machine's stored map (or study ``name``) under ``root`` (``benchmarks/results``), by folder name."""
    return sorted((root or BENCH_DIR / "results").glob(f"*/{name}"))


def find_crossover(hardware_id: str, root: Path | None = None) -> CrossoverMap | None:
    """This hardware id's map when there is one (``None`` otherwise: the doctor calibrates on the spot)."""
    path = crossover_path(hardware_id, root)
    return load_crossover(path) if path.is_file() else None


def crossover_advice(root: Path | None = None) -> str:
    """How to build this machine's map, and how long ``lab crossover --quick`` took where it was run (the
    committed quick maps' ``wall_s``), so a user without a map knows the price of one."""
    took = []
    for path in stored_maps(root):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("quick") and data.get("wall_s"):
            took.append(f"{float(data['wall_s']) / 60:.1f} min on {path.parent.name}")
    return ("`python -m lab crossover --quick` builds this machine's map (" + ("; ".join(took) if took else
            "about 2-3 min on a 2-core machine") + ", plus a machine card of about 30 s the first time)")


def find_link(hardware_id: str, root: Path | None = None) -> Link | None:
    """The all-reduce link ``benchmarks/distributed.py`` calibrated on this hardware id (alpha, bandwidth of a
    2-rank gloo all-reduce), or ``None`` when it has not run here: data-parallel is then not predicted."""
    path = (root or BENCH_DIR / "results") / hardware_id / "distributed.json"
    try:
        link = json.loads(path.read_text())["calibrated_link"]
        return Link(f"calibrated here ({path.name})", float(link["alpha_s"]), float(link["bandwidth_bytes_per_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------ on-the-spot rates

def _ratio_rate(base: list[float], tech: list[float], what: str) -> Rate:
    s, lo, hi = bootstrap_ratio_ci(base, tech, n_boot=500)
    lo, hi = min(lo, s), max(hi, s)
    return Rate(s, max(lo, 1e-6), hi, f"measured here: {what}")


def _time_arms(arms: dict[str, Callable[[], Any]], *, budget_ms: float = 3.0, repeats: int = 12,
               errors: dict[str, str] | None = None, min_repeats: int = 3) -> dict[str, list[float]]:
    """Interleaved ms samples, each a block of enough calls to last about ``budget_ms``; an arm that raises
    (no kernel for that dtype) is left out and its error goes to ``errors``."""
    errors = {} if errors is None else errors
    sync = "cuda" if torch.cuda.is_available() else None  # a GPU's kernels are asynchronous: sync each block
    first = interleaved_ms(arms, repeats=1, warmup=2, errors=errors, sync=sync)
    if not first:
        return {}
    iters = max(1, int(budget_ms / max(min(v[0] for v in first.values()), 1e-3)))
    live = {k: v for k, v in arms.items() if k in first}
    # A very slow arm (fp16 convolutions on a CPU without fp16 kernels: ~50x) must not turn seconds into
    # minutes: after 3 rounds, stop once the time box is spent.
    box_s = max(1.0, 4 * repeats * budget_ms / 1e3 * len(live))
    return interleaved_ms(live, repeats=repeats, warmup=1, iters=min(iters, 200), errors=errors, sync=sync,
                          deadline=time.monotonic() + box_s, min_repeats=min(min_repeats, repeats))


@dataclass
class Shapes:
    """The layers that dominate a model, with the input each one saw on a real batch."""

    linear: tuple[nn.Linear, torch.Size] | None = None
    conv: tuple[nn.Module, torch.Size] | None = None
    rnn: tuple[nn.Module, torch.Size] | None = None


def dominant_layers(model: nn.Module, batch: Sequence[torch.Tensor]) -> Shapes:
    """One forward on ``batch`` with hooks: the Linear, Conv and RNN with the most multiply-accumulates."""
    seen: dict[str, tuple[float, nn.Module, torch.Size]] = {}

    def hook(mod: nn.Module, args: tuple, _out: Any) -> None:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None:
            return
        if isinstance(mod, nn.Linear):
            kind, macs = "linear", x.numel() / max(mod.in_features, 1) * mod.in_features * mod.out_features
        elif isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            kind, macs = "conv", float(x.numel() * mod.out_channels * math.prod(mod.kernel_size) / max(mod.groups, 1))
        elif isinstance(mod, (nn.LSTM, nn.GRU, nn.RNN)):
            kind, macs = "rnn", float(x.numel() * mod.hidden_size * 4)
        else:
            return
        if kind not in seen or macs > seen[kind][0]:
            seen[kind] = (macs, mod, x.shape)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LSTM, nn.GRU, nn.RNN))]
    with hooks_removed(handles), torch.no_grad():
        model(*batch)
    return Shapes(**{k: (v[1], v[2]) for k, v in seen.items()})


def _fwd_bwd(mod: nn.Module, x: torch.Tensor, dtype: str) -> Callable[[], None]:
    """One forward + backward of ``mod`` on ``x`` under the run's own precision policy for ``dtype`` (its
    autocast region: the same casts a run's step pays; fp32 runs outside any autocast, as a run's does)."""
    policy = PrecisionPolicy(dtype=dtype, device_type=x.device.type)

    def call() -> None:
        with policy.autocast():
            out = mod(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return call


def precision_rates(shapes: Shapes, dtypes: Sequence[str]) -> dict[tuple[str, str], Rate]:
    """``{(dtype, layer kind): Rate}``: fp32 vs autocast forward + backward of each dominant layer at its input
    shape, from an fp32 input (the layer pays its casts, as under autocast in a real step). A variant that fed
    an input already in the low precision (as a later layer of a conv stack sees it) predicted worse on this
    machine's Linear models (docs/doctor.md), so it was dropped."""
    out: dict[tuple[str, str], Rate] = {}
    for kind in ("linear", "conv", "rnn"):
        found = getattr(shapes, kind)
        if found is None:
            continue
        mod, shape = found
        mod = copy.deepcopy(mod).float().train()
        x = torch.randn(shape, device=module_device(mod))
        arms = {"fp32": _fwd_bwd(mod, x, "fp32")}
        arms.update({d: _fwd_bwd(mod, x, d) for d in dtypes})
        errors: dict[str, str] = {}
        times = _time_arms(arms, errors=errors)
        for d in dtypes:
            if times.get(d) and times.get("fp32"):
                out[(d, kind)] = _ratio_rate(times["fp32"], times[d], f"{kind} {tuple(shape)} fp32 vs {d} fwd+bwd")
            elif d in errors:  # the lab's policy runs such a module in fp32 (lab.precision.policy)
                out[(d, kind)] = Rate(1.0, 0.95, 1.05, f"measured here: no {d} kernel for this {kind}, so it runs "
                                                       "in fp32")
    return out


def optimizer_rate(model: nn.Module, name: str, lr: float) -> Rate | None:
    """torch's default (foreach) step vs the fused one on copies of this model's parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None

    def arm(fused: bool) -> Callable[[], None]:
        ps = [nn.Parameter(p.detach().clone()) for p in params]
        for p in ps:
            p.grad = torch.randn_like(p)
        kw = {"fused": True} if fused else {}
        opt = torch.optim.Adam(ps, lr=lr, **kw) if name == "adam" else torch.optim.SGD(ps, lr=lr, momentum=0.9, **kw)
        return opt.step

    try:
        times = _time_arms({"default": arm(False), "fused": arm(True)})
    except RuntimeError:  # no fused kernel for these tensors
        return None
    return _ratio_rate(times["default"], times["fused"], f"{name} step on {len(params)} tensors, default vs fused")


def grad_scaler_rate(model: nn.Module, name: str, lr: float) -> Rate | None:
    """fp16's extra optimizer work: a plain step vs ``GradScaler`` unscale + inf check + step + update, on
    copies of this model's parameters (as a rate of the optimizer class: below 1 means slower)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None
    ps = [nn.Parameter(p.detach().clone()) for p in params]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(ps, lr=lr) if name == "adam" else torch.optim.SGD(ps, lr=lr, momentum=0.9)
    dev = ps[0].device.type
    scaler = torch.amp.GradScaler(dev, init_scale=1.0, growth_interval=1_000_000)
    scaler.scale(torch.ones((), device=ps[0].device))  # the scale tensor is created on first use

    def scaled() -> None:
        scaler.step(opt)
        scaler.update()

    errors: dict[str, str] = {}
    times = _time_arms({"plain": opt.step, "scaled": scaled}, errors=errors)
    if "scaled" not in times or "plain" not in times:
        return None
    return _ratio_rate(times["plain"], times["scaled"], f"{name} step vs GradScaler step + update")


def dynamic_int8_rate(shapes: Shapes, rows: int) -> Rate | None:
    """fp32 vs ``quantize_dynamic`` int8 forward of the largest Linear at ``rows`` rows (the eval batch)."""
    if shapes.linear is None:
        return None
    from torch.ao import quantization as tq

    from lab.quant import ao_warnings_filtered

    lin, shape = shapes.linear
    fp32 = nn.Sequential(copy.deepcopy(lin)).float().eval()
    with ao_warnings_filtered():
        int8 = tq.quantize_dynamic(copy.deepcopy(fp32), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(rows, shape[-1])
    with torch.no_grad():
        times = _time_arms({"fp32": lambda: fp32(x), "int8": lambda: int8(x)})
    return _ratio_rate(times["fp32"], times["int8"], f"Linear {lin.in_features}x{lin.out_features} at {rows} rows, "
                                                     "fp32 vs dynamic int8 forward")


def model_fwd_bwd_rate(model: nn.Module, fast: nn.Module, batch: Sequence[torch.Tensor], what: str) -> Rate:
    """Forward + backward of two implementations of the same model on one batch (the workload's fast kernels)."""
    def arm(m: nn.Module) -> Callable[[], None]:
        def call() -> None:
            m.zero_grad(set_to_none=True)
            m(*batch).float().sum().backward()
        return call

    times = _time_arms({"base": arm(model), "fast": arm(fast)}, budget_ms=6.0, repeats=8)
    return _ratio_rate(times["base"], times["fast"], what)


def tiny_op_us() -> float:
    """The dispatch cost of one tiny op (an add of two 1-element tensors), in microseconds."""
    a, b = torch.ones(1), torch.ones(1)
    times = _time_arms({"add": lambda: torch.add(a, b)}, budget_ms=2.0, repeats=7)
    return 1e3 * sorted(times["add"])[len(times["add"]) // 2]


__all__ = ["map_names", "NEAREST_MAP_ROW", "CrossoverMap", "ONE", "Rate", "Shapes",
           "MAP_ENV_VAR", "MAP_FILE", "THREADS_ENV_VAR", "THREADS_FILE", "crossover_advice", "crossover_path",
           "stored_maps",
           "dominant_layers", "dynamic_int8_rate", "find_crossover", "find_link", "grad_scaler_rate", "load_crossover",
           "model_fwd_bwd_rate", "optimizer_rate", "precision_rates", "prior", "tiny_op_us"]
