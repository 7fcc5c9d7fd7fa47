"""The spawn folder's watchdog: ``python -I -S watchdog.py FOLDER``, started by :func:`lab.distributed.spawn`.

Why a separate process: a launcher killed by SIGKILL runs no ``finally`` and no ``atexit``, so only a
process outside it can clean up. It runs in its own session (a Ctrl-C to the terminal does not reach it),
imports nothing but the standard library (it starts in milliseconds) and reads the ranks' pids from the
launcher on stdin. On EOF without a ``done`` line (the launcher died) it kills those ranks; it always
removes FOLDER.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys


def _is_rank(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing" in f.read()  # a spawned rank, not a process that reused the pid
    except OSError:
        return True  # no /proc (not Linux): trust the pid


def main(folder: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids: list[int] = []
    done = False
    for line in sys.stdin:
        line = line.strip()
        if line == "done":
            done = True
            break
        if line.isdigit():
            pids.append(int(line))
    if not done:
        for pid in pids:
            if _is_rank(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
