"""The zoo of real-world model patterns (tests/zoo_models.py, issue 45 item 3) through every technique family:
each cell is ok with its effect verified from the run record (loader and fused optimizer named, bf16 outputs
seen, blocks checkpointed, sparsity measured, channels removed, modules swapped to int8 and int8 MACs counted)
or refused by ``lab.run`` before any training step in one line that says why. Never a traceback, never a silent
no-op. The slow doors (``torch.compile``, the PT2E flows, low-bit Adam, DDP x 2) and legacy QAT (the static
column's FX tracing and refusals, plus a fine-tune) of every pattern are in ``tests/zoo_table.py``, which writes
the whole table (docs/workloads.md); DDP of a view buffer and PT2E of int
tensors made in forward and of an ``nn.Transformer`` subclass are tested in tests/distributed and
tests/e2e/test_pasted.py. No timing assertions."""

from __future__ import annotations

from pathlib import Path

import pytest
from matrix import run_cell
from zoo_models import PATTERNS

from lab import RunConfig, run

SPEC = str(Path(__file__).resolve().parents[1] / "zoo_models.py")

#: One option per family, cheap enough for every pattern (data and compute stacked: neither touches the model).
TECHNIQUES: dict[str, dict] = {
    "prefetch+fused_optim": {"data.loader": "thread", "compute.fused_optimizer": True},
    "bf16": {"precision.dtype": "bf16"},
    "checkpoint_blocks": {"memory.checkpoint": "blocks"},
    "prune50": {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "prune_channels50": {"prune.method": "structured_channels", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "int8_eager": {"quant.method": "dynamic", "quant.flow": "legacy"},
    "int8_static_legacy": {"quant.method": "static", "quant.flow": "legacy", "quant.calibration_batches": 1},
}
NO_BLOCKS = ("has no blocks to checkpoint", "Workload(blocks=fn)")
NO_FX = ("FX symbolic tracing fails", "quant.flow='pt2e'")
#: (pattern, technique) -> words the one-line refusal must hold (why, and the way out). Every other cell is ok.
REFUSED: dict[tuple[str, str], tuple[str, ...]] = {
    **{(p, "checkpoint_blocks"): NO_BLOCKS for p in (
        "next_params", "view_buffers", "tied", "tuple_out", "seq_first", "log_softmax", "int_forward", "data_branch",
        "custom_layernorm")},
    **{(p, t): NO_FX for p in ("next_params", "view_buffers", "tuple_out", "data_branch", "transformer_subclass")
       for t in ("int8_static_legacy",)},
    ("seq_first", "prune_channels50"): ("no structurally prunable layer", "rnn:", "head: the output layer"),
}
ZOO = [p for p in PATTERNS if p != "tuple_out_raw"]


def _cfg(pattern: str, overrides: dict) -> RunConfig:
    return RunConfig(workload=f"{SPEC}:{pattern.upper()}", size="tiny", threads=1, latency_repeats=0,
                     warmup_steps=1).with_overrides(**overrides)


def _verify(r, pattern: str, technique: str) -> None:
    d = r.details
    if technique == "prefetch+fused_optim":
        assert d["steps"]["train"]["loader"] == "ThreadPrefetcher" and d["steps"]["train"]["fused"] is True
    elif technique == "bf16":
        layers = d["precision"]["phases"]["train"]["layer_dtypes"]
        assert any(rec["type"] == "Linear" and rec["output_dtype"] == "bfloat16" for rec in layers), layers
    elif technique == "checkpoint_blocks":
        assert d["memory"]["checkpointed_blocks"], d["memory"]
    elif technique == "prune50":
        p = d["pruning"]
        assert p["sparsity_prunable"] == pytest.approx(0.5, abs=0.02) and r.nonzero_params < r.param_count
        assert p["finetune"]["steps"] > 0
    elif technique == "prune_channels50":
        p = d["pruning"]
        shrunk = {n for n, (before, after) in p["channels"].items() if after < before}
        assert shrunk and r.param_count < p["params_dense"], p["channels"]
        if pattern == "tied":  # the layer feeding the tied head keeps its width, saying why; the one before shrinks
            assert shrunk == {"block.fc"} and "weight tying" in p["excluded"]["block.proj"]
        if pattern in ("fused_qkv", "dropout"):  # q, k, v in one Linear: never an uneven cut across heads
            assert not any(".attn." in n for n in shrunk)
            assert "heads" in p["excluded"]["transformer.h.0.attn.c_attn"]
    else:  # int8
        q = d["quant"]
        assert q["flow"] == "legacy" and q["swap"]["n_swapped"] >= 1
        assert q["int8_model_macs_by_dtype"]["int8"] > 0 and r.int8_macs_per_sample > 0
        if pattern == "next_params" and technique == "int8_eager":  # every Linear swapped: a float anchor kept
            assert "float_parameter_kept" in q


@pytest.mark.parametrize("technique", list(TECHNIQUES))
@pytest.mark.parametrize("pattern", ZOO)
def test_every_family_works_on_every_pattern_or_refuses_before_training(pattern, technique):
    r = run_cell(_cfg(pattern, TECHNIQUES[technique]), REFUSED.get((pattern, technique)))
    if r is None:  # refused before training, as REFUSED says
        return
    assert r.status == "ok", r.error
    assert r.steps == 2 and r.metric == r.metric and r.metric_before is not None
    _verify(r, pattern, technique)


def test_a_tuple_output_is_refused_before_training_naming_the_adapter():
    """nanoGPT's ``(logits, loss)`` pasted as is: one line, the tuple described, :class:`lab.workloads.FirstOutput`
    named (``zoo_tuple_out`` is the same model through it, ok above)."""
    with pytest.raises(ValueError, match=r"returned tuple.*\(\[64x4\] float32, NoneType\).*FirstOutput") as err:
        run(_cfg("tuple_out_raw", {}))
    assert "\n" not in str(err.value)


def test_static_int8_of_a_model_no_flow_can_trace_is_refused_before_training():
    """A branch on a value: torch.export and FX symbolic tracing both fail, so PT2E static int8 is refused before
    training (it was refused after it, the training spent)."""
    events: list[dict] = []
    with pytest.raises(ValueError, match=r"torch\.export cannot trace DataBranch.*FX symbolic tracing fails too"):
        run(_cfg("data_branch", {"quant.method": "static", "quant.calibration_batches": 2}), progress=events.append)
    assert not [e for e in events if "step" in e]


def test_an_adapter_taking_star_inputs_exports_with_a_dynamic_batch():
    """``FirstOutput.forward(self, *inputs)``: torch.export matches dynamic_shapes to the signature, so the inputs
    taken by ``*inputs`` are one tuple there (a flat tuple failed: "inputs[0] is a tuple ... dynamic_shapes[0] is
    a dict", and PT2E fell back to legacy)."""
    import torch
    from zoo_models import TupleOut

    from lab.quant.export import batch_dims, export_for_quant
    from lab.workloads import FirstOutput

    model = FirstOutput(TupleOut()).eval()
    assert batch_dims(model, 1) == (({0: torch.export.Dim.AUTO},),)
    assert batch_dims(TupleOut(), 1) == ({0: torch.export.Dim.AUTO},)
    x = torch.randint(0, 12, (4, 8))
    gm = export_for_quant(model, (x,))
    torch.testing.assert_close(gm(torch.randint(0, 12, (6, 8)))[:0], model(torch.randint(0, 12, (6, 8)))[:0])
    torch.testing.assert_close(gm(x), model(x))
