"""Correctness of the measurement primitives (no timing assertions: see docs/architecture.md 5.7)."""

from __future__ import annotations

import gc
import itertools
import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from lab import measure

# ------------------------------------------------------------------------------------------ PhaseTimer


def fake_clock(ticks: list[float]):
    it = iter(ticks)
    return lambda: next(it)


def test_phase_timer_phases_sum_to_total_with_fake_clock() -> None:
    # start, data_wait, forward, backward, end  (seconds) -> phases 1, 2, 4 ms; total 7 ms
    ticks = [0.0, 0.001, 0.003, 0.007, 0.007, 10.0, 10.5, 10.5]
    timer = measure.PhaseTimer(phases=("data_wait", "forward", "backward"), clock=fake_clock(ticks))
    timer.start_step()
    timer.mark("data_wait")
    timer.mark("forward")
    timer.mark("backward")
    timer.end_step()
    timer.start_step()
    timer.mark("forward")  # only one phase marked: the others get 0.0
    timer.end_step()
    s = timer.samples_ms()
    assert s["data_wait"] == pytest.approx([1.0, 0.0])
    assert s["forward"] == pytest.approx([2.0, 500.0])
    assert s["backward"] == pytest.approx([4.0, 0.0])
    assert s["total"] == pytest.approx([7.0, 500.0])
    assert timer.n_steps == 2


def test_phase_timer_real_clock_and_sync_called() -> None:
    calls = itertools.count()
    timer = measure.PhaseTimer(sync=lambda: next(calls))
    for _ in range(5):
        timer.start_step()
        sum(range(1000))
        timer.mark("forward")
        timer.mark("comm")
        timer.mark("forward")  # repeated marks accumulate
        timer.end_step()
    s = timer.samples_ms()
    assert set(s) == {"data_wait", "forward", "backward", "optimizer", "comm", "total"}
    assert all(len(v) == 5 for v in s.values())
    for i in range(5):
        parts = sum(s[p][i] for p in timer.phases)
        assert parts <= s["total"][i] + 1e-9  # unmarked time can only make total larger
        assert s["data_wait"][i] == 0.0
    assert next(calls) == 5 * 5  # start + 3 marks + end per step


def test_phase_timer_misuse() -> None:
    timer = measure.PhaseTimer()
    with pytest.raises(RuntimeError):
        timer.mark("forward")
    timer.start_step()
    with pytest.raises(KeyError):
        timer.mark("fwd")
    with pytest.raises(ValueError):
        measure.PhaseTimer(phases=("total",))


# ---------------------------------------------------------------------------------------------- memory


