"""The fault suite (issue 17; helpers in faults_common.py), user workloads that break the contract: raised before
training (API), one line and nothing stored (CLI), named with the rank under DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
from faults_common import assert_one_line, cli

from lab.config import (
    RunConfig,
)
from lab.store import ResultStore

WORKLOADS_SRC = '''
import torch
from torch import nn
from lab.workloads import Datasets, SizeSpec, Workload

SPEC = SizeSpec(n_train=256, n_test=128, batch_size=32, epochs=1, lr=1e-2)


def _data(width=8, n_test=128, label_hi=2, float_labels=False):
    def make_data(spec, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(spec.n_train + n_test, width, generator=g)
        y = torch.randint(0, label_hi, (len(x),), generator=g)
        y = y.float() if float_labels else y
        return Datasets(train=(x[:spec.n_train], y[:spec.n_train]), test=(x[spec.n_train:], y[spec.n_train:]))
    return make_data


def _accuracy(out, y):
    return {"accuracy": (out.argmax(1) == y).float().mean().item()}


def _wl(name, make_data, evaluate=_accuracy):
    return Workload(name=name, description="a broken workload for the fault suite", sizes=SPEC,
                    make_data=make_data, loss=nn.functional.cross_entropy, metric_name="accuracy", chance=0.5,
                    make_model=lambda spec: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
                    evaluate=evaluate)


def wrong_width(): return _wl("fault_wrong_width", _data(width=5))
def empty_test(): return _wl("fault_empty_test", _data(n_test=0))
def labels_out_of_range(): return _wl("fault_labels_out_of_range", _data(label_hi=7))
def float_labels(): return _wl("fault_float_labels", _data(float_labels=True))
def data_none(): return _wl("fault_data_none", lambda spec, seed: None)
def metric_missing(): return _wl("fault_metric_missing", _data(), evaluate=lambda out, y: {"acc": 0.5})


def _nan_in_test(spec, seed):
    d = _data()(spec, seed)
    d.test[0][5, 3] = float("nan")
    return d


def nan_in_test(): return _wl("fault_nan_in_test", _nan_in_test)
'''

WORKLOAD_FAULTS = [
    ("wrong_width", "fault_wrong_width", "cannot take a batch of the train split"),
    ("empty_test", "fault_empty_test", "the test split is empty"),
    ("labels_out_of_range", "fault_labels_out_of_range", "labels lie in [0, 6]"),
    ("float_labels", "fault_float_labels", "target [64] float32"),
    ("data_none", "fault_data_none", "make_data returned NoneType"),
    ("metric_missing", "fault_metric_missing", "without its metric_name 'accuracy'"),
    ("nan_in_test", "fault_nan_in_test", "the test split's input 1 holds 1 non-finite value(s) (NaN / inf), "
                                         "first in row(s) 5"),
]


@pytest.fixture(scope="session")
def broken_workloads(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("workloads") / "broken.py"
    path.write_text(WORKLOADS_SRC)
    return path


@pytest.mark.parametrize(("attr", "name", "needle"), WORKLOAD_FAULTS, ids=[a for a, _, _ in WORKLOAD_FAULTS])
def test_workload_contract_api_raises_before_training(attr, name, needle, broken_workloads):
    from lab import run

    events: list[dict] = []
    with pytest.raises(ValueError) as err:
        run(RunConfig(workload=f"{broken_workloads}:{attr}", size="tiny", latency_repeats=0), progress=events.append)
    msg = str(err.value)
    assert msg.startswith(f"workload {name!r}") and needle in msg and "\n" not in msg, msg
    assert not [e for e in events if e.get("phase") == "train"]  # refused before the first step


@pytest.mark.parametrize(("attr", "name", "needle"), WORKLOAD_FAULTS, ids=[a for a, _, _ in WORKLOAD_FAULTS])
def test_workload_contract_cli_is_one_line_exit_2_nothing_stored(attr, name, needle, broken_workloads, capsys,
                                                                 private_store):
    rc, _, err = cli(["run", "--workload", f"{broken_workloads}:{attr}", "--size", "tiny", "--no-progress"], capsys)
    assert rc == 2
    assert_one_line(err, f"workload {name!r}", needle)
    with ResultStore(private_store, read_only=True) as store:
        assert store.count() == 0


def test_workload_contract_under_ddp_names_the_workload_and_the_rank(broken_workloads, capsys, private_store):
    """Each spawned rank loads the spec and checks the contract: the same one-line error, exit 2, rank named."""
    rc, _, err = cli(["run", "--workload", f"{broken_workloads}:labels_out_of_range", "--size", "tiny",
                      "--world-size", "2", "--threads", "1", "--no-progress"], capsys)
    assert rc == 2
    line = assert_one_line(err, "raised ValueError: workload 'fault_labels_out_of_range'", "labels lie in [0, 6]")
    assert line.startswith("lab: error: rank ")
    with ResultStore(private_store, read_only=True) as store:
        assert store.count() == 0
