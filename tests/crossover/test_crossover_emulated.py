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
    skips = mapping.emulated_skips(["bf16", "fp16", "auto", "prune50"])
    assert set(skips) == {("bf16", "train_step"), ("bf16", "inference"), ("fp16", "train_step"), ("fp16", "inference")}
    assert all("is emulated here" in why and "planted" in why and "--include-emulated" in why for why in skips.values())
    monkeypatch.setattr(mapping, "capability", _planted({"bf16"}))
    assert set(mapping.emulated_skips(["bf16", "fp16"])) == {("fp16", "train_step"), ("fp16", "inference")}
    assert mapping.emulated_skips(["prune50"]) == {}


@pytest.mark.parametrize("skip", [True, False])
def test_the_quick_map_skips_emulated_cells_and_auto_keeps_fp32(monkeypatch, skip):
    monkeypatch.setattr(mapping, "capability", _planted(set()))
    the_map = build_map(["sequence"], ["bf16", "auto", "fused_optimizer"], quick=True, rungs={"sequence": ["xs"]},
                        repeats=3, batch_size={"sequence": 8}, skip_emulated=skip)
    check_schema(the_map)
    bf16 = [r for r in the_map["rows"] if r["technique"] == "bf16"]
    auto = [r for r in the_map["rows"] if r["technique"] == "auto"]
    fused = [r for r in the_map["rows"] if r["technique"] == "fused_optimizer"]
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
    the_map = build_map(["sequence"], ["auto", "fused_optimizer"], rungs={"sequence": ["xs"]}, repeats=3,
                        batch_size={"sequence": 8})
    check_schema(the_map)
    (auto,) = [r for r in the_map["rows"] if r["technique"] == "auto"]
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
        {"technique": "auto", "axis": "train_step", "speedup": 1.0,
         "why": f"auto chose fp32: ...; fp16: not measured above rung m, where it was x9 {mapping.SLOW_MARK}"},
        {"technique": "bf16", "axis": "train_step", "speedup": 2.1, "why": ""},
        {"technique": "compile", "axis": "train_step", "speedup": None, "why": "skipped: RuntimeError: boom"},
    ]
    skips = mapping.slow_skips(rows, "l")
    assert list(skips) == [("fp16", "train_step")]
    assert skips["fp16", "train_step"].startswith("not measured above rung l, where it was x9 ")
