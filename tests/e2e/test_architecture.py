"""The architecture is checked, not hoped for: import-linter's layers / independence / acyclic contracts
(pyproject.toml) hold for the tree, and a deliberately introduced circle breaks them; the package stays
small enough to read (top-level modules, module length); registries are the single source of names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def _lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(LINT, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_import_contracts_hold():
    out = _lint(ROOT, ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("lab/loop.py", "from lab import train  # noqa", "Layers"),  # a lower layer importing a higher one
    ("lab/pruning/masks.py", "from lab.quant import int8  # noqa", "do not import each other"),
    ("lab/data/sampler.py", "from lab.data import loaders  # noqa", "No import circle"),  # loaders imports sampler
], ids=["upward", "technique-to-technique", "circle-inside-a-package"])
def test_a_deliberate_violation_breaks_a_contract(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "lab", tmp_path / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}\n")
    out = _lint(tmp_path, tmp_path)
    assert out.returncode != 0
    assert broken in out.stdout and "BROKEN" in out.stdout


def test_the_top_level_stays_small_and_no_module_is_long():
    """Modules are split by concept, not by length; the cap is only an alarm for one that grew several concepts
    (at 400 it cut modules in the middle of one)."""
    top = sorted(p.name for p in (ROOT / "lab").glob("*.py"))
    assert len(top) <= 14, top
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "lab").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_loader_and_storage_names_come_from_the_registries():
    from lab.cli import build_parser
    from lab.config import DataConfig
    from lab.registry import LOADERS, STORAGES

    assert set(LOADERS.names()) >= {"memory", "dataloader", "naive", "thread", "device_prefetch"}
    assert set(STORAGES.names()) >= {"none", "local_ssd", "network_fs", "object_store"}
    for name in LOADERS:  # every registered name is accepted, and builds
        DataConfig(loader=name, num_workers=1 if LOADERS[name].worker_processes else 0)
    with pytest.raises(ValueError, match="allowed: " + ", ".join(LOADERS.names())):
        DataConfig(loader="nope")
    run_p = build_parser()._subparsers._group_actions[0].choices["run"]
    loader_flag = next(a for a in run_p._actions if a.dest == "data.loader")
    assert tuple(loader_flag.choices) == LOADERS.names()
