"""A tiny real crossover measurement (structure only: no timing assertion), the CLI's one-line errors, and
placing a model on the map by its layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lab.cli import main
from lab.crossover import ROW_KEYS, build_map, check_schema, describe, family_of, place_workload
from lab.crossover.mapping import attach_ceilings
from lab.measure import CEILING_KEYS


def test_a_tiny_real_map_has_the_schema_and_one_row_per_rung_technique_axis(cpu_caps) -> None:
    """Where bf16 is native both bf16 rows are measured; where it is emulated (an AVX2 CPU) each bf16 row is
    measured and tagged "emulated", or absent with a reason that says it was emulated and too slow to time."""
    the_map = build_map(["sequence"], ["bf16", "int8_static_legacy"], rungs={"sequence": ["xs", "s"]}, repeats=3,
                        batch_size={"sequence": 8})
    check_schema(the_map)
    assert the_map["env"]["hardware_id"] and the_map["env"]["torch_threads"] == 1
    assert len(the_map["rows"]) == 2 * 3  # 2 rungs x (bf16 train, bf16 inference, static int8 inference)
    assert all(set(r) == set(ROW_KEYS) | set(CEILING_KEYS) for r in the_map["rows"])  # each beside its ceiling
    planted = {"peaks": {"gemm_gflops": {"fp32": {"1": 50.0}, "bf16": {"1": 100.0}, "int8": {"1": 200.0}}}}
    shares = [r["share_of_ceiling"] for r in attach_ceilings(the_map, planted)["rows"] if r["speedup"] is not None]
    assert any(shares) and all(s is None or s > 0 for s in shares)  # int8 is measured on every machine
    seen = the_map["contention"]  # whether the machine was busy while the map was timed, said in its headline
    assert seen["cores"] >= 1 and seen["wall_s"] > 0 and (seen["busy"] == bool(seen["sentence"]))
    from lab.crossover import headline_lines
    assert any(seen["sentence"] in line for line in headline_lines(the_map)) if seen["busy"] else True
    measured = [r for r in the_map["rows"] if r["speedup"] is not None]
    bf16 = [r for r in the_map["rows"] if r["technique"] == "bf16"]
    if cpu_caps.native_bf16:
        assert {(r["technique"], r["axis"]) for r in measured} >= {("bf16", "train_step"), ("bf16", "inference")}
    else:
        # measured and tagged, or skipped with what stopped it (too slow on one call, or no kernel
        # at all: oneDNN's LSTM has no bf16 primitive below AVX-512) and still tagged
        assert bf16 and all("emulated here" in r["why"] for r in bf16)
        assert all("skipped: " in r["why"] for r in bf16 if r["speedup"] is None)
    for r in measured:
        assert r["ci_lo"] <= r["speedup"] <= r["ci_hi"] and r["base_ms"] > 0 and r["tech_ms"] > 0
        assert r["regime"] in ("dispatch-bound", "compute-bound", "memory-bound") and "fixed overhead" in r["why"]
    params = {r["rung"]: r["params"] for r in the_map["rows"]}
    assert params["xs"] < params["s"]
    per_pair = [(r["technique"], r["axis"]) for r in measured if r["technique"] == "bf16"]
    fitted = {p for p in per_pair if per_pair.count(p) == 2}  # measured on both rungs: a fit exists
    assert {(f["technique"], f["axis"]) for f in the_map["fits"]} >= fitted
    placed = place_workload(the_map, "sequence", size="tiny")
    assert placed["family"] == "sequence" and placed["params"] > 0 and placed["macs_per_sample"] > 0
    assert {p["technique"] for p in placed["predictions"]} >= {f[0] for f in fitted}
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


def _row(workload: str, rung: str, tech: str, axis: str, speedup: float | None, lo: float | None = None,
         why: str = "") -> dict:
    return {"workload": workload, "rung": rung, "technique": tech, "axis": axis, "speedup": speedup,
            "ci_lo": lo if lo is not None else speedup, "ci_hi": speedup, "why": why}


def test_the_cross_hardware_table_compares_machines_at_the_rung_both_measured(tmp_path) -> None:
    import json

    from lab.crossover import cross_hardware_table, load_maps

    amx = {"quick": False, "env": {"hardware_id": "amx-box"},
           "rows": [_row("mlp", "s", "bf16", "train_step", 1.2), _row("mlp", "xl", "bf16", "train_step", 1.9, 1.5),
                    _row("mlp", "xl", "compile", "inference", 1.1, 0.9)]}
    avx2 = {"quick": True, "env": {"hardware_id": "avx2-box"},
            "rows": [_row("mlp", "s", "bf16", "train_step", None, why="x20 slower than fp32 on a single call")]}
    for name, m in (("a", amx), ("b", avx2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "crossover.json").write_text(json.dumps(m))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "crossover.json").write_text("not json")  # left out, never a crash
    maps = load_maps(tmp_path)
    assert [hw for hw, _ in maps] == ["amx-box", "avx2-box"]
    table = cross_hardware_table(maps)
    assert "amx-box (full map)" in table and "avx2-box (quick map)" in table and "(mlp s)" in table
    bf16 = next(line for line in table.splitlines() if line.startswith("| bf16 | train step"))
    assert "1.20×" in bf16 and "1.90" not in bf16  # xl is not a rung both measured
    assert "> 8× slower on 1 of 1: not timed" in bf16
    assert "not in this map" in next(line for line in table.splitlines() if line.startswith("| compile"))
    assert "No crossover map yet" in cross_hardware_table([])


def test_another_machines_figures_are_never_shown_as_this_machines() -> None:
    from lab.measure import environment_stamp, other_machine_note

    mine = environment_stamp()["hardware_id"]
    assert other_machine_note(mine) is None
    note = other_machine_note("some-other-cpu-avx2-9c", "This map's figures")
    assert note.startswith("This map's figures were measured on some-other-cpu-avx2-9c, not on this machine")
    assert mine in note and "lab crossover --quick" in note


def test_the_results_page_block_is_regenerated_between_its_markers_and_nowhere_else(tmp_path) -> None:
    import json

    from lab.crossover.report import write_cross_hardware

    (tmp_path / "r" / "box").mkdir(parents=True)
    (tmp_path / "r" / "box" / "crossover.json").write_text(json.dumps(
        {"quick": True, "env": {"hardware_id": "box"}, "rows": [_row("mlp", "s", "bf16", "inference", 1.5, 1.2)]}))
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("before\n<!-- cross-hardware:start (generated) -->\nold table\n"
                    "<!-- cross-hardware:end -->\nafter\n")
    assert write_cross_hardware(page, tmp_path / "r")
    once = page.read_text()
    assert once.startswith("before\n<!-- cross-hardware:start (generated) -->\n| technique") and "old table" not in once
    assert once.endswith("<!-- cross-hardware:end -->\nafter\n") and "| bf16 | inference | 1.50×" in once
    assert write_cross_hardware(page, tmp_path / "r") and page.read_text() == once  # idempotent
    assert "box (quick map)" in (tmp_path / "r" / "cross-hardware.md").read_text()
    page.write_text("no markers\n")
    assert not write_cross_hardware(page, tmp_path / "r") and page.read_text() == "no markers\n"


def test_the_repository_results_page_holds_the_cross_hardware_markers() -> None:
    from lab.bench import RESULTS_PAGE
    from lab.crossover.report import CROSS_END, CROSS_START

    text = RESULTS_PAGE.read_text()
    assert text.count(CROSS_START) == 1 and text.count(CROSS_END) == 1
    assert text.index(CROSS_START) < text.index(CROSS_END)
