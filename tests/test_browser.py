"""One real-browser test: ``streamlit run`` on a free 127.0.0.1 port, headless Chromium (Debian's package,
driven by Playwright for Python through ``executable_path``; no browser download), click Run, wait for the
chart, save a screenshot. AppTest cannot see what the browser renders (plotly charts, websocket updates),
so this is the check that the page really draws. Skipped with a reason when chromium or playwright is
missing; ``.ci/run`` installs both so CI runs it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"streamlit did not answer on {url} within {timeout_s} s")


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_dashboard_draws_the_ablation_chart_in_a_real_browser(tmp_path, private_store):
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LAB_RESULTS_DB": str(private_store)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"), "--server.address",
         "127.0.0.1", "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats",
         "false"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_healthy(url, proc)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url, timeout=60_000)
                page.get_by_text("Run ablation", exact=True).wait_for(timeout=60_000)
                page.get_by_text("techniques", exact=True).click()  # default stack [bf16]: 2 tiny runs
                page.wait_for_timeout(1_000)
                page.get_by_role("button", name="Run ablation").click()
                page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=120_000)
                page.get_by_text("Verdict (").first.wait_for(timeout=30_000)
                shot = tmp_path / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                assert page.locator("text=Traceback").count() == 0
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
