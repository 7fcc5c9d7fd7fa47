"""Shard files: a click log streamed into N Parquet files plus a manifest (rows, checksums, schema).

Why shards: one big file can be read by one reader at a time and cannot be split across ranks; N files let
each rank and worker own a subset, and a manifest lets every reader check, before training on it, that the
shard it got is the one that was written (row count + SHA-256). Every problem is one :class:`ShardError` line
naming the file and the field: a manifest that is not JSON, lacks a field or has one of the wrong type, lists
no shard (an empty manifest is refused, never zero rows), or names a shard that is missing, of another size, of
another checksum, of another row count or of another schema (a foreign Parquet file). Never a silent short
epoch: :class:`ShardReader` yields every row, the last batch partial unless ``drop_last=True``. Writing
streams ``generate_click_log`` in chunks, so a log of any size is written with one chunk in memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
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


class ShardError(RuntimeError, ValueError):
    """A manifest or a shard is unusable: the message names the file and the manifest field. A
    ``ValueError`` too (bad input data, as the CLI reports it) and a ``RuntimeError`` (as it always was)."""


#: Manifest fields per shard and their types (bool is refused where an int is expected).
SHARD_FIELDS: dict[str, type] = {"name": str, "rows": int, "first_row": int, "sha256": str, "nbytes": int}
#: Columns every ctr shard holds (what :func:`to_tensors` reads).
COLUMNS = ("row_id", "day", "user", "label", "dense", "cat")


def _type_name(value: object) -> str:
    return type(value).__name__


def _check_shard_entry(path: Path, k: int, entry: object, seen: set[str], next_row: int) -> ShardInfo:
    where = f"{path}: shards[{k}]"
    if not isinstance(entry, dict):
        raise ShardError(f"{where} must be an object with fields {', '.join(SHARD_FIELDS)}, got {_type_name(entry)}")
    for name, typ in SHARD_FIELDS.items():
        if name not in entry:
            raise ShardError(f"{where} is missing field {name!r}")
        value = entry[name]
        if not isinstance(value, typ) or isinstance(value, bool):
            kind = "an integer" if typ is int else "a string"
            raise ShardError(f"{where}.{name}={value!r} is invalid: must be {kind}, got {_type_name(value)}")
    unknown = sorted(set(entry) - set(SHARD_FIELDS))
    if unknown:
        raise ShardError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; fields: "
                         + ", ".join(SHARD_FIELDS))
    name = entry["name"]
    if not name or Path(name).name != name or name in (".", ".."):
        raise ShardError(f"{where}.name={name!r} is invalid: must be a file name inside {path.parent}")
    if name in seen:
        raise ShardError(f"{where}.name={name!r} is invalid: listed twice")
    seen.add(name)
    for field in ("rows", "nbytes"):
        if entry[field] < 1:
            raise ShardError(f"{where}.{field}={entry[field]} is invalid: must be >= 1")
    sha = entry["sha256"]
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ShardError(f"{where}.sha256={sha!r} is invalid: must be 64 lowercase hex digits")
    if entry["first_row"] != next_row:
        raise ShardError(f"{where}.first_row={entry['first_row']} is invalid: shards are contiguous, expected "
                         f"{next_row} (the rows of the shards before it)")
    return ShardInfo(name, entry["rows"], entry["first_row"], sha, entry["nbytes"])


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
        """Read and check ``root/manifest.json``: every problem is a :class:`ShardError` naming the file and
        the field (not JSON, a missing or mistyped field, no shards, non-contiguous rows, a duplicate name)."""
        root = Path(root)
        if root.is_file():
            raise ShardError(f"{root} is a file: give the folder that holds {MANIFEST}")
        path = root / MANIFEST
        if not path.is_file():
            raise ShardError(f"no {MANIFEST} in {root}: write the shards with write_ctr_shards first")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ShardError(f"{path} is not a manifest: not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise ShardError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        except OSError as exc:
            raise ShardError(f"{path} cannot be read: {exc.strerror}") from None
        if not isinstance(raw, dict):
            raise ShardError(f"{path} must hold a JSON object with fields shards, schema, meta; got {_type_name(raw)}")
        for field, typ in (("shards", list), ("schema", dict), ("meta", dict)):
            if field not in raw:
                raise ShardError(f"{path} is missing field {field!r}")
            if not isinstance(raw[field], typ):
                raise ShardError(f"{path}: field {field!r} must be a JSON {'array' if typ is list else 'object'}, "
                                 f"got {_type_name(raw[field])}")
        if not raw["shards"]:
            raise ShardError(f"{path}: field 'shards' is empty: a manifest listing no shard is refused (it would "
                             "read 0 rows)")
        bad = [k for k, v in raw["schema"].items() if not isinstance(v, str)]
        if bad:
            raise ShardError(f"{path}: schema[{bad[0]!r}] must be a type name string")
        seen: set[str] = set()
        infos, next_row = [], 0
        for k, entry in enumerate(raw["shards"]):
            info = _check_shard_entry(path, k, entry, seen, next_row)
            infos.append(info)
            next_row += info.rows
        return cls(tuple(infos), raw["schema"], raw["meta"])


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


def _type_key(type_name: str) -> str:
    """A Parquet round trip renames a list's item field (``item`` -> ``element``): compare types without it."""
    return re.sub(r"<\w+: ", "<", type_name)


