""""Your model is here": place any model on the crossover map and say which techniques should pay at its size.

The map is measured on the built-in ladders; a user's model is placed by its MACs per sample (and shown by
its parameters) against the fits of the built-in family it resembles most (by the layers that carry its
arithmetic: an LSTM / GRU -> ``sequence``, a Conv -> ``vision``, attention -> ``transformer``, an
EmbeddingBag with an MLP -> ``ctr``, an Embedding (tokens) -> ``transformer``, any other Linear stack ->
``mlp``, the dense reference ladder; a map without that ladder reads it against ``transformer``, whose steps
are matmuls too), before any ablation is run. A prediction is only as good as that likeness and the batch: the fits are
per step at the family's batch (``rungs[].batch_size``), and a prediction says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from lab.crossover.fit import PAYS_GAIN, Line, crossover_macs, predicted_speedup
from lab.measure import count_macs, count_params
from lab.workloads import Workload, get_workload

#: Module type name -> family, most specific first.
_FAMILY_OF = (("LSTM", "sequence"), ("GRU", "sequence"), ("RNN", "sequence"), ("Conv2d", "vision"),
              ("Conv1d", "vision"), ("MultiheadAttention", "transformer"), ("EmbeddingBag", "ctr"),
              ("Embedding", "transformer"))
#: A family a map may lack (maps written before the dense ladder existed) -> the one read instead.
_FALLBACK = {"mlp": "transformer"}
#: A predicted speedup must clear this to be called "pays" (the noise on a shared box is a few percent).
PAYS_AT = 1.0 + PAYS_GAIN


def family_of(model: nn.Module) -> str:
    """The built-in family whose map a model is read against (see the module docstring)."""
    names = {type(m).__name__ for m in model.modules()}
    for type_name, family in _FAMILY_OF:
        if type_name in names:
            return family
    return "mlp"


def place(the_map: dict[str, Any], params: int, macs_per_sample: float, family: str) -> dict[str, Any]:
    """Predictions of every fitted technique x axis of ``family`` at ``macs_per_sample``: the predicted
    speedup, whether it pays (>= :data:`PAYS_AT`), and the family's predicted crossover."""
    fits = [f for f in the_map.get("fits", []) if f["workload"] == family]
    if not fits and family in _FALLBACK:
        family = _FALLBACK[family]
        fits = [f for f in the_map.get("fits", []) if f["workload"] == family]
    if not fits:
        have = sorted({f["workload"] for f in the_map.get("fits", [])})
        raise ValueError(f"the map has no fits for family {family!r}; it has: {', '.join(have) or 'none'}")
    batch = next((r.get("batch_size") for r in the_map.get("rungs", []) if r["workload"] == family), None)
    out = []
    for f in fits:
        base = Line(f["base_overhead_ms"], f["base_ms_per_mmac"])
        tech = Line(f["tech_overhead_ms"], f["tech_ms_per_mmac"])
        speedup = predicted_speedup(base, tech, macs_per_sample)
        out.append({"technique": f["technique"], "axis": f["axis"], "predicted_speedup": speedup,
                    "pays": speedup >= PAYS_AT, "crossover_macs": crossover_macs(base, tech, PAYS_GAIN),
                    "loo_error": f["loo_error"]})
    out.sort(key=lambda p: -p["predicted_speedup"])
    ladder = sorted((r for r in the_map.get("rungs", []) if r["workload"] == family),
                    key=lambda r: r["macs_per_sample"])
    nearest = min(ladder, key=lambda r: abs(r["macs_per_sample"] - macs_per_sample), default=None)
    return {"params": params, "macs_per_sample": macs_per_sample, "family": family, "batch_size": batch,
            "nearest_rung": nearest["rung"] if nearest else None, "predictions": out,
            "note": f"read against the {family} ladder's fits, per step at batch {batch}; a different batch moves "
                    "the fixed overhead's share, so measure before trusting a prediction near a crossover"}


def place_model(the_map: dict[str, Any], model: nn.Module, example_inputs: tuple, *,
                family: str | None = None) -> dict[str, Any]:
    """Place a model given one example batch: its parameters, MACs per sample and family (guessed from its
    layers unless ``family``)."""
    n = int(example_inputs[0].shape[0])
    return place(the_map, count_params(model), count_macs(model, example_inputs) / n, family or family_of(model))


def place_workload(the_map: dict[str, Any], workload: str | Workload, *, size: str = "small",
                   model_scale: str | None = None, family: str | None = None) -> dict[str, Any]:
    """Place a registered workload (a built-in, a spec ``module:NAME`` or ``file.py:NAME``) at ``size``."""
    wl = get_workload(workload) if isinstance(workload, str) else workload
    spec = wl.spec_at(size, model_scale)
    data = wl.make_data(dataclasses.replace(spec, n_train=16, n_test=4), 0)
    model = wl.make_model(spec)
    placed = place_model(the_map, model, tuple(t[:8] for t in data.train[:-1]),
                         family=family or (wl.name if any(f["workload"] == wl.name for f in the_map.get("fits", []))
                                           else None))
    return {"workload": wl.name, "size": size, "model_scale": model_scale, **placed}


def describe(placed: dict[str, Any]) -> str:
    """A few lines for a terminal or a notebook: where the model sits and what should pay there."""
    pays = [p for p in placed["predictions"] if p["pays"]]
    lines = [f"{placed.get('workload', 'your model')}: {placed['params']:,} parameters, "
             f"{placed['macs_per_sample'] / 1e6:.3g} MMACs per sample; read against the {placed['family']} ladder "
             f"(nearest rung {placed['nearest_rung']})"]
    lines += [f"  pays: {p['technique']} ({p['axis']}) predicted x{p['predicted_speedup']:.2f}" for p in pays] or \
        ["  predicted to pay: none at this size"]
    return "\n".join(lines)
