"""Shard files: a click log streamed into N Parquet files plus a manifest (rows, checksums, schema).

Why shards: one big file can be read by one reader at a time and cannot be split across ranks; N files let
each rank and worker own a subset, and a manifest lets every reader check, before training on it, that the
shard it got is the one that was written (row count + SHA-256). A missing or corrupted shard raises
:class:`ShardError` naming the shard, never a silent short epoch. Writing streams ``generate_click_log`` in
chunks, so a log of any size is written with one chunk in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lab.data.storage import EmulatedStore, StoragePreset
from lab.workloads.ctr import CHUNK_ROWS, criteo_like_vocab, generate_click_log, preprocess_dense

MANIFEST = "manifest.json"


class ShardError(RuntimeError):
    """A shard is missing, truncated or does not match its manifest checksum."""


@dataclass(frozen=True)
class ShardInfo:
    name: str
    rows: int
    first_row: int
    sha256: str
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    shards: tuple[ShardInfo, ...]
    schema: dict[str, str]
    meta: dict

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @classmethod
    def load(cls, root: str | Path) -> Manifest:
        path = Path(root) / MANIFEST
        if not path.exists():
            raise ShardError(f"no {MANIFEST} in {root}: write the shards with write_ctr_shards first")
        raw = json.loads(path.read_text())
        return cls(tuple(ShardInfo(**s) for s in raw["shards"]), raw["schema"], raw["meta"])


def _table(log: dict[str, np.ndarray]) -> pa.Table:
    # Fixed-size list columns keep dense/cat as 2-D blocks: one column read, one reshape, no per-row work.
    n_dense, n_cat = log["dense"].shape[1], log["cat"].shape[1]
    return pa.table({
        "row_id": log["row_id"], "day": log["day"], "user": log["user"], "label": log["label"],
        "dense": pa.FixedSizeListArray.from_arrays(pa.array(log["dense"].ravel()), n_dense),
        "cat": pa.FixedSizeListArray.from_arrays(pa.array(log["cat"].ravel()), n_cat),
    })


def write_ctr_shards(root: str | Path, n_rows: int, n_shards: int, *, seed: int = 0, max_vocab: int = 1_000,
                     n_dense: int = 13, n_cat: int = 26, chunk_rows: int = CHUNK_ROWS) -> Manifest:
    """Stream rows ``[0, n_rows)`` of the ``ctr`` click log into ``n_shards`` contiguous Parquet shards
    (in log order, i.e. by time) and write the manifest. Memory: one chunk of ``chunk_rows`` rows."""
    if n_shards < 1 or n_rows < n_shards:
        raise ValueError(f"n_shards={n_shards!r} is invalid: must be in 1..n_rows ({n_rows})")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    vocab = criteo_like_vocab(max_vocab, n_cat)
    bounds = np.linspace(0, n_rows, n_shards + 1).round().astype(int)
    infos, schema = [], {}
    for k in range(n_shards):
        name, lo, hi = f"shard-{k:05d}.parquet", int(bounds[k]), int(bounds[k + 1])
        writer = None
        for start in range(lo, hi, chunk_rows):
            table = _table(generate_click_log(start, min(chunk_rows, hi - start), seed=seed, n_dense=n_dense,
                                              n_cat=n_cat, vocab=vocab))
            writer = writer or pq.ParquetWriter(root / name, table.schema)
            writer.write_table(table)
            schema = {f.name: str(f.type) for f in table.schema}
        writer.close()
        data = (root / name).read_bytes()
        infos.append(ShardInfo(name, hi - lo, lo, hashlib.sha256(data).hexdigest(), len(data)))
    meta = {"workload": "ctr", "seed": seed, "max_vocab": max_vocab, "n_dense": n_dense, "n_cat": n_cat,
            "order": "time"}
    (root / MANIFEST).write_text(json.dumps({"shards": [s.__dict__ for s in infos], "schema": schema,
                                             "meta": meta}, indent=1))
    return Manifest(tuple(infos), schema, meta)


def read_shard(store: EmulatedStore, info: ShardInfo, *, verify: bool = True) -> dict[str, np.ndarray]:
    """One shard's columns as numpy arrays, read through ``store`` (its latency and bandwidth apply)."""
    try:
        data = store.read_bytes(info.name)
    except FileNotFoundError:
        raise ShardError(f"shard {info.name} is missing from {store.root}") from None
    if verify and hashlib.sha256(data).hexdigest() != info.sha256:
        raise ShardError(f"shard {info.name} is corrupted: its SHA-256 does not match the manifest")
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"shard {info.name} cannot be parsed: {exc}") from exc
    if table.num_rows != info.rows:
        raise ShardError(f"shard {info.name} has {table.num_rows} rows, manifest says {info.rows}")
    out = {c: np.array(table.column(c).to_numpy()) for c in ("row_id", "day", "user", "label")}
    for c in ("dense", "cat"):
        col = table.column(c).combine_chunks()
        out[c] = np.array(col.values.to_numpy()).reshape(len(col), -1)  # writable copy
    return out


def to_tensors(cols: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense, cat, label) exactly as the ``ctr`` workload feeds its model."""
    return preprocess_dense(cols["dense"]), torch.from_numpy(cols["cat"]), torch.from_numpy(cols["label"])


class ShardReader:
    """Streams batches from a list of shards: one storage read per shard (batched reads, never per row),
    then slices. ``shard_ids`` is the subset this rank/worker owns (see :mod:`lab.data.sharding`)."""

    def __init__(self, root: str | Path, batch_size: int, *, storage: str | StoragePreset = "network_fs",
                 shard_ids: list[int] | None = None, verify: bool = True) -> None:
        self.manifest = Manifest.load(root)
        self.store = EmulatedStore(root, storage)
        self.batch_size, self.verify = batch_size, verify
        self.shard_ids = list(range(len(self.manifest.shards))) if shard_ids is None else list(shard_ids)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for k in self.shard_ids:
            dense, cat, label = to_tensors(read_shard(self.store, self.manifest.shards[k], verify=self.verify))
            for i in range(0, len(label) - self.batch_size + 1, self.batch_size):
                yield dense[i:i + self.batch_size], cat[i:i + self.batch_size], label[i:i + self.batch_size]
