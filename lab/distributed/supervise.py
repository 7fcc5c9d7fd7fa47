"""Supervising spawned ranks: the rank-count bound, heartbeats, the watchdog, and naming the rank that failed.

Why a module of its own: :func:`lab.distributed.spawn` must end a job whose rank died (a signal, an exit code),
hung (a stopped process: its heartbeat goes stale) or raised, with one line that names the *cause*, not the
rank that was left waiting for it; and it must leave no process and no temporary folder behind on any exit,
its own SIGKILL included. The launcher (:mod:`.launch`) starts the ranks; this module watches them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: Spawned CPU ranks allowed without asking: 4 per core, and never more than 64 (each rank is a Python process
#: with its own copy of torch, ~300 MB; beyond this a "scaling" run measures the scheduler, not DDP).
MAX_RANKS_PER_CORE = 4
MAX_CPU_RANKS = 64
#: Set to a number to allow that many spawned ranks (the explicit override of the bound above).
MAX_RANKS_ENV = "LAB_MAX_LOCAL_RANKS"
#: A rank's heartbeat thread touches ``rank<N>.alive`` in the spawn folder this often.
HEARTBEAT_S = 0.5
#: When a rank fails, a live peer whose heartbeat is older than this (or whose process is stopped) is named
#: as the hung rank the failing one was waiting for.
STALE_S = 5.0
#: A rank that has not started its heartbeat (still importing torch) counts as hung only after this much more.
STARTUP_GRACE_S = 120.0

_DIST_ERROR = re.compile(r"gloo|nccl|connection (closed|reset|refused)|broken pipe|timed out|timeout|"
                         r"rendezvous|tcpstore|process ?group|peer", re.IGNORECASE)


class RankFailure(RuntimeError):
    """A spawned rank died (a signal or an exit code), hung, raised, or left no result. ``rank`` names it,
    ``kind`` is ``died | hung | raised | no_result | timeout``; ``exit_code`` / ``signal`` where the process
    ended, ``rank_traceback`` the rank's own traceback where it raised. The message is one line."""

    def __init__(self, message: str, *, rank: int | None, kind: str, exit_code: int | None = None,
                 signal_name: str | None = None, rank_traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank, self.kind, self.exit_code, self.signal = rank, kind, exit_code, signal_name
        self.rank_traceback = rank_traceback


class RankHung(RankFailure, TimeoutError):
    """A rank stopped making progress (its heartbeat went stale), or the whole job ran past its bound."""


class RankValueError(RankFailure, ValueError):
    """A rank refused its configuration or workload (a ``ValueError`` raised before or during training):
    the same kind of error a single-process run reports, with the rank named."""


def max_local_ranks() -> int:
    """How many ranks :func:`spawn` starts on this machine: ``$LAB_MAX_LOCAL_RANKS`` when set, else
    ``min(MAX_CPU_RANKS, MAX_RANKS_PER_CORE x cores)``."""
    env = os.environ.get(MAX_RANKS_ENV)
    if env:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{MAX_RANKS_ENV}={env!r} is invalid: must be an integer >= 1")
        return value
    return min(MAX_CPU_RANKS, MAX_RANKS_PER_CORE * (os.cpu_count() or 1))


def check_spawn_world_size(world_size: int, device: torch.device | None = None) -> None:
    """Refuse, before any process starts, more local ranks than this machine can hold: on CPU at most
    ``min(64, 4 x cores)`` unless ``$LAB_MAX_LOCAL_RANKS`` allows more; NCCL ranks need one GPU each."""
    if world_size < 1:
        raise ValueError(f"ddp.world_size={world_size} is invalid: must be >= 1")
    device = device or torch.device("cpu")
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if world_size > gpus:
            raise ValueError(f"ddp.world_size={world_size} is invalid: spawned CUDA ranks need one GPU each and "
                             f"this machine has {gpus}; use device=cpu (gloo) or launch across machines with "
                             "torchrun / srun")
        return
    bound, cores = max_local_ranks(), os.cpu_count() or 1
    if world_size > bound:
        rule = (f"{MAX_RANKS_ENV}={bound}" if os.environ.get(MAX_RANKS_ENV) else
                f"at most min({MAX_CPU_RANKS}, {MAX_RANKS_PER_CORE} x {cores} cores) = {bound} spawned CPU ranks")
        raise ValueError(f"ddp.world_size={world_size} is invalid: {rule} on this machine (each rank is a process "
                         f"with its own torch; more only measure the scheduler); set {MAX_RANKS_ENV}={world_size} "
                         "to allow it, or launch across machines with torchrun / srun")


def die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this rank when the process that spawned it dies (PR_SET_PDEATHSIG), so no rank outlives
    its launcher; the heartbeat thread checks the parent too, for the moment before this was set."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the heartbeat thread's parent check still applies
        pass
    if os.getppid() != parent:
        os._exit(1)


def heartbeat(path: Path, parent: int) -> None:
    """Touch ``path`` every :data:`HEARTBEAT_S`; a stopped or wedged process stops touching it. Exits the rank
    when its parent is gone (reparented), so an orphan never keeps computing."""
    while True:
        try:
            os.utime(path)
        except OSError:  # the spawn folder is gone: the launcher ended
            os._exit(1)
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(HEARTBEAT_S)


def is_dist_error(exc: BaseException) -> bool:
    """An error that reports a peer's failure (a closed connection, a collective's timeout), not its own: a
    ``torch.distributed`` error, or a ``RuntimeError`` (how gloo and the rendezvous report) that says so."""
    dist_error = getattr(dist, "DistError", ())
    if isinstance(exc, dist_error):
        return True
    return isinstance(exc, RuntimeError) and bool(_DIST_ERROR.search(f"{type(exc).__name__} {exc}"))


def start_watchdog(folder: str) -> subprocess.Popen | None:
    """:mod:`lab.distributed.watchdog` for ``folder``: it removes the folder (and kills the ranks) even when
    this process dies by SIGKILL."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).with_name("watchdog.py")), folder],
                                stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                text=True)
    except OSError:  # no watchdog: atexit and the finally clause still remove the folder
        return None


def tell(watchdog: subprocess.Popen | None, line: str) -> None:
    if watchdog is not None and watchdog.stdin is not None:
        with contextlib.suppress(OSError, ValueError):
            watchdog.stdin.write(line + "\n")
            watchdog.stdin.flush()


@dataclass
class RankState:
    rank: int
    process: Any
    out: Path
    started: float

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def error(self) -> dict[str, Any] | None:
        path = self.out / f"rank{self.rank}.err"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def heartbeat_age(self) -> float | None:
        """Seconds since the last heartbeat; None before the rank started one."""
        try:
            return max(0.0, time.time() - (self.out / f"rank{self.rank}.alive").stat().st_mtime)
        except OSError:
            return None

    def stopped(self) -> bool:
        """Linux: the process is stopped (SIGSTOP, Ctrl-Z, a debugger): state T or t in /proc/<pid>/stat."""
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")

    def hung_for(self, stale_s: float, *, stopped_is_hung: bool = False) -> float | None:
        """How long this live rank has shown no sign of life, when that is more than ``stale_s`` (or, with
        ``stopped_is_hung``, its process is stopped); None while it is healthy or has exited."""
        if self.exitcode is not None:
            return None
        age = self.heartbeat_age()
        if age is None:
            age = time.monotonic() - self.started
            stale_s += STARTUP_GRACE_S
        if age > stale_s or (stopped_is_hung and self.stopped()):
            return age
        return None


def _exit_text(code: int) -> tuple[str, str | None]:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})", name
    return f"exit code {code}", None


def _others(states: list[RankState], rank: int) -> str:
    rest = [s.rank for s in states if s.rank != rank]
    return "" if not rest else f"; the launcher ended rank{'s' if len(rest) > 1 else ''} {', '.join(map(str, rest))}"


def find_hung(states: list[RankState], stale_s: float, *, stopped_is_hung: bool = False,
              others: bool = True) -> RankHung | None:
    """The first live rank without a heartbeat for ``stale_s`` (a stopped process counts at once with
    ``stopped_is_hung``: used to name the cause once a peer failed, never on its own, so attaching a debugger
    to a rank does not end the job)."""
    hung = [(s, age) for s in states if (age := s.hung_for(stale_s, stopped_is_hung=stopped_is_hung)) is not None]
    if not hung:
        return None
    s, age = hung[0]
    what = ("its process is stopped (SIGSTOP, Ctrl-Z or a debugger)" if s.stopped() else
            "it never started its heartbeat" if s.heartbeat_age() is None else "it stopped responding")
    names = ", ".join(str(h.rank) for h, _ in hung)
    return RankHung(f"rank {s.rank} hung: no heartbeat for {age:.0f} s, {what}"
                    + (f" (hung ranks: {names})" if len(hung) > 1 else "") + (_others(states, s.rank) if others
                                                                                 else ""),
                    rank=s.rank, kind="hung")


def diagnose(states: list[RankState], stale_s: float) -> RankFailure:
    """The failure to report, cause before consequence: a rank that died without a Python error (a signal,
    an exit code), then one that raised its own error, then a live rank that hung, and only then a rank that
    raised because a peer failed (a closed connection, a collective's timeout)."""
    deadline = time.monotonic() + 1.0
    while True:
        died = [s for s in states if s.exitcode not in (None, 0) and s.error() is None]
        raised = [(s, e) for s in states if s.exitcode not in (None, 0) and (e := s.error()) is not None]
        own = [(s, e) for s, e in raised if not e["dist"]]
        if died or own or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # only peer errors so far: give the cause a moment to show (an exit, a stale heartbeat)
    if died:
        s = died[0]
        text, name = _exit_text(s.exitcode)
        if s.heartbeat_age() is None:  # it never reached the lab's code: its own error is printed above
            text = f"{text} before it started (its error is printed above)"
        elif name == "SIGKILL":
            text += ", as the kernel's out-of-memory killer does"
        return RankFailure(f"rank {s.rank} died: {text}" + _others(states, s.rank), rank=s.rank, kind="died",
                           exit_code=s.exitcode, signal_name=name)
    if own:
        s, e = own[0]
        cls = RankValueError if e["value_error"] else RankFailure
        first = (e["message"].splitlines() or [""])[0]
        return cls(f"rank {s.rank} raised {e['type']}: {first}" + _others(states, s.rank), rank=s.rank,
                   kind="raised", exit_code=s.exitcode, rank_traceback=e["traceback"])
    hung = find_hung(states, min(stale_s, STALE_S), stopped_is_hung=True)
    if hung is not None:
        return hung
    s, e = raised[0]
    first = (e["message"].splitlines() or [""])[0]
    return RankFailure(f"rank {s.rank} raised {e['type']} (a peer failed or was too slow): {first}"
                       + _others(states, s.rank), rank=s.rank, kind="raised", exit_code=s.exitcode,
                       rank_traceback=e["traceback"])


