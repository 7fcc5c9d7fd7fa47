"""``torch.compile`` per step: from this model's own compiled forward + backward when it was measured, else
from what compile saves per fusable op and costs per call (:class:`~lab.doctor.compile_rate.CompileCost`), else
the crossover map's rate or wide priors, each said in the reason. Kept apart from :mod:`lab.doctor.predict`
(which registers it) so each module stays short.
"""

from __future__ import annotations

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
    what = "the crossover map" if cross else "a prior: verify it"
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


__all__ = ["COMPILE_MODEL_SPREAD", "FUSABLE", "compile_step_ms", "compile_time_s", "predict_compile"]
