"""The git stamp: a benchmark's own results and the notebooks' executed copies in the checkout must not mark it
dirty; a code change must."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lab.measure.env import git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=root,
                   check=True, capture_output=True)


def test_results_are_not_dirt_but_code_is(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "benchmarks" / "results" / "cpu").mkdir(parents=True)
    (tmp_path / "lab" / "x.py").write_text("a = 1\n")
    (tmp_path / "benchmarks" / "results" / "cpu" / "bench.json").write_text("{}")
    (tmp_path / "docs" / "notebooks").mkdir(parents=True)
    (tmp_path / "docs" / "notebooks" / "00_tour.ipynb").write_text("{}")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "init")
    sha, dirty = git_state(tmp_path)
    assert len(sha) == 40 and dirty is False
    (tmp_path / "benchmarks" / "results" / "cpu" / "bench.json").write_text('{"new": 1}')
    (tmp_path / "docs" / "notebooks" / "00_tour.ipynb").write_text('{"executed": 1}')  # notebooks-docs wrote it
    (tmp_path / "untracked.txt").write_text("scratch")
    assert git_state(tmp_path) == (sha, False)
    (tmp_path / "lab" / "x.py").write_text("a = 2\n")
    assert git_state(tmp_path) == (sha, True)


def test_not_a_checkout(tmp_path):
    assert git_state(tmp_path) == ("unknown", None)
