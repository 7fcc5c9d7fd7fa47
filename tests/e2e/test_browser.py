"""One real-browser test: ``streamlit run`` on a free 127.0.0.1 port, headless Chromium (Debian's package,
driven by Playwright for Python through ``executable_path``; no browser download), click Run, wait for the
chart, save a screenshot. AppTest cannot see what the browser renders (plotly charts, websocket updates),
so this is the check that the page really draws. Skipped with a reason when chromium or playwright is
missing; ``.ci/run`` installs both so CI runs it."""

from __future__ import annotations

import os
import re
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
  // the tab row: every tab's label in view, no sideways scroll (nor its arrow) hiding the last tabs
  for (const row of document.querySelectorAll('[role="tablist"]'))
    if (seen(row) && row.scrollWidth > row.clientWidth + 1)
      out.overflow.push('the tab row scrolls: its tabs need ' + row.scrollWidth + ' px of ' + row.clientWidth);
  // a text field's placeholder wider than the field shows cut (the browser clips it without an ellipsis)
  const ctx = document.createElement('canvas').getContext('2d');
  for (const input of document.querySelectorAll('input[placeholder]')) {
    if (!seen(input) || !input.placeholder) continue;
    const s = getComputedStyle(input);
    ctx.font = s.fontStyle + ' ' + s.fontWeight + ' ' + s.fontSize + ' ' + s.fontFamily;
    const room = input.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    if (ctx.measureText(input.placeholder).width > room + 1)
      out.overflow.push('placeholder cut: "' + input.placeholder + '" needs ' +
                        Math.round(ctx.measureText(input.placeholder).width) + ' px of ' + Math.round(room));
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
    // annotations (a facet's title among them) that print over each other: the report's hardware titles did
    const notes = [...plot.querySelectorAll('g.annotation-text-g')].map(g => [g, g.getBoundingClientRect()])
      .filter(([g, r]) => r.width > 0 && g.textContent.trim());
    for (let i = 0; i < notes.length; i++) for (let j = i + 1; j < notes.length; j++) {
      const [a, ra] = notes[i], [b, rb] = notes[j];
      if (ra.left < rb.right - 2 && rb.left < ra.right - 2 && ra.top < rb.bottom - 2 && rb.top < ra.bottom - 2)
        out.titles.push('"' + a.textContent.slice(0, 40) + '" over "' + b.textContent.slice(0, 40) + '"');
    }
  }
  return out;
}"""

#: In the page, at a window tall enough that every table is drawn: each visible dataframe whose columns are
#: narrower than their header or longest text (a cut "…": the grid draws on a canvas, so its texts, from the
#: grid's accessible table, are measured in its own font and compared with the width its columns take), and
#: any other visible text cut with an ellipsis (a label, a tab, a caption).
CUTS_JS = """async () => {
  await document.fonts.ready;
  const out = [], ctx = document.createElement('canvas').getContext('2d');
  for (const df of document.querySelectorAll('[data-testid="stDataFrame"]')) {
    if (df.offsetParent === null) continue;
    const grid = df.querySelector('.stDataFrameGlideDataEditor'), stack = df.querySelector('.dvn-stack');
    const table = df.querySelector('table[role="grid"]');
    if (!grid || !stack || !table) { out.push('a table that was not drawn'); continue; }
    const st = getComputedStyle(grid), fam = st.getPropertyValue('--gdg-font-family');
    const pad = 2 * (parseFloat(st.getPropertyValue('--gdg-cell-horizontal-padding')) || 8);
    const heads = [...table.querySelectorAll('thead th')];
    ctx.font = st.getPropertyValue('--gdg-header-font-style') + ' ' + fam;
    const need = heads.map(th => ({name: th.textContent, px: ctx.measureText(th.textContent).width + pad,
                                   text: th.textContent}));
    ctx.font = st.getPropertyValue('--gdg-base-font-style') + ' ' + fam;
    for (const tr of table.querySelectorAll('tbody tr'))
      [...tr.children].forEach((td, i) => {
        const px = ctx.measureText(td.textContent).width + pad;
        if (need[i] && px > need[i].px) Object.assign(need[i], {px, text: td.textContent});
      });
    // the columns' own widths (the stack they scroll), stretched to the grid's width when narrower
    const total = need.reduce((a, n) => a + n.px, 0);
    const have = Math.max(stack.getBoundingClientRect().width, grid.getBoundingClientRect().width - 2);
    const named = '[' + need.slice(0, 3).map(n => n.name).join(' | ') + ' ...]';
    const widest = need.filter(n => n.px > 480).map(n => n.name + ' ' + Math.round(n.px) + ' px ("' +
                                                    n.text.slice(0, 40) + '")');
    for (const n of need)
      if (n.px > 1000) out.push(named + ': column "' + n.name + '" needs ' + Math.round(n.px) +
                                ' px, wider than a grid column can be (1000 px)');
    if (total > have + 2) out.push(named + ': its columns need ' + Math.round(total) + ' px for their longest ' +
                                   'texts and take ' + Math.round(have) + ' (widest: ' + widest.join('; ') + ')');
  }
  for (const el of document.querySelectorAll('body *')) {
    if (el.offsetParent === null || !el.textContent.trim()) continue;
    const s = getComputedStyle(el);
    if (s.textOverflow === 'ellipsis' && s.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1)
      out.push('cut with an ellipsis: "' + el.textContent.slice(0, 60) + '"');
  }
  return out;
}"""

EXAMPLE_PAGE = """import streamlit as st
TITLE = "Example page"
def render() -> None:
    st.markdown("A page found in LAB_DASHBOARD_PAGES: every discovered page gets a tab.")
