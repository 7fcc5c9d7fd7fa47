"""Threads on the crossover map (issue 15, item 5): the 1-thread vs all-cores comparison on synthetic maps,
the workers-along-the-ladder study with an injected ``run`` returning planted throughputs, the CLI
(``python -m lab threads``, and ``crossover --threads-study``, its old spelling) and its one-line refusals,
and the dashboard's "Threads" section on a synthetic study. No timing is asserted."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.cli import main
from lab.crossover import compare_maps, stops_paying, workers_along_ladder, write_study
from lab.crossover.threads import LOSES, NO_VERDICT, PAYS, UNCLEAR, verdict
from lab.crossover.threads_study import load_study, study_figures, summary_lines
from lab.workloads import SCALE_NAMES

TWO_CORES = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to split")


def _row(rung: str, tech: str, speedup: float | None, base_ms: float, *, half_ci: float = 0.03,
         axis: str = "train_step", params: int = 1000) -> dict:
    if speedup is None:
        return {"workload": "w", "rung": rung, "params": params, "macs_per_sample": 10.0 * params,
                "technique": tech, "axis": axis, "speedup": None, "ci_lo": None, "ci_hi": None, "base_ms": None,
                "tech_ms": None, "regime": None, "why": "skipped: no kernel"}
    return {"workload": "w", "rung": rung, "params": params, "macs_per_sample": 10.0 * params, "technique": tech,
            "axis": axis, "speedup": speedup, "ci_lo": speedup - half_ci, "ci_hi": speedup + half_ci,
            "base_ms": base_ms, "tech_ms": base_ms / speedup, "regime": "dispatch-bound", "why": ""}


def _map(threads: int, rows: list[dict], crossovers: list[dict] | None = None) -> dict:
    return {"threads": threads, "rows": rows, "crossovers": crossovers or []}


def test_compare_finds_the_flip_and_the_baselines_thread_scaling() -> None:
    # bf16 pays at 1 thread on the large rung (1.3x) but not at 2 (the fp32 step gained 1.9x, bf16's 1.1x).
    one = _map(1, [_row("xs", "bf16", 0.8, 2.0, params=100), _row("l", "bf16", 1.3, 40.0, params=10**6),
                   _row("l", "fused_optim", 1.1, 40.0, params=10**6), _row("xs", "fp16", None, 2.0, params=100)],
               [{"workload": "w", "technique": "bf16", "axis": "train_step", "measured_rung": "l",
                 "measured_params": 10**6}])
    many = _map(2, [_row("xs", "bf16", 0.79, 1.98, params=100), _row("l", "bf16", 1.3 * 1.1 / 1.9, 40.0 / 1.9,
                                                                        params=10**6),
                    _row("l", "fused_optim", 1.1, 40.0 / 1.9, params=10**6),
                    _row("xs", "fp16", 0.5, 1.98, params=100)],
                [{"workload": "w", "technique": "bf16", "axis": "train_step", "measured_rung": None,
                  "measured_params": None}])
    out = compare_maps(one, many)
    assert out["threads"] == [1, 2]
    scaling = {s["rung"]: s for s in out["scaling"]}
    assert scaling["xs"]["scaling"] == pytest.approx(2.0 / 1.98)
    assert "buy little" in scaling["xs"]["why"]  # a dispatch-bound step gets ~nothing from the second core
    assert scaling["l"]["scaling"] == pytest.approx(1.9)
    assert "compute-bound" in scaling["l"]["why"]
    rows = {(r["rung"], r["technique"]): r for r in out["rows"]}
    big = rows[("l", "bf16")]
    assert (big["verdict_1"], big["verdict_n"], big["flipped"]) == (PAYS, LOSES, True)
    assert big["tech_scaling"] == pytest.approx(1.1) and big["base_scaling"] == pytest.approx(1.9)
    assert "flips" in big["why"]
    # speedup at N = speedup at 1 x (technique's scaling / baseline's): the identity the why states
    assert big["speedup_n"] == pytest.approx(big["speedup_1"] * big["tech_scaling"] / big["base_scaling"])
    assert not rows[("xs", "bf16")]["flipped"] and not rows[("l", "fused_optim")]["flipped"]
    assert rows[("xs", "fp16")]["verdict_1"] == NO_VERDICT and not rows[("xs", "fp16")]["flipped"]
    assert [(f["rung"], f["technique"]) for f in out["flips"]] == [("l", "bf16")]
    assert out["headline"][0].startswith("1 of 3 technique verdicts") and "(1 of them from pays to loses" in \
        out["headline"][0]
    assert big["reversed"] and not rows[("xs", "bf16")]["reversed"]
    assert out["crossovers"][0]["moved"] and "l -> never" in out["headline"][-1]


def test_compare_refuses_maps_it_cannot_compare() -> None:
    with pytest.raises(ValueError, match="1-thread map first"):
        compare_maps(_map(2, [_row("xs", "bf16", 1.0, 1.0)]), _map(1, [_row("xs", "bf16", 1.0, 1.0)]))
    with pytest.raises(ValueError, match="share no"):
        compare_maps(_map(1, [_row("xs", "bf16", 1.0, 1.0)]), _map(2, [_row("s", "bf16", 1.0, 1.0)]))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 5), st.floats(0.01, 1))
def test_verdict_follows_the_interval(mid: float, half: float) -> None:
    v = verdict(mid - half, mid + half)
    assert v == (PAYS if mid - half > 1 else LOSES if mid + half < 1 else UNCLEAR)
    assert verdict(None, None) == NO_VERDICT


def _fake_run(throughput: dict[tuple[str, int], float], calls: list):
    """A ``run`` that returns planted throughputs per (rung, workers) with a small deterministic jitter."""
    def run(cfg):
        calls.append(cfg)
        rung, w = cfg.model_scale, cfg.data.num_workers if cfg.data.loader == "dataloader" else 0
        jitter = 1 + 0.01 * (len(calls) % 3 - 1)
        return SimpleNamespace(throughput_samples_per_s=throughput[(rung, w)] * jitter, data_wait_fraction=0.1,
                               ideal_step_ms=5.0 * (1 + SCALE_NAMES.index(rung)), status="ok",
                               param_count=10 ** (3 + SCALE_NAMES.index(rung)), macs_per_sample=7,
                               details={"data": {"read_ms_per_batch": 1.0, "decode_ms_per_batch": 9.0}})
    return run


@TWO_CORES
def test_workers_along_ladder_finds_where_the_worker_stops_paying() -> None:
    planted = {("xs", 0): 100, ("xs", 1): 180, ("s", 0): 100, ("s", 1): 140, ("m", 0): 100, ("m", 1): 100.5,
               ("l", 0): 100, ("l", 1): 60}
    calls: list = []
    out = workers_along_ladder("vision", ["l", "xs", "m", "s"], run=_fake_run(planted, calls), cores=2, repeats=3,
                               max_steps=4, warmup_steps=1)
    assert len(calls) == 4 * 2 * 3
    assert {(c.threads, c.data.num_workers if c.data.loader == "dataloader" else 0) for c in calls} == {(2, 0), (1, 1)}
    assert all(c.data.source == "files" and c.max_steps == 4 for c in calls)
    rows = out["rows"]
    assert [r["rung"] for r in rows] == ["xs", "s", "m", "l"]  # ordered along the ladder
    assert [r["verdict"] for r in rows] == [PAYS, PAYS, UNCLEAR, LOSES]
    assert rows[0]["ratio"] == pytest.approx(1.8, rel=0.03) and rows[0]["ci95"][0] > 1
    assert rows[0]["params"] == 1000 and rows[0]["loader_ms_per_batch"] == pytest.approx(10.0)
    assert "loader-bound" in rows[0]["why"] and "compute-bound" in rows[3]["why"]  # same step time in both pairs
    ans = out["answer"]
    assert ans["stops_paying_from"]["rung"] == "m" and ans["costs_from"]["rung"] == "l"
    assert "stops paying from m" in ans["text"]
    # on 2 cores the rule always gives the loader one core: right where the worker pays, wrong where it costs
    assert [r["rule_agrees"] for r in rows] == [True, True, None, False]


@TWO_CORES
def test_too_few_rounds_give_no_verdict_and_bad_input_is_refused() -> None:
    planted = {("xs", 0): 100, ("xs", 1): 200}
    out = workers_along_ladder("vision", ["xs"], run=_fake_run(planted, []), cores=2, repeats=2, max_steps=4,
                               warmup_steps=1)
    assert out["rows"][0]["verdict"] == NO_VERDICT and out["rows"][0]["ci95"] is None
    assert "does not pay at any rung" in out["answer"]["text"]  # unproven is not paying
    with pytest.raises(ValueError, match="not on 'vision'"):
        workers_along_ladder("vision", ["xxl"], run=_fake_run(planted, []), cores=2)
    with pytest.raises(ValueError, match=">= 2 cores"):
        workers_along_ladder("vision", ["xs"], run=_fake_run(planted, []), cores=1)


def test_stops_paying_edge_cases() -> None:
    def r(rung: str, v: str) -> dict:
        return {"rung": rung, "params": 1, "macs_per_sample": 1.0, "verdict": v, "rule": {"threads": 1, "workers": 1}}
    assert stops_paying([r("xs", PAYS), r("s", PAYS)])["stops_paying_from"] is None
    assert "pays at every rung" in stops_paying([r("xs", PAYS), r("s", PAYS)])["text"]
    # a rung that pays again above a non-paying one: it stops paying only from the last non-paying run
    assert stops_paying([r("xs", UNCLEAR), r("s", PAYS), r("m", LOSES)])["stops_paying_from"]["rung"] == "m"


def synthetic_study() -> dict:
    one = _map(1, [_row("xs", "bf16", 0.8, 2.0, params=100), _row("l", "bf16", 1.3, 40.0, params=10**6)])
    many = _map(2, [_row("xs", "bf16", 0.8, 2.0, params=100), _row("l", "bf16", 0.75, 21.0, params=10**6)])
    rows = []
    for i, (rung, v, ratio) in enumerate([("xs", PAYS, 1.6), ("m", UNCLEAR, 1.0), ("l", LOSES, 0.7)]):
        rows.append({"workload": "vision", "rung": rung, "params": 10 ** (3 + i), "macs_per_sample": 10 ** (5 + i),
                     "loader_ms_per_batch": 40.0, "compute_ms_per_step": 10.0 * 4 ** i, "ratio": ratio,
                     "ci95": [ratio - 0.05, ratio + 0.05], "verdict": v, "rule": {"threads": 1, "workers": 1},
                     "rule_agrees": {PAYS: True, LOSES: False}.get(v), "why": v})
    ladder = {"workload": "vision", "storage": "network_fs", "cores": 2, "rows": rows, "answer": stops_paying(rows)}
    study = {"benchmark": "crossover_threads", "quick": True, "env": {"device_name": "test CPU"}, "cores": 2,
             "comparison": compare_maps(one, many), "ladder": ladder, "wall_s": 1.0}
    study["figures"] = study_figures(study)
    return study


def test_study_figures_and_json_round_trip(tmp_path) -> None:
    study = synthetic_study()
    names = {f["name"]: f for f in study["figures"]}
    assert names["vision: a loader worker stops paying from (params)"]["value"] == 10**4
    rule = names["the rule picks the measured winner (rungs where the CI separates the pairs)"]
    assert rule["value"] == 0.5 and rule["met"] is False
    path = write_study(study, tmp_path / "t.json")
    assert load_study(path)["ladder"]["answer"]["stops_paying_from"]["rung"] == "m"
    assert any("stops paying from m" in line for line in summary_lines(study))
    (tmp_path / "bad.json").write_text(json.dumps({"figures": []}))
    with pytest.raises(ValueError, match="not a threads study"):
        load_study(tmp_path / "bad.json")


@pytest.fixture
def two_cores(monkeypatch) -> None:
    """The CLI's checks as on a 2-core machine, whatever this one has."""
    import lab.crossover.threads

    monkeypatch.setattr(lab.crossover.threads, "usable_cores", lambda: 2)


