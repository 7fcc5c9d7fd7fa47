"""The recipe (``python -m lab recipe``, :mod:`lab.portable`): for every option, the plain-PyTorch file it writes
imports no ``lab``, trains the lab's own tiny mlp, and does what the lab's run of the same option does.

Each option's file is imported from a temporary folder and its ``train`` run for one epoch, batches in order
(``shuffle=False``, as the lab's run with ``data.shuffle=False``), on the model a lab run builds from the same seed.
The effect each option promises is read off both sides: the losses (every training option changes speed, not the
numbers, so a file's losses *equal* the lab run's, compile's within rounding), the dtypes autocast ran the layers in,
the GradScaler's steps, the optimizer that stepped (fused), a Dynamo graph compiled, the worker processes or reader
threads that read the batches, the masks' zeros and the fine-tune's losses, the layers' widths after Torch-Pruning,
the int8 layers of the inference model. The PT2E int8 files are compared with the lab's own quantization of the same
trained model (:func:`lab.quant.quantize_with_report`, what a run calls; its batch-1 Inductor compile skipped with
torch.compile's force_eager stance: the swap report is read off the converted graph): a lab run of them compiles the
int8 graph to evaluate it, about 20 s each here. The data-parallel file runs as one process here and as two
torchrun ranks.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import Dataset

from lab.cli import main
from lab.config import RunConfig
from lab.context import prepare
from lab.portable import build, config_of, from_techniques
from lab.registry import FAMILIES, OPTIONS
from lab.result import RunResult
from lab.store import ResultStore
from lab.technique import NotPortable
from lab.train import run

#: The lab's runs: the dense reference workload at its tiny size, one epoch (32 steps), batches in order.
BASE = RunConfig(workload="mlp", size="tiny", epochs=1, latency_repeats=0).with_overrides(**{"data.shuffle": False})
ROOT = Path(__file__).resolve().parents[2]


def load(text: str, path: Path) -> Any:
    """The script as a module imported from ``path``, after checking that it imports nothing of the lab."""
    tree = ast.parse(text)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "import lab" not in text and not any(m == "lab" or m.startswith("lab.") for m in imported), imported
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recording(Dataset):
    """The training split, row by row, noting which process and thread read each row (a file per reader)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], folder: Path) -> None:
        self.tensors, self.folder, self.seen = tensors, folder, set()

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        who = f"{os.getpid()}-{threading.current_thread().name}"
        if who not in self.seen:
            self.seen.add(who)
            (self.folder / who).touch()
        return tuple(t[i] for t in self.tensors)


@dataclass
class Emitted:
    """What the file's ``train`` did: its model and losses, each fit's losses by phase, and what was seen."""

    module: Any
    model: nn.Module
    losses: list[float]
    phases: dict[str, list[float]] = field(default_factory=dict)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    dtypes: dict[str, str] = field(default_factory=dict)
    compiled: list[nn.Module] = field(default_factory=list)
    scaler_steps: int = 0
    readers: set[str] = field(default_factory=set)
    calls: dict[str, int] = field(default_factory=dict)  # forward calls of each Linear in the main training


