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
ROOT = Path(__file__).resolve().parents[2]
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


#: In the page: the visible elements wider than the window or than their own box (a table or a chart that
#: overflows sideways), and each visible plot whose title (with its subtitle) is wider than the plot.
CHECKS_JS = """() => {
  const vw = document.documentElement.clientWidth, out = {overflow: [], titles: [], plots: 0};
  const seen = el => el.offsetParent !== null && el.getBoundingClientRect().width > 0;
  if (document.documentElement.scrollWidth > vw + 1) out.overflow.push('page scrolls sideways: ' +
      document.documentElement.scrollWidth + ' > ' + vw);
  for (const el of document.querySelectorAll('[data-testid="stElementContainer"]')) {
    if (!seen(el)) continue;
    const edge = Math.min(vw, el.getBoundingClientRect().right) + 1;
    // anything drawn right of its element's box (or of the window), except inside a box that clips or
    // scrolls its content (a wide table scrolls: that is its content reachable, not overflowing) and a
    // dataframe's 20 px resize handle, which sits half outside on purpose
    const bad = [];
    const walk = d => {
      const r = d.getBoundingClientRect(), st = getComputedStyle(d);
      const handle = r.width <= 24 && st.position === 'absolute';
      if (r.width > 0 && !handle && r.right > edge)
        bad.push((d.getAttribute('data-testid') || d.tagName.toLowerCase() + '.' +
                  String(d.getAttribute('class') || '').split(' ')[0]) + ' right ' + Math.round(r.right) + ' > ' +
                 Math.round(edge - 1) + ' in "' + (el.innerText || '').slice(0, 30).replace(/\\n/g, ' ') + '"');
      if (d !== el && st.overflowX !== 'visible') return;
      for (const c of d.children) walk(c);
    };
    walk(el);
    if (bad.length) out.overflow.push(bad[0]);
  }
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    if (!seen(plot)) continue;
    out.plots += 1;
    const box = plot.getBoundingClientRect();
    for (const t of plot.querySelectorAll('.gtitle, .gtitle-subtitle')) {
      const r = t.getBoundingClientRect();
      if (r.width > 0 && (r.left < box.left - 1 || r.right > box.right + 1))
        out.titles.push(t.textContent.slice(0, 60) + ': ' + Math.round(r.width) + ' px in a ' +
                        Math.round(box.width) + ' px plot');
    }
  }
  return out;
}"""

EXAMPLE_PAGE = """import streamlit as st
TITLE = "Example page"
def render() -> None:
    st.markdown("A page found in LAB_DASHBOARD_PAGES: every discovered page gets a tab.")
"""


def _screenshot(page, path: Path) -> None:
    """The whole tab: Streamlit scrolls inside its main block, so the window grows to its height for the shot."""
    height = page.evaluate("() => Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], section')]"
                           ".map(e => e.scrollHeight), 800)")
    page.set_viewport_size({"width": 1280, "height": min(int(height) + 40, 6000)})
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})


def _check(page, name: str, shots: Path) -> dict:
    page.wait_for_timeout(1_500)  # plotly draws after the websocket delta
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, f"{name}: {exceptions.first.inner_text()[:500]}"
    assert page.locator("text=Traceback").count() == 0, name
    found = page.evaluate(CHECKS_JS)
    _screenshot(page, shots / f"{name.lower().replace(' ', '_')}.png")
    assert not found["overflow"], f"{name}: overflowing {found['overflow']}"
    assert not found["titles"], f"{name}: titles wider than their plot {found['titles']}"
    return found


@pytest.mark.browser
@pytest.mark.timeout(600)  # the default ablation: 105-257 s measured on a busy 2-core machine
def test_every_page_reads_in_a_real_browser_after_the_default_ablation(tmp_path, private_store):
    """At 1280x800: run the default ablation (the sidebar as it opens), then visit every tab, the
    discovered pages included, and fail on a Streamlit exception, a sideways-overflowing element or a
    plot title wider than its plot. Screenshots go to ``$LAB_SCREENSHOTS`` (default: the test's tmp folder)."""
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    pages_dir = tmp_path / "pages"
    pages_dir.mkdir()
    (pages_dir / "page_example.py").write_text(EXAMPLE_PAGE)
    shots = Path(os.environ.get("LAB_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LAB_RESULTS_DB": str(private_store), "LAB_DASHBOARD_PAGES": str(pages_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"), "--server.port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # address and headless: .streamlit/
    try:
        _wait_healthy(url, proc)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(url, timeout=60_000)
                page.get_by_role("button", name="Run ablation").wait_for(timeout=60_000)
                t0 = time.monotonic()
                page.get_by_role("button", name="Run ablation").click()
                page.get_by_text("elapsed", exact=False).first.wait_for(timeout=60_000)  # live progress
                assert page.get_by_role("button", name="Run ablation").is_disabled()
                page.get_by_text("Verdict (").first.wait_for(timeout=480_000)
                took = time.monotonic() - t0
                page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=60_000)
                (shots / "default_ablation_seconds.txt").write_text(f"{took:.0f}\n")
                tabs = page.get_by_role("tab")
                names = [tabs.nth(i).inner_text() for i in range(tabs.count())]
                assert names[:5] == ["Ablation", "Stored runs", "Scaling model", "Data loading", "Performance report"]
                assert "Example page" in names
                plots = 0
                for i, name in enumerate(names):
                    tabs.nth(i).click()
                    plots += _check(page, name, shots)["plots"]
                assert plots >= 4  # the ablation's figures at least were drawn and checked
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
