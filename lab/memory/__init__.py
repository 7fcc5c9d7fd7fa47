"""Memory: train what does not fit. ``memory.checkpoint="blocks"`` (activation checkpointing per block, the
workload's :meth:`~lab.workloads.Workload.model_blocks`), ``memory.optimizer_state="int8" | "int4"`` (Adam's moments
in 8 / 4 bits, torchao), ``memory.micro_batches=k`` (each batch as k micro-batches, gradients accumulated in
:func:`lab.loop.train_step`: the same effective batch), ``memory.shard="fsdp2"`` (parameters, gradients and
optimizer state sharded across the data-parallel ranks, FSDP2's ``fully_shard``, where DDP replicates them) and
``memory.offload="optimizer"`` (Adam's state and update in host memory, parameters on the GPU: torchao's
``CPUOffloadOptimizer``, CUDA only, :mod:`lab.memory.offload`), each verified by its effect; and every run's step
counted by role (``details["memory"]``: parameters, gradients, optimizer state, activations saved for backward)
beside the process RSS peak the loop samples. Page: docs/memory.md; taught in ``notebooks/09_memory.ipynb``.

Where it sits in a run (:data:`lab.registry.FAMILY_ORDER`, after compute and precision, before pruning): its
``before_training`` checkpoints the blocks of the model that trains (after compute's fast-kernel swap); its
``fit_options`` sets the fit's optimizer (low-bit state, offload) and wraps the precision policy precision has set with
the counting one (:mod:`lab.memory.roles`); its ``after_training`` hands pruning and quantization the plain
model (checkpointing is a training-time lever: a fine-tune after pruning or QAT runs unchecked). Sharding is the
family's launcher (:mod:`lab.memory.launcher`, in :data:`lab.registry.LAUNCHERS`): the data-parallel ranks, with
FSDP2 where DDP would wrap the model, and a plain model gathered back after training.

What each lever costs is measured, not assumed: ``benchmarks/memory.py`` (saved-activation and optimizer-state
bytes ratios, step-time ratios with intervals on the transformer and vision ladders); the doctor predicts
checkpointing's step time from this model's own forward + backward with its blocks checkpointed.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch
from torch import nn

from lab.config import RunConfig
from lab.context import TrainContext
from lab.loop import FitStats, StepHook
from lab.memory import portable as portable_
from lab.memory.checkpointing import checkpoint_blocks, checkpointed_copy, restore_blocks
from lab.memory.launcher import LAUNCHER as SHARDED_LAUNCHER
from lab.memory.offload import check_offload, offload_adam, state_bytes_by_place
from lab.memory.optim import LOW_BIT, low_bit_adam, low_bit_class
from lab.memory.roles import CountingStep
from lab.registry import FAMILIES, LAUNCHERS
from lab.result import RunResult
from lab.technique import FitPlan, Option, Portable, Technique
from lab.timed import TRAIN, Bench, NotTimed, TimedArm


def no_blocks_refusal(workload: str, model: nn.Module) -> str:
    """The one line a model without blocks is refused with."""
    return (f"memory.checkpoint='blocks' is invalid for workload {workload!r}: its model ({type(model).__name__}) "
            "has no blocks to checkpoint (no composite module held by an nn.Sequential / nn.ModuleList, no Hugging "
            "Face checkpointable layer); a workload names its own with Workload(blocks=fn)")


class Memory(Technique):
    """Activation checkpointing per block, low-bit Adam state, batch-keeping accumulation and CPU offload of the
    optimizer; memory by role in every run."""

    name = "memory"

    def portable(self, cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
        """Checkpointing per block, torchao's low-bit AdamW, FSDP2's shard and gather, written out
        (:mod:`lab.memory.portable`)."""
        return portable_.portable(cfg, run)

    def check(self, cfg: RunConfig) -> None:
        """Low-bit state is Adam's: refused with SGD, with torch's fused Adam (one or the other), with checkpoint /
        resume (read weights-only, which does not load torchao's state tensors) and without torchao. Sharding:
        :func:`check_shard`; offload: :func:`lab.memory.offload.check_offload` (on a CPU device among others)."""
        check_shard(cfg)
        check_offload(cfg)
        state = cfg.memory.optimizer_state
        if state == "fp32":
            return
        what = f"memory.optimizer_state={state!r} is invalid"
        if cfg.optimizer != "adam":
            raise ValueError(f"{what} with optimizer={cfg.optimizer!r}: low-bit state is Adam's two moments "
                             f"(torchao {LOW_BIT[state]}); use --optimizer adam")
        if cfg.compute.fused_optimizer:
            raise ValueError(f"{what} with compute.fused_optimizer: torchao's low-bit Adam is its own compiled "
                             "update, not torch's fused kernel; choose one")
        if cfg.checkpoint_every is not None or cfg.resume is not None:
            raise ValueError(f"{what} with checkpoint_every / resume: checkpoints are read weights-only, which does "
                             "not load torchao's low-bit state tensors")
        low_bit_class(state)

    def preflight(self, ctx: TrainContext, model: nn.Module) -> None:
        """Refuse checkpointing a model without blocks, and more micro-batches than a batch has rows, before any
        training."""
        if ctx.cfg.memory.checkpoint == "blocks" and not ctx.workload.model_blocks(model):
            raise ValueError(no_blocks_refusal(ctx.cfg.workload, model))
        k, batch = ctx.cfg.memory.micro_batches, ctx.resolved.batch_size
        if k > batch:
            raise ValueError(f"memory.micro_batches={k} is invalid with batch_size={batch}: a micro-batch needs at "
                             "least one row; lower --memory-micro-batches or raise --batch-size")

    def before_training(self, ctx: TrainContext, model: nn.Module) -> tuple[nn.Module, list[StepHook]]:
        """Checkpoint the blocks of the model that trains."""
        if ctx.cfg.memory.checkpoint == "blocks":
            blocks = ctx.workload.model_blocks(model)
            if not blocks:  # the model that trains is not the one preflight saw (a fast-kernel swap)
                raise ValueError(no_blocks_refusal(ctx.cfg.workload, model))
            ctx.state["memory.blocks"] = checkpoint_blocks(model, blocks)
        return model, []

    def fit_options(self, ctx: TrainContext, model: nn.Module, plan: FitPlan) -> None:
        """Every fit: the low-bit or offloaded optimizer. The main training fit: its first step counted by role,
        and an offloaded optimizer's state by where it lives."""
        state = ctx.cfg.memory.optimizer_state
        if state != "fp32":
            plan.optimizer = low_bit_adam(state)
        built: list[torch.optim.Optimizer] = []
        if ctx.cfg.memory.offload == "optimizer":
            make = offload_adam()

            def keep(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
                built.append(make(params, lr))
                return built[-1]

            plan.optimizer = keep
        plan.micro_batches = ctx.cfg.memory.micro_batches
        if plan.phase != "train" or plan.probe:
            return
        counting = CountingStep(plan.policy, model, activations=plan.forward is None)
        plan.policy = counting

        def record(stats: FitStats) -> None:
            if counting.record is None:  # no step was taken
                return
            rec = {**counting.record, "checkpoint": ctx.cfg.memory.checkpoint, "optimizer_state": state,
                   "micro_batches": plan.micro_batches, "counted_step": 0}
            if "memory.blocks" in ctx.state:
                rec["checkpointed_blocks"] = ctx.state["memory.blocks"]
            sharded = ctx.state.get("memory.sharded")
            rec["shard"] = ctx.cfg.memory.shard
            if sharded is not None:  # the bytes above are this rank's shards (rank 0's: the record's)
                rec.update(world_size=sharded.world_size, sharded_blocks=sharded.blocks,
                           shard_note="params, grads and optimizer state: rank 0's local shards (dim 0 split "
                                      "across ranks, padded to equal shards); a block's full parameters and "
                                      "gradients exist only while it runs (all-gather / reduce-scatter buffers, "
                                      "a transient in the process RSS peak), not counted here")
            rec["offload"] = ctx.cfg.memory.offload
            if built:  # the state's bytes by place: all of it on the host is what the lever promises
                rec.update(state_bytes_by_place(built[-1]),
                           offload_note="Adam's state and update on the host (torchao CPUOffloadOptimizer, "
                                        "fused CPU AdamW at weight decay 0); parameters and gradients on the device, "
                                        "each gradient copied to pinned host memory in backward, each parameter back "
                                        "after the step")
            if state != "fp32":
                rec["optimizer_compile_s"] = first_step_excess_s(stats.step_times_ms.get("optimizer", []))
            ctx.result.details["memory"] = rec

        plan.finished.append(record)

    def after_training(self, ctx: TrainContext, model: nn.Module) -> nn.Module:
        """The plain model for what follows (evaluation, pruning, quantization): no block stays checkpointed."""
        restore_blocks(model)
        return model

    def timed(self, option: Option, bench: Bench, arm: TimedArm) -> None:
        """Training only. Checkpointing: the arm trains a deep copy of its model with the blocks checkpointed.
        Low-bit state: the arm's optimizer is torchao's low-bit Adam (its first step compiles: the map's warm-up
        calls take it). Offload: the arm's optimizer is torchao's CPUOffloadOptimizer, on a CUDA bench only."""
        o = option.overrides
        if o.get("memory.shard", "none") != "none":
            raise NotTimed(f"{option.name} shards a model across ranks; the map times one process")
        if arm.axis != TRAIN:
            raise NotTimed(f"{option.name} changes what a training step keeps: training only")
        if o.get("memory.checkpoint") == "blocks":
            if arm.forward is not None:
                raise NotTimed(f"{option.name} checkpoints a copy of the model; the arm's forward was compiled from "
                               "the model before it")
            try:
                model, names = checkpointed_copy(arm.model, bench.workload.model_blocks)
            except ValueError:
                raise NotTimed(no_blocks_refusal(bench.workload.name, arm.model)) from None
            arm.notes.append(f"{len(names)} blocks checkpointed")
            arm.derive(model, "checkpointed")
        if o.get("memory.micro_batches", 1) > 1:
            arm.micro_batches = o["memory.micro_batches"]
            arm.notes.append(f"{arm.micro_batches} micro-batches")
        state = o.get("memory.optimizer_state", "fp32")
        if state != "fp32":
            if arm.fused:
                raise NotTimed(f"{option.name} replaces the optimizer; the arm's is torch's fused Adam")
            arm.optimizer = low_bit_adam(state)
            arm.notes.append(f"torchao {LOW_BIT[state]}")
        if o.get("memory.offload", "none") != "none":
            if bench.device.type != "cuda":
                raise NotTimed(f"{option.name} needs CUDA: on a CPU the optimizer state already is in host memory")
            if arm.fused:
                raise NotTimed(f"{option.name} replaces the optimizer; the arm's is torch's fused Adam")
            arm.optimizer = offload_adam()
            arm.notes.append("torchao CPUOffloadOptimizer: Adam's state and update on the host")

    def report(self, result: RunResult) -> dict[str, Any]:
        """Which levers ran, and the step's bytes by role."""
        cfg = (result.config or {}).get("memory", {})
        rec = result.details.get("memory") or {}
        out: dict[str, Any] = {"checkpoint": cfg.get("checkpoint", "none"),
                               "optimizer_state": cfg.get("optimizer_state", "fp32"),
                               "micro_batches": cfg.get("micro_batches", 1), "shard": cfg.get("shard", "none"),
                               "offload": cfg.get("offload", "none")}
        out.update({k: rec[k] for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes",
                                        "saved_activations_bytes", "optimizer_state_host_bytes",
                                        "optimizer_state_device_bytes") if k in rec})
        return out


def _ranks_asked(cfg: RunConfig) -> int:
    """The ranks a run of ``cfg`` has: ``ddp.world_size``, or what torchrun / srun started this process among."""
    return max(cfg.ddp.world_size, int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("SLURM_NTASKS") or 1))


