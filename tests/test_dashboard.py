"""The Streamlit app driven headless through Streamlit's AppTest: choose, run a tiny ablation, see the
verdict, table and charts; bad input is a message; stored ablations can be browsed again."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def _chart_ids(at: AppTest) -> str:
    # AppTest has no typed accessor for plotly charts (nor keys on dataframes): the element id embeds the key
    return " ".join(el.proto.id for el in at.get("plotly_chart"))


def test_app_starts_with_instructions():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("Run ablation" in info.value for info in at.info)
    assert {"ctr", "sequence", "vision"} <= set(at.selectbox(key="workload").options)
    assert {"stacked", "quantization", "pruning_sweep"} <= set(at.selectbox(key="recipe").options)


def _tiny_custom(at: AppTest, techniques: list[str]) -> AppTest:
    at.selectbox(key="workload").select("sequence")
    at.selectbox(key="size").select("tiny")
    at.radio(key="mode").set_value("techniques").run()
    at.multiselect(key="techniques").set_value(techniques)
    at.number_input(key="repeats").set_value(1)
    return at


def test_run_tiny_ablation_shows_verdict_table_and_stores_runs(private_store):
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=120).run(), ["prune50"])
    at.button(key="run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.warning and "n = 1: no interval, no verdict" in at.warning[0].value  # 1 repeat: a preview
    table = at.dataframe[0].value  # the Ablation tab comes first
    assert list(table["arm"]) == ["baseline", "prune50", "aa"] and table.iloc[0]["train_speedup"] == 1.0
    assert all(k in _chart_ids(at) for k in ("pareto_chart", "speedup_chart", "phases_chart", "stored_chart"))
    at.selectbox(key="detail_arm").select("prune50").run()
    assert "detail_per-layer sparsity" in _chart_ids(at)  # the per-technique figure of the chosen arm
    with ResultStore(private_store) as store:
        assert store.count(status="ok") == 3
    # pressing Run again resumes: nothing new is trained, the stored runs are reused
    at.button(key="run").click().run()
    with ResultStore(private_store) as store:
        assert store.count() == 3
    assert "stored_ablation" in [s.key for s in at.selectbox]
    assert set(at.dataframe[1].value["arm"]) == {"baseline", "prune50", "aa"}  # the stored ablation, re-read


@pytest.mark.parametrize("bad, message", [("repeats", "Repeats must be at least 1"),
                                          ("techniques", "Pick at least one technique")])
def test_bad_input_is_a_message_not_a_traceback(bad, message):
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=60).run(), ["bf16"])
    if bad == "repeats":
        at.number_input(key="repeats").set_value(0)
    else:
        at.multiselect(key="techniques").set_value([])
    at.button(key="run").click().run()
    assert not at.exception
    assert at.error and message in at.error[0].value


def test_conflicting_factorial_is_a_message():
    at = _tiny_custom(AppTest.from_file(APP, default_timeout=60).run(), ["bf16", "fp16"])
    at.checkbox(key="factorial").check()
    at.button(key="run").click().run()
    assert not at.exception
    assert at.error and "Cannot build this ablation" in at.error[0].value


def _frame_with(at, column: str):
    """The dataframe that has ``column`` (AppTest does not expose dataframe keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_scaling_model_page_projects_the_chosen_links():
    from lab.distributed.scaling import LINK_PRESETS, project

    at = AppTest.from_file(APP, default_timeout=60).run()
    at.multiselect(key="sc_links").set_value(["10GbE", "NVLink"]).run()
    assert not at.exception
    assert at.get("plotly_chart")
    table = _frame_with(at, "link")
    expected = project(0.1, 100e6, [8], LINK_PRESETS["10GbE"], overlap=0.5)[0]["speedup"]
    row = table[(table["link"] == "10GbE") & (table["p"] == 8)].iloc[0]
    assert row["speedup"] == pytest.approx(round(expected, 2))
    at.multiselect(key="sc_links").set_value([]).run()
    assert any("Pick at least one link" in w.value for w in at.warning)


def test_data_loading_page_measures_the_loaders():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.selectbox(key="dl_storage").select("local_ssd")
    at.number_input(key="dl_steps").set_value(10)
    at.button(key="dl_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    table = _frame_with(at, "loader")
    assert list(table["loader"]) == ["naive", "thread"]


def _bench(folder: Path, benchmark: str, env: dict, figures: list[dict]) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{benchmark}.json").write_text(json.dumps(
        {"benchmark": benchmark, "quick": True, "env": env, "figures": figures}))


def _figure(name: str, value: float, ci=None, unit: str = "x", goal=None, met=None, note: str = "") -> dict:
    return {"name": name, "value": value, "unit": unit, "ci95": ci, "goal": goal, "met": met, "note": note}


