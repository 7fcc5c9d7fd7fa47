"""Plain PyTorch beside the lab: the same technique at the same size, timed both ways in one loop.

Why: a speedup the lab reports is only worth something if the lab's machinery (its precision policy, its
optimizer factory, its quantize and channel-pruning doors) adds nothing and hides nothing. The goals come
from a plain-PyTorch table for an MLP 256 -> w -> w -> 10 at batch 128 on this machine (bf16 train step 2.16x and
dynamic int8 inference 3.33x at w = 2048); this module rebuilds those plain arms with nothing from the lab
(``torch.optim.Adam``, ``torch.autocast``, ``torch.ao.quantization.quantize_dynamic``, a model built at half
the width) and times them interleaved with the lab's arms (:func:`lab.crossover.arms.build_arms`) on the
same model and batch, so both ratios see the same machine at the same moment; plus two rows that explain a
gap to the table: bf16 on forward + backward alone (plain), and bf16 stacked with the fused Adam update
(lab and plain). ``agrees``: the two 95 %
bootstrap intervals overlap. Run on the largest rung of the ``mlp`` ladder by ``build_map`` when ``mlp`` is
mapped; the targets are shares of each ceiling on this machine (:mod:`lab.goals`: bf16 and dynamic int8 >= 50 %
of the card's GEMM ratio over fp32, none without a cached card; channel pruning >= 0.75x of its MACs ratio).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lab.crossover.arms import INFER, TRAIN, Arm, Bench, apply_options, build_arms
from lab.goals import GEMM_SHARE_GOAL
from lab.measure import count_macs, gemm_ratio, interleaved_ms, load_card, median, rounds_ratio_ci
from lab.timed import TimedArm, timed

#: The techniques with a plain-PyTorch counterpart here, and the axes they are compared on.
TECHNIQUES = {"bf16": (TRAIN, INFER), "int8_eager": (INFER,), "prune_channels50": (TRAIN, INFER)}
#: The speedup goals at the largest dense rung: a share of the card's GEMM ratio of this dtype over fp32 (once the
#: constants 1.8x and 2.5x, what plain PyTorch measured on one CPU, 2.16x and 3.33x at w = 2048).
TARGET_DTYPES = {("bf16", TRAIN): "bf16", ("int8_eager", INFER): "int8"}


def targets() -> dict[tuple[str, str], float]:
    """``{(technique, axis): speedup goal}`` from this machine's cached card (empty without one)."""
    card = load_card()
    ratios = {k: gemm_ratio(card.to_dict(), d, 1) if card else None for k, d in TARGET_DTYPES.items()}
    return {k: GEMM_SHARE_GOAL * r for k, r in ratios.items() if r and r > 1}
PRUNE_TARGET_SHARE = 0.75  # channel pruning's speedup >= 0.75 x its MACs ratio
#: The stacked arm: bf16 autocast with the fused Adam update (the step's fp32 optimizer part, which no dtype
#: speeds up, is what keeps bf16 alone below the table's forward+backward figure).
STACK = "bf16+fused_optim"


def _plain_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, *, bf16: bool = False,
                 optimizer: bool = True, fused: bool = False) -> Arm:
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        if optimizer:
            opt.step()

    return step


def _plain_infer(model: nn.Module, x: torch.Tensor, *, bf16: bool = False) -> Arm:
    model.eval()

    @torch.no_grad()
    def call() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(x)

    return call


