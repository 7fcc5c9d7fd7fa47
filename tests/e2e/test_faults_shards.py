"""The fault suite (issue 17; helpers in faults_common.py), shards: a bad manifest or shard file is one line naming the
file and the field; the reader's arguments and root are checked; every row once, the last batch partial (a
hypothesis property)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from faults_common import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.data.shards import MANIFEST, ShardError, ShardReader, write_ctr_shards


@pytest.fixture(scope="module")
def shard_template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shard-template")
    write_ctr_shards(root, 1000, 3, seed=2, max_vocab=50, chunk_rows=400)  # 333 / 334 / 333 rows
    return root


@pytest.fixture
def shards(shard_template, tmp_path) -> Path:
    root = tmp_path / "shards"
    shutil.copytree(shard_template, root)
    return root


def _edit_manifest(root: Path, edit) -> None:
    path = root / MANIFEST
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def _drop(key):
    return lambda m: m.pop(key)


def _shard1(**changes):
    def edit(m):
        m["shards"][1].update(changes)
    return edit


def _shard1_without(field):
    return lambda m: m["shards"][1].pop(field)


def _foreign_parquet(root: Path) -> None:
    """shard-00001 replaced by another table, the manifest's checksum and size updated to match it."""
    path = root / "shard-00001.parquet"
    pq.write_table(pa.table({"id": list(range(334)), "text": ["x"] * 334}), path)
    data = path.read_bytes()
    _edit_manifest(root, _shard1(sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data)))


def _flip_byte(root: Path) -> None:
    path = root / "shard-00001.parquet"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def _truncate(root: Path) -> None:
    path = root / "shard-00001.parquet"
    path.write_bytes(path.read_bytes()[:-100])


def _rows_mismatch(root: Path) -> None:
    def edit(m):
        m["shards"][1]["rows"] = 300
        m["shards"][2]["first_row"] = 633
    _edit_manifest(root, edit)


MANIFEST_FAULTS = [  # (id, edit of the parsed manifest, needle)
    ("missing-shards", _drop("shards"), "missing field 'shards'"),
    ("missing-schema", _drop("schema"), "missing field 'schema'"),
    ("missing-meta", _drop("meta"), "missing field 'meta'"),
    ("shards-not-a-list", lambda m: m.update(shards={"a": 1}), "field 'shards' must be a JSON array"),
    ("schema-not-an-object", lambda m: m.update(schema=["int64"]), "field 'schema' must be a JSON object"),
    ("empty-manifest", lambda m: m.update(shards=[]), "a manifest listing no shard is refused"),
    ("shard-not-an-object", lambda m: m["shards"].__setitem__(1, "shard-00001.parquet"), "shards[1] must be an object"),
    *[(f"shard-missing-{f}", _shard1_without(f), f"shards[1] is missing field {f!r}")
      for f in ("name", "rows", "first_row", "sha256", "nbytes")],
    ("rows-a-string", _shard1(rows="334"), "shards[1].rows='334' is invalid"),
    ("rows-a-bool", _shard1(rows=True), "shards[1].rows=True is invalid"),
    ("rows-a-float", _shard1(rows=334.0), "shards[1].rows=334.0 is invalid"),
    ("sha-an-int", _shard1(sha256=5), "shards[1].sha256=5 is invalid"),
    ("sha-not-hex", _shard1(sha256="z" * 64), "shards[1].sha256="),
    ("name-escapes-the-folder", _shard1(name="../elsewhere.parquet"), "shards[1].name='../elsewhere.parquet'"),
    ("name-twice", _shard1(name="shard-00000.parquet"), "listed twice"),
    ("first-row-gap", _shard1(first_row=400), "shards[1].first_row=400"),
    ("rows-zero", _shard1(rows=0), "shards[1].rows=0"),
    ("unknown-field", _shard1(checksum="abc"), "unknown field(s) 'checksum'"),
]


