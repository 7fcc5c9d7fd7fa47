"""Checkpoint and mid-epoch resume: ``--checkpoint-every N`` and ``--resume RUN_ID_OR_PATH``.

Why the loader state is part of it: resuming a killed run from its weights alone restarts the epoch, so the
samples before the kill are seen twice and the run is not the one it would have been. Every lab loader walks
an order fixed by (seed, epoch) (:class:`lab.data.ShuffledBatchSampler`,
:class:`lab.data.fileloaders.ShardedBatchSampler`), so the loader state is two integers: the epoch and the
batches already consumed in it. On resume the loop calls ``loader.skip(batches)`` and the epoch continues
where it stopped, every sample once. (torchdata's ``StatefulDataLoader`` stores the same thing for a
DataLoader; the lab's samplers make it unnecessary, and one mechanism serves every loader, threads and worker
processes alike.)

What a checkpoint holds: model, optimizer and GradScaler state, the torch / numpy / Python RNG states, the step,
epoch and position, the losses so far and the run's config (a resume with another config is refused). It is
written with ``torch.save`` to a temporary file that is then renamed over ``latest.pt`` (a kill mid-write
leaves the previous checkpoint intact), and read with ``torch.load(weights_only=True)``: only tensors and plain
containers, no pickled code. Folder: ``<results folder>/checkpoints/<run id>/``, next to the results database.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lab.store import default_store_path

CHECKPOINT_FORMAT = 1
LATEST = "latest.pt"
#: Config fields that may differ between a run and its resume (they say how to run, not what is trained).
RESUME_FREE_FIELDS = ("checkpoint_every", "resume")


def checkpoints_root() -> Path:
    """``<results folder>/checkpoints``: beside the results database (``$LAB_RESULTS_DB`` or ``results/``)."""
    return default_store_path().parent / "checkpoints"


def resolve_checkpoint(ref: str) -> Path:
    """A checkpoint file from ``--resume``: a ``.pt`` file, a folder holding ``latest.pt``, or a run id (or a
    unique prefix of one) under :func:`checkpoints_root`. A missing one is a one-line ``ValueError``."""
    path = Path(ref).expanduser()
    for candidate in (path, path / LATEST, checkpoints_root() / ref / LATEST):
        if candidate.is_file():
            return candidate
    root = checkpoints_root()
    matches = sorted(p for p in root.glob(f"{ref}*/{LATEST}")) if root.is_dir() and Path(ref).name == ref else []
    if len(matches) == 1:  # a unique prefix of a run id, as the run's summary prints it
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"resume={ref!r} is invalid: it is the prefix of {len(matches)} run ids under {root}; "
                         "give more of the id")
    raise ValueError(f"resume={ref!r} is invalid: no checkpoint file, folder with {LATEST}, or run id under "
                     f"{checkpoints_root()} (write one with --checkpoint-every N)")


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in RESUME_FREE_FIELDS}


def load_checkpoint(path: str | Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint at ``path`` (weights_only: no code is unpickled); with ``config``, refused unless it
    trained the same config (fields listed in the error)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file is one line, not a traceback
        raise ValueError(f"resume: {path} is not a readable lab checkpoint: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"resume: {path} is not a lab checkpoint (format {CHECKPOINT_FORMAT})")
    if config is not None:
        saved, now = _comparable(json.loads(state["config"])), _comparable(config)
        diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if diff:
            raise ValueError(f"resume: {path} was written by another config (differs in {', '.join(diff)}); "
                             "resume with the flags the run was started with")
    return state


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
            "numpy": [name, int(pos), int(has_gauss), float(cached)], "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0]}


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    name, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, rng["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate((rng["python_version"], tuple(rng["python"]), None))


class Checkpointer:
    """The loop's checkpoint hook (:class:`lab.loop.Checkpointer`): ``restore`` at the start of a fit, ``save``
    every ``every`` steps. ``folder`` is where this run writes; ``resume_from`` a checkpoint to continue."""

    def __init__(self, *, config: dict[str, Any], folder: Path | None, every: int | None,
                 resume_from: Path | None = None) -> None:
        self.config, self.folder, self.every, self.resume_from = config, folder, every, resume_from
        self.saved = 0
        self.start_step = 0

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer, policy: Any) -> tuple[int, list[float]]:
        """Load the resume checkpoint into ``model`` / ``optimizer`` / the policy's scaler and the RNGs;
        returns (steps already done, their losses). (0, []) when not resuming."""
        if self.resume_from is None:
            return 0, []
        state = load_checkpoint(self.resume_from, self.config)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler = getattr(policy, "scaler", None)
        if state.get("scaler") is not None:
            if scaler is None:
                raise ValueError(f"resume: {self.resume_from} holds a GradScaler state but this run has no scaler")
            scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"])
        self.start_step = int(state["step"])
        return self.start_step, [float(x) for x in state["losses"].tolist()]

    def due(self, step: int) -> bool:
        """Whether :meth:`save` writes after ``step`` steps (the loop reads pending losses first)."""
        return self.folder is not None and bool(self.every) and step % self.every == 0

    def save(self, *, step: int, epoch: int, batches_done: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             policy: Any, losses: list[float]) -> Path | None:
        """Write ``latest.pt`` atomically (temporary file + rename) when ``step`` is a multiple of ``every``."""
        if not self.due(step):
            return None
        scaler = getattr(policy, "scaler", None)
        state = {"format": CHECKPOINT_FORMAT, "step": step, "epoch": epoch, "batches_done": batches_done,
                 "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict() if scaler is not None else None, "rng": _rng_state(),
                 "losses": torch.tensor(losses, dtype=torch.float64), "config": json.dumps(self.config)}
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".latest.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.folder / LATEST)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.saved += 1
        return self.folder / LATEST

    def describe(self) -> dict[str, Any]:
        return {"folder": str(self.folder) if self.folder else None, "every": self.every, "saved": self.saved,
                "resumed_from": str(self.resume_from) if self.resume_from else None, "start_step": self.start_step}