"""


#: The visible tables' cell texts (the grid's accessible table), for the Machine tab's rounding check.
CELLS_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].filter(df => df.offsetParent !== null)
  .flatMap(df => [...df.querySelectorAll('table[role="grid"] tbody td')].map(td => td.textContent))"""


def _machine_helpers():
    """``unrounded_card`` and ``unrounded`` of tests/dashboard/test_dashboard_machine.py (one definition of
    what an unrounded figure is, for the AppTest check and this one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_test_dashboard_machine",
                                                  ROOT / "tests" / "dashboard" / "test_dashboard_machine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _screenshot(page, path: Path) -> list[str]:
    """The whole tab: Streamlit scrolls inside its main block, so the window grows to its height for the shot;
    at that height every table is drawn (the grid draws only what is in view), so the cut texts
    (:data:`CUTS_JS`) are looked for then."""
    height = page.evaluate("() => Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], section')]"
                           ".map(e => e.scrollHeight), 800)")
    page.set_viewport_size({"width": 1280, "height": min(int(height) + 40, 6000)})
    page.wait_for_timeout(800)
    page.screenshot(path=str(path), full_page=True)
    cuts = page.evaluate(CUTS_JS)
    page.set_viewport_size({"width": 1280, "height": 800})
    return cuts


def _check(page, name: str, shots: Path) -> dict:
    page.wait_for_timeout(1_500)  # plotly draws after the websocket delta
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, f"{name}: {exceptions.first.inner_text()[:500]}"
    assert page.locator("text=Traceback").count() == 0, name
    found = page.evaluate(CHECKS_JS)
    cuts = _screenshot(page, shots / f"{name.lower().replace(' ', '_')}.png")
    assert not cuts, f"{name}: cut texts {cuts}"
    assert not found["overflow"], f"{name}: overflowing {found['overflow']}"
    assert not found["titles"], f"{name}: titles wider than their plot {found['titles']}"
    return found


def _quiet_runs(store_path: Path) -> dict[str, float]:
    """What the contention meter said about the default ablation's runs while this page watched them: how many
    were busy, how many were measured again after a burst (lab.ablation.runner._Settling), and the most cores other
    processes (this page and its server among them) took in a kept run. Recorded, never asserted: on a quiet
    machine the page alone must not make its own runs busy (before the settle wait and the slower redraws it made
    30 of 30 busy, and the card never crowned); on a busy CI box they are busy, rightly. Under ``make test``'s
    two pytest-xdist workers the other worker's tests are "others" too, so most runs read busy there: the page's
    own load is read with this test alone (``pytest tests/e2e/test_browser.py -rP``)."""
    from lab.store import ResultStore

    seen = [(r.details.get("contention") or {}) for r in ResultStore(store_path).list_results()]
    seen = [c for c in seen if c]
    return {"runs_busy (of the ablation's runs)": float(sum(bool(c.get("busy")) for c in seen)),
            "runs_measured_again (a burst spoiled the first try)": float(sum(bool(c.get("discarded")) for c in seen)),
            "others_cores_max (in a kept run)": max((float(c.get("others_cores") or 0) for c in seen), default=0.0)}


def _check_card(page) -> None:
    """The recommendation card above the tabs says what the Ablation tab's verdict says: the same winner, or on a
    busy machine no recommendation (lab.doctor.recommendation reads the verdict's own rule)."""
    card = page.locator(".st-key-recommendation").first
    card.wait_for(timeout=60_000)
    page.wait_for_timeout(1_000)  # the rerun after the job ended redraws the card from the finished ablation
    # and it ends: until then the last run's elements stay (faded), the card's next-step button among them
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=60_000)
    text = card.inner_text()
    assert "Diagnose ctr" not in text, text  # measured: no next step offered
    said = page.get_by_text("Verdict on ").first.inner_text()
    assert "holds at:" in text and "workload ctr at size tiny" in text, text
    winner = re.match(r"Verdict on [^:]+: (\S+): .* beats the baseline beyond noise", said)
    if winner:
        assert text.startswith(f"Use {winner.group(1)}: "), (said, text)
    elif "busy" in said:
        assert text.startswith("No recommendation: measured while this machine was busy"), (said, text)
    else:
        assert not text.startswith("Use "), (said, text)


