"""Issue 31 item 4 and 6 while a job runs: the Ablation tab shows the first arms' figures as they arrive ("n of
m arms", from the runs stored so far), the caption names the worker's pid (never the server's, which holds the
row until the worker adopts it) and where its log is: beside the results store, not in the system temp folder.

The running job is staged in the store (no worker, no training): two finished runs from a fake run function,
then the job row set back to live, as a worker between runs leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    jobs,  # noqa: E402
)
from lab.ablation import run_ablation, to_spec, worker  # noqa: E402
from lab.jobs import launch  # noqa: E402
from lab.recipes import from_techniques  # noqa: E402
from lab.result import RunResult, new_run_id  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def _two_runs_then_stop():
    calls: list[RunConfig] = []

    def run_fn(cfg: RunConfig, progress=None, on_error="record") -> RunResult:
        calls.append(cfg)
        if len(calls) == 3:  # the third run: stop, as Cancel would (nothing stored for it)
            raise jobs.Cancelled("staged")
        fast = 0.5 if len(calls) == 2 else 1.0  # the first arm after the baseline: twice as fast
        return _result(cfg, fast)

    return run_fn


def _result(cfg: RunConfig, fast: float) -> RunResult:
    return RunResult(run_id=new_run_id(), config=cfg.to_dict(), env={"hardware_id": "test-machine"}, workload="ctr",
                     metric_name="auc", metric=0.8, steps=6, warmup_steps=1, batch_size=64, train_time_s=fast,
                     step_times_ms={"total": [100 * fast * (1 + 0.01 * i) for i in range(6)]}, model_bytes=1000,
                     macs_per_sample=100, latency_ms={"batch_256": [2.0 * (1 + 0.01 * i) for i in range(6)]})


def _staged(path: Path, status: str, pid: int):
    ablation = from_techniques("live", RunConfig(workload="ctr", size="tiny", threads=1), [["bf16"], ["prune50"]])
    with ResultStore(path) as store:
        with pytest.raises(jobs.Cancelled):
            run_ablation(ablation, repeats=3, store=store, run_fn=_two_runs_then_stop())
        assert store.count() == 2
        state = {"done": 2, "total": 3 * len(ablation.arms), "arm": "prune50", "repeat": 0, "seed": 0,
                 "started_at": time.time() - 5, "published_at": time.time()}
        with store.transaction() as conn:  # back to live: the worker (pid) between its second and third run
            conn.execute("UPDATE jobs SET status = ?, pid = ?, heartbeat = ?, state_json = ?, spec_json = ?",
                         (status, pid, time.time(), json.dumps(state), json.dumps(to_spec(ablation, 3, [0]))))
        return ablation, jobs.job(store, ablation.key)


def test_a_running_ablation_shows_its_first_arms_and_the_workers_pid_and_log(private_store):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the "worker"
    try:
        ablation, job = _staged(private_store, "running", sleeper.pid)
        assert job["live"]
        at = AppTest.from_file(APP, default_timeout=60).run()
        assert not at.exception, at.exception
        assert at.button(key="run").disabled  # it runs
        shown = " ".join(m.value for m in at.markdown)
        assert f"Figures so far: 2 of {len(ablation.arms)} arms" in shown and "(2 of 12 runs)" in shown
        ids = " ".join(el.proto.id for el in at.get("plotly_chart"))
        assert "so_far_chart" in ids and "pareto_chart" not in ids  # the bars so far; no verdict yet
        assert not any(s.value.startswith("Verdict") for s in [*at.success, *at.warning])
        assert len(at.dataframe) >= 1
        caption = " ".join(c.value for c in at.caption)
        assert f"pid {sleeper.pid}" in caption and f"pid {os.getpid()}" not in caption
        log = launch.log_path(private_store, job["token"])
        assert f"`{log}`" in caption and log.parent == private_store.parent / "logs"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_before_the_worker_adopts_the_job_no_pid_is_named(private_store):
    """Claimed by the server (its pid in the row, status ``starting``): the caption says starting, and does not
    pass the server's pid off as the worker's."""
    _staged(private_store, "starting", os.getpid())
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    caption = " ".join(c.value for c in at.caption)
    assert "starting" in caption and f"pid {os.getpid()}" not in caption


def test_worker_logs_live_beside_the_results_store(tmp_path):
    store = tmp_path / "results" / "lab.sqlite"
    assert launch.log_path(store, "abcdef0123456789") == tmp_path / "results" / "logs" / "worker-abcdef012345.log"
    assert launch.log_path(":memory:", "t").parent == Path(tempfile.gettempdir())  # no folder to put it beside


def test_the_data_loading_caption_names_the_worker_not_the_server(private_store):
    """The data-loading tab's caption read ``pid <the row's pid>`` from the first rerun on: the server's, which
    claimed the row, until the worker adopted it."""
    base = RunConfig(workload="ctr", size="tiny", threads=1, max_steps=3, warmup_steps=1, latency_repeats=0)
    key, spec = worker.batch_spec("loaders", {"naive": base})
    with ResultStore(private_store) as store:
        token = jobs.claim(store, key, spec=spec)  # as the page does: the row holds this process's pid
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    caption = " ".join(c.value for c in at.caption)
    assert "data-loading measurement" in caption and "starting" in caption and f"pid {os.getpid()}" not in caption
    assert str(launch.log_path(private_store, token)) in caption
