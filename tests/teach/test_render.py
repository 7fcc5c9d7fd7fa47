"""The executed notebooks the docs site renders (lab.teach.render, `make notebooks-docs`): one stamped copy per
source notebook in docs/notebooks/, each in the site's nav and small; the sources themselves carry no outputs.
The render's rules (one clean commit, a quiet machine, a fresh store per notebook, sanity checks, a static image
beside every figure) are tested on a planted checkout and one tiny planted notebook (one kernel, no torch in it);
nothing here executes a real notebook (that is `make notebooks-docs`, minutes each)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import nbformat
import pytest

from lab.measure import contention as contention_mod
from lab.measure.contention import Contention
from lab.teach import preflight, render
from lab.teach.render import DROPPED_MIMES, Execution, Stamp, execute_copy, kernel_env, publish, strip_outputs
from lab.teach.static_figures import PLOTLY_MIME, add_static_images, figures_without_image, with_fallback

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks").glob("*.ipynb"))
COPIES = ROOT / "docs" / "notebooks"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_a_source_notebook_carries_no_outputs(src: Path) -> None:
    cells = json.loads(src.read_text(encoding="utf-8"))["cells"]
    ran = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]
    assert not ran, f"{src.name}: cells {ran} hold outputs (the executed copy lives in docs/notebooks/)"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_each_notebook_has_a_small_stamped_executed_copy_in_the_docs_nav(src: Path) -> None:
    copy = COPIES / src.name
    assert copy.is_file(), f"no executed copy of {src.name}: run make notebooks-docs NOTEBOOKS=notebooks/{src.name}"
    # a static PNG per figure (twice: in its bundle and in its HTML) is tens of kB; plotly.js embedded is ~4.6 MB
    assert copy.stat().st_size < 2_000_000, f"{copy.name} is {copy.stat().st_size} bytes (an embedded plotly.js?)"
    nb = json.loads(copy.read_text(encoding="utf-8"))
    stamp = nb["metadata"]["lab_executed"]
    assert stamp["hardware_id"] and len(stamp["git_sha"]) == 40 and stamp["seconds"] > 0
    assert "".join(nb["cells"][0]["source"]).startswith("> **Executed copy**")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in code) and any(c["outputs"] for c in code)
    assert not any(o.get("output_type") == "error" for c in code for o in c["outputs"])
    # the source's code, cell by cell: the figures are this code's (a markdown edit does not change them)
    assert [c.source for c in nbformat.read(src, as_version=4).cells if c.cell_type == "code"] == [
        c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in code], \
        f"{copy.name} was executed from other code than notebooks/{src.name}: rerun make notebooks-docs"
    assert f"notebooks/{src.name}" in (ROOT / "mkdocs.yml").read_text(), f"{src.name} is not in mkdocs.yml's nav"


def test_the_copies_come_from_one_clean_commit_and_every_figure_reads_without_javascript() -> None:
    paths = sorted(COPIES.glob("*.ipynb"))
    stamps = {p.name: json.loads(p.read_text(encoding="utf-8"))["metadata"]["lab_executed"] for p in paths}
    old = sorted(name for name, s in stamps.items() if s.get("format", 1) < 2)
    if old:
        pytest.skip(f"rendered before the render checked its rules (stamp format 2): {old}; `make notebooks-docs` "
                    "re-renders them all at one commit")
    copies = {p.name: nbformat.read(p, as_version=4) for p in paths}
    assert len({s["git_sha"] for s in stamps.values()}) == 1, {n: s["git_sha"][:10] for n, s in stamps.items()}
    assert not any(s["dirty_files"] for s in stamps.values()), {n: s["dirty_files"] for n, s in stamps.items()}
    blank = {name: figures_without_image(nb) for name, nb in copies.items() if figures_without_image(nb)}
    assert not blank, f"interactive figures without a static image (cells): {blank}"


def test_strip_outputs_drops_widget_views_and_state_and_keeps_the_text() -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"state": {}}
    cell = nbformat.v4.new_code_cell("w")
    data = {"text/plain": "w", **dict.fromkeys(DROPPED_MIMES, {})}
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    nb.cells.append(cell)
    strip_outputs(nb)
    assert "widgets" not in nb.metadata and dict(cell.outputs[0]["data"]) == {"text/plain": "w"}


# ---------------------------------------------------------------------------------------------------------------
# The render's rules, on a planted checkout.

QUIET = Contention(others_cores=0.05, steal_share=0.0, load1=0.3, cores=2, wall_s=1.0)
BUSY = Contention(others_cores=1.7, steal_share=0.0, load1=4.2, cores=2, wall_s=1.0)
FAKE_PNG = b"\x89PNG\r\n\x1a\nplanted"

#: A notebook that records what its kernel sees, shows one plotly figure and holds two "runs" (a stand-in class
#: with RunResult's name and to_dict: the probe recognises runs by name, so the kernel never imports torch).
PLANTED_CELLS = [
    "import os\n"
    "store, cache = os.environ['LAB_RESULTS_DB'], os.environ['LAB_CACHE_DIR']\n"
    "print('store', store, os.path.exists(store), 'cache', os.listdir(cache))",
    "from IPython.display import display\n"  # the bundle plotly emits under static_figures.RENDERER, without plotly
    "display({'text/html': '<div><div id=\"f1\" class=\"plotly-graph-div\"></div><script>draw()</script></div>',\n"
    "         'application/vnd.plotly.v1+json': {'data': [{'type': 'bar', 'y': [1, 3]}],\n"
    "                                            'layout': {'title': {'text': 'planted bars'}}}}, raw=True)",
    "class RunResult:\n"
    "    def __init__(self, requested, ms):\n"
    "        self.requested, self.ms = requested, ms\n"
    "    def to_dict(self):\n"
    "        return {'run_id': self.requested, 'config': {'workload': 'ctr', 'precision': {'dtype': self.requested}},\n"
    "                'env': {}, 'workload': 'ctr', 'step_times_ms': {'total': self.ms},\n"
    "                'details': {'precision': {'resolved': 'fp32'}}}\n"
    "results = {'fp32': [RunResult('fp32', [10.0, 10.2, 9.9] * 8)],\n"
    "           'auto': [RunResult('auto', [10.1, 10.0, 9.9] * 8)]}",
]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=lab@example.org", "-c", "user.name=lab", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A committed git checkout holding ``notebooks/planted.ipynb`` and a stale ``docs/notebooks`` copy."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# planted"), *map(nbformat.v4.new_code_cell, PLANTED_CELLS)]
    nbformat.write(nb, repo / "notebooks" / "planted.ipynb")
    (repo / "lab.py").write_text("X = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "planted")
    return repo


def _no_run(*_a, **_k):
    raise AssertionError("no notebook may run after a refusal")


def test_a_dirty_tree_is_refused_and_each_dirty_file_named(checkout: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(render, "execute_copy", _no_run)
    monkeypatch.setattr(preflight, "sample_contention", _no_run)
    (checkout / "lab.py").write_text("X = 2\n")
    (checkout / "new_module.py").write_text("")
    (checkout / "docs" / "notebooks").mkdir(parents=True)
    (checkout / "docs" / "notebooks" / "old.ipynb").write_text("{}")  # the render's own output: not a reason
    argv = ["--repo", str(checkout), "--out", str(checkout / "docs" / "notebooks"), "--no-static-images",
            str(checkout / "notebooks" / "planted.ipynb")]
    assert render.main(argv) == 2
    said = capsys.readouterr().out
    assert "refusing" in said and "lab.py" in said and "new_module.py" in said and "old.ipynb" not in said
    assert preflight.dirty_files(checkout, ["docs/notebooks"]) == ["lab.py", "new_module.py"]


def test_a_machine_that_stays_busy_is_refused_with_progress(checkout: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(render, "execute_copy", _no_run)
    monkeypatch.setattr(preflight, "sample_contention", lambda _w: BUSY)
    monkeypatch.setattr(preflight.time, "monotonic", itertools.count(0.0, 1.0).__next__)  # a window: 1 s
    argv = ["--repo", str(checkout), "--out", str(checkout / "docs" / "notebooks"), "--no-static-images",
            "--wait", "3", "--window", "0", str(checkout / "notebooks" / "planted.ipynb")]
    assert render.main(argv) == 2
    said = capsys.readouterr().out
    assert said.count("waiting for it to go quiet") == 2  # progress while it waits, then the refusal
    assert "stayed busy" in said and "1.7 of 2 cores" in said and "--force" in said
    # the lab's own rule decides: a window below BUSY_CORES is quiet, and the wait ends at once
    monkeypatch.setattr(preflight, "sample_contention", lambda _w: QUIET)
    assert preflight.wait_until_quiet(60, 0)[0] is QUIET


def test_each_notebook_gets_its_own_empty_store_and_cache(tmp_path: Path) -> None:
    a, b = kernel_env(tmp_path / "a", "png"), kernel_env(tmp_path / "b", "png")
    assert a["LAB_RESULTS_DB"] != b["LAB_RESULTS_DB"] and a["LAB_CACHE_DIR"] != b["LAB_CACHE_DIR"]
    assert a["LAB_RESULTS_DB"] != os.environ.get("LAB_RESULTS_DB")
    assert not Path(a["LAB_RESULTS_DB"]).exists() and not any(Path(a["LAB_CACHE_DIR"]).iterdir())


def test_a_planted_render_is_stamped_fresh_checked_and_has_a_static_image(checkout: Path, monkeypatch) -> None:
    class QuietMeter:  # the box's neighbours must not decide this test
        def start(self):
            return self

        def stop(self):
            return QUIET

    monkeypatch.setattr(contention_mod, "ContentionMeter", QuietMeter)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    src, out = checkout / "notebooks" / "planted.ipynb", checkout / "docs" / "notebooks"
    info = execute_copy(src, out, 120, to_png=lambda fig: FAKE_PNG, git_sha=_git(checkout, "rev-parse", "HEAD").strip(),
                        dirty=[])
    assert info["written"] and not info["problems"], info
    copy = nbformat.read(out / "planted.ipynb", as_version=4)
    stamp = copy.metadata["lab_executed"]
    assert stamp["format"] == 2 and stamp["dirty_files"] == [] and len(stamp["git_sha"]) == 40
    assert stamp["load_before"] is not None and stamp["load_after"] is not None and stamp["hardware_id"]
    head = copy.cells[0].source
    for part in (stamp["git_sha"][:10], "a clean tree", "load average", "before", "after", stamp["hardware_id"],
                 "fresh results store", "within its noise", "1 of 1 interactive figures"):
        assert part in head, part
    # the kernel saw a store and cache of its own, empty, and gone afterwards
    printed = copy.cells[2].outputs[0]["text"].split()
    assert printed[0] == "store" and printed[2] == "False" and printed[-1] == "[]"
    assert "lab-render-planted-" in printed[1] and not Path(printed[1]).parent.exists()
    # the probe cell is gone: the copy's code is the source's
    assert [c.source for c in copy.cells if c.cell_type == "code"] == PLANTED_CELLS
    # the figure: its PNG in the bundle and inside its HTML; the figure JSON dropped
    [fig_out] = copy.cells[3].outputs
    assert fig_out["data"]["image/png"] == "iVBORw0KGgpwbGFudGVk" and PLOTLY_MIME not in fig_out["data"]
    html = fig_out["data"]["text/html"]
    assert 'class="lab-static-figure"' in html and 'alt="planted bars"' in html and "draw()" in html
    assert figures_without_image(copy) == []
    assert [s["rule"] for s in stamp["sanity"]] == ["A/A reads 1"] and stamp["sanity"][0]["ok"]


def _execution(runs: list[dict], contention: Contention | None = QUIET) -> Execution:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/html": '<div><div id="u1" class="plotly-graph-div" style="height:100%"></div><script>x</script></div>',
        PLOTLY_MIME: {"data": [{"type": "bar", "y": [1]}], "layout": {}}})]
    nb.cells.append(cell)
    return Execution(nb=nb, started_at="2026-01-01 00:00 UTC", seconds=3.0, cpu_seconds=1.0, load_before=0.5,
                     load_after=0.7, contention=contention, runs=runs)


def _run_row(requested: str, ms: float) -> dict:
    return {"run_id": requested, "config": {"workload": "ctr", "precision": {"dtype": requested}}, "env": {},
            "workload": "ctr", "step_times_ms": {"total": [ms, ms * 1.01, ms * 0.99] * 8},
            "details": {"precision": {"resolved": "fp32"}}}


def test_a_copy_that_breaks_a_rule_is_not_written_unless_forced_and_then_says_so(tmp_path: Path) -> None:
    src = Path("notebooks/02_mixed_precision.ipynb")
    liar = [_run_row("fp32", 10.0), _run_row("auto", 8.0)]  # 02's copy: auto (fp32) at 1.25x over fp32
    info = publish(src, _execution(liar, BUSY), tmp_path, to_png=lambda f: FAKE_PNG)
    assert not info["written"] and not (tmp_path / src.name).exists()
    assert any("excludes 1" in p for p in info["problems"]) and any("busy while it ran" in p for p in info["problems"])
    blank = publish(src, _execution([]), tmp_path, to_png=lambda f: 1 / 0)  # a figure kaleido could not draw
    assert not blank["written"] and "figures without a static image in cells [0]" in blank["problems"][0]
    forced = publish(src, _execution(liar, BUSY), tmp_path, to_png=lambda f: FAKE_PNG, force=True,
                     forced=["started on a busy machine"], git_sha="f" * 40, dirty=[])
    assert forced["written"]
    copy = nbformat.read(tmp_path / src.name, as_version=4)
    assert "Written with `--force`" in copy.cells[0].source and "excludes 1" in copy.cells[0].source
    assert len(copy.metadata["lab_executed"]["forced"]) == 3


def test_the_stamp_says_where_when_and_from_which_code_the_figures_come() -> None:
    stamp = Stamp(notebook="01_data_loading.ipynb", git_sha="0123456789abcdef", dirty_files=["lab/x.py"],
                  hardware_id="hw-2c", device="A CPU", cores=2, started_at="2026-01-01 10:00 UTC", seconds=61.4,
                  cpu_seconds=50.0, load_before=0.4, load_after=1.9,
                  contention={"others_cores": 0.1, "cores": 2}, figures=2, static_images=2)
    text = stamp.markdown()
    for part in ("`notebooks/01_data_loading.ipynb`", "`hw-2c`", "A CPU", "`0123456789`", "`lab/x.py`",
                 "uncommitted", "Ran 61 s", "50 CPU s", "load average 0.4 before, 1.9 after",
                 "0.1 of 2 cores while it ran", "2026-01-01 10:00 UTC", "2 of 2 interactive figures"):
        assert part in text, part
    assert text.startswith("> **Executed copy**") and "--force" not in text
    assert stamp.metadata()["git_dirty"] is True


def test_a_plot_without_a_plot_box_still_gets_its_image_for_readers_without_javascript() -> None:
    page = with_fallback("<div>no box</div>", "QUJD", "t")
    assert page.startswith('<noscript><img src="data:image/png;base64,QUJD"')
    nb = _execution([]).nb
    assert add_static_images(nb, None) == {"figures": 1, "static": 0, "failed": []}  # images off: counted
    assert figures_without_image(nb) == [0]


def _kaleido_missing() -> str | None:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install -e '.[docs]'; only make notebooks-docs needs it)"
    from lab.teach.static_figures import find_browser

    return None if find_browser() else "no Chrome/Chromium for kaleido on this machine"


@pytest.mark.slow
@pytest.mark.skipif(_kaleido_missing() is not None, reason=str(_kaleido_missing()))
def test_kaleido_draws_a_png_with_the_local_chromium() -> None:
    from lab.teach.static_figures import StaticImages

    with StaticImages() as images:
        png = images.png({"data": [{"type": "scatter", "y": [1, 3, 2]}], "layout": {"height": 300}})
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_the_kernel_renderer_gives_plotly_s_html_and_the_figure_json_in_one_bundle(monkeypatch) -> None:
    import plotly.graph_objects as go
    import plotly.io as pio

    from lab.teach.static_figures import PLOT_DIV, RENDERER

    monkeypatch.setattr(pio.renderers, "default", RENDERER)
    bundle = go.Figure(go.Bar(y=[1, 2]))._repr_mimebundle_()
    assert PLOT_DIV.search(bundle["text/html"]) and bundle[PLOTLY_MIME]["data"][0]["type"] == "bar"
    assert "cdn.plot.ly" in pio.renderers[RENDERER.split("+")[0]].to_mimebundle(go.Figure().to_dict())["text/html"]


def _png(width: int = 4, height: int = 3) -> bytes:
    """A real (red) PNG, so a browser decodes it: signature, IHDR, IDAT, IEND."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.mark.browser