def train_emitted(module: Any, cfg: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  dtypes: bool = False, eager: bool = False) -> Emitted:
    """The file's ``train`` on the lab's model (same seed) and training split, one epoch in order, watched (the
    first ``cfg.max_steps`` batches where the lab's run stops there). ``eager``: ``torch.compile`` returns what it is
    given (torchao's low-bit update, compiled per shape, runs eagerly: the same code without a ~20 s compile)."""
    with prepare(cfg) as ctx:
        model, tensors, r = ctx.new_model(), ctx.data.train, ctx.resolved
    if cfg.max_steps is not None:
        tensors = tuple(t[:cfg.max_steps * r.batch_size] for t in tensors)
    out = Emitted(module=module, model=model, losses=[])
    folder = tmp_path / "readers"
    folder.mkdir()

    def seen(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            out.dtypes.setdefault(name, str(output.dtype).split(".")[-1])
        return hook

    def called(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            out.calls[name] = out.calls.get(name, 0) + 1
        return hook

    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    handles = [m.register_forward_hook(seen(n)) for n, m in linears] if dtypes else []
    handles += [m.register_forward_hook(called(n)) for n, m in linears]
    fit = module.fit

    def watched_fit(*args: Any, phase: str = "train", **kwargs: Any) -> list[float]:
        losses = fit(*args, phase=phase, **kwargs)
        out.phases[phase] = losses
        for h in handles:  # the main training only: a pruned or exported model is another graph
            h.remove()
        return losses

    real_compile, real_step = (lambda m, *a, **k: m) if eager else torch.compile, torch.amp.GradScaler.step

    def scaler_step(self: torch.amp.GradScaler, *a: Any, **k: Any) -> Any:
        out.scaler_steps += 1
        return real_step(self, *a, **k)

    def stepped(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not any(o is opt for o in out.optimizers):
            out.optimizers.append(opt)

    hook = register_optimizer_step_pre_hook(stepped)
    with monkeypatch.context() as patch:  # only while the file trains (the lab's run compiles too)
        patch.setattr(module, "fit", watched_fit)
        patch.setattr(torch, "compile", lambda m, *a, **k: (out.compiled.append(m), real_compile(m, *a, **k))[1])
        patch.setattr(torch.amp.GradScaler, "step", scaler_step)
        try:
            out.model, out.losses = module.train(model, ctx.workload.loss, Recording(tensors, folder), epochs=1,
                                                 batch_size=r.batch_size, lr=r.lr, seed=cfg.seed, shuffle=False)
        finally:
            hook.remove()
    out.readers = {p.name for p in folder.iterdir()}
    return out


_RUNS: dict[str, RunResult] = {}


def lab_run(techniques: tuple[str, ...], base: RunConfig = BASE, eager: bool = False, **overrides: Any) -> RunResult:
    """The lab's run of the stack on ``base`` (each config run once per session: the baseline serves several
    tests); ``eager`` as :func:`train_emitted`'s."""
    cfg = config_of(techniques, base).with_overrides(**overrides)
    key = repr(cfg.to_dict())
    if key not in _RUNS:
        with mock.patch.object(torch, "compile", lambda m, *a, **k: m) if eager else contextlib.nullcontext():
            _RUNS[key] = run(cfg)
    assert _RUNS[key].status == "ok", _RUNS[key].error
    return _RUNS[key]


def emit(techniques: tuple[str, ...], tmp_path: Path, base: RunConfig = BASE, **kwargs: Any) -> Any:
    recipe = from_techniques(techniques, base, command="test", **kwargs)
    return load(recipe.text, tmp_path / f"recipe_{'_'.join(techniques) or 'baseline'}.py")


# ----------------------------------------------------------------------------------------- the effects


def _same_losses(lab: RunResult, got: Emitted, exact: bool = True) -> None:
    assert len(got.losses) == len(lab.losses) == (lab.config.get("max_steps") or 32)
    if exact:
        assert got.losses == lab.losses  # the same step on the same batches: the same numbers, bit for bit
    else:
        assert got.losses == pytest.approx(lab.losses, rel=1e-3, abs=1e-4)


def _fused(lab: RunResult, got: Emitted, fused: bool) -> None:
    assert got.optimizers and all(bool(o.defaults.get("fused")) == fused for o in got.optimizers)
    assert lab.details["steps"]["train"]["fused"] is fused


def check_plain(option: str, lab: RunResult, got: Emitted) -> None:
    _same_losses(lab, got)
    _fused(lab, got, option == "fused_optim")
    assert not got.compiled and not got.scaler_steps


def check_precision(option: str, lab: RunResult, got: Emitted) -> None:
    if option == "amp_auto":  # the file is the code of the dtype the lab's run chose: that dtype's run is the match
        assert got.module.__doc__.count(f"run {lab.run_id[:8]} chose {lab.details['precision']['resolved']}") == 1
        option = {"fp32": "", "bf16": "bf16", "fp16": "fp16"}[lab.details["precision"]["resolved"]]
        lab = lab_run((option,) if option else ())
    _same_losses(lab, got)
    phase = (lab.details.get("precision") or {}).get("phases", {}).get("train")
    want = {"bf16": "bfloat16", "fp16": "float16", "": "float32"}[option]
    layers = {r["module"]: r["output_dtype"] for r in phase["layer_dtypes"] if r["type"] == "Linear"} if phase \
        else dict.fromkeys(got.dtypes, "float32")  # an fp32 run records no policy: its layers ran in fp32
    assert got.dtypes == layers and set(layers.values()) == {want}, (got.dtypes, layers)
    scaled = bool(phase and phase["grad_scaler"])
    assert scaled == (option == "fp16") and (got.scaler_steps == 32) == scaled


def check_compile(option: str, lab: RunResult, got: Emitted) -> None:
    from torch._dynamo.utils import counters

    _same_losses(lab, got, exact=False)  # Inductor fuses the ops: the same math, rounded otherwise
    assert [m is got.model for m in got.compiled] == [True] and counters["stats"]["unique_graphs"] >= 1
    assert lab.details["steps"]["train"]["compiled"] and lab.details["compute"]["graphs"] >= 1


def check_loader(option: str, lab: RunResult, got: Emitted) -> None:
    _same_losses(lab, got)  # another loader, the same batches
    cfg = lab.config["data"]
    me = f"{os.getpid()}-{threading.current_thread().name}"
    assert me not in got.readers, "the training thread read a batch itself"
    if cfg["loader"] == "dataloader":
        assert len({r.split("-")[0] for r in got.readers}) == cfg["num_workers"]  # that many worker processes
        assert lab.details["threads"]["loader_workers"] == cfg["num_workers"]
    else:
        assert {r.split("-")[0] for r in got.readers} == {str(os.getpid())}  # threads of this process
        assert len(got.readers) == cfg["prefetch_readers"] and lab.details["steps"]["train"]["loader"] == \
            "ThreadPrefetcher"


def check_masks(option: str, lab: RunResult, got: Emitted) -> None:
    from lab.measure import count_nonzero_params

    _same_losses(lab, got)
    assert got.phases["finetune"] == lab.details["pruning"]["finetune"]["losses"]  # same masks, same fine-tune
    assert count_nonzero_params(got.model) == lab.nonzero_params and not any(
        n.endswith(("_mask", "_orig")) for n, _ in got.model.named_buffers())  # masks baked in
    amount = lab.config["prune"]["amount"]
    for name, m in got.model.named_modules():
        if isinstance(m, nn.Linear):
            assert int((m.weight == 0).sum()) == round(amount * m.weight.numel()), name


def check_channels(option: str, lab: RunResult, got: Emitted) -> None:
    _same_losses(lab, got)
    widths = {n: m.out_features for n, m in got.model.named_modules() if isinstance(m, nn.Linear)}
    channels = lab.details["pruning"]["channels"]
    assert {n: after for n, (_, after) in channels.items()} == {n: w for n, w in widths.items() if n in channels}
    assert all(after < before for before, after in channels.values())
    assert got.phases["finetune"] == pytest.approx(lab.details["pruning"]["finetune"]["losses"], rel=1e-6)


def _int8_of(got: Emitted, tensors: tuple[torch.Tensor, ...]) -> nn.Module:
    """The file's ``for_inference`` of its trained model (Inductor's freezing set back after)."""
    import torch._inductor.config as inductor

    freezing = inductor.freezing
    try:
        return got.module.for_inference(got.model, torch.utils.data.TensorDataset(*tensors), batch_size=64)
    finally:
        inductor.freezing = freezing


def check_int8(option: str, lab: RunResult, got: Emitted) -> None:
    from lab.quant import (
        error_bound,
        graph_swap_report,
        quantize_with_report,
        reduce_range_choice,
        relative_error,
        swap_report,
    )

    _same_losses(lab, got)
    with prepare(BASE) as ctx:
        tensors, test, fresh = ctx.data.train, ctx.data.test[0][:64], ctx.new_model().eval()
    qc = config_of((option,), BASE).quant
    if qc.flow == "auto":  # without a stored run, the file takes the default flow
        qc = dataclasses.replace(qc, flow="pt2e")
    q = _int8_of(got, tensors)
    if option == "int8_qat":  # train() returned the model its fake-quant fine-tune trained
        assert len(got.phases["qat"]) == 32 and isinstance(got.model, torch.fx.GraphModule)
    float_model = fresh if option == "int8_qat" else got.model.eval()
    if isinstance(q, torch._dynamo.eval_frame.OptimizedModule):  # PT2E: the converted graph, never compiled here
        graph = q._orig_mod
        ours = graph_swap_report(graph, float_model, qc.method)
        calibration = [tuple(t[i:i + 64] for t in tensors) for i in range(0, 1024, 64)]
        with torch.compiler.set_stance("force_eager"):  # the swap report is the converted graph's: no compile
            theirs = quantize_with_report(float_model, qc, calibration, finetune=lambda prepared: None)[1]["swap"]
        bound = error_bound(qc.method, reduce_range_choice("auto", "pt2e")["used"])
    else:  # the legacy flows: torch.ao modules, against the lab's run of the option
        graph, ours, theirs = q, swap_report(float_model, q, qc.method), lab.details["quant"]["swap"]
        bound = error_bound(qc.method, True)
    assert ours["swapped"] == theirs["swapped"] and ours["n_swapped"] == 3, (ours, theirs)
    if option != "int8_qat":
        with torch.no_grad():
            assert relative_error(float_model(test), graph(test)) < bound


def check_checkpoint(option: str, lab: RunResult, got: Emitted) -> None:
    """The file's blocks are the lab's, a Linear inside one runs forward twice a step (once outside), the losses
    are the lab's, and the trained model runs its own forwards again."""
    _same_losses(lab, got, exact=False)  # the same recompute; rounding may differ in the order of the adds
    blocks = lab.details["memory"]["checkpointed_blocks"]
    assert blocks and [n for n, m in got.model.named_modules() if m in got.module.find_blocks(got.model)] == blocks
    steps = len(lab.losses)
    inside = {n: c for n, c in got.calls.items() if n.startswith(tuple(f"{b}." for b in blocks))}
    assert max(inside.values()) == 2 * steps and all(c in (steps, 2 * steps) for c in inside.values()), got.calls
    assert all(c == steps for n, c in got.calls.items() if n not in inside), got.calls
    assert not any("forward" in m.__dict__ for m in got.model.modules())


def check_low_bit(option: str, lab: RunResult, got: Emitted) -> None:
    """torchao's low-bit AdamW stepped (Adam's update: weight decay 0), its 64 x 64 weight's moments in its
    quantized subclass, and the losses are the lab's run of the option."""
    _same_losses(lab, got)
    cls = {"adam8bit": "AdamW8bit", "adam4bit": "AdamW4bit"}[option]
    assert [type(o).__name__ for o in got.optimizers] == [cls] and got.optimizers[0].defaults["weight_decay"] == 0
    assert lab.details["memory"]["optimizer"] == cls
    states = [type(v).__name__ for st in got.optimizers[0].state.values() for v in st.values()]
    assert f"OptimState{cls[-4:]}" in states, states


def check_sharded_alone(option: str, lab: RunResult, got: Emitted) -> None:
    """Started as one process (no torchrun), the FSDP2 file has nobody to shard with: the plain loop, step for step
    (two ranks: tests/memory/test_sharding.py)."""
    check_plain("", lab, got)
    assert not any(type(p).__name__ == "DTensor" for p in got.model.parameters())


EFFECTS = {
    "fused_optim": check_plain, "compile": check_compile, "bf16": check_precision, "fp16": check_precision,
    "amp_auto": check_precision, "workers1": check_loader, "workers2": check_loader, "prefetch": check_loader,
    "parallel_reads": check_loader, "prune30": check_masks, "prune50": check_masks, "prune70": check_masks,
    "prune_channels50": check_channels, "int8_dynamic": check_int8, "int8_eager": check_int8,
    "int8_static": check_int8, "int8_static_legacy": check_int8, "int8_auto": check_int8, "int8_qat": check_int8,
    "checkpoint_blocks": check_checkpoint, "adam8bit": check_low_bit, "adam4bit": check_low_bit,
    "fsdp2": check_sharded_alone,
}
#: Options whose file and lab run train another base than :data:`BASE`: checkpointing needs a model with blocks
#: (the tiny transformer, at batch 16); torchao's low-bit update runs eagerly (:func:`train_emitted`); both train 4
#: steps; the FSDP2 file is written for two ranks and started here as one process (two: tests/memory/).
SHORT = BASE.with_overrides(max_steps=4)
BASES = {"checkpoint_blocks": RunConfig(workload="transformer", size="tiny", epochs=1, max_steps=4, batch_size=16,
                                        latency_repeats=0).with_overrides(**{"data.shuffle": False}),
         "adam8bit": SHORT, "adam4bit": SHORT, "fsdp2": BASE.with_overrides(**{"ddp.world_size": 2})}
EAGER = {"adam8bit", "adam4bit"}
#: Options whose lab run is not the comparison (a PT2E run compiles its int8 graph to evaluate it): the lab's
#: baseline run trains the same float model, and the int8 layers are compared with the lab's own quantization.
LAB_BASELINE = {"int8_dynamic", "int8_static", "int8_auto", "int8_qat", "fsdp2"}
#: Decisions: the file is written from the lab's stored run of the option (what it chose), then compared.
FROM_RUN = {"amp_auto"}


def _refused(option: str) -> bool:
    base = RunConfig(workload="ctr", size="tiny")
    try:
        from_techniques((option,), base)
    except NotPortable:
        return True
    except ValueError as err:  # a CUDA-only option on a machine without CUDA: the lab refuses to run it first
        if "needs CUDA" not in str(err):
            raise
        with pytest.raises(NotPortable):  # and its family's part refuses it wherever it runs
            FAMILIES[OPTIONS[option].family].portable(config_of((option,), base))
        return True
    return False


def test_every_option_has_its_effect_checked_or_is_refused_with_the_reason():
    refused = {o for o in OPTIONS if o not in EFFECTS and _refused(o)}
    assert set(EFFECTS) | refused == set(OPTIONS) and not set(EFFECTS) & refused


@pytest.mark.parametrize("option", sorted(EFFECTS))
def test_the_emitted_file_does_what_the_labs_run_of_the_option_does(option, tmp_path, monkeypatch):
    base, eager = BASES.get(option, BASE), option in EAGER
    lab = lab_run(() if option in LAB_BASELINE else (option,), BASE if option in LAB_BASELINE else base, eager)
    module = emit((option,), tmp_path, base, run=lab if option in FROM_RUN else None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # python FILE: one process
    got = train_emitted(module, config_of((option,), base), tmp_path, monkeypatch,
                        dtypes=OPTIONS[option].family == "precision", eager=eager)
    EFFECTS[option](option, lab, got)


def test_the_plain_loop_is_the_labs_baseline_step_for_step(tmp_path, monkeypatch):
    module = emit((), tmp_path)
    check_plain("", lab_run(()), train_emitted(module, BASE, tmp_path, monkeypatch))


def test_a_stack_is_every_familys_part_in_the_order_a_run_applies_them(tmp_path, monkeypatch):
    """fused Adam + channels removed + static int8: fused in every fit, the lab's widths and fine-tune, int8 layers."""
    from lab.quant import graph_swap_report, quantize_with_report

    stack = ("fused_optim", "prune_channels50", "int8_static")
    recipe = from_techniques(stack, BASE, command="test")
    assert recipe.title == "fused_optim + prune_channels50 + int8_static" and recipe.requires == ("torch-pruning",
                                                                                                  "torchao")
    assert list(recipe.parts) == ["compute", "pruning", "quant"]
    module = load(recipe.text, tmp_path / "stack.py")
    got = train_emitted(module, config_of(stack, BASE), tmp_path, monkeypatch)
    lab = lab_run(stack[:2])  # the int8 half against the lab's quantization of the same pruned model (below)
    check_channels("", lab, got)
    assert len(got.optimizers) == 2 and all(o.defaults["fused"] for o in got.optimizers)  # training, fine-tune
    with prepare(BASE) as ctx:
        tensors = ctx.data.train
    graph = _int8_of(got, tensors)._orig_mod
    calibration = [tuple(t[i:i + 64] for t in tensors) for i in range(0, 1024, 64)]
    with torch.compiler.set_stance("force_eager"):  # the swap report is the converted graph's: no compile
        theirs = quantize_with_report(got.model.eval(), config_of(stack, BASE).quant, calibration)[1]["swap"]
    assert graph_swap_report(graph, got.model, "static")["swapped"] == theirs["swapped"] and theirs["n_swapped"] == 3


def test_data_parallel_is_torchrun_a_sampler_and_ddp_and_one_process_without_torchrun(tmp_path, monkeypatch):
    cfg = BASE.with_overrides(**{"ddp.world_size": 2})
    recipe = build(cfg, techniques=(), command="test")
    assert recipe.title == "ddp.world_size=2" and recipe.how_to_run("x.py") == "torchrun --nproc_per_node=2 x.py"
    for needed in ("dist.init_process_group(", "DistributedSampler(train_set", "DDP(model", "set_epoch(epoch)",
                   "dist.destroy_process_group()", "torchrun --nproc_per_node=2"):
        assert needed in recipe.text, needed
    module = load(recipe.text, tmp_path / "ddp.py")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    check_plain("", lab_run(()), train_emitted(module, cfg, tmp_path, monkeypatch))  # python FILE: one process


DRIVER = """
import importlib.util, json, os, sys
import torch
from lab.config import RunConfig
from lab.context import prepare

spec = importlib.util.spec_from_file_location("recipe", sys.argv[1])
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
cfg = RunConfig.from_dict(json.loads(sys.argv[2]))
with prepare(cfg) as ctx:
    model, tensors, r = ctx.new_model(), ctx.data.train, ctx.resolved
model, losses = recipe.train(model, ctx.workload.loss, torch.utils.data.TensorDataset(*tensors), epochs=1,
                             batch_size=r.batch_size, lr=r.lr, shuffle=False)
rank = int(os.environ["RANK"])
out = {"world": int(os.environ["WORLD_SIZE"]), "steps": len(losses),
       "params": [float(p.sum()) for p in model.parameters()]}
open(os.path.join(sys.argv[3], f"rank{rank}.json"), "w").write(json.dumps(out))
"""


@pytest.mark.slow
def test_the_data_parallel_file_trains_two_torchrun_ranks_in_step(tmp_path):
    """Two gloo ranks: each reads half of every epoch (16 steps of 64 rows, the lab's per-rank batch) and ends
    with the same parameters (DDP all-reduced every step's gradients)."""
    import json

    cfg = BASE.with_overrides(**{"ddp.world_size": 2})
    (tmp_path / "ddp.py").write_text(build(cfg, command="test").text)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(tmp_path / "driver.py"), str(tmp_path / "ddp.py"), json.dumps(cfg.to_dict()), str(tmp_path)]
    env = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                     "LOCAL_RANK")}  # torchrun's own, never the suite's leftovers
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if done.returncode != 0 and "SIGABRT" in done.stderr:  # once in CI a gloo rank aborted (-6) with nothing of ours
        # in its output; it never reproduced in 9 runs alone or beside the distributed tests: one retry, said
        print("rank aborted (SIGABRT), retried once; its first try said:\n" + done.stderr[:3000])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [16, 16]
    assert ranks[0]["params"] == pytest.approx(ranks[1]["params"], rel=1e-6)


def _planted(option: str, details: dict) -> RunResult:
    return RunResult(run_id="planted0", config=config_of((option,), BASE).to_dict(), env={}, details=details,
                     status="ok")


def test_a_decision_is_the_code_of_what_a_stored_run_chose_else_of_what_the_lab_keeps_unmeasured():
    plain = from_techniques(("amp_auto",), BASE).text
    assert "torch.autocast" not in plain and "amp_auto: fp32" in plain
    chosen = from_techniques(("amp_auto",), BASE, run=_planted("amp_auto", {"precision": {"resolved": "bf16"}})).text
    assert "torch.autocast(device.type, dtype=torch.bfloat16)" in chosen and "run planted0 chose bf16" in chosen
    assert "prepare_pt2e(graph, quantizer)" in from_techniques(("int8_auto",), BASE).text
    legacy = from_techniques(("int8_auto",), BASE, run=_planted("int8_auto", {"quant": {"flow": "legacy"}})).text
    assert "quantize_fx.prepare_fx(" in legacy and "prepare_pt2e" not in legacy and "took the legacy flow" in legacy
    with pytest.raises(NotPortable, match="records no resolved dtype"):
        from_techniques(("amp_auto",), BASE, run=_planted("amp_auto", {}))


@pytest.mark.parametrize(("overrides", "why"), [
    ({"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.schedule": "gradual"}, "cubic schedule"),
    ({"precision.dtype": "bf16", "precision.fp32_modules": ("net.4",)}, "fp32 islands"),
    ({"ddp.grad_accum_steps": 2}, "gradient accumulation"),
    ({"data.loader": "device_prefetch"}, "device_prefetch loader"),
    ({"quant.method": "qat", "quant.flow": "legacy", "device": "cpu"}, "FX quantization-aware"),
    ({"ddp.world_size": 2, "memory.shard": "fsdp2", "memory.optimizer_state": "int8"}, "Inductor cache"),
], ids=["gradual", "fp32-islands", "accumulation", "device-prefetch", "legacy-qat", "fsdp2-adam8bit"])
def test_what_the_script_cannot_express_is_refused_with_the_reason(overrides, why):
    with pytest.raises(NotPortable, match=why):
        build(BASE.with_overrides(**overrides))


def test_the_cli_prints_or_writes_the_file_and_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "mine.py"
    assert main(["recipe", "--techniques", "bf16,fused_optim", "--workload", "mlp", "--size", "tiny",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith('"""Training with bf16 + fused_optim') and "lab recipe --techniques bf16,fused_optim" in text
    assert "python mine.py" in capsys.readouterr().err
    load(text, tmp_path / "loaded.py")
    assert main(["recipe", "--techniques", "prune50", "--size", "tiny"]) == 0
    assert capsys.readouterr().out.startswith('"""Training with prune50')
    for argv, said in ((["--techniques", "bf16,nope"], "technique='nope' is invalid"),
                       (["--techniques", "bf16,fp16"], "conflict on precision.dtype"),
                       (["--techniques", "fast_kernels", "--workload", "ctr"], "the workload's own faster model"),
                       (["--run", "nothing"], "no results database"),
                       (["--run", "x", "--techniques", "bf16"], "give --run alone")):
        assert main(["recipe", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_a_stored_runs_recipe_says_what_the_lab_measured_on_which_machine(tmp_path, capsys, private_store):
    result = lab_run(("prune50",))
    with ResultStore(private_store) as store:
        store.add(result)
    assert main(["recipe", "--run", result.run_id[:8]]) == 0
    text = capsys.readouterr().out
    assert main(["recipe", "--run", "nothing"]) == 2 and "no stored run" in capsys.readouterr().err
    assert f"run {result.run_id[:8]} (mlp tiny, seed 0" in text and f"on {result.hardware_id}" in text
    assert "training: 32 steps" in text and text.startswith('"""Training with prune50:')  # its config, named


def test_every_emitted_file_is_lint_clean(tmp_path):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed here")
    files = []
    for option in sorted(EFFECTS):
        files.append(tmp_path / f"{option}.py")
        files[-1].write_text(from_techniques((option,), BASES.get(option, BASE)).text)
    (tmp_path / "ddp.py").write_text(build(BASE.with_overrides(**{"ddp.world_size": 2})).text)
    (tmp_path / "stack.py").write_text(from_techniques(("fused_optim", "prune_channels50", "int8_static"), BASE).text)
    (tmp_path / "memory.py").write_text(from_techniques(("checkpoint_blocks", "fsdp2"), BASES["fsdp2"]).text)
    for option in sorted(o for o in EFFECTS if o.startswith("int8")):  # both int8 ranges, whatever this CPU has:
        for setting in ("on", "off"):  # 7-bit activations are emitted only without VNNI, and a QAT line with them
            config = config_of((option,), BASES.get(option, BASE)).with_overrides(**{"quant.reduce_range": setting})
            (tmp_path / f"{option}_reduce_range_{setting}.py").write_text(build(config).text)  # (once past 120)
    done = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "E,F,W,I,B", "--line-length", "120",
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_effect_check_fails_a_file_that_drops_the_technique(tmp_path, monkeypatch):
    """The check can fail: the fused_optim file without ``fused=True`` trains the same numbers on CPU, but the
    optimizer that stepped is not the lab run's."""
    text = from_techniques(("fused_optim",), BASE).text
    assert text.count(", fused=True") == 1
    module = load(text.replace(", fused=True", ""), tmp_path / "unfused.py")
    got = train_emitted(module, config_of(("fused_optim",), BASE), tmp_path, monkeypatch)
    with pytest.raises(AssertionError):
        check_plain("fused_optim", lab_run(("fused_optim",)), got)


def test_a_configs_stack_is_named_by_its_options_and_what_they_do_not_say():
    from lab.portable import options_of
    from lab.recipes import top_stack

    arm = top_stack(BASE, include_emulated=True).arms["fused_optim+prune_channels50+int8_static"]
    assert options_of(arm) == (["fused_optim", "prune_channels50", "int8_static"], ["prune.finetune_epochs=3"])
    assert options_of(BASE.with_overrides(**{"ddp.world_size": 2})) == ([], ["ddp.world_size=2"])
    assert build(arm).title == "fused_optim + prune_channels50 + int8_static + prune.finetune_epochs=3"
