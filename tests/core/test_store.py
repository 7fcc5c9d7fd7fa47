"""RunResult serialisation/summaries and the SQLite store, including crash safety under SIGKILL."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lab.result import RunResult
from lab.store import ResultStore, config_hash, default_store_path

ROOT = Path(__file__).resolve().parents[2]


def make_result(i: int = 0, *, workload: str = "ctr", warmup: int = 2, **overrides) -> RunResult:
    """Warm-up steps are 1000x slower than measured ones, so any leak into a summary is obvious."""
    total = [1000.0] * warmup + [10.0, 12.0, 14.0]
    wait = [900.0] * warmup + [1.0, 3.0, 2.0]
    fields = dict(
        run_id=f"run{i:04d}",
        config={"workload": workload, "size": "tiny", "seed": i, "batch_size": 32,
                "precision": {"mode": "bf16", "keep_fp32": ["head"]}, "prune": None},
        env={"hardware_id": "test-cpu-2c", "torch_threads": 1, "device_name": "cpu"},
        started_at=f"2026-01-01T00:00:{i % 60:02d}+00:00",
        workload=workload,
        metric_name="auc",
        metric=0.75,
        metric_before=0.5,
        metrics={"auc": 0.75, "logloss": 0.45},
        steps=warmup + 3,
        warmup_steps=warmup,
        batch_size=32,
        train_time_s=2.5,
        step_times_ms={"data_wait": wait, "forward": [50.0] * warmup + [4.0, 5.0, 6.0], "total": total},
        losses=[0.7, 0.6, 0.55, 0.5, 0.45][: warmup + 3],
        peak_memory_mb=123.5,
        memory_kind="rss",
        param_count=1000,
        nonzero_params=400,
        model_bytes=4321,
        macs_per_sample=999,
        latency_ms={"batch_1": [1.0, 2.0, 3.0], "batch_256": [10.0, 30.0, 20.0]},
        why=["no native bf16 on this CPU"],
        details={"per_layer": {"fc1": 0.5}, "scale_history": [65536.0, 32768.0]},
    )
    fields.update(overrides)
    return RunResult(**fields)


# -------------------------------------------------------------------------------------------- RunResult


def test_round_trip_dict_and_json() -> None:
    r = make_result()
    assert RunResult.from_dict(r.to_dict()) == r
    assert RunResult.from_json(r.to_json()) == r
    assert RunResult.from_json(r.to_json()).to_dict() == r.to_dict()


def test_nonfinite_floats_survive_strict_json() -> None:
    r = make_result(losses=[0.5, float("nan"), float("inf")], metric=float("-inf"),
                    details={"scale": [float("inf"), 1.0], "note": "fine"})
    text = r.to_json()
    assert "NaN" in text and "Infinity" in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
    back = RunResult.from_json(text)
    assert back == r
    assert math.isnan(back.losses[1]) and back.losses[2] == math.inf and back.metric == -math.inf
    assert back.details["scale"][0] == math.inf and back.details["note"] == "fine"
    assert make_result(losses=[float("nan")]) != make_result(losses=[0.0])


def test_to_dict_is_json_compatible_copy() -> None:
    r = make_result(config={"workload": "ctr", "dims": (1, 2)})
    d = r.to_dict()
    assert d["config"]["dims"] == [1, 2]
    d["losses"].append(99.0)
    assert 99.0 not in r.losses


def test_summary_excludes_warmup() -> None:
    r = make_result(warmup=3)
    assert r.median_step_ms == 12.0
    assert r.phase_medians_ms() == {"data_wait": 2.0, "forward": 5.0, "total": 12.0}
    assert r.throughput_samples_per_s == pytest.approx(32 * 3 / 0.036)
    assert r.data_wait_fraction == pytest.approx(6.0 / 36.0)
    assert r.latency_median_ms("batch_256") == 20.0
    s = r.summary()
    assert s["median_step_ms"] == 12.0 and s["median_data_wait_ms"] == 2.0
    assert s["latency_batch_1_ms"] == 2.0
    assert s["cfg.precision.mode"] == "bf16" and s["cfg.seed"] == 0 and s["cfg.prune"] is None
    assert s["size"] == "tiny" and s["hardware_id"] == "test-cpu-2c"
    assert s["sparsity"] == pytest.approx(0.6)
    assert all(not isinstance(v, (list, dict)) for v in s.values())


def test_summary_of_failed_run_does_not_raise() -> None:
    r = RunResult(run_id="x", config={}, env={}, status="error", error="ValueError: boom", warmup_steps=5)
    s = r.summary()
    assert s["status"] == "error" and s["error"] == "ValueError: boom"
    assert s["median_step_ms"] is None and s["throughput_samples_per_s"] is None
    assert s["data_wait_fraction"] is None and r.phase_medians_ms() == {}
    # all steps inside warm-up: nothing measured, still no exception
    assert make_result(warmup=2, steps=2, step_times_ms={"total": [5.0, 5.0]}).median_step_ms is None


# ---------------------------------------------------------------------------------------------- store


def test_config_hash_stable_and_sensitive() -> None:
    a = {"workload": "ctr", "seed": 1, "precision": {"mode": "bf16"}}
    b = {"precision": {"mode": "bf16"}, "seed": 1, "workload": "ctr"}
    assert config_hash(a) == config_hash(b) and len(config_hash(a)) == 64
    assert config_hash(a) != config_hash({**a, "seed": 2})


def test_default_store_path_env_override(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LAB_RESULTS_DB", str(tmp_path / "x.sqlite"))
    assert default_store_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("LAB_RESULTS_DB")
    assert default_store_path().name == "lab.sqlite"


def test_store_round_trip_and_queries(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "lab.sqlite"
    with ResultStore(path) as store:
        assert store.count() == 0
        runs = [make_result(i, workload="ctr" if i % 2 else "sequence") for i in range(4)]
        failed = make_result(8, workload="vision", status="error", error="boom")
        for r in runs:
            store.add(r, label="baseline" if r.run_id != "run0003" else "bf16")
        store.add(failed)
        assert store.get("run0001") == runs[1]
        assert store.count() == 5
        assert [r.run_id for r in store.list_results(workload="ctr")] == ["run0001", "run0003"]
        assert [r.run_id for r in store.list_results(label="bf16")] == ["run0003"]
        assert [r.run_id for r in store.list_results(status="error")] == ["run0008"]
        assert store.has(config_hash(runs[2].config))
        assert not store.has(config_hash(failed.config))  # only ok runs count as done by default
        assert store.has(config_hash(failed.config), status=None)
        assert store.delete("run0000") and not store.delete("run0000")
        with pytest.raises(KeyError):
            store.get("run0000")
    with ResultStore(path) as again:  # persisted
        assert again.count() == 4 and sorted(again.labels()) == ["baseline", "bf16"]


def test_load_runs_dataframe_and_csv(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "lab.sqlite")
    empty = store.load_runs()
    assert isinstance(empty, pd.DataFrame) and empty.empty
    for col in ("run_id", "workload", "median_step_ms", "throughput_samples_per_s", "label", "config_hash"):
        assert col in empty.columns
    store.add(make_result(1), label="a")
    store.add(make_result(2), label="b")
    store.add(make_result(3, status="error", error="boom", step_times_ms={}))
    df = store.load_runs()
    assert len(df) == 3 and list(df["run_id"]) == ["run0001", "run0002", "run0003"]
    assert list(df["label"][:2]) == ["a", "b"] and df["median_step_ms"].iloc[0] == 12.0
    assert df["config_hash"].iloc[0] == config_hash(make_result(1).config)
    assert len(store.load_runs(label="a")) == 1
    out = store.export_csv(tmp_path / "out" / "runs.csv")
    csv = pd.read_csv(out)
    assert len(csv) == 3 and set(df.columns) == set(csv.columns)
    assert csv["status"].tolist() == ["ok", "ok", "error"]
    store.close()
    with pytest.raises(RuntimeError):
        store.count()


WRITER = textwrap.dedent(
    """
    import sys
    from lab.result import RunResult
    from lab.store import ResultStore
    import time
    store = ResultStore(sys.argv[1])
    n, pause_s = int(sys.argv[2]), float(sys.argv[3])
    i = 0
    while True:
        # a big payload makes it likely that the kill lands inside a write
        r = RunResult(run_id=f"w{i:06d}", config={"seed": i}, env={}, workload="ctr",
                      losses=[float(i)] * n, step_times_ms={"total": [1.0] * n})
        store.add(r)
        i += 1
        print(i, flush=True)
        time.sleep(pause_s)
    """
)


def _spawn_writer(db: Path, n: int, pause_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-c", WRITER, str(db), str(n), str(pause_s)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for_runs(proc: subprocess.Popen, n: int) -> None:
    for _ in range(n):
        line = proc.stdout.readline()
        assert line, f"writer died early (rc={proc.poll()})"


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_mid_write_keeps_every_committed_run(tmp_path: Path) -> None:
    db = tmp_path / "crash.sqlite"
    proc = _spawn_writer(db, 20000, 0.0)
    try:
        _wait_for_runs(proc, 3)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    with ResultStore(db) as store:
        assert store.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        results = store.list_results()
        assert len(results) >= 3
        for r in results:
            i = int(r.run_id[1:])
            assert r.losses == [float(i)] * 20000 and len(r.step_times_ms["total"]) == 20000
        store.add(make_result(1))  # still writable after the crash
        assert store.count() == len(results) + 1


def test_reader_while_writer_writes(tmp_path: Path) -> None:
    db = tmp_path / "concurrent.sqlite"
    ResultStore(db).close()  # schema exists before both sides open it
    proc = _spawn_writer(db, 500, 0.02)  # throttled: the reader re-parses every run each time
    errors: list[BaseException] = []
    seen: list[int] = []

    def read_loop() -> None:
        try:
            with ResultStore(db) as reader:
                for _ in range(20):
                    rs = reader.list_results()
                    bad = [r.run_id for r in rs if r.losses != [float(int(r.run_id[1:]))] * 500]
                    assert not bad, f"torn or wrong runs: {bad}"
                    seen.append(len(rs))
                    time.sleep(0.01)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    try:
        _wait_for_runs(proc, 1)
        thread = threading.Thread(target=read_loop)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive()
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert not errors, errors
    assert seen == sorted(seen) and seen[0] >= 1  # never goes backwards, never sees a torn run
