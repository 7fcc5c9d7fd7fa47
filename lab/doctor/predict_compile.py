"""``torch.compile`` per step: from this model's own compiled forward + backward when it was measured, else
from what compile saves per fusable op and costs per call (:class:`~lab.doctor.compile_rate.CompileCost`), else
the crossover map's rate or wide priors, each said in the reason. Kept apart from :mod:`lab.doctor.predict`
(which registers it) so each module stays short.

Why a structural prior (:func:`structural_prior`) beats a borrowed rate: scored on the committed and held-out
runs of intel-xeon-processor-amx-2c (``benchmarks/results/intel-xeon-processor-amx-2c/{doctor.json,heldout/}``),
the map's median over *other* workloads (1.04-1.07x) missed every attention model (BERT, GPT-2, DistilBERT,
the gallery transformer, the transformer ladder: 1.09-1.55x measured, 9 runs), and the chain micro-benchmark
missed both ways (GRU 1.41x predicted, 0.99x measured; DistilBERT 0.63x vs 1.38x). The misses follow the
model's structure: attention blocks are many small layout / softmax / elementwise ops that Inductor fuses,
a recurrent layer's ops run inside ``aten::lstm`` / ``aten::gru`` where nothing is fused (0.90-1.07x), and a
step under 2 ms pays the compiled call's fixed price on every step (0.78-0.98x). The same attention models
read 0.67x (BERT) and 0.94x (GPT-2) on an AMD EPYC: so the attention prior's interval reaches both, and
every structural prediction says "prior, not measured".
"""

from __future__ import annotations

from typing import Any

from lab.doctor.amdahl import COMPUTE, Prediction, Rates, _fmt, _pct, amdahl
from lab.doctor.compile_rate import CompileCost
from lab.doctor.rates import Rate, prior
from lab.measure.profile import Breakdown

#: The classes whose ops compile fuses (forward and backward): what :class:`CompileCost` measures per op.
FUSABLE = ("elementwise", "norm", "reduction")


#: The chain stands in for the model's own ops, so its saving and price are taken within +-50 % beyond their
#: timing intervals: on ctr at ``small`` the chain's price at 2048 x 128 holds the generated kernel's pass over
#: memory, which the model pays per fused kernel, and the bootstrap interval alone missed the measured 1.10x.
COMPILE_MODEL_SPREAD = 0.5


def compile_time_s(b: Breakdown, cost: CompileCost) -> float:
    """Estimated compile seconds of the model: the chains' fixed part plus their per-op part times the
    forward + backward ops of a step (a lower estimate: a matmul or an embedding compiles slower than an
    activation does)."""
    return cost.compile_s_fixed + cost.compile_s_per_op * sum(b.op_counts.get(c, 0.0) for c in COMPUTE)


def compile_step_ms(b: Breakdown, saving_ms: float, call_ms: float) -> float:
    """The compiled step: each fusable op saves ``saving_ms`` (never more than the fusable classes and the
    overhead hold together), and the compiled forward + backward add ``call_ms`` once per step."""
    n = sum(b.op_counts.get(c, 0.0) for c in FUSABLE)
    cap = sum(b.ms.get(c, 0.0) for c in FUSABLE) + b.ms.get("overhead", 0.0)
    saved = min(max(n * saving_ms, -b.step_ms), cap)
    return max(b.step_ms - saved + call_ms, 1e-6 * b.step_ms)


#: Attention models: the step's non-matmul part under compile (the matmuls keep their kernels): the Intel
#: runs' 1.09-1.55x steps at 22-58 % matmul share imply ~1.5x on the rest; AMD EPYC's BERT 0.67x implies 0.6x.
ATTENTION_REST = (1.5, 0.55, 2.4)
#: An attention model under this many MACs per sample has blocks too small for compile to pay. MACs, not the
#: step's ms: a busy machine stretches a step 4-10x, never its MACs. On the AMD EPYCs the HF tiny models
#: (1.1-1.7 M MACs) gained 1.02-1.52x, the gallery transformer (0.3 M) 0.93-1.14x, three small attention
#: models pasted as people write them (a minimal GPT, RoBERTa, an nn.Transformer subclass) lost (0.75-0.92x);
#: the transformer ladder's xs rung (0.13 M) gained 1.25x (a miss this accepts: its interval's top).
SMALL_ATTENTION_MACS = 5e5
#: compile on such a model: (central, low, high), below 1 at the centre, reaching the Intel gains at the top.
SMALL_ATTENTION = (0.9, 0.65, 1.25)
#: Below this step time the compiled call's fixed price (guards, graph call) is a large share of the step.
TINY_STEP_MS = 2.0
#: A recurrent share at which the step is mostly inside aten::lstm / aten::gru (not fused by compile).
RECURRENT_SHARE = 0.2


