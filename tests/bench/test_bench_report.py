"""The performance report: combining benchmark JSON, reproduction checks, markdown and the results page's
block (docs/results.md)."""

from __future__ import annotations

import json
import math

import pytest

from lab import bench as br
from lab.cli import main as cli_main

ENV = {"hardware_id": "test-cpu-2c", "device_name": "Test CPU", "usable_cores": 2, "isa_flags": ["avx2"],
       "torch_version": "2.13.0", "python_version": "3.11", "git_sha": "abc1234567", "git_dirty": False}


def _fig(name, value, *, unit="x", ci=None, goal=None, met=None, note="", family=None):
    return {"name": name, "value": value, "unit": unit, "ci95": ci, "goal": goal, "met": met, "note": note,
            "family": family}


def _write(folder, benchmark, figures, quick=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{benchmark}.json").write_text(json.dumps(
        {"benchmark": benchmark, "quick": quick, "env": ENV, "figures": figures}))


def test_report_rows_carry_family_anchor_and_hardware(tmp_path):
    _write(tmp_path, "precision", [_fig("ctr/bf16 speedup vs fp32", 0.9, ci=[0.85, 0.95])])
    _write(tmp_path, "gpu", [_fig("2:4 sparse linear speedup", math.nan, family="pruning", note="skipped: no CUDA")])
    rep = br.build_report(tmp_path)
    by_name = {r["name"]: r for r in rep["rows"]}
    assert by_name["ctr/bf16 speedup vs fp32"]["family"] == "precision"
    assert by_name["2:4 sparse linear speedup"]["family"] == "pruning"  # a figure's own family wins
    assert rep["hardware_id"] == "test-cpu-2c" and rep["benchmarks"] == ["gpu", "precision"]
    md = br.render_markdown(rep)
    assert br.ANCHORS["precision"].claim in md and br.ANCHORS["pruning"].source in md
    assert "skipped: no CUDA" in md  # a skipped figure says why instead of showing a number
    assert "reproduced" not in md  # nothing to compare with yet


@pytest.mark.parametrize(("before", "now", "within"), [
    ({"value": 2.0, "ci95": [1.8, 2.2]}, {"value": 2.1, "ci95": [2.0, 2.2]}, True),
    ({"value": 2.0, "ci95": [1.9, 2.1]}, {"value": 2.6, "ci95": [2.5, 2.7]}, False),
    ({"value": 2.0, "ci95": [1.99, 2.01]}, {"value": 2.1, "ci95": [1.5, 2.5]}, True),  # the new CI holds the old
    ({"value": 2.0, "ci95": None}, {"value": 2.2, "ci95": None}, None),
])
def test_reproduction_verdict(before, now, within):
    out = br.reproduction(before, now)
    assert out["within_ci"] is within
    assert out["rel_change"] == pytest.approx((now["value"] - before["value"]) / before["value"])


def test_reproduction_without_previous_or_with_nan():
    assert br.reproduction(None, {"value": 1.0})["within_ci"] is None
    assert br.reproduction({"value": math.nan, "ci95": [0, 1]}, {"value": 1.0})["previous"] is None


def test_second_run_is_compared_with_the_first_and_flags_misses(tmp_path):
    _write(tmp_path, "data_loading", [_fig("pick / in-memory", 1.0, ci=[0.9, 1.1]),
                                      _fig("naive / in-memory", 0.5, ci=[0.48, 0.52])])
    br.write_report(tmp_path)
    _write(tmp_path, "data_loading", [_fig("pick / in-memory", 1.05, ci=[0.95, 1.12]),
                                      _fig("naive / in-memory", 0.8, ci=[0.78, 0.82])])
    _, md_path, rep = br.write_report(tmp_path)
    rows = {r["name"]: r for r in rep["rows"]}
    assert rows["pick / in-memory"]["within_ci"] is True
    assert rows["naive / in-memory"]["within_ci"] is False
    assert (tmp_path / br.PREVIOUS_JSON).exists()
    md = md_path.read_text()
    assert "**NO**" in md and "1 figures inside the earlier CI, 1 outside" in md
    # Re-rendering alone compares with the kept previous report, never with itself.
    _, _, again = br.write_report(tmp_path, new_results=False)
    assert {r["name"]: r["within_ci"] for r in again["rows"]} == {"pick / in-memory": True,
                                                                  "naive / in-memory": False}


def test_empty_or_broken_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no benchmark JSON"):
        br.build_report(tmp_path)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="x.json: not valid JSON"):
        br.load_benchmarks(tmp_path)
    (tmp_path / "x.json").write_text(json.dumps({"something": 1}))
    with pytest.raises(ValueError, match="not a benchmark result"):
        br.load_benchmarks(tmp_path)


