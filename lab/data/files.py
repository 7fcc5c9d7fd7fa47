"""The file-backed source (``data.source="files"``): a run's training split written once to shard files, then
every loader reads and decodes those files instead of slicing tensors.

Why files: with in-memory tensors a loader costs a slice, so no loader choice can matter except for the
emulated storage wait. Real training reads files and *decodes* them, which is CPU work that competes with
compute for the same cores; that trade-off (loader workers against compute threads) only appears here.

Formats, chosen for what each workload's data is:

* images (a workload whose ``info`` carries ``normalise_mean`` / ``normalise_std``, i.e. ``vision``): each
  sample is a PNG (lossless, so the decode equals the uint8 source exactly) plus a ``cls`` label, in tar
  shards in the WebDataset layout (``000123.png``, ``000123.cls``), written with ``webdataset.TarWriter``
  and parsed with webdataset's tar iterator; decoded per sample with Pillow (:mod:`.decode`).
* everything else (``ctr``, ``sequence``, a user's map-style ``Dataset``, already stacked by
  :class:`lab.workloads.Datasets`): Parquet, one column per tensor (a fixed-size list per row for a
  tensor of more than one dimension), so the round trip is bit-exact.

The folder is ``$LAB_CACHE_DIR/files/<workload>-<key>``: the key hashes the data's bytes and the settings
(format version, rows per shard), so a changed split or setting writes a new folder and an unchanged one is
reused. A folder is written under a temporary name and renamed into place, so a killed writer never leaves a
half-written set that a later run would trust. The manifest (:class:`lab.data.shards.Manifest`) lists each
shard's rows, bytes and SHA-256; a reader checks them at every read (:class:`FileSet`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lab.data.shards import MANIFEST, Manifest, ShardError, ShardInfo, check_shard_file
from lab.data.storage import EmulatedStore, StoragePreset

#: Bump when the on-disk layout changes: old folders are then never read as new ones.
FORMAT_VERSION = 1
#: Rows per shard. Images: 64 PNGs (~20 kB) per tar, so a shard is a couple of batches and the per-request
#: latency of remote storage is paid per shard, as with real tar shards. Parquet: ~1 MB per shard.
IMAGE_ROWS_PER_SHARD = 64
PARQUET_SHARD_BYTES = 1 << 20


def cache_root() -> Path:
    """``$LAB_CACHE_DIR/files`` (default ``~/.cache/lab/files``): where written shard sets live."""
    return Path(os.environ.get("LAB_CACHE_DIR") or Path.home() / ".cache" / "lab") / "files"


def is_image_split(info: dict[str, Any], tensors: tuple[torch.Tensor, ...]) -> bool:
    """Image data the lab can encode as PNG: normalised [N, C, H, W] floats with C in (1, 3), integer labels."""
    x = tensors[0]
    return ("normalise_mean" in info and "normalise_std" in info and len(tensors) == 2 and x.dim() == 4
            and x.shape[1] in (1, 3) and not tensors[1].is_floating_point())


def to_uint8(x: torch.Tensor, mean: float, std: float) -> np.ndarray:
    """Undo the workload's normalisation: the uint8 pixels [N, H, W(, C)] that are written as PNG."""
    u8 = (x * std + mean).mul(255.0).round().clamp(0, 255).to(torch.uint8)
    u8 = u8.permute(0, 2, 3, 1)
    return (u8[..., 0] if u8.shape[-1] == 1 else u8).numpy()


def _fingerprint(tensors: tuple[torch.Tensor, ...], settings: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class FileSet:
    """A written, checked shard set: its folder, manifest, and how to turn a shard's bytes into rows."""

    root: Path
    manifest: Manifest

    @property
    def kind(self) -> str:
        return self.manifest.meta["format"]

    @property
    def rows(self) -> int:
        return self.manifest.rows

    @property
    def shard_rows(self) -> list[int]:
        return [s.rows for s in self.manifest.shards]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.manifest.shards)

    def store(self, storage: str | StoragePreset) -> EmulatedStore:
        return EmulatedStore(self.root, storage)

    def read(self, store: EmulatedStore, k: int) -> list | tuple[np.ndarray, ...]:
        """Shard ``k`` through ``store`` (its latency and bandwidth apply), checked against the manifest:
        for images, ``[(png bytes, label), ...]``; for Parquet, one array per tensor (rows first)."""
        info = self.manifest.shards[k]
        try:
            data = store.read_bytes(info.name)
        except FileNotFoundError:
            raise ShardError(f"shard {info.name} is missing from {self.root} ({MANIFEST} field "
                             f"shards[{k}].name)") from None
        if hashlib.sha256(data).hexdigest() != info.sha256:
            raise ShardError(f"shard {self.root / info.name} is corrupted: its SHA-256 does not match {MANIFEST} "
                             f"field shards[{k}].sha256 (delete {self.root} to rewrite it)")
        rows = _parse_tar(data, info) if self.kind == "tar" else _parse_parquet(data, info, self.manifest.meta)
        if len(rows if self.kind == "tar" else rows[0]) != info.rows:
            raise ShardError(f"shard {info.name} holds {len(rows)} rows, but {MANIFEST} field shards[{k}].rows "
                             f"says {info.rows}")
        return rows


def _parse_tar(data: bytes, info: ShardInfo) -> list[tuple[bytes, int]]:
    from webdataset.tariterators import base_plus_ext, tar_file_iterator

    try:
        samples: dict[str, dict[str, bytes]] = {}
        for item in tar_file_iterator(io.BytesIO(data)):  # webdataset's tar stream parser, member by member
            key, ext = base_plus_ext(item["fname"])
            samples.setdefault(key, {})[ext] = item["data"]
        return [(s["png"], int(s["cls"])) for s in samples.values()]
    except Exception as exc:  # noqa: BLE001 - any parse failure of a checksummed shard is one clear line
        raise ShardError(f"shard {info.name} cannot be read as a WebDataset tar: {exc!r}") from None


