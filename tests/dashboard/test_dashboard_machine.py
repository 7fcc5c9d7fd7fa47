"""The Machine page reads a cached card (never measures on a rerun) and prints its figures rounded as the other
pages round theirs (issue 31: it showed the card's raw floats, ``191.35539063212934``): peaks at 3 significant
digits, each GEMM ratio to fp32 at its interval's precision (``lab.ablation.record.fmt_ratio``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import torch  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab.measure import environment_stamp, machine  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def unrounded(text: str) -> list[str]:
    """The numbers in ``text`` with more than 4 significant digits (``191.355``, ``518670.9404``; not ``519000``
    nor ``4.24``): more than any figure measured on a shared machine can carry."""
    out = []
    for token in re.findall(r"\d+(?:\.\d+)?", text):
        digits = token.replace(".", "").lstrip("0")
        if len(digits if "." in token else digits.rstrip("0")) > 4:
            out.append(token)
    return out


def unrounded_card() -> machine.MachineCard:
    """A card with the raw floats a measurement leaves (as the issue saw them)."""
    gflops = {"fp32": 191.35539063212934, "bf16": 1370.5755051515412, "fp16": 202.9568647615094,
              "int8": 518670.9404}
    return machine.MachineCard(
        hardware_id=environment_stamp("cpu")["hardware_id"], cpu_model="Test CPU", logical_cores=2, usable_cores=2,
        caches={"L3": 32 * 2**20}, capabilities={"native_bf16": False, "caps": [], "aten_capability": "AVX2"},
        torch_version=torch.__version__, threads=[1, 2], measured_at="2026-01-01T00:00:00+00:00", quick=True,
        duration_s=1.0, int8_kernel="torch._int_mm (int8 x int8 -> int32)",
        peaks={"gemm_gflops": {dt: {"1": v, "all": v / 5.773} for dt, v in gflops.items()},
               "gemm_vs_fp32": {"bf16": [7.16246090911753, 6.30994597322279, 7.3849505435555],
                                "fp16": [1.0606278929015556, 0.9999240380838995, 1.105349803323458],
                                "int8": [4.237956689904561, 4.1, 4.3]},
               "triad_gbps": {"1": 15.425747572842502, "all": 14.629894961010768}, "small_op_us": 0.7749333334080196},
        sizes={"gemm_n": dict.fromkeys(gflops, 512), "triad_mib": 64.0})


def test_the_machine_page_rounds_the_cards_figures(tmp_path, monkeypatch, private_store):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    machine.save_card(unrounded_card())
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    tables = [df.value for df in at.dataframe if "1 thread" in df.value.columns]
    assert tables, "the Machine page drew no peak table"
    cells = [str(v) for v in tables[0].to_numpy().ravel()]
    assert not [c for c in cells if unrounded(c)], cells
    shown = dict(zip(tables[0]["figure"], tables[0]["1 thread"], strict=True))
    assert shown["GEMM fp32"] == "191" and shown["GEMM bf16"] == "1370" and shown["triad a=b+s*c"] == "15.4"
    vs = dict(zip(tables[0]["figure"], tables[0][machine_vs_column()], strict=True))
    assert vs["GEMM bf16"] == "7.2x [6.3, 7.4]" and vs["GEMM fp16"] == "1.06x [1.00, 1.11]"


def machine_vs_column() -> str:
    from lab.plots.machine import VS_FP32

    return VS_FP32


def test_measuring_runs_in_the_worker_and_the_page_shows_its_stage(tmp_path, monkeypatch, private_store):
    """A live machine job (staged: the worker between two stages): the button is disabled, the caption names the
    worker's pid and log, the progress line says which stage; the cached card still reads below."""
    import json
    import subprocess
    import sys
    import time

    from lab import ResultStore, jobs
    from lab.ablation import worker

    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    machine.save_card(unrounded_card())
    key, spec = worker.machine_spec(quick=False)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the "worker"
    try:
        with ResultStore(private_store) as store:
            jobs.claim(store, key, spec=spec)
            state = {"arm": "GEMM at 1 thread(s): fp32 n=512", "stage": 2, "estimate_s": 15,
                     "started_at": time.time() - 4, "published_at": time.time()}
            with store.transaction() as conn:
                conn.execute("UPDATE jobs SET status = 'running', pid = ?, state_json = ?",
                             (sleeper.pid, json.dumps(state)))
        at = AppTest.from_file(APP, default_timeout=60).run()
        assert not at.exception, at.exception
        assert at.button(key="machine_measure").disabled
        assert any(m.value.startswith("stage 2: **GEMM at 1 thread(s)") for m in at.markdown)
        assert any(f"pid {sleeper.pid}" in c.value and "cached when it ends" in c.value for c in at.caption)
        assert [df for df in at.dataframe if "1 thread" in df.value.columns]  # the card cached before
    finally:
        sleeper.kill()
        sleeper.wait()
