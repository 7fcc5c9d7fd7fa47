"""Issue 31: one page, one truth. A synthetic stored ablation (baseline, int8_eager, prune50 and the A/A arm,
3 repeats, made by a fake run function so no training runs) is rendered by the dashboard, and every figure
that appears in more than one view (table, bars, scatter, why, technique details) must be the same number:
the size ratio in one direction, the MACs ratio, each inference speedup. The numbers are planted where the old
views disagreed: the table's size was arm / baseline under "x smaller", the why quoted the first run's
int8-vs-float ratio, the details quoted pruning's zero-skipping MACs while the table counted dense ones.

Also the noise floor: an A/A interval that excludes 1 (a planted drift) names no winner and says why, in the
dashboard's verdict and in the text ``lab ablate`` prints (both read ``lab.ablation.verdict``)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import ResultStore, RunConfig  # noqa: E402
from lab.ablation import run_ablation, verdict  # noqa: E402
from lab.recipes import from_techniques  # noqa: E402
from lab.result import RunResult, new_run_id  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
BASE_BYTES, INT8_BYTES = 280_000, 132_000  # 2.12x smaller (the old table read 0.471x)
BASE_MACS = 10_000
#: Median ms at batch_256 per arm (the table's inference column: baseline's runs / the arm's).
LATENCY = {"baseline": 2.0, "int8_eager": 1.15, "prune50": 0.85, "aa": 2.0}


def _fake_runs(ablation, planted_aa: float = 1.0):
    """A run function that returns each scheduled arm's synthetic result, in the runner's order."""
    order = iter([arm for arm, *_ in ablation.schedule(3, [0])])  # the runner's own order (it rotates per round)
    k = itertools.count()

    def run_fn(cfg: RunConfig, progress=None, on_error="record") -> RunResult:
        arm, i = next(order), next(k)
        jitter = 1.0 + 0.01 * (i % 3)
        train = 1.0 * jitter * (1 / planted_aa if arm == "aa" else 1.0)
        lat = [LATENCY[arm] * jitter * (1 + 0.02 * j) for j in range(8)]
        details: dict = {}
        why: list[str] = []
        if arm == "int8_eager":
            ratio = 0.70 + 0.05 * (i % 3)  # each run's own int8-vs-float ratio differs from the pooled one
            details["quant"] = {"method": "dynamic", "api": "torch.ao eager", "float_bytes": BASE_BYTES - 900,
                                "int8_bytes": INT8_BYTES + 700, "size_ratio": 2.1, "output_rel_error": 0.004,
                                "latency": {"batch_256": {"ratio": ratio, "ci_lo": 0.6, "ci_hi": 0.9, "samples_ms": {
                                    "float": [1.0 * jitter] * 6, "int8": [1.0 * jitter / ratio] * 6}}}}
            why += [f"int8 slower than fp32 at batch_256 ({ratio:.2f}x): memory-bound: int8 saves bytes",
                    "stayed float: wide"]
        if arm == "prune50":
            details["pruning"] = {"method": "l1_unstructured", "amount": 0.5, "schedule": "oneshot", "macs_ratio": 1.67,
                                "inference": {"batch": 256, "dense_ms": [1.0] * 6, "pruned_ms": [1.0 * jitter] * 6,
                                              "speedup": 1.0, "ci95": [0.94, 1.5]}}
            why.append("unstructured zeros do not speed up dense kernels (1.67x fewer MACs, 1.00x measured)")
        return RunResult(
            run_id=new_run_id(), config=cfg.to_dict(), env={"hardware_id": "test-machine"}, workload="ctr",
            metric_name="auc", metric=0.80 - (0.002 if arm != "baseline" else 0.0) + 0.001 * (i % 3), steps=6,
            warmup_steps=1, batch_size=64, train_time_s=train, step_times_ms={"total": [train * 100] * 6},
            model_bytes=INT8_BYTES if arm == "int8_eager" else BASE_BYTES, macs_per_sample=BASE_MACS,
            latency_ms={"batch_1": [0.1] * 4, "batch_256": lat}, why=why, details=details)

    return run_fn


def _stored(path: Path, planted_aa: float = 1.0):
    ablation = from_techniques("truth", RunConfig(workload="ctr", size="tiny", threads=1),
                               [["int8_eager"], ["prune50"]])
    with ResultStore(path) as store:
        return run_ablation(ablation, repeats=3, store=store, run_fn=_fake_runs(ablation, planted_aa))


def _plot_json(at: AppTest) -> list[str]:
    return [el.proto.spec for el in at.get("plotly_chart")]


def _numbers(text: str, word: str) -> set[str]:
    return set(re.findall(rf"(\d+(?:\.\d+)?x {word})", text))


def test_every_view_of_a_stored_ablation_says_the_same_figures(private_store):
    df = _stored(private_store)
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "Arm" in d.value.columns and "Status" in d.value.columns)
    rows = table.set_index("Arm")
    why = next(m.value for m in at.markdown if m.value.startswith("**Why**"))
    why_of = {line.split("**")[1]: line for line in why.splitlines() if line.startswith("- **")}
    details = {}
    for arm in ("int8_eager", "prune50"):
        at.selectbox(key="detail_arm").select(arm).run()
        details[arm] = "\n".join(m.value for m in at.markdown if m.value.startswith("- "))
    plots = " ".join(_plot_json(at))

    # size: one direction, one number, in the table, the why and the details
    size = rows.loc["int8_eager", "Size"]
    assert size == "2.12x smaller"
    assert _numbers(why_of["int8_eager"], "smaller|larger") <= {size} and size in why_of["int8_eager"]
    assert _numbers(details["int8_eager"], "(?:smaller|larger)") == {size}
    assert rows.loc["prune50", "Size"] == "same size" and rows.loc["baseline", "Size"] == ""
    assert "0.471" not in " ".join(table.astype(str).to_numpy().ravel())

    # MACs: dense kernels and zero-skipping are two named columns, each the same wherever it is said
    skipped = rows.loc["prune50", "MACs if zeros skipped"]
    assert skipped == "1.67x fewer"
    for text in (why_of["prune50"], details["prune50"]):
        assert _numbers(text, "fewer") == {skipped}

    # inference: against the baseline's runs (table, bars, hover, details) and paired (why, details)
    for arm in ("int8_eager", "prune50"):
        vs_base = rows.loc[arm, "Inference speedup (x, 95 % CI)"]
        value = float(vs_base.split("x")[0])
        assert value == pytest.approx(float(df.set_index("arm").loc[arm, "infer_speedup"]), abs=0.01)
        assert f"against the baseline's runs {vs_base}" in why_of[arm]
        assert f"against the baseline's runs {vs_base}" in details[arm]
        assert vs_base in plots  # the scatter's and bars' hover
        paired = re.search(r"at batch 256: (\d+\.\d+x \[[^]]+\])", why_of[arm]).group(1)
        assert paired in details[arm]
        # no other inference figure anywhere in the arm's why (the runs' own "(0.70x)" tags are gone)
        quoted = set(re.findall(r"\d+\.\d+x", why_of[arm]))
        allowed = set(re.findall(r"\d+\.\d+x", f"{vs_base} {paired} {skipped} {rows.loc[arm, 'Size']}"))
        assert quoted <= allowed, quoted - allowed
    assert "stayed float" not in why and "`wide`" in why_of["int8_eager"]
    assert "test-machine" in " ".join(m.value for m in at.markdown)  # whose machine, on the page


def test_a_planted_drift_in_the_a_a_arm_names_no_winner(private_store):
    df = _stored(private_store, planted_aa=1.4)  # the baseline's rerun 1.4x "faster" than the baseline
    aa = df.set_index("arm").loc["aa"]
    assert aa["train_speedup_lo"] > 1.0  # the noise floor excludes 1
    fast = df.copy()
    fast.loc[fast["arm"] == "int8_eager", ["axes", "train_speedup", "train_speedup_lo", "train_speedup_hi"]] = [
        "train,inference,size", 2.0, 1.8, 2.2]  # would win on training beyond noise
    said = verdict(fast, 1.0, "train_speedup")
    assert said["winner"] is None and said.get("unstable")
    assert "unstable" in said["text"] and "more repeats" in said["text"] and "int8_eager would" in said["text"]
    steady = verdict(fast.assign(train_speedup_lo=fast["train_speedup_lo"].where(fast["arm"] != "aa", 0.9)),
                     1.0, "train_speedup")
    assert steady["winner"] == "int8_eager"  # the same table with a floor that contains 1 does name it
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert any("measurement unstable" in w.value for w in at.warning)