def test_performance_report_page_shows_every_hardware(tmp_path, monkeypatch):
    from lab.bench import ANCHORS, write_report

    cpu_env = {"hardware_id": "test-cpu-2c", "device_name": "Test CPU", "usable_cores": 2, "torch_version": "2.13.0",
               "git_sha": "abc1234567", "gpu_count": 0}
    gpu_env = {"hardware_id": "nvidia-h200", "device_name": "NVIDIA H200", "usable_cores": 16, "gpu_count": 1,
               "cuda_version": "12.8", "cpu_model": "Host CPU", "torch_version": "2.13.0+cu128",
               "git_sha": "def7654321"}
    cpu, gpu = tmp_path / "test-cpu-2c", tmp_path / "nvidia-h200"
    _bench(cpu, "precision", cpu_env, [_figure("ctr/bf16 speedup vs fp32", 1.25, ci=[1.0, 1.5], goal=">= 1.3x",
                                               met=False)])
    _bench(cpu, "data_loading", cpu_env, [_figure("naive: data wait", 42.0, unit="%")])
    write_report(cpu)
    # a second run in the same folder: the page says whether it reproduced the first
    _bench(cpu, "precision", cpu_env, [_figure("ctr/bf16 speedup vs fp32", 1.375, ci=[1.25, 1.5], goal=">= 1.3x",
                                               met=True)])
    write_report(cpu)
    _bench(gpu, "gpu", gpu_env, [_figure("bf16 matmul speedup vs fp32", 7.5, ci=[7.0, 8.0]),
                                 {**_figure("2:4 sparse speedup", float("nan"), note="skipped: no cuSPARSELt"),
                                  "family": "pruning"}])
    write_report(gpu)
    monkeypatch.setenv("LAB_BENCH_RESULTS", str(tmp_path))

    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    assert set(at.multiselect(key="report_hw").value) == {"test-cpu-2c", "nvidia-h200"}
    table = _frame_with(at, "reproduced")
    assert set(table["hardware"]) == {"test-cpu-2c", "nvidia-h200"}
    row = table[table["figure"] == "ctr/bf16 speedup vs fp32"].iloc[0]
    assert (row["hardware"], row["measured"], row["CI"], row["met"]) == ("test-cpu-2c", 1.375, "[1.25, 1.5]", "met")
    assert row["reproduced"] == "yes (+10%)"  # 1.375 lies in the first run's CI [1.0, 1.5]
    gpu_row = table[table["figure"] == "bf16 matmul speedup vs fp32"].iloc[0]
    assert (gpu_row["hardware"], gpu_row["measured"]) == ("nvidia-h200", 7.5)
    assert table[table["figure"] == "2:4 sparse speedup"].iloc[0]["note"] == "skipped: no cuSPARSELt"
    captions = " ".join(c.value for c in at.caption)
    assert "NVIDIA H200" in captions and "1 GPU, CUDA 12.8" in captions and "Test CPU; 2 cores" in captions
    assert "report_chart" in _chart_ids(at)
    assert any(ANCHORS["precision"].claim in m.value for m in at.markdown)

    at.multiselect(key="report_families").set_value(["precision"]).run()
    assert set(_frame_with(at, "reproduced")["family"]) == {"precision"}
    at.multiselect(key="report_hw").set_value(["nvidia-h200"]).run()
    assert any("Pick at least one hardware and one family" in w.value for w in at.warning)  # GPU has no precision


def test_performance_report_page_without_reports_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_BENCH_RESULTS", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("make bench-quick" in info.value and "benchmarks/gpu.sh" in info.value for info in at.info)
    assert "report_chart" not in _chart_ids(at)


def test_a_workload_spec_typed_in_the_sidebar_joins_the_list(tmp_path):
    path = tmp_path / "dash_mine.py"
    path.write_text(
        "from torch import nn\nfrom lab.workloads import Datasets, SizeSpec, Workload\nimport torch\n"
        "def make():\n"
        "    s = SizeSpec(n_train=64, n_test=32, batch_size=16, epochs=1, lr=0.01)\n"
        "    d = lambda spec, seed: Datasets(train=(torch.randn(64, 3), torch.randint(0, 2, (64,))),\n"
        "                                    test=(torch.randn(32, 3), torch.randint(0, 2, (32,))))\n"
        "    return Workload(name='dash_mine', description='x', sizes=s, make_data=d,\n"
        "                    make_model=lambda spec: nn.Linear(3, 2), loss=nn.functional.cross_entropy,\n"
        "                    evaluate=lambda o, y: {'accuracy': float((o.argmax(1) == y).float().mean())},\n"
        "                    metric_name='accuracy')\n")
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.text_input(key="wl_spec").set_value(f"{path}:make").run()
    assert not at.exception and "dash_mine" in at.selectbox(key="workload").options
    at.text_input(key="wl_spec").set_value(f"{tmp_path}/nope.py:make").run()
    assert not at.exception and any("cannot be loaded" in e.value for e in at.error)