def test_a_figure_in_a_copy_shows_its_image_with_javascript_off_or_plotly_unreachable(tmp_path: Path) -> None:
    import shutil

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not Path(chromium).exists():
        pytest.skip("no chromium on this machine")
    src = Path("notebooks/02_mixed_precision.ipynb")
    assert publish(src, _execution([]), tmp_path, to_png=lambda f: _png(), git_sha="f" * 40, dirty=[])["written"]
    html = nbformat.read(tmp_path / src.name, as_version=4).cells[1].outputs[0]["data"]["text/html"]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        try:
            for js in (False, True):  # JavaScript off; on, with plotly.js unreachable (offline, CDN blocked)
                page = browser.new_context(java_script_enabled=js).new_page()
                page.route("**/*", lambda route: route.abort())
                page.set_content(f"<html><body>{html}</body></html>")
                img = page.locator("img.lab-static-figure")
                assert img.count() == 1 and img.is_visible()
                assert page.evaluate("() => document.querySelector('img.lab-static-figure').naturalWidth") == 4
        finally:
            browser.close()


def test_force_renders_on_a_busy_machine_saying_so_and_a_tree_that_changes_mid_render_stops_it(
        checkout: Path, monkeypatch, capsys) -> None:
    calls = []

    def fake_copy(src, out, timeout, **kw):  # the first notebook "runs" and leaves a file in the tree
        calls.append(kw["forced"])
        (checkout / "stray.txt").write_text("written by a notebook")
        return {"written": True, "seconds": 1.0, "cpu_seconds": None, "contention": None, "problems": [],
                "static": 0, "figures": 0, "sanity": [], "bytes": 1, "path": str(out / src.name)}

    monkeypatch.setattr(render, "execute_copy", fake_copy)
    monkeypatch.setattr(preflight, "sample_contention", lambda _w: BUSY)
    nb = str(checkout / "notebooks" / "planted.ipynb")
    argv = ["--repo", str(checkout), "--out", str(checkout / "docs" / "notebooks"), "--no-static-images",
            "--wait", "0", "--window", "0", "--force", nb, nb]
    assert render.main(argv) == 1
    said = capsys.readouterr().out
    assert len(calls) == 1 and any("started on a busy machine" in r for r in calls[0])
    assert "no static images" in " ".join(calls[0]) and "FORCED" in said
    assert "files changed: stray.txt" in said and "stopping before" in said


