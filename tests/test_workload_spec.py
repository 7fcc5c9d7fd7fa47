"""Your workload, end to end: specs (file and module), LAB_WORKLOADS, the CLI, DDP ranks; a friendlier
Workload (one SizeSpec, a map-style Dataset, sizes enforced by the lab); the "did not learn" tag; summaries
that read the latency key a run stored and keep a loss-like metric in its own units."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from lab import RunConfig, run
from lab.ablation import summarize
from lab.cli import main as cli_main
from lab.workloads import Datasets, SizeSpec, Workload, get_workload, load_spec, register_workload

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
    cfg = RunConfig(workload=f"{path}:make", size="tiny", latency_repeats=0, threads=1)
    assert cfg.workload == name and cfg.workload_spec == f"{path}:make"
    assert RunConfig.from_dict(cfg.to_dict()) == cfg and "workload_spec" not in RunConfig().to_dict()
    assert get_workload(name).sizes["full"] is get_workload(name).sizes["tiny"]  # one SizeSpec serves all
    res = run(cfg)
    assert res.status == "ok" and res.metric > 0.8 and not any("did not learn" in w for w in res.why)


def test_a_module_spec_and_a_list(user_file, monkeypatch):
    path, name = user_file
    monkeypatch.syspath_prepend(str(path.parent))
    assert load_spec("mine:BOTH") == [f"{name}_a", f"{name}_b"]
    with pytest.raises(ValueError, match="names 2 workloads"):
        RunConfig(workload=f"{path}:BOTH")


@pytest.mark.parametrize(("spec", "needle"), [
    ("/nowhere/mine.py:make", "FileNotFoundError"),
    ("no_such_module_xyz:make", "ModuleNotFoundError"),
    ("lab.workloads:nothing_here", "AttributeError"),
    ("lab.workloads.base:REQUIRED_SIZES", "TypeError"),
])
def test_a_spec_that_cannot_be_loaded_is_one_line_naming_it(spec, needle):
    with pytest.raises(ValueError, match=f"workload spec '{spec}' cannot be loaded: {needle}") as info:
        RunConfig(workload=spec)
    assert "\n" not in str(info.value)


def test_the_cli_runs_a_file_spec_and_lab_workloads_reaches_a_new_process(user_file, capsys):
    path, name = user_file
    assert cli_main(["run", "--workload", f"{path}:make", "--size", "tiny", "--no-store", "--no-progress",
                     "--latency-repeats", "0"]) == 0
    assert f"{name}/tiny" in capsys.readouterr().out
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
    assert res.status == "ok" and res.details["ddp"]["world_size"] == 2


class _Pairs(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_a_map_style_dataset_is_accepted_and_the_lab_enforces_the_sizes(toy_workload):
    d = Datasets(train=_Pairs(50), test=_Pairs(20))
    assert d.train[0].shape == (50, 8) and d.test[1].shape == (20,)
    with pytest.raises(ValueError, match="each item must be a tuple"):
        Datasets(train=_Scalars(), test=_Pairs(5))
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


def test_a_loss_like_metric_keeps_its_own_units(toy_workload):
    reg = Workload(name="toy_reg", description="regression", sizes=SizeSpec(n_train=256, n_test=64, batch_size=32,
                                                                             epochs=1, lr=0.01),
                   make_data=lambda spec, seed: Datasets(train=(torch.randn(256, 4), torch.randn(256)),
                                                         test=(torch.randn(64, 4), torch.randn(64))),
                   make_model=lambda spec: nn.Linear(4, 1), loss=_mse,
                   evaluate=lambda out, y: {"mse": float(_mse(out, y))}, metric_name="mse", higher_is_better=False)
    register_workload(reg, overwrite=True)
    a = run(RunConfig(workload="toy_reg", size="tiny", latency_repeats=0))
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
