"""Issue 30: ``lab crossover --quick`` answers in about a minute on either CPU class. Where a low precision runs
emulated (an AVX2-only CPU: a reference path at 0.02-0.45x fp32, most of the quick map's 153 s there), the quick
map does not time it: each of its cells is a skipped row that says why, ``auto`` is decided from fp32 alone,
and ``--include-emulated`` (``skip_emulated=False``) times it again. The emulation is planted, so this runs the
same on an AMX Xeon and an AVX2 EPYC."""

from __future__ import annotations

import pytest

from lab.crossover import build_map, check_schema, mapping
from lab.precision.gate import Capability


def _planted(native: set[str]):  # noqa: ANN202 - a capability() stand-in
    def capability(dtype: str, device: object = "cpu", **_: object) -> Capability:
        ok = dtype in native or dtype == "fp32"
        return Capability(dtype, "cpu", ok, "planted flags" if ok else "none of avx512_bf16 (planted); emulated")
    return capability


def test_emulated_low_precisions_are_named_with_the_reason(monkeypatch):
    monkeypatch.setattr(mapping, "capability", _planted(set()))
    skips = mapping.emulated_skips(["bf16", "fp16", "amp_auto", "prune_channels50"])
    assert set(skips) == {("bf16", "train_step"), ("bf16", "inference"), ("fp16", "train_step"), ("fp16", "inference")}
    assert all("is emulated here" in why and "planted" in why and "--include-emulated" in why for why in skips.values())
    monkeypatch.setattr(mapping, "capability", _planted({"bf16"}))
    assert set(mapping.emulated_skips(["bf16", "fp16"])) == {("fp16", "train_step"), ("fp16", "inference")}
    assert mapping.emulated_skips(["prune_channels50"]) == {}


@pytest.mark.parametrize("skip", [True, False])
def test_the_quick_map_skips_emulated_cells_and_auto_keeps_fp32(monkeypatch, skip):
    monkeypatch.setattr(mapping, "capability", _planted(set()))
    the_map = build_map(["sequence"], ["bf16", "amp_auto", "fused_optim"], quick=True, rungs={"sequence": ["xs"]},
                        repeats=3, batch_size={"sequence": 8}, skip_emulated=skip)
    check_schema(the_map)
    bf16 = [r for r in the_map["rows"] if r["technique"] == "bf16"]
    auto = [r for r in the_map["rows"] if r["technique"] == "amp_auto"]
    fused = [r for r in the_map["rows"] if r["technique"] == "fused_optim"]
    assert len(bf16) == 2 and len(auto) == 1 and fused and fused[0]["speedup"] is not None
    if skip:
        assert the_map["skipped_emulated"] == ["bf16"]
        assert all(r["speedup"] is None and "skipped: bf16 is emulated here" in r["why"] for r in bf16)
        # auto had no candidate left: fp32 against itself, and it says which candidate was not timed and why
        assert auto[0]["speedup"] == 1.0 and "auto chose fp32" in auto[0]["why"]
        assert "bf16: bf16 is emulated here" in auto[0]["why"]
    else:
        assert the_map["skipped_emulated"] == []
        assert all("this map does not time it" not in (r["why"] or "") for r in bf16)  # built and timed again


@pytest.mark.parametrize("native", [set(), {"bf16"}])
def test_auto_asked_without_its_candidates_is_decided_from_fp32_only_where_neither_is_native(monkeypatch, native):
    """A full map that leaves the emulated bf16 / fp16 out (they would cost most of an AVX2 box's run) still
    gets an ``auto`` row: fp32 against itself, saying why. Where a low precision is native, ``auto`` without
    it would hide the gain it is there to capture, so that cell is a skip that says to ask for it."""
    from lab.crossover import arms
    monkeypatch.setattr(arms, "capability", _planted(native))
    the_map = build_map(["sequence"], ["amp_auto", "fused_optim"], rungs={"sequence": ["xs"]}, repeats=3,
                        batch_size={"sequence": 8})
    check_schema(the_map)
    (auto,) = [r for r in the_map["rows"] if r["technique"] == "amp_auto"]
    if native:
        assert auto["speedup"] is None and "bf16 runs natively here; ask for them too" in auto["why"]
    else:
        assert auto["speedup"] == 1.0 and "auto chose fp32" in auto["why"]
        assert "bf16 / fp16 not timed: neither runs natively here" in auto["why"]


