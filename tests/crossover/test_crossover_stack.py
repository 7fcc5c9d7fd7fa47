"""The map's top-rung stack (``prune50_pt2e_int8``): channels 50 % removed, then PT2E static int8 of the *pruned*
model, timed against the dense fp32 eager call; and its report figure with the parts it stacks."""

from __future__ import annotations

import copy

import torch

from lab.crossover import arms, mapping
from lab.crossover.measure import make_bench
from lab.crossover.report import STACK_GOAL, figures, stack_note
from lab.pruning.timed import channels_removed
from lab.quant import converted_graph
from lab.workloads import get_workload


def _out(model, inputs):
    with torch.no_grad():
        return model(*inputs).float()


def test_the_stack_quantizes_the_pruned_model_and_computes_what_it_computes():
    bench = make_bench(get_workload("mlp"), "xs", batch_size=32)
    built, skipped = arms.build_arms(bench, ["prune_channels50", "prune_channels50+int8_static"], arms.INFER)
    assert not skipped and {"base", "prune_channels50", "prune_channels50+int8_static"} <= set(built)
    model_q, info = bench.built[("int8", "static", "pt2e", "pruned")]
    assert ("int8", "static", "pt2e") not in bench.built  # the dense model was never quantized for this arm
    assert info["swap"]["swapped"], "no int8 layer in the stacked model"
    pruned = channels_removed(bench, 0.5)[0].eval()
    dense_params = sum(p.numel() for p in bench.model.parameters())
    assert sum(p.numel() for p in pruned.parameters()) < 0.5 * dense_params
    graph = converted_graph(model_q)
    int8_weights = sum(b.numel() for b in graph.buffers() if b.dtype == torch.int8) if graph is not None else 0
    assert 0 < int8_weights < 0.5 * dense_params  # the int8 layers are the pruned, narrower ones
    x = bench.inputs
    ref, got = _out(pruned, x), _out(model_q, x)
    err = (got - ref).norm() / ref.norm()
    assert err < 0.1, f"int8 of the pruned model is {err:.3f} off the pruned fp32 model"
    assert err < (got - _out(copy.deepcopy(bench.model).eval(), x)).norm() / ref.norm()  # not the dense model's
    note = bench.notes["prune_channels50+int8_static"]
    assert "fewer MACs" in note and "then int8 MAC share" in note
    stack = "prune_channels50+int8_static"
    assert stack in mapping.SPARSE_RUNGS and arms.TECHNIQUES[stack] == (arms.INFER,)


def _row(tech, speedup, rung="xl", params=11e6):
    return {"workload": "vision", "rung": rung, "params": params, "technique": tech, "axis": "inference",
            "speedup": speedup, "ci_lo": speedup * 0.98, "ci_hi": speedup * 1.01, "base_ms": 65.0,
            "regime": "compute-bound", "why": ""}


def test_the_stack_figure_holds_the_goal_and_names_its_parts_and_their_product():
    rows = [_row("prune_channels50", 3.6), _row("int8_static", 4.3), _row("prune_channels50+int8_static", 13.4),
            _row("prune_channels50+int8_static", 1.4, rung="xs", params=5e3)]
    the_map = {"rows": rows, "crossovers": [], "reference": []}
    (fig,) = [f for f in figures(the_map) if "prune_channels50+int8_static" in f["name"]]
    assert fig["value"] == 13.4 and fig["goal"] == f"> {STACK_GOAL:g}x" and fig["met"] is True  # the top rung
    assert "prune_channels50 3.60x, int8_static 4.30x, product 15.48x, the stack 87% of it" in fig["note"]
    assert stack_note(rows[:1] + rows[2:], rows[2]) == ""  # a part not measured at that rung: no product
