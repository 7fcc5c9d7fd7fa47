"""A sensitivity study's fine-tune of chosen per-layer amounts (notebook 03's exercise scores the learner's choice
with it): the masks are the amounts asked and stay through the fine-tune, which really trains, from the study's
trained weights, and a layer the scan did not cover is refused."""

from __future__ import annotations

import pytest
import torch

from lab import RunConfig
from lab.pruning.report import sensitivity_study

CFG = RunConfig(workload="mlp", size="tiny", epochs=1, max_steps=8, latency_repeats=0, threads=1)


@pytest.fixture(scope="module")
def study():
    return sensitivity_study(CFG, amounts=(0.0, 0.5), layers=("Linear",))


def test_the_fine_tune_keeps_the_chosen_masks_and_trains(study):
    first, *rest = study.sizes
    scan = {(r["layer"], r["amount"]): r["metric"] for r in study.rows}
    res = study.finetuned({first: 0.5})
    assert res["sparsity"][first] == pytest.approx(0.5, abs=1e-3)  # the mask asked, read back after the fine-tune
    assert all(res["sparsity"][n] < 0.01 for n in rest)  # no other layer pruned
    assert res["metric_pruned"] == pytest.approx(scan[(first, 0.5)])  # the scan's model: the study's trained weights
    assert res["metric_finetuned"] != res["metric_pruned"]  # the fine-tune moved the weights
    assert study.sparsity({first: 0.5}) == pytest.approx(0.5 * study.sizes[first] / sum(study.sizes.values()), abs=1e-3)
    assert all(torch.equal(v, study.state[k]) for k, v in study.state.items())  # the study's weights are untouched


def test_a_layer_the_scan_did_not_cover_is_refused(study):
    with pytest.raises(ValueError, match="not scanned"):
        study.finetuned({"nowhere.weight": 0.5})