def check_shard(cfg: RunConfig) -> None:
    """``memory.shard='fsdp2'``, before any work: several ranks (one has nobody to shard with), and none of what
    cannot run on sharded parameters here, each refused by name."""
    if cfg.memory.shard == "none":
        return
    what = f"memory.shard={cfg.memory.shard!r} is invalid"
    if _ranks_asked(cfg) < 2:
        raise ValueError(f"{what} with ddp.world_size={cfg.ddp.world_size}: FSDP2 shards across data-parallel "
                         "ranks and one rank has nobody to shard with; add --ddp-world-size 2")
    if cfg.prune.enabled and cfg.prune.schedule == "gradual":
        raise ValueError(f"{what} with prune.schedule='gradual': its masks are recomputed during training from "
                         "whole weights, which a rank holds only a shard of; prune once after training instead")
    if cfg.profile:
        raise ValueError(f"{what} with --profile: the profiled steps re-wrap a copy of the model in DDP, not FSDP2; "
                         "profile the DDP run")
    if cfg.checkpoint_every is not None or cfg.resume is not None:
        raise ValueError(f"{what} with checkpoint_every / resume: a checkpoint of sharded parameters (DTensors) is "
                         "not written or read by the lab's checkpointer")


def first_step_excess_s(ms: list[float]) -> float:
    """The first sample's time beyond the median of the others, in seconds (a first-step compile)."""
    if len(ms) < 2:
        return 0.0
    return max(ms[0] - statistics.median(ms[1:]), 0.0) / 1e3


TECHNIQUE = FAMILIES.register(Memory.name, Memory(), overwrite=True)  # overwrite: importlib.reload stays idempotent
LAUNCHER = LAUNCHERS.register(Memory.name, SHARDED_LAUNCHER, overwrite=True)
from lab.memory import options  # noqa: E402, F401 - the family's option strings, registered with it

__all__ = ["LAUNCHER", "TECHNIQUE", "Memory", "check_shard", "first_step_excess_s", "no_blocks_refusal"]
