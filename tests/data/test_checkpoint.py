"""Checkpoint and mid-epoch resume: a run killed with SIGKILL and resumed sees every sample of the epoch
exactly once and ends bit-identical to an uninterrupted run (CPU, one thread, same seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lab
from lab.config import DataConfig, RunConfig
from lab.data.checkpoint import LATEST, Checkpointer, checkpoints_root, load_checkpoint, resolve_checkpoint

ROOT = Path(__file__).resolve().parents[2]

# The child trains through lab.run, logs every batch the sampler hands out, and SIGKILLs itself mid-epoch.
CHILD = r"""
import json, os, signal, sys
import lab
from lab.config import RunConfig
from lab.data.fileloaders import ShardedBatchSampler

cfg, trace_path, kill_at = RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], int(sys.argv[3])
trace = open(trace_path, "a")
plain = ShardedBatchSampler.__iter__

def logged(self):
    for epoch, idx in plain(self):
        trace.write(json.dumps([epoch, idx.tolist()]) + "\n")
        trace.flush()
        yield epoch, idx

ShardedBatchSampler.__iter__ = logged

def progress(event):
    if event.get("phase") == "train" and event["step"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

result = lab.run(cfg, progress=progress)
print(json.dumps({"metric": result.metric, "losses": result.losses, "checkpoint": result.details.get("checkpoint")}))
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))


def _cfg(**kw) -> RunConfig:
    base = dict(workload="sequence", size="tiny", epochs=2, device="cpu", threads=1, latency_repeats=0,
                data=DataConfig(source="files", loader="naive"))
    return RunConfig(**{**base, **kw})


def _child(cfg: RunConfig, trace: Path, kill_at: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg.to_dict()), str(trace), str(kill_at)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def _trace(path: Path) -> list[tuple[int, list[int]]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]


def test_sigkill_mid_epoch_then_resume_sees_each_sample_once_and_matches(tmp_path):
    # sequence/tiny: 2,048 rows, batch 64 -> 32 steps an epoch. Checkpoints every 5 steps; killed at step 43,
    # i.e. epoch 1, batch 11: the last checkpoint is step 40 (epoch 1, batch 8); 3 steps are redone.
    killed = _child(_cfg(checkpoint_every=5), tmp_path / "killed.jsonl", kill_at=43)
    assert killed.returncode == -9, killed.stderr[-2000:]
    (folder,) = list(checkpoints_root().iterdir())
    state = load_checkpoint(folder / LATEST)
    assert (state["step"], state["epoch"], state["batches_done"]) == (40, 1, 8)

    resumed = _child(_cfg(resume=folder.name[:8]), tmp_path / "resumed.jsonl", kill_at=-1)  # by run id prefix
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out["checkpoint"]["start_step"] == 40

    before = [idx for epoch, idx in _trace(tmp_path / "killed.jsonl") if epoch == 1][:state["batches_done"]]
    after = [idx for epoch, idx in _trace(tmp_path / "resumed.jsonl") if epoch == 1]
    seen = [i for idx in before + after for i in idx]
    assert len(after) == 32 - 8 and sorted(seen) == list(range(2048))  # every sample of the epoch, once
    assert all(epoch == 1 for epoch, _ in _trace(tmp_path / "resumed.jsonl"))  # epoch 0 was not re-read

    reference = lab.run(_cfg())  # uninterrupted, same seed: bit-identical losses and metric
    assert out["losses"] == reference.losses and len(out["losses"]) == 64
    assert out["metric"] == reference.metric


def test_checkpoint_round_trip_is_weights_only_and_atomic(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    cfg = _cfg().to_dict()
    ck = Checkpointer(config=cfg, folder=tmp_path / "run", every=2)
    assert ck.save(step=1, epoch=0, batches_done=1, model=model, optimizer=opt, policy=None, losses=[1.0]) is None
    path = ck.save(step=2, epoch=0, batches_done=2, model=model, optimizer=opt, policy=None, losses=[1.0, 0.5])
    assert path == tmp_path / "run" / LATEST and [p.name for p in path.parent.iterdir()] == [LATEST]
    torch.load(path, weights_only=True)  # no pickled code needed
    twin, twin_opt = torch.nn.Linear(3, 2), None
    twin_opt = torch.optim.Adam(twin.parameters(), lr=0.1)
    torch.manual_seed(123)
    step, losses = Checkpointer(config=cfg, folder=None, every=None, resume_from=path).restore(twin, twin_opt, None)
    assert (step, losses) == (2, [1.0, 0.5])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values(), strict=True))
    assert twin_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_resume_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="resume='nope' is invalid: no checkpoint file"):
        resolve_checkpoint("nope")
    model = torch.nn.Linear(2, 2)
    ck = Checkpointer(config=_cfg().to_dict(), folder=tmp_path, every=1)
    path = ck.save(step=1, epoch=0, batches_done=1, model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1),
                   policy=None, losses=[0.0])
    with pytest.raises(ValueError, match="written by another config .*seed"):
        load_checkpoint(path, _cfg(seed=3).to_dict())
    load_checkpoint(path, _cfg(resume=str(path)).to_dict())  # resume / checkpoint_every may differ
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable lab checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="checkpoint_every=2 is invalid: is not supported with pruning"):
        RunConfig(workload="sequence", checkpoint_every=2, prune=lab.config.PruneConfig(method="l1_unstructured",
                                                                                         amount=0.5))


def test_cli_resume_of_a_missing_checkpoint_exits_2(capsys):
    """In process (``lab.cli.main``, what ``python -m lab`` calls, whose exit status in a real process
    tests/core/test_cli.py checks): exit 2, the reason, no traceback."""
    from lab.cli import main

    assert main(["run", "--workload", "sequence", "--size", "tiny", "--resume", "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint file" in err and "Traceback" not in err


def test_a_resume_that_adds_no_step_still_prints():
    from lab.result import RunResult, format_result

    r = RunResult(run_id="r" * 32, config=_cfg().to_dict(), env={}, steps=64, warmup_steps=3,
                  details={"checkpoint": {"resumed_from": "x.pt", "start_step": 64, "saved": 0}})
    assert "resumed from x.pt at step 64" in format_result(r)
