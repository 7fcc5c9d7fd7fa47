"""benchmarks/gpu.sh + gpu.py: runs (and says "skipped") without CUDA, imports nothing the H200 box lacks, measures
interleaved, writes its JSON after every part, never crashes on a missing arm, and survives a part that kills its
own (child) process. The layout: each family's GPU part is ``gpu_part`` in that family's benchmark file, timed by
``lab.measure`` (no timer of the benchmarks' own), and importing a family file does not run its CPU benchmark.
Structure only: no timing assertions (the speed figures are the benchmark's business)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import lab.measure

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
FAMILIES = {"precision", "data", "pruning", "quantization", "distributed", "memory"}
FAMILY_FILES = {"precision": "precision", "data": "data_loading", "pruning": "pruning",
                "quantization": "quantization", "distributed": "distributed",
                "memory": "memory"}  # part -> benchmarks/<file>.py
# What the H200 box does not have (torchao is there, but blocking it simulates a box without it).
BLOCKED = ("plotly", "streamlit", "sklearn", "mlxtend", "psutil", "torch_pruning", "scipy", "matplotlib", "tqdm")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the real GPU parts")


def _bench_module(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # gpu.py imports its siblings (_common, _gpu, the family files) as a script does
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def gpu():
    """The entry point: flags, the part loop (``PARTS``, ``main``)."""
    return _bench_module("gpu")


@pytest.fixture(scope="module")
def common():
    """``benchmarks/_common.py``: the figure helpers every benchmark shares."""
    return _bench_module("_common")


@pytest.fixture(scope="module")
def gpu_common():
    """``benchmarks/_gpu.py``: settings, part context, report, device handling."""
    return _bench_module("_gpu")


@pytest.fixture(scope="module")
def pruning():
    return _bench_module("pruning")


@pytest.fixture(scope="module")
def quantization():
    return _bench_module("quantization")


@pytest.fixture(scope="module")
def memory_bench():
    return _bench_module("memory")


def _blocker(folder: Path, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """A sitecustomize.py that makes the blocked packages absent; returns the env that loads it.

    ``sys.modules[name] = None`` is how Python spells "not installed" for both doors: ``import name`` raises
    ModuleNotFoundError and ``importlib.util.find_spec(name)`` returns None. (A meta-path finder that raises
    breaks torch._dynamo, which probes optional libraries with find_spec and expects None, not an error.)"""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys

        for name in {sorted(set(BLOCKED + extra))!r}:
            sys.modules[name] = None  # blocked for this test: not on the GPU box
        """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_the_import_blocker_blocks(tmp_path):
    """Negative control: without this, a clean import closure would prove nothing."""
    env = _blocker(tmp_path / "block")
    for mod in ("plotly", "sklearn.datasets", "psutil", "mlxtend.data"):
        out = _run([sys.executable, "-c", f"import {mod}"], env)
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, (mod, out.stderr[-300:])
    probe = "import importlib.util as u, numpy, torch; assert u.find_spec('scipy') is None"
    assert _run([sys.executable, "-c", probe], env).returncode == 0
    if importlib.util.find_spec("plotly") is not None:  # positive half: it is the blocker that stops it
        assert _run([sys.executable, "-c", "import plotly"], dict(os.environ)).returncode == 0