def half_width(model: nn.Module) -> nn.Module:
    """The same MLP with every hidden width halved (the plain-PyTorch table's "pruning by half", which the goals
    came from): built from the model's own ``nn.Linear`` stack, so it needs no pruning library."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("half_width needs a stack of nn.Linear layers")
    layers: list[nn.Module] = []
    d = linears[0].in_features
    for i, lin in enumerate(linears):
        out = lin.out_features if i == len(linears) - 1 else max(1, lin.out_features // 2)
        layers.append(nn.Linear(d, out))
        if i < len(linears) - 1:
            layers.append(nn.ReLU())
        d = out
    return nn.Sequential(*layers)


def plain_arms(bench: Bench, axis: str) -> dict[str, Arm]:
    """``plain_base`` and one ``plain_<technique>`` arm per technique of :data:`TECHNIQUES` on ``axis``,
    on copies of the bench's model (the lab's arms keep training theirs), in nothing but PyTorch."""
    (x,), y = bench.inputs, bench.target
    if axis == TRAIN:
        arms = {"plain_base": _plain_train(copy.deepcopy(bench.model), x, y, bench.lr),
                "plain_bf16": _plain_train(copy.deepcopy(bench.model), x, y, bench.lr, bf16=True),
                "plain_prune_channels50": _plain_train(half_width(bench.model), x, y, bench.lr),
                # Forward + backward without the optimizer: Adam's update is memory-bound and no dtype speeds
                # it up, so this pair says how much of the gap to a matmul-only figure the optimizer explains.
                "plain_fb_base": _plain_train(copy.deepcopy(bench.model), x, y, bench.lr, optimizer=False),
                "plain_fb_bf16": _plain_train(copy.deepcopy(bench.model), x, y, bench.lr, bf16=True,
                                              optimizer=False),
                # bf16 stacked with the fused Adam update: the optimizer part bf16 leaves alone, made cheaper.
                "plain_bf16+fused_optim": _plain_train(copy.deepcopy(bench.model), x, y, bench.lr, bf16=True,
                                                           fused=True)}
    else:
        eval_model = copy.deepcopy(bench.model).eval()
        int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(eval_model), {nn.Linear}, dtype=torch.qint8)
        arms = {"plain_base": _plain_infer(eval_model, x), "plain_bf16": _plain_infer(eval_model, x, bf16=True),
                "plain_int8_eager": _plain_infer(int8, x),
                "plain_prune_channels50": _plain_infer(half_width(bench.model), x)}
    return arms


def _ratio(base: list[float], tech: list[float] | None) -> tuple[float | None, float | None, float | None]:
    if not base or not tech:
        return None, None, None
    return rounds_ratio_ci(base, tech)


def compare(bench: Bench, *, repeats: int = 7, block_ms: float = 40.0, rung: str = "") -> list[dict[str, Any]]:
    """Rows ``rung, technique, axis, lab, lab_lo, lab_hi, plain, plain_lo, plain_hi, agrees, target,
    macs_ratio`` for the bench (a single-input model such as the ``mlp`` ladder's): lab and plain arms
    interleaved in one loop per axis."""
    if len(bench.inputs) != 1:
        raise ValueError("the plain-PyTorch reference takes a single-input model (the mlp ladder)")
    n = min(16, bench.batch_size)
    macs_ratio = count_macs(bench.model, (bench.inputs[0][:n],)) / max(1, count_macs(half_width(bench.model),
                                                                                      (bench.inputs[0][:n],)))
    rows: list[dict[str, Any]] = []
    goals = targets()
    for axis in (TRAIN, INFER):
        techs = [t for t, axes in TECHNIQUES.items() if axis in axes]
        with torch.random.fork_rng():
            lab, skipped = build_arms(bench, techs, axis)
            if axis == TRAIN:  # a stack of two of the lab's techniques, as a run with both would train
                lab[STACK] = timed(bench, apply_options(bench, TimedArm(TRAIN, bench.model), STACK))
            arms = {**lab, **plain_arms(bench, axis)}
            arms["base"]()
            base_ms = median([_once(arms["base"]) for _ in range(3)])
            iters = max(1, min(64, math.ceil(block_ms / max(base_ms, 1e-3))))
            samples = interleaved_ms(arms, repeats=repeats, warmup=1, iters=iters)
        for tech in techs + ([STACK] if axis == TRAIN else []):
            est, lo, hi = _ratio(samples["base"], samples.get(tech))
            p_est, p_lo, p_hi = _ratio(samples["plain_base"], samples.get(f"plain_{tech}"))
            agrees = None if None in (lo, hi, p_lo, p_hi) else bool(lo <= p_hi and p_lo <= hi)
            target = goals.get(("bf16" if tech == STACK else tech, axis))
            if tech == "prune_channels50":
                target = PRUNE_TARGET_SHARE * macs_ratio
            rows.append({"rung": rung, "technique": tech, "axis": axis, "lab": est, "lab_lo": lo, "lab_hi": hi,
                         "plain": p_est, "plain_lo": p_lo, "plain_hi": p_hi, "agrees": agrees, "target": target,
                         "macs_ratio": macs_ratio if tech == "prune_channels50" else None,
                         "why": skipped.get(tech, "")})
        if axis == TRAIN:
            p_est, p_lo, p_hi = _ratio(samples["plain_fb_base"], samples.get("plain_fb_bf16"))
            rows.append({"rung": rung, "technique": "bf16", "axis": "forward_backward", "lab": None, "lab_lo": None,
                         "lab_hi": None, "plain": p_est, "plain_lo": p_lo, "plain_hi": p_hi, "agrees": None,
                         "target": None, "macs_ratio": None,
                         "why": "plain PyTorch only: the training step without Adam's update (memory-bound, "
                                "not sped up by any dtype)"})
    return rows


def _once(fn: Arm) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