def borrowed(rate: Rate | None) -> bool:
    """A map rate fitted on other workloads (:meth:`lab.doctor.rates.CrossoverMap.rate`: not "same workload")."""
    return rate is not None and "same workload" not in rate.source


def structural_prior(name: str, b: Breakdown, r: Rates) -> Prediction | None:
    """compile from the model's structure when nothing measured it on this model or workload: recurrent,
    tiny step, small attention (under :data:`SMALL_ATTENTION_MACS` per sample), attention (in that order; see the
    module docstring for the residuals behind each), else ``None``. The interval is the prior's own (wide);
    calibration widens it further."""
    rec, mm = b.share("recurrent"), b.share("matmul")
    if rec >= RECURRENT_SHARE:
        s, lo, hi = 1.0, 0.85, 1.2
        why = (f"recurrent {_pct(rec)} of the step runs inside aten::lstm / aten::gru, which compile does not fuse "
               "(GRU / LSTM models measured 0.90-1.07x here)")
    elif b.step_ms < TINY_STEP_MS:
        s, lo, hi = 0.92, 0.7, 1.15
        why = (f"a {b.step_ms:.2f} ms step: the compiled call's fixed price (guards, graph call) is paid every step "
               "(steps under 2 ms measured 0.78-0.98x here)")
    elif r.attention > 0 and 0 < r.macs_per_sample < SMALL_ATTENTION_MACS:
        s, lo, hi = SMALL_ATTENTION
        why = (f"{r.attention} attention module(s) at {r.macs_per_sample / 1e3:,.0f} k MACs per sample: blocks this "
               "small give the fusion less than the compiled graphs' call price and Inductor's small kernels take "
               "back (the gallery transformer, 0.3 M MACs, measured 0.93-1.14x on AMD EPYCs; a pasted minimal "
               "GPT 0.75x, RoBERTa 0.76x, an nn.Transformer subclass 0.92x; 1.29-1.36x on "
               "intel-xeon-processor-amx-2c, which the interval does not reach)")
    elif r.attention > 0:
        rest = max(1.0 - mm, 0.0)
        s, lo, hi = (1.0 / (mm + rest / v) for v in ATTENTION_REST)
        why = (f"{r.attention} attention module(s): the {_pct(rest)} of the step outside matmuls is many small "
               "layout / softmax / elementwise ops that compile fuses (attention models measured 1.09-1.55x on "
               "intel-xeon-processor-amx-2c, 0.67-0.94x on an AMD EPYC)")
    else:
        return None
    return Prediction(name, "train_step", s, lo, hi, f"{why} -> compile predicted {_fmt(s, lo, hi)} per step "
                      "(prior, not measured: `--measure compile` times this model; compile time not included)",
                      ["prior: compile from the model's structure"])


def _compile_prior(name: str, b: Breakdown, cross: Rate | None) -> Prediction:
    """Without the on-the-spot measurement (:class:`CompileCost`): the crossover map's rate, else wide priors."""
    over = b.share("overhead")
    tiny = min(b.tiny_share, 1.0 - over)
    small = {"overhead": over, "tiny": tiny,
             "fusable": max(sum(b.share(c) for c in FUSABLE) - tiny, 0.0)}
    rates = {"overhead": cross or prior(1.0, 0.1, 2.5, "compile trades Python between ops for guards and a "
                                                        "graph call: either way, not measured here"),
             "tiny": cross or prior(2.0, 0.3, 5.0, "compile fuses tiny ops into one kernel"),
             "fusable": cross or prior(1.2, 0.3, 2.5, "compile fuses elementwise / normalisation / reductions")}
    s, lo, hi = amdahl(small, rates)
    lead = (f"framework overhead {_pct(over)} + tiny ops {_pct(tiny)} of the step -> compile or larger batches "
            f"first; precision and pruning will not pay at this size" if over + tiny > 0.5 else
            f"overhead {_pct(over)}, tiny ops {_pct(tiny)}, fusable elementwise {_pct(small['fusable'])}")
    what = ("the crossover map" if cross and not borrowed(cross) else
            "prior, not measured: another workload's map rate" if cross else "prior, not measured: verify it")
    return Prediction(name, "train_step", s, lo, hi, f"{lead} -> compile predicted {_fmt(s, lo, hi)} per step "
                      f"(compile time not included; {what})", sorted({x.source for x in rates.values()}))


