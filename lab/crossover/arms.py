"""The arms of the crossover map: one callable per technique and axis, built on one rung's model and batch.

Why steps and not runs: a crossover map needs dozens of (workload x rung x technique) speed ratios, and a
speed ratio of the *step* is what a technique changes; full training runs would cost hours and add data,
evaluation and compile time that the step ratio does not need (the ablation measures those). So every arm
here is one training step (forward + loss under the technique, backward, optimizer) on a fixed batch, or one
inference call, built from the same pieces a run uses: the lab's precision policy (autocast + GradScaler),
``lab.loop.make_optimizer`` (fused), ``lab.quant`` (legacy dynamic / static int8, PT2E static int8, and the
run's own ``--quant-flow auto`` probe choosing between the two static flows), ``lab.pruning``'s
physical channel removal, ``torch.compile``, and ``lab.data.make_loader`` (DataLoader workers).
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lab.config import DataConfig, QuantConfig
from lab.data import make_loader
from lab.loop import PLAIN, StepPolicy, make_optimizer
from lab.measure import count_macs
from lab.measure.kernel_guards import compile_guard
from lab.precision import PrecisionPolicy, capability, model_gate
from lab.pruning.channels import prune_channels
from lab.quant.fair import amdahl_bound, int8_macs
from lab.quant.flow_auto import probe_flows
from lab.quant.graph import graph_layer_bytes
from lab.quant.int8 import quantize_with_report
from lab.registry import OPTIONS
from lab.workloads import Workload

Arm = Callable[[], Any]
TRAIN, INFER = "train_step", "inference"
AXES = (TRAIN, INFER)

#: Every option the map times (names of :data:`lab.registry.OPTIONS`, or a ``+``-joined stack of them: one name
#: for one technique in recipes, arms, the map and the doctor), with the axes the map times it on. An option's
#: own axes say what it can change in a *run* (pruning and int8 happen after training); the map times the
#: model each produces, so channel pruning is also timed on the training step (what training a thinner model
#: costs) and a precision's inference in that precision. ``int8_static_legacy`` is the torch.ao flow (eager int8
#: kernels), ``int8_static`` torchao PT2E compiled by Inductor (its ratio against the eager fp32 call includes
#: what compiling alone gives: ``compile`` is that arm), ``int8_auto`` whichever of the two the run's
#: ``--quant-flow auto`` probe (:func:`lab.quant.flow_auto.probe_flows`) takes on this model and batch.
#: ``prune_channels50+int8_static`` stacks the two that shrink inference: channels 50 % removed, then PT2E static
#: int8 of the pruned model (the top-rung stack, for deployment; the map trains nothing, so no accuracy here:
#: ``benchmarks/stacked.py --part top`` measures that on a trained model).
TECHNIQUES: dict[str, tuple[str, ...]] = {
    "bf16": (TRAIN, INFER), "fp16": (TRAIN, INFER), "amp_auto": (TRAIN,), "int8_eager": (INFER,),
    "int8_static_legacy": (INFER,), "int8_static": (INFER,), "int8_auto": (INFER,), "prune_channels50": (TRAIN, INFER),
    "prune_channels50+int8_static": (INFER,), "compile": (TRAIN, INFER), "fused_optim": (TRAIN,), "workers1": (TRAIN,),
}
#: ``int8_auto``'s candidates: the flow -> the map's arm that times its int8 model.
INT8_FLOW_ARMS = {"legacy": "int8_static_legacy", "pt2e": "int8_static"}
PRUNE_AMOUNT = 0.5


@dataclass
class Bench:
    """One rung's fixture: the model (train mode), a fixed batch, the workload and its learning rate."""

    workload: Workload
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    target: torch.Tensor
    lr: float
    train_rows: tuple[torch.Tensor, ...]  # a few batches of training rows for the loaders and calibration
    notes: dict[str, str] = field(default_factory=dict)  # technique -> why it was skipped
    #: (method, flow) -> (int8 model, its quantization record): each built once per rung, shared by the arms
    int8_models: dict[tuple[str, ...], tuple[nn.Module, dict[str, Any]]] = field(default_factory=dict)
    #: an ``auto`` technique -> what it decided (``int8_auto``: the flow probe's record)
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.target.shape[0])


def train_step(bench: Bench, model: nn.Module, *, policy: StepPolicy = PLAIN, fused: bool = False,
               forward: Callable[..., torch.Tensor] | None = None,
               batches: Callable[[], tuple[torch.Tensor, ...]] | None = None) -> Arm:
    """One training step as ``lab.loop.fit`` runs it (zero grad, forward + loss in the policy's autocast,
    the policy's backward and optimizer step), on the fixed batch or on ``batches()`` when given."""
    wl = bench.workload
    optimizer = make_optimizer("adam", [p for p in model.parameters() if p.requires_grad], bench.lr, fused=fused)
    fwd = model if forward is None else forward

    def step() -> None:
        if batches is None:
            inputs, target = bench.inputs, bench.target
        else:
            *inputs, target = batches()
        optimizer.zero_grad(set_to_none=True)
        with policy.autocast():
            loss = wl.loss(fwd(*inputs), target)
        policy.backward(loss)
        policy.step(optimizer)

    return step