def _parse_parquet(data: bytes, info: ShardInfo, meta: dict) -> tuple[np.ndarray, ...]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"shard {info.name} cannot be parsed as Parquet: {str(exc).splitlines()[0]}") from None
    out = []
    for k, (dtype, shape) in enumerate(zip(meta["dtypes"], meta["shapes"], strict=True)):
        col = table.column(f"t{k}").combine_chunks()
        flat = col.values.to_numpy(zero_copy_only=False) if shape else col.to_numpy(zero_copy_only=False)
        out.append(np.array(flat, dtype=np.dtype(dtype)).reshape(len(col), *shape))
    return tuple(out)


def _write_tar(tmp: Path, tensors: tuple[torch.Tensor, ...], info: dict, rows_per_shard: int) -> tuple[list, dict]:
    from PIL import Image
    from webdataset import TarWriter

    mean, std = float(info["normalise_mean"]), float(info["normalise_std"])
    images, labels = to_uint8(tensors[0], mean, std), tensors[1].numpy()
    shards = []
    for k, lo in enumerate(range(0, len(images), rows_per_shard)):
        name = f"shard-{k:05d}.tar"
        with open(tmp / name, "wb") as f, TarWriter(f, encoder=False, mtime=0, format=tarfile.USTAR_FORMAT) as sink:
            for i in range(lo, min(lo + rows_per_shard, len(images))):
                buf = io.BytesIO()
                Image.fromarray(images[i]).save(buf, format="PNG")
                sink.write({"__key__": f"{i:06d}", "png": buf.getvalue(), "cls": str(int(labels[i])).encode()})
        shards.append((name, lo, min(lo + rows_per_shard, len(images))))
    meta = {"format": "tar", "normalise_mean": mean, "normalise_std": std,
            "image_shape": list(tensors[0].shape[1:]), "label_dtype": str(labels.dtype)}
    return shards, meta


def _write_parquet(tmp: Path, tensors: tuple[torch.Tensor, ...], rows_per_shard: int) -> tuple[list, dict]:
    arrays = [t.contiguous().numpy() for t in tensors]
    shards = []
    for k, lo in enumerate(range(0, len(arrays[0]), rows_per_shard)):
        hi, cols = min(lo + rows_per_shard, len(arrays[0])), {}
        for j, a in enumerate(arrays):
            part = a[lo:hi]
            width = int(np.prod(part.shape[1:])) if part.ndim > 1 else 0
            cols[f"t{j}"] = (pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), width) if width
                             else pa.array(part))
        name = f"shard-{k:05d}.parquet"
        pq.write_table(pa.table(cols), tmp / name)
        shards.append((name, lo, hi))
    meta = {"format": "parquet", "dtypes": [str(a.dtype) for a in arrays],
            "shapes": [list(a.shape[1:]) for a in arrays]}
    return shards, meta


def write_files(tensors: tuple[torch.Tensor, ...], info: dict[str, Any], *, workload: str,
                root: str | Path | None = None, rows_per_shard: int | None = None) -> FileSet:
    """The shard set for ``tensors`` (a training split): reused when a folder with the same key exists and
    its manifest loads, else written (atomically: a temporary folder renamed into place)."""
    image = is_image_split(info, tensors)
    if rows_per_shard is None:
        row_bytes = max(1, sum(t[0].numel() * t.element_size() for t in tensors))
        rows_per_shard = IMAGE_ROWS_PER_SHARD if image else max(64, PARQUET_SHARD_BYTES // row_bytes)
    settings = {"version": FORMAT_VERSION, "format": "tar" if image else "parquet", "rows_per_shard": rows_per_shard,
                **({"mean": info["normalise_mean"], "std": info["normalise_std"]} if image else {})}
    key = _fingerprint(tensors, settings)
    base = Path(root) if root is not None else cache_root()
    folder = base / f"{workload}-{key[:16]}"
    if (folder / MANIFEST).is_file():
        manifest = Manifest.load(folder)
        if manifest.meta.get("key") == key:
            return FileSet(folder, manifest)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{folder.name}."))
    try:
        shards, meta = (_write_tar(tmp, tensors, info, rows_per_shard) if image
                        else _write_parquet(tmp, tensors, rows_per_shard))
        infos = []
        for name, lo, hi in shards:
            data = (tmp / name).read_bytes()
            infos.append(ShardInfo(name, hi - lo, lo, hashlib.sha256(data).hexdigest(), len(data)))
        meta = {**meta, "key": key, "workload": workload, "rows_per_shard": rows_per_shard,
                "version": FORMAT_VERSION}
        schema = {f"t{j}": str(t.dtype) for j, t in enumerate(tensors)}
        (tmp / MANIFEST).write_text(json.dumps({"shards": [s.__dict__ for s in infos], "schema": schema,
                                                "meta": meta}, indent=1))
        if folder.exists():  # a stale set under the same key prefix (another version): replaced
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_files(folder)


def open_files(root: str | Path) -> FileSet:
    """A written shard set, its manifest and every shard's existence and size checked (no bytes read)."""
    manifest = Manifest.load(root)
    if manifest.meta.get("format") not in ("tar", "parquet"):
        raise ShardError(f"{Path(root) / MANIFEST}: meta.format={manifest.meta.get('format')!r} is not a lab "
                         "file source (tar or parquet)")
    for info in manifest.shards:
        check_shard_file(root, info, manifest)
    return FileSet(Path(root), manifest)
