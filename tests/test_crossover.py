"""A tiny real crossover measurement (structure only: no timing assertion), the CLI's one-line errors, and
placing a model on the map by its layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lab.cli import main
from lab.crossover import ROW_KEYS, build_map, check_schema, describe, family_of, place_workload


def test_a_tiny_real_map_has_the_schema_and_one_row_per_rung_technique_axis() -> None:
    the_map = build_map(["sequence"], ["bf16", "static_int8"], rungs={"sequence": ["xs", "s"]}, repeats=3,
                        batch_size={"sequence": 8})
    check_schema(the_map)
    assert the_map["env"]["hardware_id"] and the_map["env"]["torch_threads"] == 1
    assert len(the_map["rows"]) == 2 * 3  # 2 rungs x (bf16 train, bf16 inference, static int8 inference)
    assert all(set(r) == set(ROW_KEYS) for r in the_map["rows"])
    measured = [r for r in the_map["rows"] if r["speedup"] is not None]
    assert {(r["technique"], r["axis"]) for r in measured} >= {("bf16", "train_step"), ("bf16", "inference")}
    for r in measured:
        assert r["ci_lo"] <= r["speedup"] <= r["ci_hi"] and r["base_ms"] > 0 and r["tech_ms"] > 0
        assert r["regime"] in ("dispatch-bound", "compute-bound", "memory-bound") and "fixed overhead" in r["why"]
    params = {r["rung"]: r["params"] for r in the_map["rows"]}
    assert params["xs"] < params["s"]
    assert {(f["technique"], f["axis"]) for f in the_map["fits"]} >= {("bf16", "train_step"), ("bf16", "inference")}
    placed = place_workload(the_map, "sequence", size="tiny")
    assert placed["family"] == "sequence" and placed["params"] > 0 and placed["macs_per_sample"] > 0
    assert {p["technique"] for p in placed["predictions"]} >= {"bf16"}
    assert "parameters" in describe(placed)


@pytest.mark.parametrize(("argv", "message"), [
    (["--workloads", "nope"], "unknown workload 'nope'"),
    (["--techniques", "bf16,warp_drive"], "unknown technique(s) warp_drive"),
    (["--threads", "4096"], "threads=4096 is invalid"),
    (["--repeats", "1"], "need >= 3 rounds"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(["crossover", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_family_of_reads_the_layers_that_carry_the_arithmetic() -> None:
    assert family_of(nn.LSTM(4, 4)) == "sequence"
    assert family_of(nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LazyLinear(2))) == "vision"
    assert family_of(nn.TransformerEncoderLayer(8, 2, batch_first=True)) == "transformer"
    assert family_of(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))) == "mlp"
    assert family_of(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))) == "transformer"
    assert family_of(nn.ModuleList([nn.EmbeddingBag(10, 4), nn.Linear(4, 1)])) == "ctr"
    assert torch.get_num_threads() >= 1
