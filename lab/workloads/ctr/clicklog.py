"""The click-log generator: Criteo-shaped rows (13 count features, 26 hashed categorical fields) whose labels
come from a planted factorization-machine model, generated chunk by chunk from a seed (any size, offline,
identical every time). Why synthetic and planted: see :mod:`lab.workloads.ctr`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

CHUNK_ROWS = 8192  # fixed forever: rows are generated per chunk, so changing it changes every dataset
DEFAULT_MAX_VOCAB = 100_000
ROWS_PER_DAY = 1_000_000
CLICK_RATE = 0.25  # Criteo's order of magnitude
_LATENT_DIM = 4  # at most 4: a latent vector is four 16-bit slices of one 64-bit hash
_N_PAIRS = 12
_ALPHA_RANGE = (1.3, 2.0)  # Zipf exponents per field
_W_STD = 0.16  # first-order weights; scales tuned so bayes AUC is ~0.8, not a trivial ~1.0
_V_STD = 0.34  # latent entries; a pair's dot product has std ~ sqrt(k) * _V_STD**2


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap stateless hash, so any value's planted weight can be computed anywhere
    without storing tables (vocabularies may have millions of entries). uint64 arithmetic wraps mod 2**64."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _prefix(seed: int, *keys: int) -> np.ndarray:
    """A well-mixed 64-bit key for (seed, tag, field, ...): computed once per field, not once per row."""
    h = _mix64(np.asarray([seed % 2**64], dtype=np.uint64))
    for key in keys:
        h = _mix64(h ^ np.asarray(key, dtype=np.uint64))
    return h


def _hash(prefix: np.ndarray, values: np.ndarray) -> np.ndarray:
    # mix64 is a bijection, so distinct values under one prefix never collide before the final modulo.
    return _mix64(prefix ^ values.astype(np.uint64))


def _hash_weight(prefix: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Zero-mean, unit-variance weights keyed by ``values``: uniform on [-sqrt 3, sqrt 3]. Uniform, not
    normal, because this runs for every (row, field) and Box-Muller tripled the generator's cost."""
    h = _mix64(prefix ^ values.astype(np.uint64))
    return ((h >> np.uint64(11)).astype(np.float64) * (2.0 * np.sqrt(3.0) / 2.0**53)) - np.sqrt(3.0)


