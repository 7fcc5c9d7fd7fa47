"""Before a notebook is rendered for the docs: is the tree committed, and is the machine quiet?

Why: the executed copies in ``docs/notebooks/`` are read as "what the lab's code at this commit measured on this
machine". Four once came from trees with uncommitted changes (code no commit holds) and two ran at load 3.7 and
6.3 on a 2-core box (figures that were the neighbours'). :func:`dirty_files` names what is uncommitted, so the
render can refuse with a list the user can act on; :func:`wait_until_quiet` samples the lab's own contention
meter (:class:`lab.measure.contention.ContentionMeter`: CPU time other processes used, and steal, over a short
window) and waits, printing progress, until the machine is not *busy* by the rule every lab measurement uses
(:data:`lab.measure.contention.BUSY_CORES`), or until a deadline.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lab.measure.contention import Contention, ContentionMeter


def dirty_files(root: Path, exclude: Sequence[str] = ()) -> list[str] | None:
    """Paths under ``root`` (a git checkout) that differ from HEAD: modified, staged, deleted, and untracked files
    git does not ignore (a notebook can import an untracked module), less those under ``exclude`` (the copies
    the render itself writes). ``None`` when ``root`` is not a checkout or git is missing."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "-z", "--", ".",
                              *(f":(exclude){p}" for p in exclude)],
                             cwd=root, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    entries, files = out.stdout.split("\0"), []
    i = 0
    while i < len(entries):
        entry = entries[i]
        if len(entry) > 3:
            files.append(entry[3:])
            if entry[0] in "RC":  # a rename or copy: the next entry is its source path
                i += 1
        i += 1
    return files


def head_sha(root: Path) -> str | None:
    """The commit ``root`` has checked out (``None`` outside a checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def sample_contention(window_s: float) -> Contention | None:
    """The contention meter over ``window_s`` seconds of this process idling (``None`` where the meter cannot
    read the machine: not Linux)."""
    meter = ContentionMeter().start()
    time.sleep(window_s)
    return meter.stop()


def load_text(c: Contention | None) -> str:
    """``other processes used 1.3 of 2 cores (load 3.1)`` or ``the load could not be read``."""
    if c is None:
        return "the load could not be read (no /proc/stat)"
    steal = f", steal {c.steal_share:.0%}" if c.steal_share >= 0.005 else ""
    return f"other processes used {c.others_cores:.1f} of {c.cores} cores (load {c.load1:.1f}{steal})"


def wait_until_quiet(max_wait_s: float, window_s: float = 5.0, say: Callable[[str], None] = print,
                     sample: Callable[[float], Contention | None] | None = None) -> tuple[Contention | None, float]:
    """Sample the machine until one window is not busy or ``max_wait_s`` has passed: (the last sample, seconds
    waited). The last sample is busy when the deadline came first; ``None`` when the meter cannot read the
    machine (then nothing is waited for). Every busy window prints one progress line."""
    sample = sample or sample_contention
    t0 = time.monotonic()
    while True:
        c = sample(window_s)
        waited = time.monotonic() - t0
        if c is None or not c.busy:
            return c, waited
        if waited >= max_wait_s:
            return c, waited
        say(f"notebooks-docs: machine busy, {load_text(c)}; waiting for it to go quiet "
            f"({waited:.0f} of {max_wait_s:.0f} s)")


__all__ = ["dirty_files", "head_sha", "load_text", "sample_contention", "wait_until_quiet"]
