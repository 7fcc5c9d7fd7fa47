"""Executed copies of the notebooks, for readers who do not run them (the docs site renders them with
mkdocs-jupyter): ``make notebooks-docs`` runs each notebook at its default size (``LAB_FAST`` unset, the
exercises filled by :mod:`lab.teach.solutions`) and writes the executed copy to ``docs/notebooks/``.

The source notebooks stay without outputs (a diff of a notebook is then a diff of its code). A copy is only as
good as the code and the machine that produced it, so the render holds every copy to these rules, and says
which it broke when ``--force`` made it write one anyway:

* **One commit, a clean tree.** It refuses to start while git has uncommitted or untracked files outside the
  output folder (and names them: :func:`lab.teach.preflight.dirty_files`), and stops if HEAD moves mid-render.
  Every copy carries the commit.
* **A quiet machine.** Before each notebook it samples the lab's own contention meter and waits (printing
  progress, up to ``--wait`` seconds) until other processes use less than
  :data:`lab.measure.contention.BUSY_CORES` cores; still busy: it refuses. The same meter spans the whole run of
  the notebook: a run that was busy is not written. The stamp gives the load average before and after and what
  other processes used during the run.
* **A fresh store.** Each notebook's kernel gets its own empty results database and cache folder
  (``LAB_RESULTS_DB``, ``LAB_CACHE_DIR`` in a temporary folder): no figure is read back from an earlier run (06 once
  printed "54 runs in 0 s").
* **Figures that can be true.** After the last cell the render collects the runs the kernel holds and holds them
  to :mod:`lab.teach.sanity`'s rules (an fp32-against-fp32 comparison reads 1; ranks filling the cores are no
  faster than one process on them); a broken rule means the copy is not written.
* **Readable without JavaScript.** Each plotly figure gets a PNG beside it (:mod:`lab.teach.static_figures`,
  kaleido and a local Chromium); a figure without one means the copy is not written.

Size: plotly's default notebook renderer embeds its ~4 MB JavaScript bundle in the first figure of every
notebook. The copies are rendered with plotly's ``notebook_connected`` renderer instead (each figure is its
JSON plus a ``<script>`` tag that loads plotly.js from cdn.plot.ly when the page is viewed) plus its static PNG,
and widget state is dropped: a copy is tens to hundreds of kB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.teach.preflight import dirty_files, head_sha, load_text, wait_until_quiet

#: Plotly's renderer inside the executing kernel (read by ``plotly.io`` at import time) when no static image is
#: made; with images, :data:`lab.teach.static_figures.RENDERER` (the same HTML plus the figure's JSON).
PLOTLY_RENDERER = "notebook_connected"
#: Output types a static page cannot show (live widgets); their ``text/plain`` stays.
DROPPED_MIMES = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")
#: The checkout whose commit the copies carry.
REPO = Path(__file__).resolve().parents[2]
#: Version of the stamp's metadata (``nb.metadata["lab_executed"]["format"]``).
STAMP_FORMAT = 2


@dataclass
class Stamp:
    """Where, when and from which code an executed copy comes, and what it broke if it was forced: the copy's
    first (markdown) cell and its ``lab_executed`` metadata are both made from this."""

    notebook: str
    git_sha: str
    dirty_files: list[str] | None  # [] a clean tree; None: not known (no git)
    hardware_id: str
    device: str
    cores: int
    started_at: str  # UTC, minutes
    seconds: float
    cpu_seconds: float | None = None
    load_before: float | None = None
    load_after: float | None = None
    contention: dict[str, Any] | None = None  # lab.measure.contention over the whole run
    fresh_store: bool = True
    sanity: list[dict[str, Any]] = field(default_factory=list)  # lab.teach.sanity findings
    figures: int = 0
    static_images: int = 0
    forced: list[str] = field(default_factory=list)  # why it would have been refused
    size: str = "its default size"
    format: int = STAMP_FORMAT

    def markdown(self) -> str:
        """The markdown cell the copy opens with (everything in it is computed, nothing typed)."""
        if self.dirty_files is None:
            tree = "a tree of unknown state"
        elif not self.dirty_files:
            tree = "a clean tree"
        else:
            more = len(self.dirty_files) - 5
            tree = (f"uncommitted changes in {', '.join(f'`{f}`' for f in self.dirty_files[:5])}"
                    + (f" and {more} more" if more > 0 else ""))
        load = (f"load average {self.load_before:.1f} before, {self.load_after:.1f} after"
                if self.load_before is not None and self.load_after is not None else "load average not readable")
        during = (f"; other processes used {self.contention['others_cores']:.1f} of {self.contention['cores']} "
                  "cores while it ran" if self.contention else "")
        cpu = f" ({self.cpu_seconds:.0f} CPU s in the kernel and its children)" if self.cpu_seconds is not None else ""
        passed = [s for s in self.sanity if s["ok"]]
        checks = (f" Sanity: {'; '.join(s['text'] for s in passed)}." if passed else
                  " Sanity: no run here that a rule applies to." if not self.sanity else "")
        figs = (f" {self.static_images} of {self.figures} interactive figures carry a static image for readers "
                "without JavaScript." if self.figures else "")
        lines = [f"> **Executed copy** of `notebooks/{self.notebook}` at {self.size} (exercises filled by the "
                 f"reference solutions), regenerated by `make notebooks-docs` at git `{self.git_sha[:10]}` "
                 f"({tree}), {self.started_at}, on machine `{self.hardware_id}` ({self.device}, {self.cores} "
                 f"cores): {load}{during}. Ran {self.seconds:.0f} s{cpu} on a fresh results store.{checks}{figs} "
                 "Timings are this machine's, on this day."]
        if self.forced:
            lines.append(">\n> **Written with `--force`**, so read its timings with care: "
                         + "; ".join(self.forced) + ".")
        return "\n".join(lines)

    def metadata(self) -> dict[str, Any]:
        """``nb.metadata["lab_executed"]``: the same facts, for tests and tools."""
        return {**asdict(self), "seconds": round(self.seconds, 1),
                "cpu_seconds": round(self.cpu_seconds, 1) if self.cpu_seconds is not None else None,
                "git_dirty": bool(self.dirty_files) if self.dirty_files is not None else None}


def _size() -> str:
    return "its tiny size (LAB_FAST set)" if os.environ.get("LAB_FAST") else "its default size"


def strip_outputs(nb: Any) -> None:
    """Drop what a static page cannot show (live widget views, the notebook's widget state)."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data:
                for mime in DROPPED_MIMES:
                    data.pop(mime, None)


#: A source notebook's link to a manual page, relative to ``notebooks/`` (``../docs/`` + page + ``.md`` + anchor:
#: what JupyterLab and GitHub follow); the executed copy is a page of the site at ``notebooks/<name>/``, whose
#: manual pages sit at ``../../<page>/``.
DOCS_LINK = re.compile(r"\]\(\.\./docs/([\w/-]+)\.md(#[\w-]+)?\)")


def site_links(nb: Any) -> int:
    """Rewrite the markdown cells' links to ``../docs/*.md`` for the copy's place on the site (mkdocs-jupyter renders a
    notebook's HTML as it is: nothing rewrites its links); returns how many were rewritten."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source, k = DOCS_LINK.subn(lambda m: f"](../../{m.group(1)}/{m.group(2) or ''})", cell.source)
            n += k
    return n


def _kernel_cpu_s(client: Any) -> float | None:
    """CPU seconds the kernel and its finished children (DDP ranks, loader workers) used so far: on a shared
    box the wall time says how busy the neighbours were, this says what the notebook itself cost."""
    try:
        import psutil

        t = psutil.Process(client.km.provisioner.pid).cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except Exception:  # not a local kernel, or it is gone: no figure rather than a wrong one
        return None


def kernel_env(tmp: Path, renderer: str) -> dict[str, str]:
    """The kernel's environment: this process's, with plotly's renderer and a results store and cache folder of
    its own under ``tmp`` (empty: nothing a notebook shows is read back from an earlier run)."""
    (tmp / "results").mkdir(parents=True, exist_ok=True)
    (tmp / "cache").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PLOTLY_RENDERER": renderer, "LAB_RESULTS_DB": str(tmp / "results" / "lab.sqlite"),
            "LAB_CACHE_DIR": str(tmp / "cache")}


def _loadavg() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


@dataclass
class Execution:
    """One notebook executed on a fresh store: the executed notebook (probe cell removed), its wall and CPU
    seconds, the load average before and after, the contention meter over the run, and the runs its kernel held
    at the end (JSON rows, :func:`lab.teach.sanity.probe_source`)."""

    nb: Any
    started_at: str
    seconds: float
    cpu_seconds: float | None
    load_before: float | None
    load_after: float | None
    contention: Any  # lab.measure.contention.Contention | None
    runs: list[dict[str, Any]]


def execute(src: Path, timeout_s: int = 1800, *, static_images: bool = True) -> Execution:
    """Run ``src`` in its own folder, in a kernel with its own empty results store and cache (:func:`kernel_env`),
    under the contention meter, then collect the runs the kernel holds (a probe cell, removed afterwards).
    Raises on a failing cell."""
    import nbformat
    from nbclient import NotebookClient

    from lab.measure.contention import ContentionMeter
    from lab.teach.sanity import probe_source
    from lab.teach.static_figures import RENDERER

    nb = nbformat.read(src, as_version=4)
    n_cells = len(nb.cells)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix=f"lab-render-{src.stem}-") as tmp_name:
        tmp = Path(tmp_name)
        runs_json = tmp / "runs.json"
        nb.cells.append(nbformat.v4.new_code_cell(probe_source(str(runs_json))))
        env = kernel_env(tmp, RENDERER if static_images else PLOTLY_RENDERER)
        cpu: dict[str, float | None] = {"s": None}
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(src.parent.resolve())}})
        client.on_cell_executed = lambda **_: cpu.update(s=_kernel_cpu_s(client))
        load_before, meter, t0 = _loadavg(), ContentionMeter().start(), time.perf_counter()
        try:
            client.execute(env=env)  # the kernel is shut down and reaped on return: its CPU counts as ours
        finally:
            seconds, contention, load_after = time.perf_counter() - t0, meter.stop(), _loadavg()
            del nb.cells[n_cells:]
        runs = json.loads(runs_json.read_text()) if runs_json.is_file() else []
    return Execution(nb=nb, started_at=started, seconds=seconds, cpu_seconds=cpu["s"], load_before=load_before,
                     load_after=load_after, contention=contention, runs=runs)


def publish(src: Path, ex: Execution, out_dir: Path, *, to_png: Callable[[dict], bytes] | None = None,
            force: bool = False, forced: list[str] | None = None, git_sha: str | None = None,
            dirty: list[str] | None = None) -> dict[str, Any]:
    """Check an execution and write its stamped copy to ``out_dir/<name>``. The runs are held to
    :mod:`lab.teach.sanity`'s rules, the run's contention to the busy rule, every plotly figure must get its PNG
    (``to_png``: :meth:`lab.teach.static_figures.StaticImages.png`; ``None``: images off). A broken rule leaves the
    previous copy in place and is returned in ``"problems"``, unless ``force``, which writes the copy with the
    problems in its stamp. ``forced``: reasons decided before the run (a busy start, a dirty tree), stamped."""
    import nbformat

    from lab.measure import environment_stamp
    from lab.teach.sanity import check_rows
    from lab.teach.static_figures import add_static_images, figures_without_image

    nb, contention = ex.nb, ex.contention
    findings = check_rows(ex.runs)
    strip_outputs(nb)
    images = add_static_images(nb, to_png)
    problems = [f.text for f in findings if not f.ok]
    if contention is not None and contention.busy:
        problems.append(f"the machine was busy while it ran: {load_text(contention)}")
    if to_png is not None:
        blank = figures_without_image(nb)
        if blank or images["failed"]:
            problems.append(f"figures without a static image in cells {blank}"
                            + (f" ({'; '.join(images['failed'])})" if images["failed"] else ""))
    info = {"notebook": src.name, "seconds": ex.seconds, "cpu_seconds": ex.cpu_seconds, "problems": problems,
            "sanity": [f.to_dict() for f in findings], "figures": images["figures"], "static": images["static"],
            "contention": contention.to_dict() if contention is not None else None, "written": False}
    if problems and not force:
        return info
    env_stamp = environment_stamp()
    stamp = Stamp(notebook=src.name, git_sha=git_sha or str(env_stamp.get("git_sha") or "unknown"),
                  dirty_files=dirty, hardware_id=str(env_stamp.get("hardware_id")),
                  device=str(env_stamp.get("device_name") or env_stamp.get("cpu_model") or "unknown CPU"),
                  cores=int(env_stamp.get("usable_cores") or os.cpu_count() or 1), started_at=ex.started_at,
                  seconds=ex.seconds, cpu_seconds=ex.cpu_seconds, load_before=ex.load_before,
                  load_after=ex.load_after, contention=info["contention"], sanity=info["sanity"],
                  figures=images["figures"], static_images=images["static"], forced=[*(forced or []), *problems],
                  size=_size())
    site_links(nb)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(stamp.markdown()))
    nb.metadata["lab_executed"] = stamp.metadata()
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    nbformat.write(nb, dst)
    return {**info, "written": True, "bytes": dst.stat().st_size, "path": str(dst)}


def execute_copy(src: Path, out_dir: Path, timeout_s: int = 1800, *, to_png: Callable[[dict], bytes] | None = None,
                 **publish_kw: Any) -> dict[str, Any]:
    """:func:`execute` then :func:`publish`: one notebook, start to copy. Raises on a failing cell (nothing is
    written then, so a committed copy is always a complete run)."""
    return publish(src, execute(src, timeout_s, static_images=to_png is not None), out_dir, to_png=to_png,
                   **publish_kw)


def _refuse(what: str) -> int:
    print(f"notebooks-docs: refusing: {what}", flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.teach.render NB... --out DIR``: every notebook in turn at one commit, its time printed.
    Exit 2: refused before running (uncommitted files, a machine that stayed busy, no static images); 1: a
    notebook failed or broke a rule (the others still run, its previous copy stays); 0: every copy written."""
    p = argparse.ArgumentParser(prog="python -m lab.teach.render", description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=Path("docs/notebooks"))
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    p.add_argument("--wait", type=float, default=900.0,
                   help="seconds to wait, before each notebook, for the machine to go quiet (default 900)")
    p.add_argument("--window", type=float, default=5.0, help="seconds of each load sample (default 5)")
    p.add_argument("--force", action="store_true",
                   help="render on a busy machine and write copies that break a rule; each copy says which")
    p.add_argument("--allow-dirty", action="store_true",
                   help="render from a tree with uncommitted changes (the stamp names them)")
    p.add_argument("--no-static-images", action="store_true",
                   help="no PNG beside plotly figures (kaleido or Chromium missing); stamped")
    p.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)  # tests: a planted checkout
    args = p.parse_args(argv)
    repo = args.repo.resolve()
    out_rel = os.path.relpath(args.out.resolve(), repo)
    exclude = [] if out_rel.startswith("..") else [out_rel]
    sha, dirty = head_sha(repo), dirty_files(repo, exclude)
    if (sha is None or dirty is None) and not args.allow_dirty:
        return _refuse(f"{repo} is not a git checkout (no commit to stamp); --allow-dirty renders anyway")
    if dirty and not args.allow_dirty:
        listed = ", ".join(dirty[:20]) + (f" and {len(dirty) - 20} more" if len(dirty) > 20 else "")
        return _refuse(f"the tree has uncommitted changes: {listed}. Commit or stash them, so every copy comes "
                       "from one commit (--allow-dirty renders anyway, naming them in each copy)")
    forced_base = [] if not dirty else [f"rendered from a tree with uncommitted changes ({len(dirty)} files)"]
    static = None
    if not args.no_static_images:
        from lab.teach.static_figures import StaticImages

        try:
            static = StaticImages().start()
        except RuntimeError as exc:
            return _refuse(f"no static images: {exc}; every figure needs one for readers without JavaScript "
                           "(--no-static-images renders without them)")
    else:
        forced_base.append("no static images (--no-static-images)")
    failed = 0
    try:
        for src in args.notebooks:
            now_sha, now_dirty = head_sha(repo), ([] if args.allow_dirty else dirty_files(repo, exclude))
            if now_sha != sha or now_dirty:
                what = (f"HEAD moved to {str(now_sha)[:10]}" if now_sha != sha else
                        f"files changed: {', '.join((now_dirty or [])[:10])}")
                print(f"notebooks-docs: the tree changed since the render began at {str(sha)[:10]} ({what}): "
                      f"stopping before {src}, so the copies do not come from two trees", flush=True)
                return 1
            quiet, waited = wait_until_quiet(args.wait, args.window)
            forced = list(forced_base)
            if quiet is not None and quiet.busy:
                if not args.force:
                    return _refuse(f"the machine stayed busy for {waited:.0f} s before {src}: {load_text(quiet)} "
                                   f"(--wait longer, or --force to render anyway, stamped)")
                forced.append(f"started on a busy machine: {load_text(quiet)}")
            t0 = time.perf_counter()
            try:
                info = execute_copy(src, args.out, args.timeout, to_png=static.png if static else None,
                                    force=args.force, forced=forced, git_sha=sha, dirty=dirty)
            except Exception as err:  # a failing cell: report it, keep the previous copy, go on
                failed += 1
                print(f"notebooks-docs: {src} FAILED after {time.perf_counter() - t0:.0f} s: "
                      f"{type(err).__name__}: {str(err)[-2000:]}", flush=True)
                continue
            cpu_s = f", {info['cpu_seconds']:.0f} CPU s" if info["cpu_seconds"] is not None else ""
            during = f", {load_text_of(info['contention'])}" if info["contention"] else ""
            if not info["written"]:
                failed += 1
                print(f"notebooks-docs: {src} NOT WRITTEN after {info['seconds']:.0f} s (previous copy kept): "
                      + "; ".join(info["problems"]) + " (--force writes it, stamped)", flush=True)
                continue
            print(f"notebooks-docs: {src} passed in {info['seconds']:.0f} s{cpu_s}{during} ({_size()}), "
                  f"{info['static']}/{info['figures']} figures with a static image, {len(info['sanity'])} sanity "
                  f"check(s){', FORCED' if info['problems'] or forced else ''}, {info['bytes'] / 1e3:.0f} kB -> "
                  f"{info['path']}", flush=True)
    finally:
        if static is not None:
            static.close()
    return 1 if failed else 0


def load_text_of(contention: dict[str, Any]) -> str:
    """:func:`lab.teach.preflight.load_text` of a contention's ``to_dict()``."""
    return (f"others used {contention['others_cores']:.1f} of {contention['cores']} cores while it ran "
            f"(load {contention['load1']:.1f})")


if __name__ == "__main__":
    sys.exit(main())
