"""Was the machine busy while we measured? Other processes' CPU use and steal over a timed region.

Why: on a shared 2-core box another process taking a core moves a step time by tens of percent, in one arm
and not the next, and produces tight, non-overlapping intervals that mean nothing (a laptop with a browser, a
CI box with neighbours, a VM whose host steals cycles). The load average alone lags by a minute and counts
this run's own threads, so the meter reads, between :meth:`ContentionMeter.start` and :meth:`stop`, the CPU
time the whole machine spent busy (``/proc/stat``) minus the CPU time this run's own process tree spent
(this process, its live descendants: DataLoader workers, spawned ranks; and the children it reaped), and the
hypervisor's steal. A region where others used more than :data:`BUSY_CORES` cores on average, or steal took
more than :data:`BUSY_STEAL` of the machine, is *busy*: its figures are said to be unreliable and crown
nothing (:func:`lab.ablation.verdict`). Linux only; elsewhere the meter reports nothing (``None``), never a
guess.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

#: Other processes using more than this many cores on average during a region make it busy (on 2 cores: a
#: neighbour that keeps one core at 40 % already moves single-thread step times beyond a bootstrap interval).
BUSY_CORES = 0.4
#: Hypervisor steal above this share of the machine's CPU time makes a region busy.
BUSY_STEAL = 0.05
#: Longest wait, in seconds, for the machine to settle before a timed run (:func:`settle`). ``LAB_SETTLE_MAX_S``
#: sets it for a process and the processes it starts (the test suite sets 0, so a dashboard's background ablation
#: worker, a process of its own, neither waits nor redoes a run that its polling test made busy).
SETTLE_MAX_S = float(os.environ.get("LAB_SETTLE_MAX_S", "2.0"))
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Contention:
    """Over one region: cores used by other processes (average), the steal share of the machine, the 1-minute
    load average at its end, the machine's cores, the region's wall time, and whether that makes it busy."""

    others_cores: float
    steal_share: float
    load1: float
    cores: int
    wall_s: float
    own_cores: float = 0.0  # this run's own process tree, for scale

    @property
    def busy(self) -> bool:
        return self.others_cores > BUSY_CORES or self.steal_share > BUSY_STEAL

    def sentence(self) -> str:
        """The warning a figure measured in this region carries (empty when the region was quiet)."""
        if not self.busy:
            return ""
        parts = [f"other processes used {self.others_cores:.1f} of {self.cores} cores"]
        if self.steal_share > BUSY_STEAL:
            parts.append(f"the hypervisor stole {self.steal_share:.0%} of the CPU")
        return (f"measured while this machine was busy ({', '.join(parts)}; load {self.load1:.1f}): timings "
                "unreliable, no verdict; rerun when idle")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy": self.busy, "sentence": self.sentence()}

    def without_siblings(self, n: int) -> Contention:
        """The same region seen by one of ``n + 1`` ranks that an outside launcher (torchrun, srun) started: its
        ``n`` sibling ranks are part of the run, not other processes; each is taken to use what this one did."""
        return replace(self, others_cores=round(max(0.0, self.others_cores - n * self.own_cores), 3))


def sibling_ranks(env: dict[str, str] | None = None) -> int:
    """The other ranks of this process's group (``WORLD_SIZE - 1``, as torchrun, srun and the lab's own spawn
    set it; 0 outside a group)."""
    try:
        return max(0, int((os.environ if env is None else env).get("WORLD_SIZE", "1")) - 1)
    except ValueError:
        return 0


def attach(result: Any, contention: Contention | None, *, sibling_ranks: int = 0) -> None:
    """Record ``contention`` on a run record (``details["contention"]``) and, when busy, its sentence among the
    record's ``why`` tags, replacing what an inner measurement (a spawned rank's own) put there. A rank's
    ``sibling_ranks`` are part of the run (:meth:`Contention.without_siblings`)."""
    if contention is None:
        return
    if sibling_ranks:
        contention = contention.without_siblings(sibling_ranks)
    old = (result.details.get("contention") or {}).get("sentence")
    if old and old in result.why:
        result.why.remove(old)
    result.details["contention"] = contention.to_dict()
    if contention.busy:
        result.why.append(contention.sentence())


def _machine_jiffies() -> tuple[float, float, float] | None:
    """(busy, steal, total) CPU seconds of the whole machine since boot, from ``/proc/stat``'s ``cpu`` line."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
    busy = user + nice + system + irq + softirq  # guest time is already inside user
    return busy / _CLK_TCK, steal / _CLK_TCK, (busy + idle + iowait + steal) / _CLK_TCK


def _own_cpu_s() -> float:
    """CPU seconds of this process, its live descendants and the children it has reaped."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + reaped.ru_utime + reaped.ru_stime
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except psutil.Error:  # it ended between the listing and the read: counted once reaped
                continue
    except ImportError:  # pragma: no cover - psutil is a dependency
        pass
    return total


class ContentionMeter:
    """``start()`` before a timed region, ``stop()`` after it: the region's :class:`Contention` (``None`` where
    ``/proc/stat`` cannot be read)."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._machine0: tuple[float, float, float] | None = None
        self._own0 = 0.0

    def start(self) -> ContentionMeter:
        self._machine0, self._own0, self._t0 = _machine_jiffies(), _own_cpu_s(), time.monotonic()
        return self

    def stop(self) -> Contention | None:
        if self._t0 is None or self._machine0 is None:
            return None
        machine1, own1, wall = _machine_jiffies(), _own_cpu_s(), time.monotonic() - self._t0
        if machine1 is None or wall <= 0:
            return None
        busy0, steal0, total0 = self._machine0
        busy1, steal1, total1 = machine1
        others = max(0.0, (busy1 - busy0) - (own1 - self._own0)) / wall
        steal = (steal1 - steal0) / max(total1 - total0, 1e-9)
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return Contention(others_cores=round(others, 3), steal_share=round(max(steal, 0.0), 4), load1=load1,
                          cores=os.cpu_count() or 1, wall_s=round(wall, 3),
                          own_cores=round((own1 - self._own0) / wall, 3))


def settle(max_wait_s: float | None = None, window_s: float = 0.1) -> Contention | None:
    """Wait, at most ``max_wait_s`` seconds, until a ``window_s`` window in which other processes stayed quiet
    (the window's :class:`Contention` not busy); return the last window's reading (``None`` without
    ``/proc/stat``: nothing to wait for).

    Why: the machine a user measures on is rarely silent, and much of what else runs comes in bursts (a page
    redrawing its progress, the dashboard's own included: about a core for half a second every few seconds; an
    editor's autosave). A run of a second that starts inside such a burst is rightly called busy by its meter and
    then vetoes the whole ablation's verdict. Starting each timed run right after a burst has passed, as careful
    benchmark harnesses do, keeps a quiet machine's runs quiet; a machine that stays busy is not hidden by it:
    the wait ends at ``max_wait_s`` (default :data:`SETTLE_MAX_S`, read at the call; 0 waits for nothing) and
    the run's own meter says busy.
    """
    max_wait_s = SETTLE_MAX_S if max_wait_s is None else max_wait_s
    if max_wait_s <= 0:
        return None
    deadline = time.monotonic() + max_wait_s
    while True:
        meter = ContentionMeter().start()
        time.sleep(window_s)
        seen = meter.stop()
        if seen is None or not seen.busy or time.monotonic() + window_s > deadline:
            return seen


__all__ = ["BUSY_CORES", "BUSY_STEAL", "SETTLE_MAX_S", "Contention", "ContentionMeter", "attach", "settle",
           "sibling_ranks"]