def _compile_from_model(name: str, b: Breakdown, r: Rates, rate: Rate) -> Prediction:
    """The model's own forward + backward, eager vs compiled, applied to the classes forward + backward run
    (the optimizer and the data wait stay eager), with its measured compile time as the cost to amortise."""
    shares = {c: b.share(c) for c in COMPUTE}
    s, lo, hi = amdahl(shares, dict.fromkeys(shares, rate))
    net_ms = b.step_ms * (1 - 1 / s)
    pay = (f"its {r.model_compile_s:.0f} s compile pays back after ~{r.model_compile_s * 1e3 / net_ms:,.0f} steps"
           if net_ms > 0 else f"slower per step, so its {r.model_compile_s:.0f} s compile never pays back")
    return Prediction(name, "train_step", s, lo, hi,
                      f"forward + backward {_pct(sum(shares.values()))} of the step; compiled it ran {rate.value:.2f}x "
                      f"({rate.source}) -> compile predicted {_fmt(s, lo, hi)} per step; {pay}", [rate.source])


def predict_compile(name: str, b: Breakdown, r: Rates) -> Prediction:
    """``torch.compile`` per step from what it saves per fusable op and adds per call (:class:`CompileCost`,
    measured here), with the compile time as a cost a run must amortise: the break-even steps, and the
    end-to-end ratio over the run's own steps (``Rates.steps``). This model's own compiled forward +
    backward (``Rates.model_compile``, measured when the user accepts its cost) wins over everything; then
    the crossover map's rate; without either the old prior is used and says so."""
    if r.model_compile is not None:
        return _compile_from_model(name, b, r, r.model_compile)
    over, fus = b.share("overhead"), sum(b.share(c) for c in FUSABLE)
    cross, cost = r.crossover.get((name, "train_step")), r.compile
    if cross is None or borrowed(cross):
        structural = structural_prior(name, b, r)
        if structural is not None:
            return structural
    if cross is not None or cost is None:
        return _compile_prior(name, b, cross)
    step = b.step_ms
    s = step / compile_step_ms(b, cost.op_saving_ms, cost.call_ms)
    down, up = 1 - COMPILE_MODEL_SPREAD, 1 + COMPILE_MODEL_SPREAD
    lo = step / compile_step_ms(b, cost.op_saving_lo * down, cost.call_hi * up)
    hi = step / compile_step_ms(b, cost.op_saving_hi * up, cost.call_lo * down)
    n = sum(b.op_counts.get(c, 0.0) for c in FUSABLE)
    net_ms = step - compile_step_ms(b, cost.op_saving_ms, cost.call_ms)  # saved per step, compile time apart
    comp_s = compile_time_s(b, cost)
    lead = (f"framework overhead {_pct(over)} + fusable elementwise / norm / reduction {_pct(fus)} ({n:.0f} ops per "
            f"step, {cost.op_saving_ms * 1e3:.1f} us saved each); a compiled forward + backward costs "
            f"{cost.call_ms:.2f} ms more per step")
    if over + b.tiny_share > 0.5:
        lead += ("; overhead and tiny ops dominate -> " + ("compile or larger batches first" if s > 1 else
                 "larger batches first (compile's price per call exceeds what it saves here)")
                 + "; precision and pruning will not pay at this size")
    if net_ms > 0:
        steps = comp_s * 1e3 / net_ms
        pay = f"compile ~{comp_s:.0f} s (estimated) pays back after ~{steps:,.0f} steps"
        if r.steps:
            e2e = r.steps * step / (r.steps * (step - net_ms) + comp_s * 1e3)
            pay += f"; over this run's {r.steps} steps {e2e:.2f}x end to end"
    else:
        pay = f"slower per step, so its ~{comp_s:.0f} s compile (estimated) never pays back"
    return Prediction(name, "train_step", s, min(lo, s), max(hi, s),
                      f"{lead} -> compile predicted {_fmt(s, min(lo, s), max(hi, s))} per step; {pay} "
                      f"({cost.source})", [cost.source])


def attention_modules(model: Any) -> int:
    """How many modules of ``model`` are attention blocks (``nn.MultiheadAttention`` or a class whose name says
    attention, as Hugging Face's ``BertSelfAttention`` / ``GPT2Attention`` do; their sub-modules not counted
    twice)."""
    import torch.nn as nn

    n, inside = 0, set()
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        if isinstance(m, nn.MultiheadAttention) or "attention" in type(m).__name__.lower():
            n += 1
            inside.add(name)
    return n


__all__ = ["ATTENTION_REST", "COMPILE_MODEL_SPREAD", "FUSABLE", "SMALL_ATTENTION", "SMALL_ATTENTION_MACS",
           "attention_modules", "borrowed", "compile_step_ms", "compile_time_s", "predict_compile", "structural_prior"]
