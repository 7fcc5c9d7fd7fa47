"""The README's "Bring a Hugging Face model" example (examples/hf_bert.py) loads by spec and trains: the file a
new user copies must keep working. Skipped without the ``[hf]`` extra."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the example needs the [hf] extra (transformers)")

from lab.config import RunConfig  # noqa: E402
from lab.train import run  # noqa: E402
from lab.workloads import get_workload  # noqa: E402
from lab.workloads.spec import load_spec  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_bert.py"


def test_the_readme_points_to_the_example_and_its_spec_loads_and_runs():
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    assert "examples/hf_bert.py" in readme and "docs/workloads.md#bring-a-hugging-face-model" in readme
    spec = f"{EXAMPLE}:make"
    assert load_spec(spec) == ["my_hf_bert"]
    wl = get_workload("my_hf_bert")
    model = wl.make_model(wl.size("tiny"))
    assert type(model.model).__name__ == "BertForSequenceClassification"
    r = run(RunConfig(workload=spec, size="tiny", threads=1, max_steps=2, warmup_steps=1, latency_repeats=0))
    assert r.status == "ok", r.error
    assert r.steps == 2 and r.metric is not None
