"""The dashboard's shape (issue 26 item 5): every tab, the built-in ones too, is a ``page_*.py`` module with
``TITLE`` and ``render()`` in a fixed order; no page trains in the Streamlit script (the data-loading tab's
runs are a worker job that a reload re-attaches to and Cancel stops); one results-store handle serves every
rerun and session (``st.cache_resource``), not one per ``with ResultStore()``."""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from lab import (  # noqa: E402
    ResultStore,
    RunConfig,
    jobs,  # noqa: E402
)
from lab.ablation import worker  # noqa: E402
from lab.config import DataConfig  # noqa: E402

DASH = Path(__file__).resolve().parents[2] / "dashboard"
APP = str(DASH / "app.py")
BUILT_IN = ["Ablation", "Doctor", "Where does it pay?", "Data loading", "Workers vs threads", "Full run",
            "Scaling model", "Machine", "Stored runs", "Performance report"]
#: Their tab labels (``TAB``): short, so the row fits at 1280 px (tests/e2e/test_browser.py measures it).
BUILT_IN_TABS = ["Ablation", "Doctor", "Where it pays", "Loading", "Threads", "Full run", "Scaling", "Machine", "Runs",
                 "Report"]


def _pages_module(monkeypatch):
    name = "lab_dashboard_pages_under_test"
    spec = importlib.util.spec_from_file_location(name, DASH / "_pages.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_every_tab_is_a_page_module_with_a_title_and_render_in_the_tabs_order(monkeypatch):
    monkeypatch.syspath_prepend(str(DASH))  # the pages import their helpers (_shared, _views) from there
    monkeypatch.delenv("LAB_DASHBOARD_PAGES", raising=False)
    loader = _pages_module(monkeypatch)
    pages = loader.discover()
    assert [p.error for p in pages] == [None] * len(pages)
    assert [p.path.stem for p in pages[:10]] == list(loader.ORDER)
    assert [p.title for p in pages[:10]] == BUILT_IN  # the Ablation tab first, then what a person asks next
    assert {p.path.name for p in pages} == {p.name for p in DASH.glob("page_*.py")}
    for page in pages:
        source = ast.parse(page.path.read_text())
        names = {t.id for node in source.body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name)}
        functions = {node.name: node for node in source.body if isinstance(node, ast.FunctionDef)}
        assert "TITLE" in names and "render" in functions, page.path.name
        assert not functions["render"].args.args, f"{page.path.name}: render() takes no arguments"
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    assert [p.tab for p in pages[:10]] == BUILT_IN_TABS
    assert all(len(p.tab) <= 14 for p in pages), [p.tab for p in pages]  # a long label scrolls the row
    assert [t.label for t in at.tabs] == [p.tab for p in pages]  # app.py draws exactly the page list


def _calls_and_imports(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    return calls, imported


def test_no_dashboard_module_trains_in_the_script_or_opens_its_own_store():
    for path in sorted(DASH.glob("*.py")):
        calls, imported = _calls_and_imports(path)
        assert not {"lab.run", "lab.train.run", "lab.ablation.run_ablation"} & imported, path.name
        if path.name != "_shared.py":  # the one place that opens it, cached
            assert "ResultStore" not in calls, f"{path.name} opens a ResultStore of its own"


def test_one_store_handle_serves_every_rerun_and_session(private_store, monkeypatch):
    opened: list[str] = []
    real_init = ResultStore.__init__

    def counting(self, path=None, **kw):
        real_init(self, path, **kw)
        opened.append(str(self.path))

    monkeypatch.setattr(ResultStore, "__init__", counting)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    at.selectbox(key="speed").select("infer_speedup").run()  # a rerun
    at.run()
    AppTest.from_file(APP, default_timeout=60).run()  # a reload: another session
    assert opened == [str(private_store)]
    # a store that was closed under it (or whose file went) is opened again, not used closed
    monkeypatch.syspath_prepend(str(DASH))
    import _shared  # the module the app's pages use (AppTest put the app's folder on sys.path)

    _shared.store().close()
    again = AppTest.from_file(APP, default_timeout=60).run()
    assert not again.exception, again.exception
    assert opened == [str(private_store)] * 2


def test_a_reload_reattaches_to_a_running_measurement_and_cancel_stops_it(private_store):
    cfg = RunConfig(workload="ctr", size="tiny", threads=1, max_steps=10, latency_repeats=0,
                    data=DataConfig(loader="naive", storage="local_ssd"))
    key, spec = worker.batch_spec("loaders", {"naive": cfg})
    with ResultStore(private_store) as store:
        token = jobs.claim(store, key, spec=spec)  # as a click in another session did; its worker is starting
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, at.exception
    assert any("Re-attached to the data-loading measurement" in i.value for i in at.info)
    assert at.button(key="dl_run").disabled
    assert any(m.value.startswith("starting the worker") for m in at.markdown)  # its progress
    assert not at.button(key="run").disabled  # the Ablation tab does not take it for an ablation
    at.button(key="dl_cancel").click().run()
    with ResultStore(private_store) as store:
        assert jobs.job(store, key)["cancel"]
        assert worker.start(private_store, key, token).wait(timeout=240) == 0
        job = jobs.job(store, key)
        assert job["status"] == "cancelled" and job["pid"] != os.getpid() and store.count() == 0
    at.run()
    assert not at.exception, at.exception
    assert not at.button(key="dl_run").disabled
    assert any("Cancelled after 0 of 1 runs" in w.value for w in at.warning)
