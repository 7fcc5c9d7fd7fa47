"""The ablation lock and the background worker (``lab.jobs``, ``lab.ablation.worker``): one live job
per key, stale locks expire, a second run is refused before any work, Cancel stops between steps without
storing the run in flight, and the worker process (not the dashboard) is what a DDP arm's ranks re-import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import pytest

pytest.importorskip("pandas")

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    jobs,  # noqa: E402
    run,
)
from lab.ablation import Ablation, from_spec, run_ablation, to_spec  # noqa: E402
from lab.jobs import launch  # noqa: E402


def _ab(name: str = "j") -> Ablation:
    base = RunConfig(workload="toy", size="tiny", threads=1, latency_repeats=3)
    return Ablation(name=name, baseline=base, arms={"bf16": base.with_overrides(**{"precision.dtype": "bf16"})})


def test_one_live_job_per_key_and_stale_locks_expire(private_store):
    with ResultStore(private_store) as store:
        token = jobs.claim(store, "k")
        with pytest.raises(jobs.AlreadyRunning, match="already running .*pid"):
            jobs.claim(store, "k")
        assert jobs.claim(store, "other")  # another key is free
        assert [j["key"] for j in jobs.live_jobs(store)] == ["other", "k"]  # newest first
        # a heartbeat older than STALE_S: the lock has expired and the next claim takes it
        with store.transaction() as conn:
            conn.execute("UPDATE jobs SET heartbeat = ? WHERE key = 'k'", (time.time() - jobs.STALE_S - 1,))
        assert not jobs.job(store, "k")["live"]
        assert jobs.claim(store, "k") != token
        # a dead owner on this host frees the lock at once, however fresh its heartbeat
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
        with store.transaction() as conn:
            conn.execute("UPDATE jobs SET pid = ? WHERE key = 'k'", (int(dead),))
        assert not jobs.job(store, "k")["live"] and jobs.claim(store, "k")


def test_a_second_run_of_a_live_key_is_refused_before_any_work(toy_workload, private_store):
    ab = _ab()
    calls = []
    with ResultStore(private_store) as store:
        jobs.claim(store, ab.key)  # as if another process were running it
        with pytest.raises(jobs.AlreadyRunning, match=ab.key.replace("#", ".")):
            run_ablation(ab, repeats=1, store=store, run_fn=lambda cfg, **kw: calls.append(cfg))
        assert calls == [] and store.count() == 0


def test_cancel_stops_between_steps_and_the_run_in_flight_is_not_stored(toy_workload, private_store):
    ab = _ab()
    calls: list[int] = []

    def cancelling_run(cfg, progress=None, **kw):
        calls.append(0)

        def inner(ev):
            if len(calls) == 4 and ev.get("step") == 2:  # the 4th run, mid-training: the dashboard's Cancel
                with ResultStore(private_store) as other:  # from another connection, as the page does
                    assert jobs.request_cancel(other, ab.key)
                time.sleep(2.5 * jobs.BEAT_S)  # the heartbeat thread reads the flag
            progress(ev)
        return run(cfg, progress=inner, **kw)

    with ResultStore(private_store) as store:
        with pytest.raises(jobs.Cancelled):
            run_ablation(ab, repeats=3, store=store, run_fn=cancelling_run)
        job = jobs.job(store, ab.key)
        assert job["status"] == "cancelled" and not job["live"]
        assert store.count() == 3 == job["state"]["done"]  # three finished; the fourth stopped mid-training
        fourth = ab.schedule(3, [0])[3][0]  # round 2 starts with the second arm
        assert job["state"]["arm"] == fourth != "baseline" and job["state"]["step"] >= 2
        # cancelled is not live: Run resumes from the stored runs
        df = run_ablation(ab, repeats=1, store=store)
        assert list(df["n_ok"]) == [1, 1, 1] and store.count() == 3


def test_a_spec_rebuilds_the_same_ablation():
    from lab.recipes import RECIPES

    ab = RECIPES["stacked"](RunConfig(workload="ctr", size="tiny", threads=1))
    again, repeats, seeds = from_spec(to_spec(ab, 3, [0, 1]))
    assert again.key == ab.key and list(again.arms) == list(ab.arms) and (repeats, seeds) == (3, [0, 1])
    assert again.techniques == ab.techniques and again.axes == ab.axes


@pytest.mark.slow
def test_the_worker_runs_a_ddp_arm_and_its_ranks_never_import_the_launcher(private_store, tmp_path, monkeypatch):
    """Streamlit runs ``app.py`` as ``__main__``; multiprocessing's spawn re-imports the parent's main module
    in every rank. The worker is its own process with its own ``__main__``, so a DDP arm launched from a
    process whose main module is an "app" that leaves a mark when imported leaves no mark."""
    from lab.ablation import worker

    mark = tmp_path / "app_imported"
    app = tmp_path / "app.py"
    app.write_text(f"open({str(mark)!r}, 'w').write('imported')\n")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = str(app)
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    base = RunConfig(workload="ctr", size="tiny", threads=1, max_steps=4, warmup_steps=1, latency_repeats=0)
    ab = Ablation(name="ddp", baseline=base, arms={"ddp2": base.with_overrides(**{"ddp.world_size": 2})}, aa=False)
    with ResultStore(private_store) as store:
        token = jobs.claim(store, ab.key, spec=to_spec(ab, 1, [0]))
        proc = worker.start(private_store, ab.key, token)
        assert proc.wait(timeout=240) == 0
        job = jobs.job(store, ab.key)
        assert job["status"] == "done" and job["pid"] == proc.pid != os.getpid()
        statuses = {r.config["ddp"]["world_size"]: r.status for r in store.list_results()}
        assert statuses == {1: "ok", 2: "ok"}, [r.error for r in store.list_results()]
    assert not mark.exists()


def test_the_worker_refuses_a_token_it_was_not_given(private_store):
    from lab.ablation import worker

    with ResultStore(private_store) as store:
        jobs.claim(store, "k", spec=to_spec(_ab_ctr(), 1, [0]))
    assert worker.main(["--store", str(private_store), "--key", "k", "--token", "nope"]) == 2


def _ab_ctr() -> Ablation:
    base = RunConfig(workload="ctr", size="tiny", threads=1)
    return Ablation(name="c", baseline=base, arms={"bf16": base.with_overrides(**{"precision.dtype": "bf16"})})


def test_a_batch_job_runs_its_configs_stores_each_and_keeps_its_own_kind(toy_workload, private_store):
    """The dashboard's data-loading measurement as a worker job: one run per named config, each stored as it
    ends, the run ids in the job's state; an ablation page never re-attaches to it (nor a batch page to an
    ablation); a config refused before any work is an error row, the others still run."""
    from lab.ablation import worker

    base = RunConfig(workload="toy", size="tiny", threads=1, max_steps=3, warmup_steps=1, latency_repeats=0)
    configs = {"plain": base, "broken": base.with_overrides(seed=7), "again": base.with_overrides(seed=1)}
    key, spec = worker.batch_spec("loaders", configs)
    assert key.startswith("loaders@toy#") and spec["kind"] == worker.BATCH
    assert worker.batch_spec("loaders", configs)[0] == key  # the same batch asked twice: one key
    assert worker.batch_spec("loaders", {"plain": base})[0] != key

    def run_fn(cfg, **kw):
        if cfg.seed == 7:
            raise ValueError("refused before any work")
        return run(cfg, **kw)

    with ResultStore(private_store) as store:
        ab_token = jobs.claim(store, "an-ablation", spec=to_spec(_ab_ctr(), 1, [0]))
        results = worker.run_batch(store, key, spec=spec, run_fn=run_fn)
        assert [r.status for r in results.values()] == ["ok", "error", "ok"]
        assert "refused before any work" in results["broken"].error
        job = jobs.job(store, key)
        assert (job["status"], job["kind"], job["state"]["done"]) == ("done", worker.BATCH, 3)
        assert job["state"]["runs"] == {n: r.run_id for n, r in results.items()}
        assert sorted(store.labels()) == sorted(f"batch:{key}:{n}" for n in configs)
        shown = worker.batch_results(store, job)
        assert list(shown) == ["plain", "broken", "again"] and shown["again"].run_id == results["again"].run_id
        # kinds keep the pages apart: the live ablation is no batch, the finished batch no ablation
        assert [j["key"] for j in jobs.live_jobs(store, jobs.ABLATION)] == ["an-ablation"]
        assert jobs.live_jobs(store, worker.BATCH) == []
        assert jobs.latest_job(store, worker.BATCH)["key"] == key
        assert jobs.latest_job(store, jobs.ABLATION)["key"] == "an-ablation"
        assert jobs.latest_job(store)["key"] == key  # no kind: whatever started last
        jobs.finish(store, "an-ablation", ab_token, "done")
        with pytest.raises(ValueError, match="not a batch job"):
            worker.run_batch(store, "an-ablation")


def test_the_worker_runs_a_claimed_batch_and_stops_it_on_cancel(private_store):
    """``python -m lab.ablation.worker`` dispatches on the job's kind; a Cancel requested before its first
    step stops it with nothing stored."""
    from lab.ablation import worker

    base = RunConfig(workload="ctr", size="tiny", threads=1, max_steps=3, warmup_steps=1, latency_repeats=0)
    key, spec = worker.batch_spec("loaders", {"a": base, "b": base.with_overrides(seed=1)})
    with ResultStore(private_store) as store:
        token = jobs.claim(store, key, spec=spec)
        assert worker.start(private_store, key, token).wait(timeout=240) == 0
        job = jobs.job(store, key)
        log = launch.log_path(private_store, token)
        assert log.parent == private_store.parent / "logs" and log.is_file()  # beside the store, not in /tmp's root
        assert job["status"] == "done" and job["pid"] != os.getpid(), log.read_text()
        assert [r.status for r in worker.batch_results(store, job).values()] == ["ok", "ok"]
        token = jobs.claim(store, key, spec=spec)  # again, cancelled before the worker's first step
        assert jobs.request_cancel(store, key)
        assert worker.start(private_store, key, token).wait(timeout=240) == 0
        job = jobs.job(store, key)
        assert job["status"] == "cancelled" and job["state"]["done"] == 0 and store.count() == 2


def test_a_machine_job_says_each_stage_as_it_starts_and_stops_on_cancel(private_store):
    """The Machine page's measurement as a worker job: each stage the measurement names is the job's state when
    it starts (read from another connection, as the page does); a Cancel stops it at the next stage."""
    from lab.ablation import worker

    key, spec = worker.machine_spec(quick=True)
    assert key.startswith("machine@") and key.endswith("/quick") and spec == {"kind": worker.MACHINE, "quick": True}
    seen = []

    def fake_measure(refresh, quick, progress):
        assert refresh and quick
        for stage in ("GEMM at 1 thread(s)", "triad at 1 thread(s)"):
            progress(stage)
            with ResultStore(private_store) as other:
                seen.append((jobs.job(other, key)["state"]["arm"], jobs.job(other, key)["state"]["stage"]))
        return types.SimpleNamespace(hardware_id="test-cpu")

    with ResultStore(private_store) as store:
        assert worker.run_machine(store, key, spec=spec, measure=fake_measure).hardware_id == "test-cpu"
        assert seen == [("GEMM at 1 thread(s)", 1), ("triad at 1 thread(s)", 2)]
        job = jobs.job(store, key)
        assert job["status"] == "done" and job["kind"] == worker.MACHINE and job["state"]["hardware_id"] == "test-cpu"

        def cancelled_after_one(refresh, quick, progress):
            progress("GEMM")
            with ResultStore(private_store) as other:
                assert jobs.request_cancel(other, key)
            time.sleep(2.5 * jobs.BEAT_S)  # the heartbeat thread reads the flag
            progress("triad")  # never starts
            raise AssertionError("the measurement went on after Cancel")

        with pytest.raises(jobs.Cancelled):
            worker.run_machine(store, key, spec=spec, measure=cancelled_after_one)
        job = jobs.job(store, key)
        assert job["status"] == "cancelled" and job["state"]["arm"] == "GEMM"
        with pytest.raises(ValueError, match="not a machine-card job"):
            worker.run_machine(store, "k", spec={"kind": "batch"})
