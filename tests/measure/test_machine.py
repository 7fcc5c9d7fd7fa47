"""The machine card (issue 25): every key, a JSON round trip, positive finite peaks, an int8 GEMM timed by an
int8 kernel, the cache written once and re-read without measuring, the limit sentences on both sides, the
``--as avx2`` card from a capped child process, one-line CLI errors, the stamp's summary and the dashboard page.
No timing assertion: only structure, positivity and finiteness (docs/architecture.md section 5, rule 7)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from lab.cli import main
from lab.measure import environment_stamp, gemm_peaks, machine
from lab.measure.cpu import emulation_env, hardware_flags, mask_flags
from lab.measure.machine import CARD_FORMAT, GEMM_DTYPES, MachineCard

ROOT = Path(__file__).resolve().parents[2]
CARD_KEYS = {"hardware_id", "cpu_model", "logical_cores", "usable_cores", "caches", "capabilities", "torch_version",
             "threads", "measured_at", "quick", "duration_s", "int8_kernel", "peaks", "sizes", "notes"}


@pytest.fixture(scope="module")
def card() -> MachineCard:
    return machine.measure_card(quick=True)  # once for the module: a few seconds


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _hand_card(bf16: float = 5.0, fp16: float = 60.0, int8: float = 300.0, hardware_id: str = "test-cpu-2c",
               **kw) -> MachineCard:
    peaks = {"fp32": 100.0, "bf16": bf16, "fp16": fp16, "int8": int8}
    return dataclasses.replace(MachineCard(
        hardware_id=hardware_id, cpu_model="Test CPU", logical_cores=2, usable_cores=2, caches={"L3": 32 * 2**20},
        capabilities={"native_bf16": False, "native_fp16": False, "int8_vnni": True, "amx": False, "caps": [],
                      "aten_capability": "AVX2"},
        torch_version=torch.__version__, threads=[1, 2], measured_at="2026-01-01T00:00:00+00:00", quick=True,
        duration_s=1.0, int8_kernel="torch._int_mm (int8 x int8 -> int32)",
        peaks={"gemm_gflops": {dt: {"1": v, "all": 2 * v} for dt, v in peaks.items()},
               "gemm_vs_fp32": {"bf16": [bf16 / 100, bf16 / 110, bf16 / 90]},
               "triad_gbps": {"1": 10.0, "all": 12.0}, "small_op_us": 2.0},
        sizes={"gemm_n": dict.fromkeys(peaks, 512), "triad_mib": 64.0}), **kw)


def _here_card(**kw) -> MachineCard:
    return _hand_card(hardware_id=environment_stamp("cpu")["hardware_id"], **kw)


def test_the_card_has_every_key_and_round_trips_through_json(card):
    data = card.to_dict()
    assert set(data) == CARD_KEYS
    assert MachineCard.from_dict(json.loads(json.dumps(data))) == card
    assert card.hardware_id == environment_stamp("cpu")["hardware_id"]
    assert card.capabilities == machine.cpu_capabilities().to_dict()
    assert card.threads[0] == 1 and card.threads[-1] == card.usable_cores
    assert set(card.peaks) >= {"gemm_gflops", "gemm_vs_fp32", "triad_gbps", "small_op_us"}


def test_peaks_are_positive_and_finite(card):
    def ok(x) -> bool:
        return isinstance(x, float) and math.isfinite(x) and x > 0

    for dt in GEMM_DTYPES:
        timed = card.peaks["gemm_gflops"][dt]
        assert set(timed) == {"1", "all"}
        if not all(ok(v) for v in timed.values()):  # only a dtype this build cannot multiply, and it says so
            assert any(dt in note for note in card.notes), (dt, timed, card.notes)
        else:
            assert card.sizes["gemm_n"][dt] >= 128
    for dt, (r, lo, hi) in card.peaks["gemm_vs_fp32"].items():
        assert dt != "fp32" and all(ok(x) for x in (r, lo, hi)) and lo <= hi
    assert all(ok(v) for v in card.peaks["triad_gbps"].values()) and set(card.peaks["triad_gbps"]) == {"1", "all"}
    assert ok(card.peaks["small_op_us"])
    assert card.sizes["triad_mib"] > 0


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # torch.ao's deprecation, not ours
def test_int8_is_timed_by_an_int8_kernel(card, monkeypatch):
    fn, name = gemm_peaks.int8_gemm(64)
    out = fn()
    assert out.dtype in (torch.int32, torch.quint8), out.dtype  # an int8 kernel's output, never a float GEMM's
    assert card.int8_kernel == name
    if name.startswith("torch._int_mm"):
        assert out.dtype == torch.int32

    def no_int_mm(*_a, **_k):
        raise RuntimeError("_int_mm: not on this CPU")

    monkeypatch.setattr(torch, "_int_mm", no_int_mm)  # the fallback: torch.ao's quantized linear
    fn, name = gemm_peaks.int8_gemm(64)
    assert fn().dtype == torch.quint8 and "quantized.linear" in name


def test_int8_is_timed_on_the_fastest_int8_kernel_that_runs(monkeypatch):
    """Where two int8 kernels run, the card times the faster (raced once): an AVX2 EPYC's ``_int_mm`` is a
    reference path ~50x slower than fp32 while the quantized linear beats fp32, and timing ``_int_mm`` alone
    told users int8 cannot pay. Synthetic kernels, one made 20 ms slower by a sleep, in either order."""
    import time

    def slow() -> torch.Tensor:
        time.sleep(0.02)
        return torch.zeros(1, dtype=torch.int32)

    def fast() -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32)

    for kernels in ([(slow, "slow"), (fast, "fast")], [(fast, "fast"), (slow, "slow")]):
        monkeypatch.setattr(gemm_peaks, "_int8_kernels", lambda n, k=kernels: list(k))
        monkeypatch.setattr(gemm_peaks, "_int8_winner", [])
        assert gemm_peaks.int8_gemm(512)[1] == "fast"
    monkeypatch.setattr(gemm_peaks, "_int8_kernels", lambda n: [])
    with pytest.raises(ValueError, match="no int8 GEMM kernel"):
        gemm_peaks.int8_gemm(64)


def test_the_cache_is_written_once_and_read_back_without_measuring(cache, monkeypatch):
    calls = []

    def fake_measure(quick=False, progress=None):
        calls.append(quick)
        if len(calls) > 2:
            raise AssertionError("measured again although a card is cached")
        return _here_card(quick=quick)

    monkeypatch.setattr(machine, "measure_card", fake_measure)
    first = machine.machine_card(quick=True)
    path = machine.card_path()
    assert path.is_file() and path.parent == cache / "machine"
    assert path.name == f"{first.hardware_id}-torch{torch.__version__.replace('+', '-')}-card{CARD_FORMAT}.json"
    assert machine.machine_card(quick=True) == first == machine.load_card()
    assert calls == [True]
    full = machine.machine_card()  # only a quick card cached: a full one is measured (once)
    assert calls == [True, False] and not full.quick
    assert machine.machine_card() == full and machine.machine_card(quick=True) == full
    summary = machine.card_summary()
    assert set(summary) == {"hardware_id", "measured_at", "peaks"} and summary["peaks"] == full.peaks
    stamp = environment_stamp()
    assert stamp["machine_card"] == summary and json.loads(json.dumps(stamp)) == stamp
    stamp["machine_card"]["peaks"]["small_op_us"] = -1.0  # callers cannot poison the cached summary
    assert environment_stamp()["machine_card"]["peaks"]["small_op_us"] == 2.0


def test_no_card_cached_means_no_summary(cache):
    assert machine.card_summary() is None and machine.load_card() is None
    assert environment_stamp()["machine_card"] is None


def test_an_unwritable_cache_is_never_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LAB_CACHE_DIR", str(blocker))
    monkeypatch.setattr(machine, "measure_card", lambda quick=False, progress=None: _here_card(quick=quick))
    assert machine.card_summary() is None and environment_stamp()["machine_card"] is None
    said: list[str] = []
    assert machine.machine_card(quick=True, progress=said.append).hardware_id
    assert any("not cached" in s for s in said)


@pytest.mark.parametrize(("bf16", "word"), [(5.0, "cannot pay"), (710.0, "the most bf16 can give")],
                         ids=["slower-than-fp32", "faster-than-fp32"])
def test_ratio_limit_and_limit_sentence_on_both_sides(bf16, word):
    card = _hand_card(bf16=bf16)
    assert machine.ratio_limit(card, "bf16") == pytest.approx(bf16 / 100)
    sentence = machine.limit_sentence(card, "bf16")
    assert word in sentence and "test-cpu-2c" in sentence and "x fp32" in sentence
    assert ("0.05x" if bf16 < 100 else "7.1x") in sentence
    assert "int8 GEMM peak here is 3.0x fp32" in machine.limit_sentence(card, "int8_dynamic")
    assert "cannot pay" in machine.limit_sentence(_hand_card(int8=50.0), "int8_static")
    assert machine.limit_sentence(card, "prune50") is None and machine.ratio_limit(card, "fp64") is None
    missing = _hand_card()
    missing.peaks["gemm_gflops"]["fp16"] = {"1": None, "all": None}
    assert machine.ratio_limit(missing, "fp16") is None and machine.limit_sentence(missing, "fp16") is None
    assert len(machine.limit_sentences(card)) == 3


def test_cli_prints_the_cached_card_without_measuring(cache, monkeypatch, capsys):
    hand = _here_card()
    machine.save_card(hand)
    monkeypatch.setattr(machine, "measure_card", lambda **_k: pytest.fail("measured although a card is cached"))
    assert main(["machine", "--quick"]) == 0
    out = capsys.readouterr().out
    assert hand.hardware_id in out and "GEMM bf16" in out and "GFLOP/s" in out and "cannot pay" in out
    assert main(["machine", "--quick", "--json"]) == 0
    assert MachineCard.from_dict(json.loads(capsys.readouterr().out)) == hand


@pytest.mark.parametrize(("argv", "needle"), [
    (["machine", "--as", "sparc"], "invalid choice: 'sparc'"),
    (["machine", "--frobnicate"], "unrecognized arguments"),
    (["machine", "--as"], "expected one argument"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lab: error:") and needle in err, err


@pytest.mark.slow  # a child process, under the AVX2 cap: ~10-20 s on a shared 2-core box
def test_as_avx2_gives_the_card_an_avx2_user_would_see(tmp_path, monkeypatch, capfd):
    """``lab machine --as avx2`` from this process (``main``: no interpreter of its own to start for the part
    that only spawns); its child, capped, measures and prints straight to the file descriptors (``capfd``)."""
    if not mask_flags(hardware_flags(), emulation_env("avx2"))[1]:
        pytest.skip("this CPU has nothing above AVX2 to hide: its own card is the AVX2 card")
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    capfd.readouterr()
    assert main(["machine", "--as", "avx2", "--quick", "--json"]) == 0
    out = capfd.readouterr()
    child = MachineCard.from_dict(json.loads(out.out))
    assert child.hardware_id.endswith("-as-avx2") and child.capabilities["native_bf16"] is False
    assert child.capabilities["caps"] and child.capabilities["emulated"] is True
    version = torch.__version__.replace("+", "-")
    assert (tmp_path / "machine" / f"{child.hardware_id}-torch{version}-card{CARD_FORMAT}.json").is_file()
    assert "GEMM at 1 thread" in out.err  # progress goes to stderr, the JSON alone to stdout


def test_the_card_is_a_plain_dataclass_with_defaults():
    names = {f.name for f in dataclasses.fields(MachineCard)}
    assert names == CARD_KEYS
    assert MachineCard.from_dict({**_hand_card().to_dict(), "unknown_future_key": 1}) == _hand_card()


# ------------------------------------------------------------------------------------------ dashboard page


def _page() -> None:
    # AppTest runs this function's source as its own script: the module's imports are not there
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path.cwd() / "dashboard"))
    from page_machine import render

    render()


def test_dashboard_page_offers_to_measure_then_shows_the_card(cache, monkeypatch, private_store):
    """No card: the page offers to measure; the click starts a ``machine_card`` job (the worker's work is run
    here, in this process, with a fake measurement: no GEMM is timed), and the next draw shows the card; a reload
    reads the cached card and offers to measure again."""
    st_testing = pytest.importorskip("streamlit.testing.v1")
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "dashboard"))
    import _lifecycle

    from lab import ResultStore
    from lab.ablation import worker

    started = []

    def fake_measure(refresh, quick, progress):
        progress("GEMM at 1 thread(s)")
        card = _here_card(quick=quick)
        machine.save_card(card)
        return card

    def worker_inline(store_path, key, token, module=None):  # the worker process, synchronously
        started.append(key)
        with ResultStore(store_path) as store:
            worker.run_machine(store, key, token, measure=fake_measure)

    monkeypatch.setattr(_lifecycle, "start_worker", worker_inline)
    at = st_testing.AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("No machine card" in i.value for i in at.info)
    assert "Measure this machine (about" in at.button(key="machine_measure").label
    at.button(key="machine_measure").click().run()
    assert not at.exception, at.exception
    assert started and started[0].startswith("machine@")  # one job, the machine-card kind's key
    hid = environment_stamp("cpu")["hardware_id"]
    assert any(s.value == hid for s in at.subheader)
    table = at.dataframe[0].value
    assert {"GEMM fp32", "GEMM bf16", "GEMM fp16", "GEMM int8"} <= set(table["figure"])
    assert any("cannot pay on this machine" in m.value for m in at.markdown)
    at = st_testing.AppTest.from_function(_page, default_timeout=60).run()  # a reload reads the cached card
    assert not at.exception and any(s.value == hid for s in at.subheader)
    assert at.button(key="machine_measure").label.startswith("Measure again")
    assert len(started) == 1  # a rerun never measures


def test_the_crossover_map_sets_low_precision_and_int8_rows_against_the_card(cache):
    """A cached card is cited on the rows its GEMM peaks bound; other rows and a machine without a card are
    left as they are."""
    from lab.crossover.mapping import cite_machine_card

    rows = [{"technique": "bf16", "why": "dispatch-bound"}, {"technique": "dynamic_int8", "why": ""},
            {"technique": "prune50", "why": "2x fewer MACs"}]
    bare = {"rows": [dict(r) for r in rows]}
    cite_machine_card(bare)
    assert bare["rows"] == rows and "machine_card" not in bare
    machine.save_card(_here_card(bf16=5.0))
    cited = {"rows": [dict(r) for r in rows]}
    cite_machine_card(cited)
    bf16, int8, prune = cited["rows"]
    assert bf16["why"].startswith("dispatch-bound; card: bf16 GEMM peak here is 0.05x fp32")
    assert "cannot pay" in bf16["why"] and int8["why"].startswith("card: int8 GEMM peak here is 3.0x fp32")
    assert prune == rows[2] and cited["machine_card"]["peaks"]["gemm_gflops"]["bf16"]["1"] == 5.0


def test_the_doctor_cites_the_card_on_its_predictions_and_refusals(cache):
    from lab.doctor.amdahl import Prediction
    from lab.doctor.diagnosis import cite_machine_card
    from lab.registry import OPTIONS

    techs = [OPTIONS["bf16"], OPTIONS["fused_adam"] if "fused_adam" in OPTIONS else OPTIONS["bf16"]]
    preds = [Prediction("bf16", "train_step", 1.2, 1.0, 1.4, "matmul share 60 %")]
    skipped = {"fp16": "capability gate: no native fp16 on this CPU (...)"}
    assert "no machine card" in cite_machine_card(list(preds), dict(skipped), techs, "x")
    machine.save_card(_here_card(bf16=5.0, fp16=60.0))
    advice = cite_machine_card(preds, skipped, techs, "x")
    assert preds[0].reason.startswith("matmul share 60 %; card: bf16 GEMM peak here is 0.05x fp32")
    assert "card: fp16 GEMM peak here is 0.6x fp32" in skipped["fp16"] and advice.startswith("machine card (")