@pytest.mark.browser
@pytest.mark.timeout(600)  # the default ablation: 105-257 s measured on a busy 2-core machine
def test_every_page_reads_in_a_real_browser_after_the_default_ablation(tmp_path, private_store):
    """At 1280x800: run the default ablation (the sidebar as it opens; its first arms' figures must show while
    it runs, "Figures so far: n of m arms"), then visit every tab, the discovered pages included, and fail on a
    Streamlit exception, a sideways-overflowing element, a tab row that scrolls, a placeholder wider than its
    field, a plot title wider than its plot, a table's header or cell (a reason, a figure's name) cut short,
    any other text cut with an ellipsis, a Run button below the first 800 px, or a Machine table (of a card
    with raw floats) that prints a number with more than 4 significant digits. Screenshots go to
    ``$LAB_SCREENSHOTS`` (default: the test's tmp folder), one per tab plus ``first_page.png`` (before Run: the card
    offers the doctor's diagnosis) and ``ablation_running.png``, with ``timings.txt``: the cold first page load
    (server start to the Run button drawn, and the page's own load), the click to the first arms' figures and the
    default ablation's click to verdict, with how many of its runs the contention meter called busy or measured
    again (:func:`_quiet_runs`), also printed (``pytest -rP`` shows them; recorded, never asserted)."""
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    pages_dir = tmp_path / "pages"
    pages_dir.mkdir()
    (pages_dir / "page_example.py").write_text(EXAMPLE_PAGE)
    shots = Path(os.environ.get("LAB_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    helpers = _machine_helpers()  # a machine card with the raw floats a measurement leaves, in a private cache
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_CACHE_DIR", str(cache))
        from lab.measure import machine

        machine.save_card(helpers.unrounded_card())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LAB_RESULTS_DB": str(private_store), "LAB_DASHBOARD_PAGES": str(pages_dir),
           "LAB_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"), "--server.port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # address and headless: .streamlit/
    started = time.monotonic()
    try:
        _wait_healthy(url, proc)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                t_goto = time.monotonic()
                page.goto(url, timeout=60_000)
                run = page.get_by_role("button", name="Run ablation")
                run.wait_for(timeout=60_000)
                timings = {"first_load_s (server start to Run drawn)": time.monotonic() - started,
                           "first_load_page_s (page opened to Run drawn)": time.monotonic() - t_goto}
                # nothing stored: the card offers the doctor's next step itself (lab.doctor.jobs.next_step)
                page.get_by_role("button", name="Diagnose ctr at size tiny").wait_for(timeout=60_000)
                page.screenshot(path=str(shots / "first_page.png"))  # the first viewport, as a new user sees it
                box = run.bounding_box()  # the window, not the sidebar's scroll: Run seen without scrolling
                assert box is not None and box["y"] + box["height"] <= 800, f"Run is below the fold: {box}"
                t0 = time.monotonic()
                run.click()
                page.get_by_text("elapsed", exact=False).first.wait_for(timeout=60_000)  # live progress
                assert page.get_by_role("button", name="Run ablation").is_disabled()
                # the first arms' figures while it runs: "Figures so far: n of m arms", a chart and a table
                page.get_by_text("Figures so far:", exact=False).first.wait_for(timeout=240_000)
                page.get_by_text(re.compile(r"Figures so far: [1-9]\d* of \d+ arms")).first.wait_for(timeout=240_000)
                timings["first_figures_s (click to the first arms' figures)"] = time.monotonic() - t0
                page.screenshot(path=str(shots / "ablation_running.png"))  # the first viewport, mid-ablation
                page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=60_000)
                page.get_by_text("Verdict on ").first.wait_for(timeout=480_000)
                took = time.monotonic() - t0
                page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=60_000)
                (shots / "default_ablation_seconds.txt").write_text(f"{took:.0f}\n")
                timings["default_ablation_s (click to verdict)"] = took
                timings.update(_quiet_runs(private_store))
                said = "\n".join(f"{k}: {v:.1f}" for k, v in timings.items())
                (shots / "timings.txt").write_text(said + "\n")
                print(f"\n{said}\nscreenshots: {shots}")
                _check_card(page)
                tabs = page.get_by_role("tab")
                first = ["Ablation", "Doctor", "Where it pays", "Loading", "Threads"]
                for _ in range(5):  # once (1 run in 4) a tab read "data loading" mid-rerun: read the settled row
                    names = [tabs.nth(i).inner_text() for i in range(tabs.count())]
                    if names[:5] == first:
                        break
                    page.wait_for_timeout(2_000)
                assert names[:5] == first, names
                assert "Example page" in names and "Machine" in names
                plots = 0
                for i, name in enumerate(names):
                    tabs.nth(i).click()
                    plots += _check(page, name, shots)["plots"]
                    if name == "Machine":  # the card's raw floats must read rounded, as on every other page
                        cells = page.evaluate(CELLS_JS)
                        assert any(c.startswith("GEMM") for c in cells), f"Machine: no peak table in {cells[:8]}"
                        bad = [c for c in cells if helpers.unrounded(c)]
                        assert not bad, f"Machine: unrounded numbers {bad}"
                assert plots >= 4  # the ablation's figures at least were drawn and checked
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