def inference_call(bench: Bench, model: nn.Module, *, dtype: str = "fp32") -> Arm:
    """One no-grad forward of the fixed batch in eval mode (under autocast for a low precision)."""
    model.eval()
    policy = PrecisionPolicy(dtype=dtype)

    @torch.no_grad()
    def call() -> None:
        with policy.autocast():
            model(*bench.inputs)

    return call


def _pruned(bench: Bench) -> nn.Module:
    model = copy.deepcopy(bench.model)
    with warnings.catch_warnings():  # Torch-Pruning's notice about attention's in_proj, once per model
        warnings.filterwarnings("ignore", message=".*Torch-Pruning will prune the last non-singleton")
        changed = prune_channels(model, PRUNE_AMOUNT, example_inputs=bench.inputs,
                                 scopes=bench.workload.prune_scopes)
    if not any(after < before for before, after in changed.values()):
        raise ValueError("no channel could be removed (no prunable Linear/Conv output: e.g. an LSTM's gates)")
    n = min(16, bench.batch_size)
    rows = tuple(t[:n] for t in bench.inputs)
    ratio = count_macs(bench.model, rows) / max(1, count_macs(model, rows))
    bench.notes["prune_channels50"] = f"{PRUNE_AMOUNT:.0%} of the channels removed: {ratio:.2f}x fewer MACs"
    return model


def _method_flow(option: str) -> tuple[str, str]:
    """The quantization method and flow an int8 option names (its overrides; the config's default flow else)."""
    overrides = OPTIONS.get(option).overrides
    return overrides["quant.method"], overrides.get("quant.flow", QuantConfig().flow)