def _field(info: ShardInfo, manifest: Manifest | None, field: str) -> str:
    k = manifest.shards.index(info) if manifest is not None and info in manifest.shards else None
    return f"{MANIFEST} field shards[{k}].{field}" if k is not None else f"{MANIFEST} field {field}"


def check_shard_file(root: str | Path, info: ShardInfo, manifest: Manifest | None = None) -> None:
    """Cheap checks before any read (a stat, no bytes): the shard exists and has the manifest's size."""
    path = Path(root) / info.name
    if not path.is_file():
        raise ShardError(f"shard {info.name} is missing from {root} ({_field(info, manifest, 'name')})")
    size = path.stat().st_size
    if size != info.nbytes:
        raise ShardError(f"shard {info.name} is {size} bytes but {_field(info, manifest, 'nbytes')} says "
                         f"{info.nbytes}: truncated or replaced")


def read_shard(store: EmulatedStore, info: ShardInfo, *, verify: bool = True,
               manifest: Manifest | None = None) -> dict[str, np.ndarray]:
    """One shard's columns as numpy arrays, read through ``store`` (its latency and bandwidth apply). Checked
    against the manifest: SHA-256 (``verify``), row count, and the columns and types of ``manifest.schema``."""
    try:
        data = store.read_bytes(info.name)
    except FileNotFoundError:
        raise ShardError(f"shard {info.name} is missing from {store.root} ({_field(info, manifest, 'name')})") from None
    if verify and hashlib.sha256(data).hexdigest() != info.sha256:
        raise ShardError(f"shard {info.name} is corrupted: its SHA-256 does not match "
                         f"{_field(info, manifest, 'sha256')}")
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"shard {info.name} cannot be parsed as Parquet: {str(exc).splitlines()[0]}") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ShardError(f"shard {info.name} lacks column {missing[0]!r} (a foreign Parquet file? a ctr shard holds "
                         f"{', '.join(COLUMNS)})")
    if manifest is not None:
        for f in table.schema:
            want = manifest.schema.get(f.name)
            if want is not None and _type_key(str(f.type)) != _type_key(want):
                raise ShardError(f"shard {info.name} column {f.name!r} is {f.type}, but {MANIFEST} field "
                                 f"schema[{f.name!r}] says {want}")
    if table.num_rows != info.rows:
        raise ShardError(f"shard {info.name} has {table.num_rows} rows, but {_field(info, manifest, 'rows')} says "
                         f"{info.rows}")
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
    then slices. ``shard_ids`` is the subset this rank/worker owns (see :mod:`lab.data.sharding`).

    Every row is yielded once per pass: batches run across shard boundaries (a shard's tail fills the next
    batch with the next shard's head) and the last batch is partial unless ``drop_last=True``, which drops
    that one short batch (``len(reader)`` counts what is yielded). The manifest and each owned shard's
    existence and size are checked here, before any read; checksums, row counts and schema at each read."""

    def __init__(self, root: str | Path, batch_size: int, *, storage: str | StoragePreset = "network_fs",
                 shard_ids: list[int] | None = None, verify: bool = True, drop_last: bool = False) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: must be an integer >= 1")
        self.manifest = Manifest.load(root)
        self.store = EmulatedStore(root, storage)
        self.batch_size, self.verify, self.drop_last = batch_size, verify, drop_last
        n = len(self.manifest.shards)
        self.shard_ids = list(range(n)) if shard_ids is None else list(shard_ids)
        for k in self.shard_ids:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n:
                raise ValueError(f"shard_ids contains {k!r}: must be shard indices in 0..{n - 1} "
                                 f"({Path(root) / MANIFEST} lists {n})")
        if len(set(self.shard_ids)) != len(self.shard_ids):
            raise ValueError(f"shard_ids={self.shard_ids} is invalid: a shard listed twice would be read twice")
        for k in self.shard_ids:
            check_shard_file(root, self.manifest.shards[k], self.manifest)

    @property
    def rows(self) -> int:
        """Rows one pass reads (before ``drop_last``)."""
        return sum(self.manifest.shards[k].rows for k in self.shard_ids)

    def __len__(self) -> int:
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        bs = self.batch_size
        carry: tuple[torch.Tensor, ...] | None = None  # the previous shard's tail, fewer than bs rows
        for k in self.shard_ids:
            cols = to_tensors(read_shard(self.store, self.manifest.shards[k], verify=self.verify,
                                         manifest=self.manifest))
            start = 0
            if carry is not None:
                start = min(bs - len(carry[0]), len(cols[0]))
                carry = tuple(torch.cat([c, t[:start]]) for c, t in zip(carry, cols, strict=True))
                if len(carry[0]) < bs:
                    continue
                yield carry
                carry = None
            n = len(cols[0])
            end = start + (n - start) // bs * bs
            for i in range(start, end, bs):
                yield tuple(t[i:i + bs] for t in cols)
            if end < n:
                carry = tuple(t[end:] for t in cols)
        if carry is not None and not self.drop_last:
            yield carry