@pytest.mark.parametrize("argv, needle", [
    (["--techniques", "warp_drive"], "unknown technique"),
    (["--workloads", "nope"], "nope"),
    (["--threads", "2"], "unrecognized arguments: --threads 2"),  # the study's thread counts are its own
    (["--repeats", "5"], "unrecognized arguments: --repeats 5"),
])
def test_cli_refuses_bad_input_in_one_line(argv, needle, two_cores, capsys) -> None:
    assert main(["threads", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_refuses_one_core_in_one_line(monkeypatch, capsys) -> None:
    import lab.crossover.threads

    monkeypatch.setattr(lab.crossover.threads, "usable_cores", lambda: 1)
    assert main(["threads", "--quick"]) == 2
    assert capsys.readouterr().err == "lab: error: the threads study needs >= 2 usable cores: there is nothing to " \
                                      "split on one\n"


def test_cli_help_names_the_studys_defaults(capsys) -> None:
    from lab.crossover.threads import FULL_TECHNIQUES, FULL_WORKLOADS, QUICK_TECHNIQUES, QUICK_WORKLOADS

    assert main(["threads", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for names in (FULL_WORKLOADS, QUICK_WORKLOADS, FULL_TECHNIQUES, QUICK_TECHNIQUES):
        assert ",".join(names) in out


def test_cli_prints_the_study_and_the_old_spelling_warns_and_runs_the_same(two_cores, monkeypatch, capsys) -> None:
    import lab.crossover

    calls = []
    monkeypatch.setattr(lab.crossover, "threads_study",
                        lambda *a, **k: calls.append((a, k["quick"])) or synthetic_study())
    assert main(["threads", "--quick", "--workloads", "vision", "--json"]) == 0
    new = capsys.readouterr()
    assert new.err == "" and json.loads(new.out)["ladder"]["answer"]["stops_paying_from"]["rung"] == "m"
    assert main(["crossover", "--threads-study", "--quick", "--workloads", "vision", "--json"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and calls[0] == calls[1] == ((["vision"], None), True)
    assert old.err == "lab: warning: crossover --threads-study is deprecated; use python -m lab threads\n"
    for argv, needle in ((["--threads", "2"], "drop --threads"), (["--repeats", "5"], "--repeats does not apply"),
                         (["--include-emulated"], "--include-emulated does not apply")):
        assert main(["crossover", "--threads-study", "--quick", *argv]) == 2
        assert needle in capsys.readouterr().err.splitlines()[-1]  # the warning, then one line


@TWO_CORES
def test_one_real_rung_smoke() -> None:
    """The real path once: lab.run on file-backed vision (PNG decode) at the smallest rung, both pairs
    (no emulated storage latency; the shards are written once into the lab's cache and reused)."""
    from lab import run

    out = workers_along_ladder("vision", ["xs"], run=run, cores=2, size="tiny", storage="none", repeats=1,
                               max_steps=3, warmup_steps=1)
    row = out["rows"][0]
    assert row["error"] is None and row["params"] > 0 and row["macs_per_sample"] > 0
    assert row["loader_ms_per_batch"] > 0  # the PNGs were really read and decoded
    assert row["verdict"] == NO_VERDICT  # one round: no interval, no verdict
    assert {(p["threads"], p["workers"]) for p in row["pairs"].values()} == {(2, 0), (1, 1)}


def _page() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path.cwd() / "dashboard"))
    import page_scale

    page_scale.render()


def test_page_threads_section_renders_a_study_and_says_when_absent(tmp_path, monkeypatch) -> None:
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "no_map.json"))
    monkeypatch.setenv("LAB_CROSSOVER_THREADS_JSON", str(tmp_path / "none.json"))
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("No threads study yet" in i.value for i in at.info)
    write_study(synthetic_study(), tmp_path / "t.json")
    monkeypatch.setenv("LAB_CROSSOVER_THREADS_JSON", str(tmp_path / "t.json"))
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert any(s.value == "Threads" for s in at.subheader)
    assert len(at.get("plotly_chart")) == 3
    assert any("stops paying from m" in m.value for m in at.markdown)
    assert any("flip between 1 and 2 threads" in m.value for m in at.markdown)
    at.radio(key="scale_threads_axis").set_value("inference").run()
    assert not at.exception