def test_a_link_to_the_manual_is_rewritten_for_the_copys_place_on_the_site() -> None:
    from lab.teach.render import site_links

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("an [A/A](../docs/glossary.md#aa) test, [the recipe](../docs/recipe.md), "
                                      "[elsewhere](https://example.org/x.md)"),
        nbformat.v4.new_code_cell("print('[x](../docs/glossary.md#aa)')")])  # code is left as it is
    assert site_links(nb) == 2
    assert nb.cells[0].source == ("an [A/A](../../glossary/#aa) test, [the recipe](../../recipe/), "
                                  "[elsewhere](https://example.org/x.md)")
    assert nb.cells[1].source == "print('[x](../docs/glossary.md#aa)')"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_every_link_to_the_manual_names_a_page_and_anchor_that_exist(src: Path) -> None:
    import re

    from lab.teach.render import DOCS_LINK

    text = "".join("".join(c["source"]) for c in json.loads(src.read_text(encoding="utf-8"))["cells"]
                   if c["cell_type"] == "markdown")
    for page, anchor in DOCS_LINK.findall(text):
        doc = ROOT / "docs" / f"{page}.md"
        assert doc.is_file(), f"{src.name} links to docs/{page}.md, which does not exist"
        if anchor:
            body = doc.read_text(encoding="utf-8")
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")  # MkDocs' heading ids
                     for h in re.findall(r"^#+ (.*)$", body, re.M)}
            assert f'id="{anchor[1:]}"' in body or anchor[1:] in slugs, \
                f"{src.name} links to docs/{page}.md{anchor}: no such anchor there"