@pytest.mark.parametrize(("edit", "needle"), [m[1:] for m in MANIFEST_FAULTS], ids=[m[0] for m in MANIFEST_FAULTS])
def test_shard_manifest_problem_is_one_line_naming_file_and_field(edit, needle, shards):
    _edit_manifest(shards, edit)
    before = snapshot(shards)
    with pytest.raises(ShardError) as err:
        ShardReader(shards, 100, storage="none")
    msg = str(err.value)
    assert str(shards / MANIFEST) in msg and needle in msg and "\n" not in msg, msg
    assert isinstance(err.value, ValueError)
    assert snapshot(shards) == before


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "is not valid JSON"), ("[1, 2]", "must hold a JSON object"), ("", "is not valid JSON"),
])
def test_shard_manifest_that_is_not_a_manifest(text, needle, shards):
    (shards / MANIFEST).write_text(text)
    with pytest.raises(ShardError, match=needle) as err:
        ShardReader(shards, 100, storage="none")
    assert str(shards / MANIFEST) in str(err.value)


SHARD_FILE_FAULTS = [  # (id, damage, when, needle): construction checks a stat, iteration the bytes
    ("missing-file", lambda r: (r / "shard-00001.parquet").unlink(), "init", "shard-00001.parquet is missing"),
    ("truncated", _truncate, "init", "shards[1].nbytes"),
    ("bit-flip", _flip_byte, "read", "shards[1].sha256"),
    ("row-count", _rows_mismatch, "read", "shard-00001.parquet has 334 rows, but manifest.json field shards[1].rows"),
    ("foreign-parquet", _foreign_parquet, "read", "shard-00001.parquet lacks column 'row_id'"),
    ("schema-mismatch", lambda r: _edit_manifest(r, lambda m: m["schema"].update(label="string")), "read",
     "schema['label'] says string"),
]


@pytest.mark.parametrize(("damage", "when", "needle"), [f[1:] for f in SHARD_FILE_FAULTS],
                         ids=[f[0] for f in SHARD_FILE_FAULTS])
def test_shard_file_problem_names_the_shard_and_the_field(damage, when, needle, shards):
    damage(shards)
    with pytest.raises(ShardError) as err:
        reader = ShardReader(shards, 100, storage="none")
        assert when == "read", "the stat-level problem was not found before reading"
        list(reader)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg, msg


def test_shard_checks_without_verify_still_catch_rows_and_schema(shards):
    _foreign_parquet(shards)
    with pytest.raises(ShardError, match="lacks column"):
        list(ShardReader(shards, 100, storage="none", verify=False))


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"batch_size": 0}, "batch_size=0"), ({"batch_size": 2.5}, "batch_size=2.5"),
    ({"shard_ids": [3]}, "shard_ids contains 3"), ({"shard_ids": [0, 0]}, "listed twice"),
])
def test_shard_reader_bad_arguments(kwargs, needle, shards):
    kwargs = {"batch_size": 100, **kwargs}
    with pytest.raises(ValueError, match=needle.replace("[", r"\[")):
        ShardReader(shards, kwargs.pop("batch_size"), storage="none", **kwargs)


def test_shard_root_problems(tmp_path, shards):
    with pytest.raises(ShardError, match="no manifest.json"):
        ShardReader(tmp_path / "nowhere", 10, storage="none")
    with pytest.raises(ShardError, match="is a file"):
        ShardReader(shards / MANIFEST, 10, storage="none")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 1200), drop_last=st.booleans(),
       ids=st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True))
def test_property_shard_reader_yields_every_row_once_last_batch_partial(shard_template, batch, drop_last, ids):
    from lab.data.shards import Manifest, read_shard
    from lab.data.storage import EmulatedStore

    reader = ShardReader(shard_template, batch, storage="none", shard_ids=ids, drop_last=drop_last)
    batches = list(reader)
    sizes = [len(b[2]) for b in batches]
    total = sum(Manifest.load(shard_template).shards[k].rows for k in ids)
    assert len(batches) == len(reader)
    assert all(s == batch for s in sizes[:-1])  # only the last batch may be short
    assert sum(sizes) == (total // batch * batch if drop_last else total)
    store, m = EmulatedStore(shard_template, "none"), Manifest.load(shard_template)
    labels = torch.cat([torch.from_numpy(read_shard(store, m.shards[k])["label"]) for k in ids])
    got = torch.cat([b[2] for b in batches]) if batches else labels[:0]
    assert torch.equal(got, labels[:sum(sizes)])  # in order, each row once, across shard boundaries
