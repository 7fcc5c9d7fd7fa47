"""`python -m lab bench` end to end on the one benchmark that is fast everywhere (gpu.py skips without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from lab import bench as br
from lab.cli import main as cli_main


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU box gpu.py really measures (minutes)")
def test_bench_runs_a_benchmark_and_writes_the_report(tmp_path, capsys):
    assert cli_main(["bench", "--only", "gpu", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "wall time: gpu" in out and "report.md" in out
    envelope = json.loads((tmp_path / "gpu.json").read_text())
    assert envelope["benchmark"] == "gpu" and envelope["quick"] is True and envelope["figures"]
    report = json.loads((tmp_path / br.REPORT_JSON).read_text())
    assert {r["family"] for r in report["rows"]} >= {"precision", "data", "pruning", "quantization", "distributed"}
    assert all(r["hardware_id"] == envelope["env"]["hardware_id"] for r in report["rows"])
    md = (tmp_path / br.REPORT_MD).read_text()
    assert "skipped: no CUDA" in md and br.ANCHORS["quantization"].source in md
    # A second run is compared with the first; skipped (NaN) figures have nothing to reproduce.
    assert cli_main(["bench", "--only", "gpu", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / br.PREVIOUS_JSON).exists()
    again = json.loads((tmp_path / br.REPORT_JSON).read_text())
    assert all(r["within_ci"] is None for r in again["rows"])
