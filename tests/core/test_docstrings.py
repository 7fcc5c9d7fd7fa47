"""The lab's docstrings and comments say why, not which ticket: an issue number means nothing to a reader of the
code (docs/ may keep them, and the notebooks' helpers in lab/teach are the lessons' own)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import lab

LAB = Path(lab.__file__).parent
TICKET = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)", re.IGNORECASE)


def _prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment in ``source``."""
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def test_no_docstring_or_comment_in_lab_cites_an_issue_number():
    texts = {path: path.read_text() for path in sorted(LAB.rglob("*.py")) if "teach" not in path.relative_to(LAB).parts}
    cited = [f"{path.relative_to(LAB.parent)}:{line}: {TICKET.search(text).group(0)}"
             for path, source in texts.items() if TICKET.search(source)  # parsed only where a number appears
             for line, text in _prose(source) if TICKET.search(text)]
    assert not cited, "say why instead of citing the ticket:\n" + "\n".join(cited)


def test_the_scan_sees_docstrings_and_comments():
    source = 'def f():\n    """Fixed in issue 12."""\n    x = "issue 13"  # see Issue 14\n'
    assert [TICKET.search(t).group(0) for _, t in sorted(_prose(source)) if TICKET.search(t)] == ["issue 12",
                                                                                                  "Issue 14"]
