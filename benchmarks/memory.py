"""What the memory levers save, and what they cost in time: activation checkpointing per block, 8-bit Adam state.

    python benchmarks/memory.py [--quick] [--json PATH]

On the transformer and vision ladders (``--quick``: rung ``s`` at batch 16; full: the top rung ``xl`` at batch 32),
one thread (docs/architecture.md section 5, rule 8), each rung's model on a fixed batch of its own data:

- checkpointing (``checkpoint_blocks``): the bytes one training step saves for backward, plain / checkpointed,
  counted at the tensor level during forward + loss (:class:`lab.measure.memory.SavedTensorBytes`, the count a
  run records in ``details["memory"]``; a checkpoint's kept block inputs included); goal >= 3x at the top rungs
  (issue 43). And the step-time ratio checkpointed / plain: the step a run takes (:mod:`lab.timed`, the arms built
  by :func:`lab.crossover.arms.apply_options`), arms interleaved, median ratio with a bootstrap 95 % CI. Anchors:
  one more forward of the blocks, ~1.33x in FLOPs; Hugging Face quotes ~20 % slower.
- 8-bit Adam (``adam8bit``, torchao ``AdamW8bit``): the optimizer-state bytes after one step, torch's Adam /
  AdamW8bit on the same model (goal >= 3.5x; parameters under 4,096 elements keep fp32 moments), its first step's
  compile (a one-off cost, seconds; Inductor's on-disk cache shortens a second run), and its step-time ratio.

Accuracy over seeds and peak memory of whole runs are not here yet (issue 43 asks for them beside these).
"""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

import torch
from _common import emit, figure, parse_args, ratio_figure, skipped

from lab.crossover.arms import apply_options
from lab.crossover.measure import make_bench
from lab.loop import make_optimizer, train_step
from lab.measure import count_params, error_text, interleaved_ms
from lab.measure.memory import SavedTensorBytes, optimizer_state_bytes
from lab.memory.optim import low_bit_adam
from lab.timed import TRAIN, Bench, TimedArm, base_arm, timed
from lab.workloads import get_workload

LADDERS = ("transformer", "vision")
FAMILY = "memory"


def saved_bytes(bench: Bench, model: torch.nn.Module) -> int:
    """Bytes ``model`` saves for backward in one forward + loss on the bench's batch (parameters left out)."""
    with SavedTensorBytes(exclude=list(model.parameters())) as count:
        loss = bench.workload.loss(model(*bench.inputs), bench.target)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return count.bytes


def one_step(bench: Bench, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Seconds of one training step (the first: state created, a low-bit update compiled)."""
    t0 = time.perf_counter()
    train_step(model, optimizer, bench.workload.loss, itertools.repeat((*bench.inputs, bench.target)), bench.device)
    return time.perf_counter() - t0


def checkpoint_figures(tag: str, bench: Bench, repeats: int) -> list[dict[str, Any]]:
    plain = base_arm(bench, TRAIN)
    ckpt = apply_options(bench, base_arm(bench, TRAIN), "checkpoint_blocks")
    b_plain, b_ckpt = saved_bytes(bench, plain.model), saved_bytes(bench, ckpt.model)
    ratio = b_plain / b_ckpt
    figs = [figure(f"{tag}: saved activations, plain / checkpointed", ratio, unit="x", goal=">= 3x",
                   met=ratio >= 3, family=FAMILY,
                   note=f"{b_plain / 2**20:.3g} MiB -> {b_ckpt / 2**20:.3g} MiB per step; {ckpt.notes[0]}")]
    ms = interleaved_ms({"plain": timed(bench, plain), "checkpointed": timed(bench, ckpt)}, repeats=repeats, warmup=2)
    figs.append(ratio_figure(f"{tag}: step time, checkpointed / plain", ms["checkpointed"], ms["plain"],
                             family=FAMILY, note=f"{len(ms['plain'])} interleaved rounds; median plain step "
                             f"{sorted(ms['plain'])[len(ms['plain']) // 2]:.3g} ms; a ratio above 1 is the cost"))
    return figs


def adam8bit_figures(tag: str, bench: Bench, repeats: int) -> list[dict[str, Any]]:
    fp32_model, low_model = copy.deepcopy(bench.model), copy.deepcopy(bench.model)
    adam = make_optimizer("adam", fp32_model.parameters(), bench.lr)
    low = low_bit_adam("int8")(list(low_model.parameters()), bench.lr)
    one_step(bench, fp32_model, adam)
    first_s = one_step(bench, low_model, low)
    fp32_b, low_b = optimizer_state_bytes(adam), optimizer_state_bytes(low)
    ratio = fp32_b / low_b
    ms = interleaved_ms({"adam": timed(bench, TimedArm(TRAIN, fp32_model)),
                         "adam8bit": timed(bench, apply_options(bench, TimedArm(TRAIN, low_model), "adam8bit"))},
                        repeats=repeats, warmup=2)
    return [
        figure(f"{tag}: optimizer state, Adam fp32 / 8-bit", ratio, unit="x", goal=">= 3.5x", met=ratio >= 3.5,
               family=FAMILY, note=f"{fp32_b / 2**20:.3g} MiB -> {low_b / 2**20:.3g} MiB (torchao AdamW8bit)"),
        figure(f"{tag}: 8-bit Adam first step (compile, one-off)", first_s, unit="s", family=FAMILY,
               note="torchao compiles its update per parameter shape; Inductor's on-disk cache shortens a rerun"),
        ratio_figure(f"{tag}: step time, 8-bit Adam / Adam", ms["adam8bit"], ms["adam"], family=FAMILY,
                     note=f"{len(ms['adam'])} interleaved rounds, after the compile"),
    ]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rung, batch, repeats = ("s", 16, 7) if args.quick else ("xl", 32, 15)
    torch.set_num_threads(1)
    figs: list[dict[str, Any]] = []
    for name in LADDERS:
        bench = make_bench(get_workload(name), rung, batch_size=batch)
        tag = f"{name} {rung} ({count_params(bench.model) / 1e6:.2g} M params, batch {batch})"
        for part in (checkpoint_figures, adam8bit_figures):
            try:
                figs += part(tag, bench, repeats)
            except Exception as exc:  # noqa: BLE001 - one part failing is a figure that says why
                figs.append(skipped(f"{tag}: {part.__name__}", error_text(exc), FAMILY))
    emit("memory", args, figs, threads=1, rung=rung, batch=batch)


if __name__ == "__main__":
    main()
