"""Every figure a notebook states is computed (issue 32, "every claim computed"): the markdown cells of every
notebook carry no typed figure, i.e. no digits next to ×, x, %, ms or s, outside a short allow-list. A
figure belongs in a code cell's output, computed from what the notebook just measured (or in an assert).

What the scan leaves out, and why:

- code (fenced blocks and inline code spans): code is run, not typed prose;
- a quotation ("int8 is 2–3× faster"): the claim under test, in the words of whoever made it; the notebook's
  job is to measure it, not to hide it;
- ``95 % CI`` / ``95 % confidence`` / ``95 % interval`` (``95 % bootstrap CI`` too): the confidence level, a
  definition the library chooses (``lab.measure.bootstrap_ratio_ci``), not a measurement.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`[^`\n]*`")
#: A quotation within one paragraph (straight or curly quotes; it may wrap a line, not cross a blank one).
QUOTE = re.compile(r'"(?:[^"\n]|\n(?![ \t]*\n))*"|“[^”]*”')
#: The confidence level of an interval.
CONFIDENCE = re.compile(r"\b95\s?%\s+(?:bootstrap\s+)?(?:CIs?|confidence|interval)\b")
NUMBER = r"\d+(?:[.,]\d+)*(?:\s?[–-]\s?\d+(?:[.,]\d+)*)?"
#: A figure: a number followed by ×, x, %, ms or s (as a unit, not "5 steps"), or × followed by a number.
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}\s?(?:×|x\b|%|ms\b|s\b)|×\s?\d")


def typed_figures(markdown: str) -> list[str]:
    """The typed figures of one markdown cell, each with a little context, after the allow-list is taken out."""
    prose = FENCE.sub(" ", markdown)
    for allowed in (SPAN, QUOTE, CONFIDENCE):
        prose = allowed.sub(" ", prose)
    return [f"{m.group()!r} in …{prose[max(0, m.start() - 30):m.end() + 20]!r}…" for m in FIGURE.finditer(prose)]


def _markdown_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("text, found", [
    ("A step runs 2× faster here.", ["2×"]),
    ("int8 training speedup ≈ 1× (or < 1× with QAT).", ["1×", "1×"]),
    ("mixed precision + pruning cut training by 41.67 %", ["41.67 %"]),
    ("a step of 120 ms, an epoch of 3 s", ["120 ms", "3 s"]),
    ("a 2–3x gain", ["2–3x"]),
    ("at lr × 0.1", ["× 0"]),
])
def test_the_scan_flags_typed_figures(text, found):
    assert [f.split(" in ", 1)[0].strip("'") for f in typed_figures(text)] == found


@pytest.mark.parametrize("text", [
    'An interview answer claims "int8 is 2–3× faster".',
    "the bootstrap 95 % CI of the ratio, and a 95 %\ninterval",
    "the median with its 95 % bootstrap CI over the steps",
    "Speedup = `median(a) / median(b)`; run `lab ablate --repeats 3` (`3 s` in code)",
    "```python\nprint(f'{x:.2f}x')  # 2x\n```",
    "5 steps, 2 seeds, 3 repeats, one epoch, batch 512, 16 threads",
])
def test_the_scan_allows_code_quotations_and_the_confidence_level(text):
    assert typed_figures(text) == []


def test_a_quotation_does_not_reach_across_paragraphs():
    """An unclosed quote in one paragraph must not hide the next paragraph's typed figure."""
    assert typed_figures('A "half quote.\n\nThen it is 3× faster, said no one.') != []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_typed_figure_in_a_notebooks_markdown(path):
    flagged = [f"cell {i}: {f}" for i, text in _markdown_cells(path) for f in typed_figures(text)]
    assert not flagged, (f"{path.name} types figures in its markdown; compute them in a code cell (or quote the "
                         "claim under test):\n" + "\n".join(flagged))


def test_every_notebook_is_scanned():
    assert len(NOTEBOOKS) >= 9 and all(_markdown_cells(p) for p in NOTEBOOKS)
