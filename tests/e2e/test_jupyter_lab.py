"""`make lab` serves, as root and as a normal user: JupyterLab starts on a free 127.0.0.1 port with a token, as
the current user (with --allow-root when the uid is 0, as the Makefile's recipe passes it), answers /api/status
and opens a notebook through /api/contents; the recipe's flag is checked for both kinds of user. jupyterlab is
in the dev extra (pinned), so `make venv` installs it; the server test is skipped only where it is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAVE_LAB = importlib.util.find_spec("jupyterlab") is not None

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("uid", [0, 1000])
def test_the_makefile_passes_allow_root_only_as_root(uid, tmp_path):
    recipe = (ROOT / "Makefile").read_text().split("\nlab:", 1)[1].split("\n\n", 1)[0]
    line = next(ln for ln in recipe.splitlines() if "jupyter lab" in ln)
    assert re.search(r'\$\$\(\[ "\$\$\(id -u\)" = 0 \] && echo --allow-root\)', line), line
    shell = line.split("notebooks/ --ip 127.0.0.1", 1)[1].split("#", 1)[0].replace("$$", "$")
    fake_id = tmp_path / "id"  # the recipe's shell as a user of this uid sees it
    fake_id.write_text(f"#!/bin/sh\necho {uid}\n")
    fake_id.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["sh", "-c", f"echo {shell}"], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == (["--allow-root"] if uid == 0 else [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 (127.0.0.1 only)
        return json.loads(r.read())


@pytest.mark.skipif(not HAVE_LAB, reason="jupyterlab is not importable (pip install -e '.[dev]' installs it)")
def test_jupyterlab_serves_the_notebooks_as_the_current_user(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
           f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={ROOT / 'notebooks'}"] + (["--allow-root"] if os.getuid() == 0 else [])
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        base, status, deadline = f"http://127.0.0.1:{port}", None, time.monotonic() + 60
        while status is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                status = _get(f"{base}/api/status", token)
            except OSError:
                time.sleep(0.5)
        assert status is not None, "JupyterLab did not answer /api/status within 60 s"
        assert "started" in status
        nb = _get(f"{base}/api/contents/00_tour.ipynb", token)
        assert nb["type"] == "notebook" and nb["content"]["cells"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