def _int8_built(bench: Bench, method: str, flow: str = "legacy",
                pruned: nn.Module | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The rung's int8 model and its record for ``method`` x ``flow`` (built once per rung: a PT2E build
    exports, calibrates and compiles), of ``pruned`` instead of the rung's model when given (the stacked arm).
    Calibration: up to 4 batches of the training rows."""
    key: tuple[str, ...] = (method, flow) if pruned is None else (method, flow, "pruned")
    if key not in bench.int8_models:
        n = max(1, len(bench.train_rows[0]) // bench.batch_size)
        calib = [tuple(t[i * bench.batch_size:(i + 1) * bench.batch_size] for t in bench.train_rows)
                 for i in range(n)]
        qc = QuantConfig(method=method, calibration_batches=min(4, n), flow=flow)
        source = pruned if pruned is not None else bench.model
        bench.int8_models[key] = quantize_with_report(source, qc, calib, example_inputs=bench.inputs)
    return bench.int8_models[key]


def int8_share_note(bench: Bench, model: nn.Module, info: dict[str, Any]) -> str:
    """The share of one forward's MACs that runs in int8 layers, and the speedup that share allows if only
    those MACs got faster (:func:`lab.quant.fair.amdahl_bound`): the ceiling a row's int8 speedup is read
    against (issue 30: PT2E static >= 4x only where the int8 MAC share is >= 90 %). For a PT2E graph also how
    much smaller its int8 layers are as stored (int8 weights, fp32 scales, int8 zero points, fp32 biases, against
    the same layers in fp32): the format allows at most (4k + 4) / (k + 9) for k weights per output channel
    (:func:`lab.quant.size_bound`), so the wide layers of the top rungs show what small ones cannot."""
    from lab.quant.pt2e import converted_graph

    rows = tuple(t[: min(16, bench.batch_size)] for t in bench.inputs)
    total = count_macs(bench.model, rows)
    share = int8_macs(bench.model, list((info.get("swap") or {}).get("swapped") or ()), rows) / total if total else 0.0
    note = f"int8 MAC share {share:.0%} (MAC bound {amdahl_bound(share):.2f}x)"
    graph = converted_graph(model)
    if graph is not None:
        f_bytes, q_bytes = graph_layer_bytes(graph)
        if q_bytes:
            note += f"; int8 layers {f_bytes / q_bytes:.2f}x smaller as stored"
    return note


def _int8_auto(bench: Bench) -> dict[str, str]:
    """Run the lab's own ``--quant-flow auto`` probe (static int8) on the rung's model and batch; the
    candidates it built become the arms that time them: ``{arm: flow}`` of every built candidate. Its record
    (chosen flow, paired ratio, why) is kept in ``bench.choices["int8_auto"]``."""
    _, info = probe_flows(bench.model, QuantConfig(method="static", flow="auto"),
                          lambda qc: _int8_built(bench, qc.method, qc.flow), bench.inputs, repeats=5)
    bench.choices["int8_auto"] = info["auto"]
    return {INT8_FLOW_ARMS[flow]: flow for flow in INT8_FLOW_ARMS if ("static", flow) in bench.int8_models}


def _loader_batches(bench: Bench, workers: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    cfg = DataConfig(loader="dataloader", num_workers=workers, persistent_workers=True, prefetch_factor=2) \
        if workers else DataConfig()
    loader = make_loader(bench.train_rows, cfg, bench.batch_size, seed=0)
    batches = itertools.chain.from_iterable(loader for _ in itertools.count())  # endless epochs
    return lambda: next(batches)


def _note_emulated(bench: Bench, dtype: str) -> None:
    cap = capability(dtype, "cpu" if bench.inputs[0].device.type == "cpu" else bench.inputs[0].device)
    if not cap.native:
        bench.notes.setdefault(dtype, f"emulated here ({cap.reason}); measured anyway")


def build_arms(bench: Bench, techniques: list[str], axis: str,
               requested: Sequence[str] = ()) -> tuple[dict[str, Arm], dict[str, str]]:
    """``({arm: callable}, {technique: why skipped})`` for ``axis``: a ``base`` arm (the fp32 eager step or
    call) plus one arm per technique that applies and builds; ``workers1`` brings its own baseline
    (``workers_base``: the same step fed by the in-memory loader), and ``auto`` none (it is decided from the
    bf16 / fp16 / base samples afterwards; ``requested``: every technique asked for, so ``auto`` whose
    low-precision candidates the caller skipped is decided from fp32 alone). A technique that fails to build is
    skipped with its reason."""
    arms: dict[str, Arm] = {}
    skipped: dict[str, str] = {}
    if "compile" in techniques:
        # Every rung's model runs the same forward code, and dynamo keeps at most 8 compiled versions of a code
        # object: without a reset the 9th compile of a ladder silently runs eager and times nothing compiled.
        torch._dynamo.reset()
    model = bench.model
    eval_model = copy.deepcopy(model).eval()
    arms["base"] = train_step(bench, model) if axis == TRAIN else inference_call(bench, eval_model)
    for tech in techniques:
        if axis not in TECHNIQUES[tech]:
            skipped[tech] = (f"{tech} cannot change the {axis.replace('_', ' ')} "
                             f"(its axes: {', '.join(TECHNIQUES[tech])})")
            continue
        try:
            if tech in ("bf16", "fp16"):
                refused = model_gate(model, tech, bench.inputs[0].device.type) if axis == TRAIN else None
                if refused:  # the run's own gate: fp16 convolution backward has no fast CPU kernel
                    skipped[tech] = f"does not apply here: {refused}"
                    continue
                _note_emulated(bench, tech)
                arms[tech] = train_step(bench, model, policy=PrecisionPolicy(dtype=tech)) if axis == TRAIN \
                    else inference_call(bench, eval_model, dtype=tech)
            elif tech == "amp_auto":
                dev = bench.inputs[0].device
                native = [d for d in ("bf16", "fp16") if capability(d, "cpu" if dev.type == "cpu" else dev).native]
                if native and not {"bf16", "fp16"} & {*techniques, *requested}:
                    raise ValueError(f"auto is decided from the bf16 / fp16 arms and {' / '.join(native)} "
                                     "runs natively here; ask for them too")
                # Neither native: auto keeps fp32 here whatever it times, so it is decided from fp32 alone.
            elif tech == "fused_optim":
                arms[tech] = train_step(bench, model, fused=True)
            elif tech == "compile":
                compile_guard(bench.inputs[0].device)  # a native oneDNN bug on AVX2 CPUs (lab.measure.kernel_guards)
                if axis == TRAIN:
                    arms[tech] = train_step(bench, model, forward=torch.compile(model))
                else:
                    arms[tech] = inference_call(bench, torch.compile(copy.deepcopy(eval_model)))
            elif tech == "prune_channels50":
                pruned = _pruned(bench)
                arms[tech] = train_step(bench, pruned) if axis == TRAIN else inference_call(bench, pruned.eval())
            elif tech in ("int8_eager", "int8_static_legacy", "int8_static"):
                model_q, info = _int8_built(bench, *_method_flow(tech))
                bench.notes[tech] = int8_share_note(bench, model_q, info)
                arms[tech] = inference_call(bench, model_q)
            elif tech == "prune_channels50+int8_static":
                model_q, info = _int8_built(bench, "static", "pt2e", pruned=_pruned(bench).eval())
                pruned_note = bench.notes.get("prune_channels50", "")
                bench.notes[tech] = f"{pruned_note}; then {int8_share_note(bench, model_q, info)}"
                arms[tech] = inference_call(bench, model_q)
            elif tech == "int8_auto":
                # no arm of its own: its row is the chosen candidate's samples; both candidates are timed
                for arm, flow in _int8_auto(bench).items():
                    if arm not in arms:
                        arms[arm] = inference_call(bench, _int8_built(bench, "static", flow)[0])
            elif tech == "workers1":
                arms["workers_base"] = train_step(bench, model, batches=_loader_batches(bench, 0))
                arms[tech] = train_step(bench, model, batches=_loader_batches(bench, OPTIONS.get(tech).overrides[
                    "data.num_workers"]))
            else:  # pragma: no cover - TECHNIQUES and this switch are kept together
                raise ValueError(f"unknown technique {tech!r}")
        except Exception as exc:  # noqa: BLE001 - a technique that cannot apply to this model is a stated skip
            skipped[tech] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    return arms, skipped
