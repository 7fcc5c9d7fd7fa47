"""The fault suite (issue 17; helpers in faults_common.py), CLI flags: a bad flag, a technique this machine cannot run,
a broken ``lab.workloads`` entry, a bad ``--out``, model-dependent names: one line, exit 2, before any work."""

from __future__ import annotations

import pytest
from faults_common import CUDA, assert_one_line, cli

from lab.store import ResultStore

CLI_BAD = [
    (["run", "--batch-size", "0"], "batch_size=0 is invalid"),
    (["run", "--batch-size", "many"], "--batch-size"),
    (["run", "--lr", "nan"], "lr=nan"),
    (["run", "--lr", "inf"], "lr=inf"),
    (["run", "--lr", "-1"], "lr=-1.0"),
    (["run", "--epochs", "x"], "--epochs"),
    (["run", "--seed", "-1"], "seed=-1"),
    (["run", "--size", "huge"], "size='huge'"),
    (["run", "--optimizer", "lion"], "optimizer='lion'"),
    (["run", "--device", "tpu"], "device='tpu'"),
    (["run", "--threads", "4096"], "threads=4096"),
    (["run", "--max-steps", "2", "--warmup-steps", "5"], "warmup_steps=5"),
    (["run", "--prune-amount", "0.5"], "prune.amount=0.5 is invalid: needs prune.method"),
    (["run", "--prune-layers", "fc"], "prune.layers=('fc',) is invalid: needs prune.method"),
    (["run", "--precision-fp32-modules", "fc"], "precision.fp32_modules=('fc',) is invalid: needs precision.dtype"),
    (["run", "--quant-observer", "minmax"], "quant.observer='minmax' is invalid: needs quant.method"),
    (["run", "--ddp-timeout-s", "5"], "ddp.timeout_s=5.0 is invalid: needs ddp.world_size"),
    (["run", "--ddp-bucket-cap-mb", "1"], "ddp.bucket_cap_mb=1.0 is invalid: needs ddp.world_size"),
    (["run", "--num-workers", "2"], "data.loader='memory' is invalid"),
    (["run", "--loader", "naive", "--num-workers", "2"], "data.num_workers=2"),
    (["run", "--data-storage", "network_fs"], "data.storage='network_fs'"),
    (["run", "--loader", "warp"], "--loader"),
    (["run", "--pin-memory=yes"], "--pin-memory"),
    (["run", "--world-size", "4097"], "ddp.world_size=4097"),
    (["run", "--workload", "no/such/file.py:make"], "no/such/file.py:make"),
    (["runs", "--limit", "0"], "--limit 0"),
    (["ablate", "--repeats", "0"], "repeats=0"),
    (["ablate", "--seeds", "0"], "seeds=0"),
    (["ablate", "--budget-pt", "nan"], "budget-pt=nan"),
    (["ablate", "--budget-pt", "-1"], "budget-pt=-1.0"),
    (["ablate", "--techniques", "warp_drive"], "warp_drive"),
    (["ablate", "--threads", "4096"], "threads=4096"),
    (["ablate", "--workload", "imagenet"], "workload='imagenet'"),
    (["run", "--workload", "imagenet"], "workload='imagenet' is invalid"),
    (["run", "--precision", "fp8"], "precision.dtype='fp8'"),
    (["run", "--loader", "thread", "--data-prefetch-depth", "0"], "data.prefetch_depth=0"),
    (["run", "--world-size", "0", "--size", "tiny"], "ddp.world_size=0"),
    (["run", "--prune", "structured_channels", "--prune-amount", "1.5", "--size", "tiny"], "prune.amount=1.5"),
    (["run", "--no-such-flag"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
    (["ablate", "--size", "huge"], "size='huge' is invalid"),  # the config's own flag and check
    (["ablate", "--recipe", "nope", "--size", "tiny"], "nope"),
    ([], "required"),
    (["bench", "--only", "nope"], "unknown benchmark"),
]


@pytest.mark.parametrize(("argv", "needle"), CLI_BAD, ids=[" ".join(a) or "(no command)" for a, _ in CLI_BAD])
def test_cli_bad_flag_is_one_line_exit_2_before_any_work(argv, needle, capsys, no_work, private_store):
    rc, _, err = cli([*argv, "--no-progress"] if argv[:1] == ["run"] else argv, capsys)
    assert rc == 2
    assert_one_line(err, needle)
    assert not private_store.exists()  # refused before the store was opened: nothing written


@pytest.mark.skipif(CUDA, reason="a CUDA machine runs these")
@pytest.mark.parametrize(("argv", "needle"), [
    (["--device", "cuda"], "CUDA is not available"),
    (["--world-size", "2", "--ddp-backend", "nccl"], "NCCL needs CUDA"),
])
def test_cli_technique_this_machine_cannot_run_is_refused(argv, needle, capsys, no_work):
    rc, _, err = cli(["run", "--size", "tiny", "--threads", "1", "--no-store", "--no-progress", *argv], capsys)
    assert rc == 2
    assert_one_line(err, needle)


def test_cli_broken_lab_workloads_entry_is_one_line(monkeypatch, capsys, no_work):
    import lab.workloads.spec as spec

    monkeypatch.setenv("LAB_WORKLOADS", "no_such_module_anywhere:make")
    monkeypatch.setattr(spec, "_environment_loaded", False)
    rc, _, err = cli(["run", "--size", "tiny", "--no-store", "--no-progress"], capsys)
    assert rc == 2
    assert_one_line(err, "LAB_WORKLOADS", "no_such_module_anywhere")


def test_cli_bench_out_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "results.json"
    target.write_text("{}")
    rc, _, err = cli(["bench", "--out", str(target)], capsys)
    assert rc == 2
    assert_one_line(err, str(target), "is a file")
    assert target.read_text() == "{}"


# Model-dependent names and calibration batches: checked by the pruning, precision and quantization
# packages' preflight(ctx, model) verbs, before any training (they used to fail after training, exit 1 with
# an error row, and 100000 calibration batches ran with the 32 there were).
MODEL_NAMES = [
    pytest.param(["--prune", "l1_unstructured", "--prune-amount", "0.5", "--prune-layers", "nosuch"], "nosuch",
                 id="prune-layers-nosuch"),
    pytest.param(["--precision", "bf16", "--precision-fp32-modules", "nosuch"], "nosuch",
                 id="fp32-modules-nosuch"),
    pytest.param(["--quant", "static", "--quant-calibration-batches", "100000"], "calibration_batches",
                 id="calibration-batches-100000"),
]


@pytest.mark.parametrize(("argv", "needle"), MODEL_NAMES)
def test_cli_model_dependent_name_is_refused_before_training(argv, needle, capsys, private_store):
    rc, _, err = cli(["run", "--workload", "ctr", "--size", "tiny", "--max-steps", "5", "--warmup-steps", "1",
                      "--latency-repeats", "0", "--no-progress", *argv], capsys)
    assert rc == 2, err
    assert_one_line(err, needle)
    with ResultStore(private_store, read_only=True) as store:
        assert store.count() == 0  # refused before training: no error row
