"""A static image beside every interactive figure of an executed notebook, so the page reads without JavaScript.

Why: an executed copy draws each plotly figure with plotly.js loaded from cdn.plot.ly when the page is viewed
(:data:`lab.teach.render.PLOTLY_RENDERER`): with JavaScript off, offline, or on GitHub's notebook view the
figure is a blank box, and the copy's prose points at nothing. The kernel therefore also emits each figure's JSON
(plotly's ``plotly_mimetype`` renderer, :data:`RENDERER`), and after the run :func:`add_static_images` renders
it to PNG with plotly's own ``to_image`` (kaleido driving a local Chrome or Chromium, started once for the whole
render by :class:`StaticImages`) and puts it

* in the same output bundle as ``image/png``, for every viewer that picks a static mime type, and
* inside the interactive figure's own HTML, as an ``<img>`` in the plot's box that a one-line script removes once
  plotly.js has loaded: nbconvert (and so mkdocs-jupyter) shows one mime type per output, the HTML, so a bundle
  entry alone would never reach the docs site. JavaScript off or the CDN unreachable: the image stays.

The figure's JSON is then dropped from the bundle (the HTML carries the same data; the copy stays small).
"""

from __future__ import annotations

import base64
import html as html_lib
import os
import re
import shutil
from collections.abc import Callable
from typing import Any

#: The renderers the kernel runs with: the CDN-loading HTML plus the figure's JSON for the static image.
RENDERER = "notebook_connected+plotly_mimetype"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: How an interactive figure is recognised in an output's HTML.
PLOT_DIV = re.compile(r'(<div id="([^"]+)" class="plotly-graph-div"[^>]*>)')
#: Pixel size when the figure's layout sets none (plotly's HTML box is 525 px high, the page's width).
DEFAULT_SIZE = (700, 450)
#: Browsers kaleido may drive, in the order they are looked for on ``PATH`` (``BROWSER_PATH`` wins).
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str | None:
    """The Chrome/Chromium kaleido will drive: ``$BROWSER_PATH``, else the first of :data:`BROWSERS` on PATH."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class StaticImages:
    """PNG renderings of plotly figures through kaleido's one long-lived Chrome (kaleido >= 1). ``start()`` raises
    ``RuntimeError`` with the reason when kaleido or a browser is missing or the browser does not answer; nothing
    is downloaded (no ``kaleido.get_chrome``), and MathJax is off (it would come from a CDN)."""

    def __init__(self) -> None:
        self._started = False

    def start(self) -> StaticImages:
        try:
            import kaleido
        except ImportError as exc:
            raise RuntimeError("kaleido is not installed (pip install -e '.[docs]')") from exc
        browser = find_browser()
        if browser is None:
            raise RuntimeError(f"no Chrome or Chromium found (looked for $BROWSER_PATH, then {', '.join(BROWSERS)})")
        os.environ["BROWSER_PATH"] = browser  # choreographer, under kaleido, reads it
        try:
            kaleido.start_sync_server(mathjax=False, silence_warnings=True)
            self._started = True
            self.png({"data": [{"type": "bar", "y": [1, 2]}], "layout": {}})  # fail here, not mid-render
        except Exception as exc:
            self.close()
            raise RuntimeError(f"kaleido could not drive {browser}: {type(exc).__name__}: {exc}") from exc
        return self

    def png(self, fig: dict[str, Any]) -> bytes:
        """``fig`` (a plotly figure as JSON) as PNG bytes, at its layout's size or :data:`DEFAULT_SIZE`."""
        import warnings

        import plotly.io as pio

        layout = fig.get("layout") or {}
        with warnings.catch_warnings():  # "kopts is ignored if using a server": the server is ours, started above
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            return pio.to_image(fig, format="png", width=layout.get("width") or DEFAULT_SIZE[0],
                                height=layout.get("height") or DEFAULT_SIZE[1], scale=1, validate=False)

    def close(self) -> None:
        if self._started:
            import kaleido

            kaleido.stop_sync_server(silence_warnings=True)
            self._started = False

    def __enter__(self) -> StaticImages:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _title(fig: dict[str, Any]) -> str:
    title = (fig.get("layout") or {}).get("title")
    text = title.get("text") if isinstance(title, dict) else title
    return re.sub(r"<[^>]+>", " ", str(text)).strip() if text else "figure"


def with_fallback(page: str, png_b64: str, alt: str) -> str:
    """``page`` (plotly's HTML for one figure) with the PNG inside the plot's box and a script that removes it
    once plotly.js is there; without a plot box in ``page``, the image goes first, in a ``<noscript>``."""
    src = f"data:image/png;base64,{png_b64}"
    m = PLOT_DIV.search(page)
    if m is None:
        return f'<noscript><img src="{src}" alt="{html_lib.escape(alt)}" style="max-width:100%"></noscript>{page}'
    img_id = f"lab-static-{m.group(2)}"
    img = (f'<img id="{img_id}" class="lab-static-figure" src="{src}" alt="{html_lib.escape(alt)}" '
           'style="max-width:100%;max-height:100%">')
    remover = (f'<script>if (window.Plotly) {{ var s = document.getElementById("{img_id}"); if (s) s.remove(); }}'
               "</script>")
    return page[:m.end()] + img + page[m.end():] + remover


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def add_static_images(nb: Any, to_png: Callable[[dict[str, Any]], bytes] | None) -> dict[str, Any]:
    """Give every output of ``nb`` that carries a plotly figure's JSON its PNG (``to_png``, e.g.
    :meth:`StaticImages.png`; ``None``: images off) in the bundle and in its HTML, then drop the JSON. Returns
    ``{"figures": n, "static": k, "failed": [reasons]}``."""
    figures, static, failed = 0, 0, []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            fig = data.pop(PLOTLY_MIME, None)
            if fig is None:
                continue
            figures += 1
            if to_png is None:
                continue
            try:
                png = base64.b64encode(to_png(dict(fig))).decode("ascii")
            except Exception as exc:  # one figure that does not render must not lose the whole copy
                failed.append(f"cell {index}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            data["image/png"] = png
            if "text/html" in data:
                data["text/html"] = with_fallback(_text(data["text/html"]), png, _title(fig))
            static += 1
    return {"figures": figures, "static": static, "failed": failed}


def figures_without_image(nb: Any) -> list[int]:
    """Cells of ``nb`` holding an interactive plotly figure whose output has no static image (``image/png`` or
    ``image/svg+xml``): what a reader without JavaScript would see blank."""
    cells = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if PLOT_DIV.search(_text(data.get("text/html", ""))) and not ({"image/png", "image/svg+xml"} & set(data)):
                cells.append(index)
    return cells


__all__ = ["BROWSERS", "DEFAULT_SIZE", "PLOTLY_MIME", "RENDERER", "StaticImages", "add_static_images",
           "figures_without_image", "find_browser", "with_fallback"]