def _hash_latent(prefix: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Unit-variance latent vectors [..., _LATENT_DIM] from ONE hash per value: each component is a 16-bit
    slice of the 64-bit hash. One hash instead of four because this is the generator's hottest line."""
    h = np.ascontiguousarray(_mix64(prefix ^ values.astype(np.uint64)), dtype="<u8")  # fixed byte order
    u16 = h.view("<u2").reshape(*h.shape, 4)[..., :_LATENT_DIM]
    return (u16.astype(np.float64) + 0.5) * (2.0 * np.sqrt(3.0) / 65536.0) - np.sqrt(3.0)


def criteo_like_vocab(max_vocab: int = DEFAULT_MAX_VOCAB, n_cat: int = 26) -> tuple[int, ...]:
    """Per-field vocabulary sizes spread log-uniformly from 4 to ``max_vocab`` (field 0, the user id, gets
    the largest), like Criteo's mix of tiny and huge fields. Independent of the data seed, so a model can be
    built from a ``SizeSpec`` alone."""
    sizes = np.unique(np.geomspace(4, max_vocab, n_cat).round().astype(np.int64))[::-1]
    sizes = np.resize(sizes, n_cat)  # repeats only when max_vocab is too small for n_cat distinct sizes
    rest = np.random.default_rng(0).permutation(sizes[1:])
    return tuple(int(v) for v in np.concatenate([sizes[:1], rest]))


def _power_law_rank(u: np.ndarray, n: int | np.ndarray, alpha: float | np.ndarray) -> np.ndarray:
    """Inverse CDF of a continuous power law on [1, n+1), floored to ranks 0..n-1: Zipf-like without an
    O(n) table, so huge vocabularies cost nothing."""
    a = 1.0 - np.asarray(alpha, dtype=np.float64)
    top = (np.asarray(n, dtype=np.float64) + 1.0) ** a
    r = (1.0 + u * (top - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(r).astype(np.int64) - 1, np.asarray(n) - 1)


@functools.lru_cache(maxsize=32)
def _planted(seed: int, n_dense: int, sizes: tuple[int, ...]) -> dict:
    """The planted model's small parameters (the per-value ones are hashed on demand)."""
    n_cat = len(sizes)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    all_pairs = [(f, g) for f in range(n_cat) for g in range(f + 1, n_cat)]
    pick = rng.choice(len(all_pairs), size=min(_N_PAIRS, len(all_pairs)), replace=False)
    pairs = [all_pairs[i] for i in sorted(pick)]
    params = {
        "alpha": rng.uniform(*_ALPHA_RANGE, size=n_cat),
        "user_alpha": 1.05,
        "dense_mu": rng.uniform(0.0, 3.0, size=n_dense),
        "dense_sigma": rng.uniform(0.5, 1.5, size=n_dense),
        "dense_coef": rng.normal(0.0, 0.35, size=n_dense),
        "dense_cross": 0.4,  # z0 * z1: a dense interaction a plain linear model cannot fit
        "pairs": pairs,
        "latent_fields": sorted({f for pair in pairs for f in pair}),
        "bias": 0.0,  # calibrated below
        # Hash keys per field; the per-value weights and latent vectors are hashed from them on demand.
        "cat_key": np.concatenate([_prefix(seed, 0xCA7, f) for f in range(n_cat)]),
        "w_key": np.concatenate([_prefix(seed, 0xA1, f) for f in range(n_cat)]),
        "v_key": np.concatenate([_prefix(seed, 0xB2, f) for f in range(n_cat)]),
    }
    # Calibrate the bias on chunk 0 so every seed and vocabulary clicks at ~CLICK_RATE: the popular values'
    # random weights otherwise swing the rate from 20 % to 40 %, and log-loss is not comparable across that.
    prob = _chunk(0, seed, n_dense, np.asarray(sizes), params, ROWS_PER_DAY)["prob"]
    logit = np.log(prob) - np.log1p(-prob)
    lo, hi = -10.0, 10.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < CLICK_RATE else (lo, mid)
    params["bias"] = (lo + hi) / 2
    return params


def generate_click_log(
    start_row: int,
    n_rows: int,
    *,
    seed: int,
    n_dense: int = 13,
    n_cat: int = 26,
    vocab: int | Sequence[int] | None = None,
    rows_per_day: int = ROWS_PER_DAY,
) -> dict[str, np.ndarray]:
    """Rows ``[start_row, start_row + n_rows)`` of the click log for ``seed``.

    Returns ``row_id`` (int64), ``day`` (int64), ``user`` (int64, power-law), ``dense`` (float32 counts,
    [n, n_dense]), ``cat`` (int64 hashed ids in ``[0, vocab[f])``, [n, n_cat]), ``prob`` (float64 true click
    probability) and ``label`` (float32 0/1). Rows come from per-chunk RNGs keyed by chunk index, so any range
    is identical whether generated in one call or in pieces: the data-loading lab streams it into shards.
    ``vocab`` is one size for all fields, a per-field sequence, or ``None`` for ``criteo_like_vocab()``.
    The planted model is a function of (``seed``, ``n_dense``, ``vocab``); ``seed`` must be >= 0.
    """
    if start_row < 0 or n_rows < 0:
        raise ValueError(f"start_row and n_rows must be >= 0, got {start_row}, {n_rows}")
    if seed < 0 or rows_per_day < 1:
        raise ValueError(f"seed must be >= 0 and rows_per_day >= 1, got {seed}, {rows_per_day}")
    if vocab is None:
        vocab = criteo_like_vocab(DEFAULT_MAX_VOCAB, n_cat)
    sizes = np.broadcast_to(np.asarray(vocab, dtype=np.int64), (n_cat,))
    if (sizes < 1).any():
        raise ValueError(f"vocab sizes must be >= 1, got {vocab}")
    params = _planted(seed, n_dense, tuple(int(v) for v in sizes))
    first, last = start_row // CHUNK_ROWS, (start_row + n_rows - 1) // CHUNK_ROWS
    chunks = range(first, last + 1) if n_rows else range(0)
    parts = [_chunk(c, seed, n_dense, sizes, params, rows_per_day) for c in chunks]
    lo = start_row - first * CHUNK_ROWS
    keys = ("row_id", "day", "user", "dense", "cat", "prob", "label")
    if not parts:
        empty = _chunk(0, seed, n_dense, sizes, params, rows_per_day)
        return {k: empty[k][:0] for k in keys}
    return {k: np.concatenate([p[k] for p in parts])[lo : lo + n_rows] for k in keys}


def _chunk(
    chunk: int, seed: int, n_dense: int, sizes: np.ndarray, params: dict, rows_per_day: int
) -> dict[str, np.ndarray]:
    n_cat = len(sizes)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, chunk]))
    # Draw every random number in a fixed order and shape per chunk: that is what makes ranges reproducible.
    u_cat = rng.random((CHUNK_ROWS, n_cat))
    u_user = rng.random(CHUNK_ROWS)
    z = rng.standard_normal((CHUNK_ROWS, n_dense))
    u_label = rng.random(CHUNK_ROWS)

    n_users = int(sizes[0]) * 10  # more users than hash buckets: field 0 collides like a hashed user id
    user = _power_law_rank(u_user, n_users, params["user_alpha"])
    ranks = _power_law_rank(u_cat, sizes, params["alpha"])
    ranks[:, 0] = user
    cat = (_hash(params["cat_key"], ranks) % sizes.astype(np.uint64)).astype(np.int64)

    logit = params["bias"] + _W_STD * _hash_weight(params["w_key"], cat).sum(axis=1)
    fields = params["latent_fields"]
    latent = _V_STD * _hash_latent(params["v_key"][fields], cat[:, fields])
    where = {f: i for i, f in enumerate(fields)}
    for f, g in params["pairs"]:
        logit += (latent[:, where[f]] * latent[:, where[g]]).sum(axis=1)
    logit += np.tanh(z) @ params["dense_coef"] + params["dense_cross"] * z[:, 0] * z[:, 1]
    prob = 1.0 / (1.0 + np.exp(-logit))

    dense = np.floor(np.exp(params["dense_mu"] + params["dense_sigma"] * z)).astype(np.float32)
    row_id = np.arange(chunk * CHUNK_ROWS, (chunk + 1) * CHUNK_ROWS, dtype=np.int64)
    return {
        "row_id": row_id,
        "day": row_id // rows_per_day,
        "user": user,
        "dense": dense,
        "cat": cat,
        "prob": prob,
        "label": (u_label < prob).astype(np.float32),
    }


def preprocess_dense(counts: np.ndarray | torch.Tensor) -> torch.Tensor:
    """log1p of the counts, DLRM's convention: a per-row transform, so streamed shards can apply it too."""
    return torch.log1p(torch.as_tensor(counts, dtype=torch.float32))