def test_update_readme_rewrites_only_the_marked_block(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    _write(results / "test-cpu-2c", "stacked", [
        _fig("best stack", 2.5, ci=[2.3, 2.7], goal=">= 3x", met=False), _fig("prefetch speedup", 1.4)])
    _write(results / "test-cpu-2c", "overhead", [_fig("timer cost", 4.9, unit="us")])  # no goal: not a headline
    br.write_report(results / "test-cpu-2c")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{br.README_START}\nold table\n{br.README_END}\noutro\n")
    assert br.update_readme(readme, results)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old table" not in text
    assert "| stacked | best stack | 2.5 x | [2.3, 2.7] | >= 3x | **not met** |  |" in text
    assert "prefetch speedup" in text and "timer cost" not in text
    assert "**[test-cpu-2c](benchmarks/results/test-cpu-2c/report.md)**: Test CPU" in text
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers")
    assert not br.update_readme(plain, results) and plain.read_text() == "no markers"


def test_update_readme_on_a_docs_page_names_each_report_as_a_code_span_not_a_link(tmp_path):
    # MkDocs --strict fails on a link that leaves docs/, so from docs/results.md a report is a path, not a link.
    results = tmp_path / "benchmarks" / "results"
    _write(results / "test-cpu-2c", "stacked", [_fig("best stack", 2.5, ci=[2.3, 2.7], goal=">= 3x", met=False)])
    br.write_report(results / "test-cpu-2c")
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(f"intro\n{br.README_START}\nold table\n{br.README_END}\noutro\n")
    assert br.update_readme(page, results)
    text = page.read_text()
    assert "**test-cpu-2c** (`benchmarks/results/test-cpu-2c/report.md`): Test CPU" in text
    assert "](" not in text and "| stacked | best stack | 2.5 x |" in text


def test_the_repository_results_page_holds_the_report_markers():
    text = br.RESULTS_PAGE.read_text()
    assert text.count(br.README_START) == 1 and text.count(br.README_END) == 1


def test_cli_report_only(tmp_path, capsys):
    _write(tmp_path, "overhead", [_fig("instrumentation / step", 0.06, unit="%", goal="<= 2 %", met=True)])
    assert cli_main(["bench", "--report-only", "--out", str(tmp_path)]) == 0
    assert "# Performance report: `test-cpu-2c`" in (tmp_path / br.REPORT_MD).read_text()
    assert cli_main(["bench", "--report-only", "--out", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_benchmark_not_rerun_keeps_its_earlier_comparison(tmp_path):
    """``bench --only X``: figures of the other benchmarks were not measured again, so they must not be
    compared with themselves; they keep the verdict of the run that measured them."""
    def write(benchmark, value, stamp):
        _write(tmp_path, benchmark, [_fig(f"{benchmark} ratio", value, ci=[value - 0.1, value + 0.1])])
        data = json.loads((tmp_path / f"{benchmark}.json").read_text())
        (tmp_path / f"{benchmark}.json").write_text(json.dumps({**data, "measured_at": stamp}))

    write("precision", 1.0, "t1")
    write("pruning", 2.0, "t1")
    br.write_report(tmp_path)
    write("precision", 1.5, "t2")  # outside the first CI
    write("pruning", 2.05, "t2")  # inside
    br.write_report(tmp_path)
    write("precision", 1.52, "t3")  # only precision re-run: inside its previous CI
    rows = {r["benchmark"]: r for r in br.write_report(tmp_path)[2]["rows"]}
    assert rows["precision"]["within_ci"] is True and rows["precision"]["previous"] == 1.5
    assert rows["pruning"]["within_ci"] is True and rows["pruning"]["previous"] == 2.0  # t2 vs t1, kept


@pytest.mark.parametrize(("goal", "bound"), [
    (">= 3x at <= 1 pt AUC", (">=", 3.0)), ("<= 2 %", ("<=", 2.0)), ("> 5x", (">", 5.0)),
    (">= 0.95 (never >5 % slower)", (">=", 0.95)), ("95 % intervals overlap", None), ("within +-20 %", None),
    ("~1.0x, reported honestly (0.8-1.25)", None), (None, None)])
def test_goal_bound_reads_the_leading_comparison_only(goal, bound):
    assert br.goal_bound(goal) == bound


@pytest.mark.parametrize(("goal", "ci", "met", "beyond"), [
    (">= 3x", [2.73, 3.49], True, False),   # met on the point estimate, the CI reaches below the goal
    (">= 3x", [3.05, 3.49], True, True),
    ("<= 1 pt", [0.2, 1.4], True, False),   # an upper-bound goal: the CI's top end is the unfavourable one
    ("<= 1 pt", [0.2, 0.9], True, True),
    (">= 3x", [2.1, 2.9], False, None),     # not met: nothing to qualify
    (">= 3x", None, True, None),            # no CI: the point is all there is
    ("95 % intervals overlap", [0.9, 1.1], True, None)])
def test_met_beyond_noise_reads_the_unfavourable_end_of_the_ci(goal, ci, met, beyond):
    row = {"goal": goal, "ci95": ci, "met": met}
    assert br.met_beyond_noise(row) is beyond


def test_report_marks_a_goal_met_on_the_point_only(tmp_path):
    _write(tmp_path, "stacked", [_fig("ctr stack", 3.16, ci=[2.73, 3.49], goal=">= 3x", met=True),
                                 _fig("vision int8", 4.39, ci=[4.19, 4.41], goal=">= 4x", met=True)])
    rep = br.build_report(tmp_path)
    by_name = {r["name"]: r for r in rep["rows"]}
    assert by_name["ctr stack"]["met_beyond_noise"] is False and by_name["vision int8"]["met_beyond_noise"] is True
    md = br.render_markdown(rep)
    assert "| >= 3x | met, point only (CI crosses the goal) |" in md and "| >= 4x | met |" in md