@cpu_only
def test_gpu_sh_without_cuda_skips_every_part_and_exits_0(tmp_path):
    env = _blocker(tmp_path / "block")
    out_dir = tmp_path / "out"
    proc = _run(["bash", str(BENCH / "gpu.sh"), str(out_dir)], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no CUDA device" in proc.stdout and "skipped" in proc.stdout
    assert str(out_dir / "gpu.json") in proc.stdout  # says where the JSON went
    doc = json.loads((out_dir / "gpu.json").read_text())
    assert {"benchmark", "quick", "env", "figures"} <= doc.keys() and doc["benchmark"] == "gpu"
    assert doc["quick"] is False and doc["env"]["hardware_id"] and doc["env"]["torch_version"] == torch.__version__
    assert {f["family"] for f in doc["figures"]} == FAMILIES
    for f in doc["figures"]:
        assert math.isnan(f["value"]) and f["note"].startswith("skipped: no CUDA device"), f
        assert {"name", "value", "unit", "ci95", "goal", "met", "note", "family"} <= f.keys()
    assert all(p["status"] == "skipped" for p in doc["parts"].values())


@cpu_only
def test_cpu_self_test_runs_every_part_with_torchao_missing(tmp_path):
    """``--device cpu`` runs each part's code path at tiny sizes under the blocker (which also blocks torchao
    here): every part finishes, CUDA-only arms and the torchao arms are skipped with their reason.
    ``--in-process``: one interpreter under the blocker, not a child per part (five imports of torch and the
    family files, most of this test's time); the children, their streamed logs and a crashing part are
    ``capped_run_with_a_crash``'s business below."""
    env = _blocker(tmp_path / "block", extra=("torchao",))
    path = tmp_path / "self" / "gpu.json"
    proc = _run([sys.executable, str(BENCH / "gpu.py"), "--device", "cpu", "--quick", "--in-process", "--json",
                 str(path)], env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(path.read_text())
    assert doc["setting"] == "tiny" and doc["quick"] is True
    assert list(doc["parts"]) == ["precision", "data", "pruning", "distributed", "memory", "quantization"]
    assert all(p["status"] == "ok" for p in doc["parts"].values()), doc["parts"]
    figs = {f["name"]: f for f in doc["figures"]}
    assert {f["family"] for f in doc["figures"]} == FAMILIES
    for arm in ("tf32", "bf16"):  # measured arms: a ratio with its bootstrap CI around it
        f = figs[f"resnet-tiny-16px-b4/{arm} speedup vs fp32"]
        assert f["value"] > 0 and f["ci95"][0] <= f["value"] <= f["ci95"][1]
    assert "ctr-tiny-b512/bf16 auc delta vs fp32" in figs
    assert math.isfinite(figs["data/ctr-b256/prefetch speedup vs sync copies"]["value"])  # measured, not skipped
    assert any(n.startswith("ddp-ws1-gloo/") and n.endswith("ddp overhead per step") for n in figs)
    sparse = [f for f in doc["figures"] if f["family"] == "pruning"]
    assert sparse and all(f["note"].startswith("skipped:") and "CUDA" in f["note"] for f in sparse)
    quant = [f for f in doc["figures"] if "int8" in f["name"] or "int4" in f["name"]]
    assert quant and all(math.isnan(f["value"]) and "torchao not importable" in f["note"] for f in quant)
    assert figs["decode bf16 latency batch 1"]["value"] > 0
    for case in ("transformer xs b8", "vision xs b4"):  # memory: both ladders' cases, plain and checkpointed
        plain, ckpt = figs[f"memory: {case} plain step peak"], figs[f"memory: {case} checkpoint_blocks step peak"]
        assert plain["value"] > 0 and ckpt["value"] > 0 and plain["unit"] == "MiB"
        assert figs[f"memory: {case} checkpoint_blocks peak ratio"]["value"] == pytest.approx(
            plain["value"] / ckpt["value"])
        f = figs[f"memory: {case} checkpoint_blocks step-time ratio"]
        assert f["value"] > 0 and f["ci95"][0] <= f["value"] <= f["ci95"][1]
        for what in ("step peak", "peak ratio", "step-time ratio"):
            assert "needs torchao" in figs[f"memory: {case} adam8bit {what}"]["note"]
            assert figs[f"memory: {case} offload_optim {what}"]["note"] == "skipped: CUDA only"
        assert math.isnan(figs[f"memory: {case} adam8bit first-step compile s"]["value"])


def test_interleaved_runs_arms_in_rounds_and_excludes_warmup():
    """The parts' timer (``lab.measure.interleaved_ms``), called as the parts call it (``sync=`` their device)."""
    calls: list[str] = []
    arms = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = lab.measure.interleaved_ms(arms, sync=torch.device("cpu"), repeats=3, iters=2, warmup=1)
    assert calls == ["a", "b", "c"] + ["a", "a", "b", "b", "c", "c"] * 3  # warm-up first, then A B C rounds
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in samples.values() for t in v)


def test_interleaved_drops_a_failing_arm_and_keeps_the_others():
    n = {"late": 0}

    def late() -> None:
        n["late"] += 1
        if n["late"] > 2:
            raise RuntimeError("kernel missing\nsecond line")

    def early() -> None:
        raise ValueError("no such API")

    errors: dict[str, str] = {}
    samples = lab.measure.interleaved_ms({"ok": lambda: None, "late": late, "early": early},
                                         sync=torch.device("cpu"), repeats=4, iters=1, warmup=1, errors=errors)
    assert list(samples) == ["ok"] and len(samples["ok"]) == 4
    assert errors == {"late": "RuntimeError: kernel missing", "early": "ValueError: no such API"}


def test_interleaved_stops_at_the_deadline_after_the_minimum_repeats():
    samples = lab.measure.interleaved_ms({"a": lambda: None}, sync=torch.device("cpu"), repeats=50, iters=1,
                                         warmup=0, deadline=0.0, min_repeats=3)
    assert len(samples["a"]) == 3


def test_each_family_file_holds_its_gpu_part_and_gpu_py_only_drives_them(gpu):
    assert set(gpu.PARTS) == FAMILIES and set(gpu.PART_ORDER) == FAMILIES
    for part, stem in FAMILY_FILES.items():
        module = _bench_module(stem)
        assert gpu.PARTS[part] is module.gpu_part, part  # the part lives in its family's file
        assert callable(module.main), stem  # beside that family's CPU benchmark
        assert module.interleaved_ms is lab.measure.interleaved_ms, stem  # timed by the one timer
    assert not (BENCH / "gpu_parts").exists()
    gpu_defs = {n.name for n in ast.walk(ast.parse((BENCH / "gpu.py").read_text())) if isinstance(n, ast.FunctionDef)}
    assert not gpu_defs & {"gpu_part", "part_precision", "part_data", "prune_case", "ddp_case"}


def test_no_benchmark_defines_a_timer_of_its_own():
    """One timer (lab.measure): a copy in benchmarks/ could drift from it, and then ratios stop being comparable."""
    timers = {"interleaved_ms", "block_ms", "sync", "sync_for", "inference_latency_ms", "error_text"}
    for path in sorted(BENCH.glob("*.py")):
        defs = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not defs & timers, (path.name, defs & timers)


#: One child under the blocker for the two checks below (each child costs an ``import torch``, seconds here):
#: first every family file imported as gpu.py imports them, with argv that would run a CPU benchmark; then each file
#: run as ``python benchmarks/<name>.py --help`` runs it (as ``__main__``, the benchmarks' modules imported afresh
#: for each, so a file that leans on a sibling another file imported still fails), its stdout and exit status kept.
SCRIPTS_CHILD = """
import contextlib, io, json, runpy, sys
bench, marker, out = sys.argv[1:4]
stems = sys.argv[4:]
sys.path.insert(0, bench)
argv = sys.argv
sys.argv = ['x', '--quick', '--json', marker]
for stem in stems:
    __import__(stem)
report = {'imported': True, 'scripts': {}}
for stem in stems:
    for name in [n for n, m in sys.modules.items() if (getattr(m, '__file__', None) or '').startswith(bench)]:
        del sys.modules[name]
    sys.argv = [f'{bench}/{stem}.py', '--help']
    buf, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(f'{bench}/{stem}.py', run_name='__main__')
    except SystemExit as exc:
        code = exc.code or 0
    except BaseException as exc:
        code, buf = 1, io.StringIO(f'{type(exc).__name__}: {exc}')
    report['scripts'][stem] = {'returncode': code, 'stdout': buf.getvalue()}
open(out, 'w').write(json.dumps(report))
print('imported')
"""


@pytest.fixture(scope="module")
def bench_scripts(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """The child above, run once for this module (read only by the tests)."""
    tmp = tmp_path_factory.mktemp("bench_scripts")
    marker, out = tmp / "ran.json", tmp / "report.json"
    proc = _run([sys.executable, "-c", SCRIPTS_CHILD, str(BENCH), str(marker), str(out),
                 *sorted(FAMILY_FILES.values())], _blocker(tmp / "block"))
    return proc, (json.loads(out.read_text()) if out.exists() else {}), marker


def test_importing_a_family_file_does_not_run_its_cpu_benchmark(bench_scripts):
    """gpu.py imports the family files for their GPU parts: their CPU benchmark must run only as a script. Were
    ``main()`` not guarded, the import would parse these argv and write the JSON (and take minutes)."""
    proc, report, marker = bench_scripts
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "imported\n" and report["imported"] and not marker.exists()


@pytest.mark.parametrize("stem", sorted(FAMILY_FILES.values()))
def test_family_files_stay_runnable_as_scripts(stem, bench_scripts):
    """``python benchmarks/<name>.py [--quick] [--json PATH]`` is the CPU benchmark's entry point (``--help``:
    parsed, nothing measured)."""
    proc, report, _ = bench_scripts
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = report["scripts"][stem]
    assert script["returncode"] == 0, script["stdout"][-2000:]
    assert "--quick" in script["stdout"] and "--json" in script["stdout"]


def test_figures_have_the_common_envelope(common):
    f = common.ratio_figure("x speedup", [2.0, 2.1, 1.9, 2.0], [1.0, 1.05, 0.95, 1.0], family="pruning", goal_min=1.1)
    assert f["value"] == pytest.approx(2.0) and f["ci95"][0] <= 2.0 <= f["ci95"][1]
    assert f["met"] is True and f["goal"] == ">= 1.1x" and f["family"] == "pruning"
    s = common.skipped("y", "no CUDA", "data", unit="ms")
    assert math.isnan(s["value"]) and s["note"] == "skipped: no CUDA" and s["family"] == "data" and s["met"] is None


def test_mask_2_4_keeps_the_two_largest_of_every_four(pruning):
    w = torch.tensor([[0.1, -4.0, 3.0, 0.2, 1.0, 2.0, -3.0, 4.0]])
    m = pruning.mask_2_4(w)
    assert m.tolist() == [[False, True, True, False, False, False, True, True]]
    big = pruning.mask_2_4(torch.randn(64, 128))
    assert (big.reshape(64, -1, 4).sum(-1) == 2).all()
    with pytest.raises(ValueError, match="in_features % 4"):
        pruning.mask_2_4(torch.randn(4, 6))


def test_weight_bytes_and_max_errors(gpu_common, quantization):
    m = quantization.decode_stack(16, 32, 3, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert [tuple(layer.weight.shape) for layer in m] == [(32, 16), (16, 32), (32, 16)]
    assert quantization.model_bytes(m) == 3 * 16 * 32 * 2
    assert gpu_common.max_errors(torch.tensor([1.0, -2.5]), torch.tensor([1.0, -2.0])) == (0.5, 0.25)


def test_memory_part_counts_the_device_held_optimizer_state_and_the_step_peak(memory_bench):
    """The at-rest part of a step's peak: the parameters and the optimizer state on the device, none of an
    offloading optimizer's host-held state (torchao's CPUOffloadOptimizer keeps only its small parameters'
    optimizer, ``d_opt``, on the device); the peak adds the step's high-water mark on top."""
    from lab.measure.memory import optimizer_state_bytes, param_bytes

    cpu = torch.device("cpu")
    model = nn.Linear(64, 64)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    adam.step()
    assert memory_bench.device_state_bytes(adam, cpu) == optimizer_state_bytes(adam) >= 2 * param_bytes(model)
    assert memory_bench.device_state_bytes(adam, torch.device("cuda")) == 0  # nothing of it on a CUDA device

    class Offloaded:  # the shape of CPUOffloadOptimizer: no ``state`` of its own, the on-device part in ``d_opt``
        d_opt = adam

    assert memory_bench.device_state_bytes(Offloaded(), cpu) == optimizer_state_bytes(adam)
    Offloaded.d_opt = None
    assert memory_bench.device_state_bytes(Offloaded(), cpu) == 0

    def step() -> None:
        model(torch.randn(4, 64)).sum().backward()
        adam.step()
        adam.zero_grad(set_to_none=True)

    arm = memory_bench.MemoryArm(model, adam, step, "torch Adam")
    peak, at_rest = memory_bench.step_peak(arm, cpu)
    assert at_rest == param_bytes(model) + optimizer_state_bytes(adam)
    assert peak >= at_rest + param_bytes(model)  # the gradients alone are one more copy of the parameters


def test_missing_torchao_is_a_skip_not_a_crash(quantization, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # what `import torchao` sees on a box without it
    model = nn.Sequential(nn.Linear(8, 8, bias=False))
    with pytest.raises(quantization.Skip, match="torchao not importable"):
        quantization.torchao_weight_only(model, "int8", torch.randn(1, 8))


def test_a_torchao_api_that_fails_every_spelling_is_reported(quantization, monkeypatch):
    """Every spelling is tried and each error lands in the skip reason (API renamed between torchao versions)."""
    import types

    fake = types.ModuleType("torchao")
    fake.__version__ = "0.0-test"
    fake_q = types.ModuleType("torchao.quantization")

    def quantize_(model, cfg):
        raise RuntimeError(f"no kernel for {cfg}")

    fake_q.quantize_ = quantize_
    fake_q.Int8WeightOnlyConfig = lambda: "int8cfg"
    fake.quantization = fake_q
    monkeypatch.setitem(sys.modules, "torchao", fake)
    monkeypatch.setitem(sys.modules, "torchao.quantization", fake_q)
    with pytest.raises(quantization.Skip) as info:
        quantization.torchao_weight_only(nn.Sequential(nn.Linear(8, 8)), "int8", torch.randn(1, 8))
    msg = str(info.value)
    assert "torchao 0.0-test" in msg and "no kernel for int8cfg" in msg and "has no int8_weight_only" in msg


def test_json_is_written_after_every_part_and_a_failing_part_is_an_entry(gpu, common, monkeypatch, tmp_path):
    seen: list[list[str]] = []
    path = tmp_path / "gpu.json"

    def fine(ctx, figs):
        figs.append(common.figure("fine figure", 1.0, unit="x", family="data"))

    def dies(ctx, figs):
        seen.append([f["name"] for f in json.loads(path.read_text())["figures"]])  # 'fine' is already on disk
        figs.append(common.figure("before the crash", 2.0, unit="x", family="pruning"))
        ctx.checkpoint()
        seen.append([f["name"] for f in json.loads(path.read_text())["figures"]])
        raise RuntimeError("simulated CUDA error")

    monkeypatch.setitem(gpu.PARTS, "data", fine)
    monkeypatch.setitem(gpu.PARTS, "pruning", dies)
    threads = torch.get_num_threads()
    # --in-process: the swapped parts live in this test process, not in a child that imports gpu.py afresh
    assert gpu.main(["--device", "cpu", "--parts", "pruning,data", "--in-process", "--json", str(path)]) == 0
    assert torch.get_num_threads() == threads  # the self-test's one thread does not leak into the caller
    assert seen == [["fine figure"], ["fine figure", "before the crash"]]
    doc = json.loads(path.read_text())
    names = [f["name"] for f in doc["figures"]]
    assert names == ["fine figure", "before the crash", "pruning: part failed"]
    assert doc["parts"]["pruning"]["status"] == "error" and "simulated CUDA error" in doc["parts"]["pruning"]["error"]
    assert doc["parts"]["data"]["status"] == "ok"


@pytest.fixture(scope="module")
def capped_run_with_a_crash(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """One ``gpu.py --device cpu --quick --parts precision,data,pruning`` (a parent and a child per part) for the
    two tests below, read only: oneDNN and ATen capped at AVX2 and torchao blocked (the precision regression's
    setting), the data part told to abort natively (the crash test's hook). Each part is its own child, so
    neither setting reaches the other's part."""
    tmp = tmp_path_factory.mktemp("capped_crash")
    env = _blocker(tmp / "block", extra=("torchao",))
    env.update(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    env["LAB_GPU_BENCH_CRASH_PART"] = "data"
    path = tmp / "gpu.json"
    proc = _run([sys.executable, str(BENCH / "gpu.py"), "--device", "cpu", "--quick", "--parts",
                 "precision,data,pruning", "--json", str(path)], env)
    return proc, (json.loads(path.read_text()) if path.exists() else {})


def test_a_part_that_crashes_natively_is_an_entry_and_the_other_parts_run(capped_run_with_a_crash):
    """Each part runs in a child process: a SIGABRT there (the test hook stands in for a kernel corrupting the
    heap) is that part's "error" entry naming the signal, with the child's last output, never a dead run."""
    proc, doc = capped_run_with_a_crash
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    crashed, fine = doc["parts"]["data"], doc["parts"]["pruning"]
    assert crashed["status"] == "error" and "SIGABRT" in crashed["error"], crashed
    assert "aborting (test hook)" in crashed["output_tail"] and len(crashed["output_tail"]) <= 2000
    assert fine["status"] == "ok" and fine["error"] is None
    (failed,) = [f for f in doc["figures"] if f["family"] == "data"]
    assert failed["name"] == "data: part failed" and math.isnan(failed["value"]) and "SIGABRT" in failed["note"]
    assert any(f["family"] == "pruning" for f in doc["figures"])
    assert "part pruning: start" in proc.stdout  # the children's logs are streamed through the parent


@cpu_only
def test_precision_part_survives_onednn_avx2_kernels(capped_run_with_a_crash):
    """Regression (issue 25): with oneDNN capped at AVX2 (what an AMD Zen 3 runs natively), the tiny ResNet in
    channels_last aborted the interpreter inside ``loss.backward()`` (oneDNN's jit_1x1 backward-weights kernel,
    stride-2 shortcut with 4 input channels); the CPU self-test now trains NCHW and the part completes."""
    proc, doc = capped_run_with_a_crash
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    part = doc["parts"]["precision"]
    assert part["status"] == "ok", part


def test_an_arm_far_slower_than_the_reference_is_dropped_with_its_reason(gpu_common, monkeypatch):
    """An arm with no fast kernel here is skipped after one probe call instead of being timed for minutes; the
    clock is faked (the probe's decision, not the machine's speed, is under test)."""
    fake_ms = {"fp32": 10.0, "close": 70.0, "slow": 5000.0, "slow_but_cheap": 90.0}
    monkeypatch.setattr(gpu_common, "block_ms", lambda fn, iters, sync: fn())

    def broken() -> float:
        raise RuntimeError("no kernel")

    arms = {name: (lambda ms=ms: ms) for name, ms in fake_ms.items()} | {"broken": broken}
    errors: dict[str, str] = {}
    gpu_common.drop_slow_arms(arms, reference="fp32", sync=torch.device("cpu"), errors=errors)
    assert list(arms) == ["fp32", "close", "slow_but_cheap"]  # 7x; 9x but only 80 ms more
    assert set(errors) == {"slow", "broken"} and errors["broken"] == "RuntimeError: no kernel"
    assert "too slow" in errors["slow"] and "5000 ms" in errors["slow"]


def test_parts_past_the_total_budget_are_skipped_entries(gpu, monkeypatch, tmp_path):
    monkeypatch.setitem(gpu.PARTS, "data", lambda ctx, figs: None)
    path = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--parts", "data", "--budget-s", "-1", "--json", str(path)]) == 0
    (f,) = json.loads(path.read_text())["figures"]
    assert f["family"] == "data" and "time budget" in f["note"] and math.isnan(f["value"])


def test_parse_args_orders_parts_and_refuses_unknown_ones(gpu):
    assert gpu.parse_args(["--parts", "quantization,data", "--quick"]).parts == ["data", "quantization"]
    with pytest.raises(SystemExit):
        gpu.parse_args(["--parts", "precision,warp"])


@cpu_only
def test_no_cuda_reason_names_the_build(gpu_common):
    reason = gpu_common.no_cuda_reason()
    assert reason is not None and reason.startswith("no CUDA device") and torch.__version__ in reason


# ---------------------------------------------------------------------------------------------- GPU only

@pytest.mark.gpu
@needs_cuda
def test_semi_structured_linear_matches_dense_on_cuda(gpu_common, pruning):
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("2:4 sparse tensor cores need compute capability >= 8.0")
    from torch.sparse import to_sparse_semi_structured

    lin = nn.Linear(256, 128).half().cuda().eval()
    with torch.no_grad():
        lin.weight.mul_(pruning.mask_2_4(lin.weight))
    x = torch.randn(64, 256, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        ref = lin(x)
        lin.weight = nn.Parameter(to_sparse_semi_structured(lin.weight.detach()), requires_grad=False)
        _, rel = gpu_common.max_errors(lin(x), ref)
    assert rel < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_quick_gpu_parts_write_their_figures(tmp_path):
    path = tmp_path / "gpu.json"
    proc = _run([sys.executable, str(BENCH / "gpu.py"), "--quick", "--parts", "data,pruning,distributed,memory",
                 "--json", str(path)], dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(path.read_text())
    assert set(doc["parts"]) == {"data", "pruning", "distributed", "memory"}
    assert all(p["status"] == "ok" for p in doc["parts"].values()), doc["parts"]
    assert {f["family"] for f in doc["figures"]} == {"data", "pruning", "distributed", "memory"}
    peaks = {f["name"]: f["value"] for f in doc["figures"] if f["name"].endswith(" step peak")}
    assert peaks and all(v > 0 for v in peaks.values()), peaks  # the allocator's figure, every arm measured
