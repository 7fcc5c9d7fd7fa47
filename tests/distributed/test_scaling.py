"""The Scaling tab's inputs from the workload the sidebar shows (lab.distributed.scaling.step_of_stored_run)."""
def test_the_scaling_tab_starts_from_the_sidebar_workloads_own_stored_run(toy_workload, private_store):
    """Its inputs had no tie to the chosen workload: now a stored single-process fp32 run of it gives the step and
    the gradient; a bf16 run or another size is not that run."""
    from lab import RunConfig, run
    from lab.distributed.scaling import step_of_stored_run
    from lab.store import ResultStore

    fp32 = run(RunConfig(workload=toy_workload.name, size="tiny", threads=1, max_steps=4, latency_repeats=0))
    bf16 = run(RunConfig(workload=toy_workload.name, size="tiny", threads=1, max_steps=4, latency_repeats=0)
               .with_overrides(**{"precision.dtype": "bf16"}))
    with ResultStore(private_store) as store:
        assert step_of_stored_run(store, toy_workload.name, "tiny") is None
        store.add(fp32)
        store.add(bf16)  # newer, but not the single-process fp32 step the model projects
        got = step_of_stored_run(store, toy_workload.name, "tiny")
        assert step_of_stored_run(store, toy_workload.name, "small") is None
    assert got["compute_ms"] == fp32.median_step_ms and got["grad_mb"] == fp32.param_count * 4 / 1e6
    assert fp32.run_id[:8] in got["said"]
