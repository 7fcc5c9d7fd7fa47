"""The README and the manual (docs/, MkDocs): the README stays short and its commands are the real ones, every
relative link and every repository path they name exists, the code cites only docs inside the repository,
and the strict MkDocs build passes (``make docs``, which ``make test`` runs first)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README_MAX_LINES = 200

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
#: A code span naming a file or folder of this repository (a placeholder such as ``<hardware-id>`` is not one).
REPO_PATH = re.compile(r"(?:lab|tests|benchmarks|dashboard|notebooks|docs)/[\w./-]*")


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def _relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(_prose(text)) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def _quick_start(text: str) -> list[str]:
    """The command lines of the first code block under the README's "Quick start" heading."""
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"^```\w*\n(.*?)^```", section, re.S | re.M).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readme_is_at_most_200_lines() -> None:
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_the_readme_quick_start_is_make_dashboard_and_make_test_and_ci_runs_the_same() -> None:
    assert _quick_start(README.read_text()) == ["make dashboard", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("dashboard", "test", "docs"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no `{target}` target"
    test_prereqs = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    assert "docs" in test_prereqs, "`make test` must build the docs first (a broken link fails CI)"
    assert re.search(r"mkdocs build --strict", makefile), "`make docs` must build with --strict"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M), ".ci/run must run the README's test command, `make test`"


def _what_is_where(text: str) -> tuple[list[str], dict[str, str], list[str]]:
    """The README's tree: the top-level folders, each ``lab`` sub-package with what its lines say, and the
    ``lab/*.py`` modules named on the lines between them."""
    section = text.split("## What is where", 1)[1]
    block = re.search(r"^```\w*\n(.*?)^```", section, re.S | re.M).group(1)
    tops, subs, modules, current = [], {}, [], None
    for line in block.splitlines():
        if m := re.match(r"(\w+/)\s", line):
            tops.append(m.group(1))
        elif m := re.match(r"  (\w+)/\s+(.*)", line):
            current = m.group(1)
            subs[current] = m.group(2)
        elif line.strip().startswith("·") and current:
            subs[current] += " " + line.strip()
        elif re.match(r"  \w+\.py\s", line):
            current = None
            modules += re.findall(r"(?:^|\s)(\w+\.py)(?=\s|$)", line)
    return tops, subs, modules


def test_what_is_where_names_every_part_of_lab_and_nothing_that_is_not_there() -> None:
    tops, subs, modules = _what_is_where(README.read_text())
    assert {"lab/", "dashboard/", "notebooks/", "benchmarks/", "tests/", "docs/"} <= set(tops)
    assert all((ROOT / t).is_dir() for t in tops), tops
    lab = ROOT / "lab"
    real_modules = {p.name for p in lab.glob("*.py")} - {"__init__.py", "__main__.py"}
    real_packages = {p.name for p in lab.iterdir() if (p / "__init__.py").is_file()}
    assert set(modules) == real_modules, f"lab/*.py: README names {sorted(modules)}, the tree {sorted(real_modules)}"
    assert set(subs) == real_packages, f"lab/*/: README names {sorted(subs)}, the tree has {sorted(real_packages)}"
    for package, said in subs.items():
        parts = {p.stem if p.suffix == ".py" else p.name for p in (lab / package).iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
        if not parts:  # a one-module package: its line says what it does
            continue
        # Each "·"- or ","-separated item starts with a module's name; "(...)" says what it holds.
        named = {piece.split()[0].rstrip("/") for piece in re.split(r"[·,]", re.sub(r"\([^)]*\)", "", said))
                 if piece.split()} - {"__init__"}
        assert named == parts, f"lab/{package}/: README names {sorted(named)}, the tree has {sorted(parts)}"


def test_the_quick_start_parser_reads_commands_not_comments() -> None:
    text = "x\n## Quick start\n\n```bash\nmake a   # one\n        # more comment\nmake b\n```\n```\nnot this\n```\n"
    assert _quick_start(text) == ["make a", "make b"]


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    missing = []
    for target in _relative_links(page.read_text()):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
        elif page.parent == DOCS and DOCS not in path.parents:
            missing.append(f"{target} (leaves docs/: name a repository file as a code span, not a link)")
    assert not missing, f"{page.relative_to(ROOT)}: broken links {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_in_a_code_span_exists(page: Path) -> None:
    missing = []
    for span in SPAN.findall(_prose(page.read_text())):
        for word in span.split():
            if REPO_PATH.fullmatch(word) and not any(c in word for c in "<>*…") and not (ROOT / word).exists():
                missing.append(word)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_link_and_path_checks_can_fail(tmp_path: Path) -> None:
    text = ("[a](missing.md) [b](https://example.org) [c](#here) `lab/nope.py` ![img](x.png)\n"
            "```\n[d](in-fence.md)\n```\n")
    assert _relative_links(text) == ["missing.md"]
    spans = [w for s in SPAN.findall(_prose(text)) for w in s.split() if REPO_PATH.fullmatch(w)]
    assert spans == ["lab/nope.py"] and not (ROOT / spans[0]).exists()


def test_every_docs_page_the_code_cites_exists_and_none_outside_the_repository() -> None:
    cited, outside = {}, []
    for folder in ("lab", "dashboard", "benchmarks", "tests"):
        for py in sorted((ROOT / folder).rglob("*.py")):
            text = py.read_text()
            for name in re.findall(r"docs/([\w-]+\.md)", text):
                cited.setdefault(name, str(py.relative_to(ROOT)))
            if re.search(r"\bshared/|DESIGN\.md", text):
                outside.append(str(py.relative_to(ROOT)))
    missing = {name: where for name, where in cited.items() if not (DOCS / name).is_file()}
    assert not missing, f"cited but not in docs/: {missing}"
    assert not outside, f"cite a file outside the repository: {outside}"


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    nav = re.findall(r"^\s*-\s[^:]+:\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(p.name for p in PAGES)


def test_mkdocs_builds_the_manual_with_strict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def _pins(text: str) -> dict[str, str]:
    """``name==version`` pins in ``text`` (a TOML list or a YAML list), names lower-cased."""
    return {m[0].lower(): m[1] for m in re.findall(r"[\"\s-]([A-Za-z0-9_.-]+)==([0-9][^\s\",]*)", text)}


def test_environment_yml_pins_what_pyproject_pins() -> None:
    """The conda file mirrors pyproject.toml: a package pinned in both has one version, and the packages a
    conda user needs (the core, the UI, HF, the tests, the docs site, JupyterLab) are all there."""
    project = _pins((ROOT / "pyproject.toml").read_text())
    conda = _pins((ROOT / "environment.yml").read_text())
    assert conda, "no pins found in environment.yml"
    drift = {k: (v, project.get(k)) for k, v in conda.items() if project.get(k) != v}
    assert not drift, f"environment.yml (left) vs pyproject.toml (right): {drift}"
    missing = set(project) - set(conda) - {"setuptools", "playwright"}  # playwright: the browser test only
    assert not missing, f"pinned in pyproject.toml, missing from environment.yml: {sorted(missing)}"