def test_only_an_arm_dropped_as_slow_is_skipped_on_the_rungs_above():
    """The full map on an AMD EPYC (native bf16, emulated fp16) lost ``auto`` at the top rungs of ctr and the
    transformer: ``auto``'s own, measured row quoted fp16's "slower than fp32 on a single call" note, and that
    was read as ``auto`` being dropped."""
    slow = f"skipped: x9 {mapping.SLOW_MARK} (149 ms vs 16.7 ms): a layer without a fast fp16 kernel"
    rows = [
        {"technique": "fp16", "axis": "train_step", "speedup": None, "why": slow},
        {"technique": "amp_auto", "axis": "train_step", "speedup": 1.0,
         "why": f"auto chose fp32: ...; fp16: not measured above rung m, where it was x9 {mapping.SLOW_MARK}"},
        {"technique": "bf16", "axis": "train_step", "speedup": 2.1, "why": ""},
        {"technique": "compile", "axis": "train_step", "speedup": None, "why": "skipped: RuntimeError: boom"},
    ]
    skips = mapping.slow_skips(rows, "l")
    assert list(skips) == [("fp16", "train_step")]
    assert skips["fp16", "train_step"].startswith("not measured above rung l, where it was x9 ")


def _planted_rounds(monkeypatch, base_ms: float, bf16_ms: float) -> list[int]:
    """interleaved_ms stand-in for settle_auto's extra rounds: one planted sample per arm per call."""
    from lab.crossover import measure

    calls: list[int] = []

    def one_round(arms, *, repeats, warmup, iters, **_):  # noqa: ANN001, ANN202
        assert repeats == 1 and warmup == 0 and set(arms) <= {"base", "bf16", "fp16"}
        calls.append(1)
        return {n: [base_ms if n == "base" else bf16_ms] for n in arms}
    monkeypatch.setattr(measure, "interleaved_ms", one_round)
    return calls


@pytest.mark.parametrize("native", [True, False])
def test_one_slow_round_does_not_leave_auto_undecided(monkeypatch, native):
    """Five rounds where bf16 halved the step four times and one round was slow (0.56x): the bootstrap CI of the
    median ratio reaches that round, so bf16 is undecided and auto kept fp32 (ctr l, sequence xl of the AMD map).
    settle_auto adds rounds of base + bf16 until the verdict is in (here: pays), at most 8 in all; an emulated
    bf16 gets none (auto never picks it)."""
    from lab.crossover import measure
    from lab.precision import compare_arms

    monkeypatch.setattr(measure, "capability", _planted({"bf16"} if native else set()))
    calls = _planted_rounds(monkeypatch, 100.0, 50.0)
    samples = {"base": [100.0] * 5, "bf16": [50.0] * 4 + [180.0], "prune_channels50": [80.0] * 5}
    caps = {"bf16": measure.capability("bf16")}
    assert compare_arms({"fp32": samples["base"], "bf16": samples["bf16"]}, caps)["bf16"]["verdict"] == \
        ("undecided" if native else "skipped")
    arms = dict.fromkeys(samples, lambda: None)
    added = measure.settle_auto(arms, samples, iters=1)
    assert added == len(calls)
    if not native:
        assert added == 0 and len(samples["base"]) == 5
        return
    assert 1 <= added <= 3 and len(samples["base"]) == len(samples["bf16"]) <= measure.AUTO_MAX_ROUNDS
    assert len(samples["prune_channels50"]) == 5  # only auto's arms get the extra rounds
    assert compare_arms({"fp32": samples["base"], "bf16": samples["bf16"]}, caps)["bf16"]["verdict"] == "pays"


def test_settle_auto_stops_at_its_round_cap_and_when_decided(monkeypatch):
    from lab.crossover import measure

    monkeypatch.setattr(measure, "capability", _planted({"bf16"}))
    calls = _planted_rounds(monkeypatch, 100.0, 101.0)  # a tie: the CI keeps straddling the 1.02 bar
    samples = {"base": [100.0, 100.0, 100.0], "bf16": [60.0, 140.0, 99.0]}
    measure.settle_auto(dict.fromkeys(samples, lambda: None), samples, iters=1, max_rounds=6)
    assert len(samples["base"]) == len(samples["bf16"]) == 6 and len(calls) == 3
    calls.clear()
    decided = {"base": [100.0] * 5, "bf16": [50.0] * 5}
    assert measure.settle_auto(dict.fromkeys(decided, lambda: None), decided, iters=1) == 0 and not calls
