"""The executed notebooks the docs site renders (lab.teach.render, `make notebooks-docs`): one stamped copy per
source notebook in docs/notebooks/, each in the site's nav and small; the sources themselves carry no outputs.
Nothing here executes a notebook (that is `make notebooks-docs`, minutes each)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from lab.teach.render import DROPPED_MIMES, stamp_text, strip_outputs

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
    assert copy.stat().st_size < 1_000_000, f"{copy.name} is {copy.stat().st_size} bytes (an embedded plotly.js?)"
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


def test_strip_outputs_drops_widget_views_and_state_and_keeps_the_text() -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"state": {}}
    cell = nbformat.v4.new_code_cell("w")
    data = {"text/plain": "w", **dict.fromkeys(DROPPED_MIMES, {})}
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    nb.cells.append(cell)
    strip_outputs(nb)
    assert "widgets" not in nb.metadata and dict(cell.outputs[0]["data"]) == {"text/plain": "w"}


def test_the_stamp_says_where_and_from_which_code_the_figures_come() -> None:
    env = {"hardware_id": "hw-2c", "device_name": "A CPU", "git_sha": "0123456789abcdef", "git_dirty": True,
           "usable_cores": 2}
    text = stamp_text(Path("notebooks/01_data_loading.ipynb"), env, 61.4, 3.0)
    for part in ("`notebooks/01_data_loading.ipynb`", "`hw-2c`", "A CPU", "`0123456789`", "uncommitted changes",
                 "ran 61 s", "load average 3.0 on 2 cores"):
        assert part in text, part
    assert "uncommitted" not in stamp_text(Path("x.ipynb"), {**env, "git_dirty": False}, 1.0, None)


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