def test_memory_sampler_cpu_sees_an_allocation() -> None:
    # RSS is the whole process: in random order an earlier test's garbage (cycles holding tensors) can be
    # freed between the baseline and the sample and hide the growth, so collect first and keep the
    # collector off while the region runs. 96 MiB is above glibc's largest mmap threshold (32 MiB), so
    # the block is fresh pages, never a reused resident arena.
    gc.collect()
    gc.disable()
    try:
        sampler = measure.MemorySampler("cpu")
        assert sampler.kind == "rss" and sampler.baseline_mb > 0
        big = torch.ones(96 * 2**20 // 4)  # 96 MiB, touched
        now = sampler.sample()
        assert sampler.peak_mb() >= now >= sampler.baseline_mb + 48
    finally:
        gc.enable()
    del big
    assert measure.peak_memory_mb("cpu") >= sampler.peak_mb() - 1


# ----------------------------------------------------------------------------------------- model size


def test_count_params_and_nonzero_with_pruning() -> None:
    model = nn.Sequential(nn.Linear(20, 10), nn.ReLU(), nn.Linear(10, 5))
    n = 20 * 10 + 10 + 10 * 5 + 5
    assert measure.count_params(model) == n
    assert measure.count_nonzero_params(model) == n
    prune.l1_unstructured(model[0], name="weight", amount=0.5)  # 100 of 200 weights masked
    assert hasattr(model[0], "weight_orig") and hasattr(model[0], "weight_mask")
    assert measure.count_params(model) == n  # the mask is a buffer, weight_orig counted once
    assert measure.count_nonzero_params(model) == n - 100
    with torch.no_grad():  # an optimizer step changes weight_orig; module.weight is stale until a forward
        model[0].weight_orig[:5].zero_()  # 5 rows x 20 = 100 weights, about half of them unmasked
    zeroed_unmasked = int(model[0].weight_mask[:5].sum().item())
    assert measure.count_nonzero_params(model) == n - 100 - zeroed_unmasked
    model(torch.randn(2, 20))
    prune.remove(model[0], "weight")
    assert measure.count_nonzero_params(model) == n - 100 - zeroed_unmasked
    prune.l1_unstructured(model[2], name="weight", amount=0.5)  # 25 of 50
    assert measure.count_nonzero_params(model) == n - 100 - zeroed_unmasked - 25


def test_shared_parameters_counted_once() -> None:
    a = nn.Linear(4, 4)
    model = nn.Sequential(a, a)
    assert measure.count_params(model) == measure.count_nonzero_params(model) == 20


def test_module_device_needs_no_float_parameter() -> None:
    """The lab's own code asked ``next(module.parameters())`` for a device (the doctor's rates, the precision
    policy's RNN probe), which raises StopIteration on an int8 model (packed weights), a buffer-only module or an
    empty one (issue 45)."""
    from torch.ao.nn.quantized import dynamic as nnqd

    int8_lstm = nnqd.LSTM(4, 4)
    assert next(int8_lstm.parameters(), None) is None
    for module in (int8_lstm, nn.BatchNorm1d(4, affine=False), nn.ReLU(), nn.Linear(2, 2)):
        assert measure.module_device(module) == torch.device("cpu")
    assert measure.module_device(nn.ReLU(), default="meta") == torch.device("meta")


def test_serialized_size_grows_with_params() -> None:
    small = measure.serialized_size_bytes(nn.Linear(10, 10))
    big = measure.serialized_size_bytes(nn.Linear(100, 100))
    assert 0 < small < big
    assert big >= 100 * 100 * 4  # fp32 payload at least


# ----------------------------------------------------------------------------------------------- MACs


def test_macs_linear_matches_formula() -> None:
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(8, 32)
    assert measure.count_macs(model, (x,)) == 8 * (32 * 16 + 16 * 3)


class LatentQuery(nn.Module):
    """A Perceiver's cross-attention as people write it: a learned latent array handed to a submodule as a view
    (``expand``) or as a copy (``repeat``) per batch."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view
        self.latents = nn.Parameter(torch.randn(4, 16))
        self.attn = nn.MultiheadAttention(16, 2)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.latents.unsqueeze(1)
        q = q.expand(-1, x.shape[0], -1) if self.view else q.repeat(1, x.shape[0], 1)
        kv = x.transpose(0, 1)
        return self.head(self.attn(q, kv, kv)[0].mean(0))


def test_macs_of_a_parameter_view_handed_to_a_submodule_are_those_of_its_copy() -> None:
    """Under no_grad the ``expand`` view requires grad without a grad function, which FlopCounterMode's module
    tracker cannot hook (it raised, and so did every baseline run of such a model): counted with grad on, the
    figure is the ``repeat`` model's, and no graph or mode is left behind."""
    torch.manual_seed(0)
    copy_, view = LatentQuery(view=False), LatentQuery(view=True)
    view.load_state_dict(copy_.state_dict())
    view.train()
    x = torch.randn(8, 5, 16)
    macs = 8 * (4 * 16 * 16 + 2 * 5 * 16 * 16 + 2 * 4 * 5 * 16 + 4 * 16 * 16) + 8 * 16 * 3  # q, k v, two bmm, out
    assert measure.count_macs(copy_, (x,)) == macs
    assert measure.count_macs_by_dtype(view, (x,)) == {"fp32": macs, "int8": 0}
    assert view.training and view.latents.grad is None


@pytest.mark.parametrize("batch_first", [True, False])
def test_macs_lstm_matches_formula(batch_first: bool) -> None:
    batch, seq, feat, hidden, layers = 4, 10, 12, 8, 2
    lstm = nn.LSTM(feat, hidden, num_layers=layers, batch_first=batch_first)
    x = torch.randn(batch, seq, feat) if batch_first else torch.randn(seq, batch, feat)
    per_sample_step = 4 * (feat * hidden + hidden * hidden) + 4 * (hidden * hidden + hidden * hidden)
    assert measure.count_macs(lstm, (x,)) == per_sample_step * batch * seq


class SeqModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 5, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(10, 4, batch_first=True)
        self.head = nn.Linear(4, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        y, _ = self.gru(self.drop(y))
        return self.head(y[:, -1])


def test_macs_lstm_gru_model_and_mode_restored() -> None:
    model = SeqModel().train()
    model.head.eval()  # mixed modes must come back exactly as they were
    x = torch.randn(3, 7, 6)
    lstm = 2 * 4 * (6 * 5 + 5 * 5)
    gru = 3 * (10 * 4 + 4 * 4)
    expected = 3 * 7 * (lstm + gru) + 3 * 4 * 2
    assert measure.count_macs(model, (x,)) == expected
    assert model.training and model.lstm.training and not model.head.training
    assert all(p.grad is None for p in model.parameters())


def test_macs_embedding_bag_model_runs() -> None:
    model = nn.Sequential(nn.EmbeddingBag(100, 8, mode="sum"), nn.Linear(8, 1))
    assert measure.count_macs(model, (torch.randint(0, 100, (4, 3)),)) == 4 * 8


# ---------------------------------------------------------------------------------- environment stamp


def test_environment_stamp_keys_and_json() -> None:
    stamp = measure.environment_stamp("cpu")
    for key in (
        "torch_version", "python_version", "platform", "cpu_model", "isa_flags", "cpu_capability",
        "logical_cores", "usable_cores", "torch_threads", "torch_interop_threads", "mkl_available",
        "mkldnn_available", "cuda_available", "device_name", "cuda_version", "gpu_driver",
        "gpu_compute_capability", "git_sha", "git_dirty", "hostname", "hardware_id",
    ):
        assert key in stamp, key
    assert json.loads(json.dumps(stamp)) == stamp
    assert set(stamp["isa_flags"]) <= set(measure.ISA_FLAGS_OF_INTEREST)
    assert stamp["hardware_id"] and all(c.isalnum() or c == "-" for c in stamp["hardware_id"])
    assert stamp["torch_threads"] == torch.get_num_threads()


def test_the_stamp_names_the_silicon_beside_the_isa_class(tmp_path, monkeypatch) -> None:
    """Two CPUs the VM names alike, of one ISA class, are told apart by family / model (Zen 4 vs Zen 5)."""
    from pathlib import Path

    from lab.measure import env

    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
               "stepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    real_read = Path.read_text
    caches = (env._cpu_info, env.cpu_signature, env._static_stamp, env._device_stamp)
    for cache in caches:  # every cache the patched /proc/cpuinfo can reach, so none keeps "Some ARM" for later tests
        cache.cache_clear()
    try:
        with monkeypatch.context() as mp:
            mp.setattr(Path, "read_text", lambda self, *a, **k: cpuinfo if str(self) == "/proc/cpuinfo"
                       else real_read(self, *a, **k))
            assert env.cpu_signature() == "AuthenticAMD family 26 model 2 stepping 1"  # the first CPU's, not a mix
            cpuinfo = "processor\t: 0\nmodel name\t: Some ARM\n"
            env.cpu_signature.cache_clear()
            assert env.cpu_signature() is None
            assert "cpu_signature" in measure.environment_stamp("cpu")
    finally:
        for cache in caches:
            cache.cache_clear()
    assert "some-arm" not in measure.environment_stamp("cpu")["hardware_id"]  # the real machine again


def test_environment_stamp_reads_threads_fresh() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert measure.environment_stamp()["torch_threads"] == 1
        stamp = measure.environment_stamp()
        stamp["isa_flags"].append("mutated")  # callers must not be able to poison the cache
        assert "mutated" not in measure.environment_stamp()["isa_flags"]
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------ statistics


def test_median_and_spread() -> None:
    assert measure.median([3.0, 1.0, 2.0, 100.0]) == 2.5
    assert measure.spread([1, 2, 3, 4, 5]) == pytest.approx(2.0)
    assert measure.relative_spread([10, 10, 10]) == 0.0


@pytest.mark.parametrize(
    "fn",
    [
        measure.median,
        measure.spread,
        measure.bootstrap_ci,
        lambda xs: measure.bootstrap_ratio_ci(xs, [1.0]),
        lambda xs: measure.bootstrap_ratio_ci([1.0], xs),
    ],
)
def test_empty_input_raises(fn) -> None:
    with pytest.raises(ValueError):
        fn([])


def test_bootstrap_ratio_ci_contains_true_ratio_and_narrows() -> None:
    rng = np.random.default_rng(123)
    # baseline ~ 20 ms, variant ~ 10 ms, lognormal noise with median exactly 20 / 10: true speedup 2.0
    def draw(med: float, n: int) -> np.ndarray:
        return med * rng.lognormal(0.0, 0.2, n)

    est, lo, hi = measure.bootstrap_ratio_ci(draw(20, 30), draw(10, 30))
    assert lo <= est <= hi
    assert lo < 2.0 < hi
    _, lo_big, hi_big = measure.bootstrap_ratio_ci(draw(20, 600), draw(10, 600))
    assert lo_big < 2.0 < hi_big
    assert hi_big - lo_big < (hi - lo) / 2  # ~sqrt(20) narrower in theory


def test_bootstrap_deterministic_with_seed_and_ci_level() -> None:
    xs = np.random.default_rng(0).normal(5, 1, 50)
    assert measure.bootstrap_ci(xs, seed=7) == measure.bootstrap_ci(xs, seed=7)
    est, lo, hi = measure.bootstrap_ci(xs, ci=0.5)
    _, lo95, hi95 = measure.bootstrap_ci(xs, ci=0.95)
    assert est == pytest.approx(np.median(xs))
    assert lo95 <= lo <= est <= hi <= hi95
    m, mlo, mhi = measure.bootstrap_ci(xs, stat=np.mean)
    assert mlo < m < mhi and m == pytest.approx(xs.mean())
    with pytest.raises(ValueError):
        measure.bootstrap_ci(xs, ci=1.5)


def test_bootstrap_stat_without_axis_argument() -> None:
    est, lo, hi = measure.bootstrap_ci([1.0, 2.0, 3.0, 4.0], stat=lambda a: float(np.max(a)), n_boot=50)
    assert est == 4.0 and 1.0 <= lo <= hi <= 4.0


# ------------------------------------------------------------------------------------------- the one timer


def test_interleaved_ms_calls_arms_in_rounds_after_warmup_and_syncs_per_block() -> None:
    calls: list[str] = []
    syncs: list[int] = []
    arms = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    samples = measure.interleaved_ms(arms, repeats=3, warmup=2, iters=2, sync=lambda: syncs.append(1))
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up: each arm alone, not timed
    assert calls[6:] == ["a", "a", "b", "b", "c", "c"] * 3  # then A B C, A B C, ... (iters=2 per block)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(x >= 0 for v in samples.values() for x in v)
    assert len(syncs) == 3 + 2 * 9  # once after each arm's warm-up, twice around every block


def test_interleaved_ms_drops_a_failing_arm_only_when_asked() -> None:
    def boom() -> None:
        raise RuntimeError("no kernel\nsecond line")

    errors: dict[str, str] = {}
    samples = measure.interleaved_ms({"ok": lambda: None, "bad": boom}, repeats=2, warmup=1, errors=errors)
    assert list(samples) == ["ok"] and errors == {"bad": "RuntimeError: no kernel"}
    with pytest.raises(RuntimeError, match="no kernel"):
        measure.interleaved_ms({"bad": boom}, repeats=1)
    with pytest.raises(ValueError, match="repeats"):
        measure.interleaved_ms({"ok": lambda: None}, repeats=-1)


def test_interleaved_ms_stops_at_the_deadline_after_min_repeats() -> None:
    samples = measure.interleaved_ms({"a": lambda: None}, repeats=100, warmup=0, deadline=0.0, min_repeats=3)
    assert len(samples["a"]) == 3


def test_inference_latency_ms_runs_in_eval_mode_and_restores_it() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    seen: list[bool] = []
    model.register_forward_hook(lambda mod, args, out: seen.append(mod.training))
    model.train()
    samples = measure.inference_latency_ms({"m": model}, (torch.randn(2, 4),), repeats=4, warmup=1)
    assert len(samples["m"]) == 4 and seen == [False] * 5 and model.training
    assert measure.sync_for("cpu") is None and callable(measure.sync_for("cuda"))


def test_the_loop_timer_is_the_plain_clock_on_cpu_and_events_on_cuda():
    cpu = measure.step_timer("cpu", ("forward",))
    assert type(cpu) is measure.PhaseTimer and cpu._sync is None  # CPU: unchanged, no sync exists
    assert type(measure.step_timer("cpu", ("forward",), timing="phase")) is measure.PhaseTimer
    with pytest.raises(ValueError, match="timing='often'"):
        measure.step_timer("cpu", ("forward",), timing="often")


def test_losses_read_together_still_name_the_step_that_went_non_finite():
    import torch

    from lab.loop import _read_losses

    losses: list[float] = []
    _read_losses([torch.tensor(1.0), torch.tensor(0.5)], losses, last_step=1, epoch=0, phase="train")
    assert losses == [1.0, 0.5]
    unread = [torch.tensor(0.25), torch.tensor(float("nan")), torch.tensor(0.125)]
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 3 \(epoch 0, train, read with steps 2-4\)"):
        _read_losses(unread, losses, last_step=4, epoch=0, phase="train")
    assert losses == [1.0, 0.5, 0.25]  # the finite ones before it are kept
    with pytest.raises(FloatingPointError, match=r"loss became inf at step 7 \(epoch 1, train\); lower the lr"):
        _read_losses([torch.tensor(float("inf"))], [], last_step=7, epoch=1, phase="train")  # CPU: one per step


@pytest.mark.gpu
def test_event_timer_syncs_once_per_step_and_charges_gpu_work_to_its_phase(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    syncs = []
    real = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: (syncs.append(1), real(self))[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("a device-wide sync in step mode"))
    timer = measure.step_timer("cuda", ("data_wait", "forward", "backward"))
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(4):
        timer.start_step()
        timer.mark("data_wait")
        for _ in range(20):
            x = (x @ x).tanh()
        timer.mark("forward")
        timer.mark("backward")
        timer.end_step()
    samples = timer.samples_ms()
    assert len(syncs) == 4  # one event sync per step, none per phase
    for f, d, b, t in zip(samples["forward"], samples["data_wait"], samples["backward"], samples["total"],
                          strict=True):
        assert f > 10 * max(d, b) and f + d + b == pytest.approx(t, rel=0.05)
