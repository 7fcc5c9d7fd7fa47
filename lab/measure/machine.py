"""The machine card: what this CPU can do, measured once and cached (``python -m lab machine``).

"bf16 is 2x faster" is a property of a machine, not of bf16. The card holds the hardware id, the ISA as the
kernels see it (:func:`lab.measure.cpu.cpu_capabilities`), cores, caches and *measured* peaks: GEMM GFLOP/s in
fp32 / bf16 / fp16 / int8 at 1 thread and all usable cores, a STREAM triad's GB/s, the fixed cost of one tiny
op. The doctor and the crossover map cite it (:func:`limit_sentence`); every environment stamp carries its
summary (:func:`card_summary`: read from the cache, never measured). Timed with the one timer (docs/architecture.md 5):
dtypes interleaved, warm-up excluded, medians of >= 3 repeats, the ratio to fp32 with a bootstrap CI. An
emulated ISA makes bf16 / fp16 GEMMs ~60x slower, so each dtype's size is fitted to a time budget from a small
probe (the card says which). int8 is timed on the fastest int8 kernel that runs
(:func:`lab.measure.gemm_peaks.int8_gemm`). Cached at
``$LAB_CACHE_DIR/machine/<hardware_id>-torch<version>-card<CARD_FORMAT>.json``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from lab.measure import env
from lab.measure.cpu import EMULATIONS, cpu_capabilities, emulation_env
from lab.measure.gemm_peaks import GEMM_DTYPES, measure_gemm
from lab.measure.stats import median
from lab.measure.timing import interleaved_ms

#: Seconds a measurement takes {quick: s}, for a button (2-core AMX Xeon: 13 / 3 s; capped at AVX2: 13 / 7 s)
ESTIMATE_S = {False: 15, True: 5}
_MIB = 2**20
Progress = Callable[[str], Any]


@dataclass
class MachineCard:
    """One machine's card (see the module docstring); ``peaks`` holds the measured figures."""

    hardware_id: str
    cpu_model: str
    logical_cores: int
    usable_cores: int
    caches: dict[str, int]  # "L1d" / "L1i" / "L2" / "L3" -> bytes (what /sys reports for cpu0)
    capabilities: dict[str, Any]  # cpu_capabilities().to_dict()
    torch_version: str
    threads: list[int]  # the torch thread counts measured ("1" and "all" in the peaks)
    measured_at: str  # ISO 8601, UTC
    quick: bool
    duration_s: float
    int8_kernel: str  # the int8 x int8 kernel timed (its output dtype says it is an int8 kernel)
    # gemm_gflops {dtype: {"1", "all"}} (int8: GOP/s), gemm_vs_fp32 {dtype: [ratio, lo, hi]} at 1 thread,
    # triad_gbps {"1", "all"}, small_op_us
    peaks: dict[str, Any]
    sizes: dict[str, Any] = field(default_factory=dict)  # gemm_n {dtype: n}, triad_mib (per array)
    notes: list[str] = field(default_factory=list)  # a dtype that could not be timed, a capped array size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineCard:
        return cls(**{k: copy.deepcopy(v) for k, v in data.items() if k in {f.name for f in fields(cls)}})


def _size_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text.upper())
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)] if m else 0


def read_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """``{"L1d": bytes, "L1i": ..., "L2": ..., "L3": ...}`` from ``index*/{level,type,size}``; ``{}`` where
    the folder is missing (containers, non-Linux)."""
    out: dict[str, int] = {}
    for d in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if _size_bytes(size):
            out[f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")] = _size_bytes(size)
    return out


def _available_bytes() -> int:
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        return int(m.group(1)) * 1024 if m else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 2 * 2**30


def _identity() -> dict[str, Any]:
    stamp = env.environment_stamp("cpu")
    return {k: stamp[k] for k in ("hardware_id", "cpu_model", "logical_cores", "usable_cores", "torch_version")}


def _measure_triad(threads: list[int], caches: dict[str, int], quick: bool, say: Progress,
                   notes: list[str]) -> tuple[dict[str, float], float]:
    """a = b + s*c over fp32 arrays 1x (quick) / 2x the L3 each, so no pass is cache resident; bytes moved
    are counted as STREAM does, 3 x 4 bytes x n (write-allocate traffic is not counted)."""
    cache = caches.get("L3") or caches.get("L2") or 32 * _MIB
    n = (1 if quick else 2) * max(cache, 16 * _MIB) // 4
    cap = _available_bytes() // 4 // 12  # the three arrays take at most a quarter of the free memory
    if n > cap:
        notes.append(f"triad arrays capped by free memory: {cap * 4 // _MIB} MiB each ({n * 4 // _MIB} wanted)")
        n = cap
    a, b, c = torch.empty(n), torch.full((n,), 1.0), torch.full((n,), 2.0)
    out: dict[str, float] = {}
    for t in threads:
        torch.set_num_threads(t)
        say(f"triad at {t} thread(s): 3 x {n * 4 // _MIB} MiB")
        ms = interleaved_ms({"triad": lambda: torch.add(b, c, alpha=3.0, out=a)}, repeats=3 if quick else 5,
                            warmup=1)["triad"]
        out["1" if t == 1 else "all"] = median([3 * 4 * n / (m / 1e3) / 1e9 for m in ms])
    out.setdefault("all", out["1"])
    return out, n * 4 / _MIB


def _measure_small_op(quick: bool) -> float:
    torch.set_num_threads(1)
    x = torch.ones(1)
    ms = interleaved_ms({"add": lambda: torch.add(x, x)}, repeats=5 if quick else 11, warmup=200,
                        iters=300 if quick else 1000)["add"]
    return median(ms) * 1e3


def measure_card(quick: bool = False, progress: Progress | None = None) -> MachineCard:
    """Measure this machine's card (~15 s, ``quick`` ~5 s, under an emulated ISA too). Restores the
    torch thread count; ``progress`` gets one line per stage."""
    say = progress or (lambda _msg: None)
    start, before = time.monotonic(), torch.get_num_threads()
    ident, caches, notes = _identity(), read_caches(), []
    if (load := os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0) > 0.5:  # a shared box (rule 5.8)
        notes.append(f"load average {load:.1f} when measured: other work shares the cores (all-core figures most)")
    threads = sorted({1, max(1, int(ident["usable_cores"]))})
    try:
        gflops, vs, sizes, kernel = measure_gemm(threads, quick, say, start + (20 if quick else 60), notes)
        triad, triad_mib = _measure_triad(threads, caches, quick, say, notes)
        say("small op: torch.add on a 1-element tensor")
        small = _measure_small_op(quick)
    finally:
        torch.set_num_threads(before)
    return MachineCard(
        **ident, caches=caches, capabilities=cpu_capabilities().to_dict(), threads=threads,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"), quick=quick,
        duration_s=round(time.monotonic() - start, 2), int8_kernel=kernel,
        peaks={"gemm_gflops": gflops, "gemm_vs_fp32": vs, "triad_gbps": triad, "small_op_us": small},
        sizes={**sizes, "triad_mib": round(triad_mib, 1)}, notes=notes)


#: Raised when what a card measures changes, so a cached card measured the old way is measured again (2: int8 on
#: the fastest int8 kernel, not ``torch._int_mm`` alone).
CARD_FORMAT = 2


def card_path(hardware_id: str | None = None) -> Path:
    """``$LAB_CACHE_DIR/machine/<hardware_id>-torch<version>-card<CARD_FORMAT>.json`` (default ``~/.cache/lab``)."""
    root = Path(os.environ.get("LAB_CACHE_DIR") or Path.home() / ".cache" / "lab")
    version = re.sub(r"[^A-Za-z0-9._-]+", "-", torch.__version__)
    return root / "machine" / f"{hardware_id or _identity()['hardware_id']}-torch{version}-card{CARD_FORMAT}.json"


def load_card(hardware_id: str | None = None) -> MachineCard | None:
    """The cached card (``None``: none cached, or unreadable). Never measures."""
    try:
        return MachineCard.from_dict(json.loads(card_path(hardware_id).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_card(card: MachineCard) -> Path:
    """Write ``card`` to its :func:`card_path` (atomically); an ``OSError`` if the cache cannot be written."""
    path = card_path(card.hardware_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(card.to_dict(), indent=1))
    os.replace(tmp, path)
    return path


def machine_card(refresh: bool = False, quick: bool = False, progress: Progress | None = None) -> MachineCard:
    """The cached card, or a new measurement (stored) when there is none, ``refresh`` is set, or only a quick
    card is cached and a full one is asked for. A cache that cannot be written is reported, not fatal."""
    card = None if refresh else load_card()
    if card is not None and (quick or not card.quick):
        return card
    card = measure_card(quick=quick, progress=progress)
    try:
        save_card(card)
    except OSError as exc:
        (progress or (lambda _m: None))(f"machine card not cached: {exc}")
    return card


_SUMMARY: dict[Path, tuple[int, dict[str, Any]]] = {}


def card_summary(hardware_id: str | None = None) -> dict[str, Any] | None:
    """``{hardware_id, measured_at, peaks}`` of the cached card, or ``None`` when none is cached. Never
    measures and never raises (cached on the file's mtime): the environment stamp of every result holds it."""
    try:
        path = card_path(hardware_id)
        mtime = path.stat().st_mtime_ns
        if path not in _SUMMARY or _SUMMARY[path][0] != mtime:
            data = json.loads(path.read_text())
            _SUMMARY[path] = (mtime, {k: data[k] for k in ("hardware_id", "measured_at", "peaks")})
        return copy.deepcopy(_SUMMARY[path][1])
    except (OSError, ValueError, TypeError, KeyError):
        return None


env.card_summary_of = card_summary  # the stamp cannot import this module back (a circle): it is handed the reader


def ratio_limit(card: MachineCard, dtype: str) -> float | None:
    """The card's GEMM peak of ``dtype`` over its fp32 peak, at 1 thread (the lab's A/B thread count);
    ``None`` when either was not measured."""
    g = card.peaks.get("gemm_gflops", {})
    num, den = g.get(dtype, {}).get("1"), g.get("fp32", {}).get("1")
    return num / den if num and den else None


def limit_sentence(card: MachineCard, technique: str) -> str | None:
    """What the GEMM peaks allow ``technique`` (bf16, fp16, any int8 one) here, citing the hardware id;
    ``None`` for a technique no GEMM dtype bounds or a ratio not measured."""
    dtype = "int8" if "int8" in technique else technique if technique in ("bf16", "fp16") else None
    r = ratio_limit(card, dtype) if dtype else None
    if r is None:
        return None
    return f"{dtype} GEMM peak here is {r:.2g}x fp32 ({card.hardware_id}): {technique} cannot pay on this machine" \
        if r < 1 else f"{dtype} GEMM peak here is {r:.1f}x fp32 ({card.hardware_id}): the most {technique} can " \
        "give a GEMM-bound step"


def limit_sentences(card: MachineCard) -> list[str]:
    return [s for t in ("bf16", "fp16", "int8") if (s := limit_sentence(card, t))]


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def peak_rows(card: MachineCard) -> list[dict[str, Any]]:
    """The peak table, one row per figure (the CLI prints it, the dashboard shows it)."""
    g, vs, n = card.peaks.get("gemm_gflops", {}), card.peaks.get("gemm_vs_fp32", {}), card.sizes.get("gemm_n", {})
    rows = [{"figure": f"GEMM {dt}", "unit": "GOP/s" if dt == "int8" else "GFLOP/s", "1 thread": g[dt].get("1"),
             "all cores": g[dt].get("all"), "size": f"{n.get(dt, '?')}^2",
             "vs fp32 (1 thread, 95% CI)": "1" if dt == "fp32" else
             (f"{vs[dt][0]:.3g}x [{vs[dt][1]:.3g}, {vs[dt][2]:.3g}]" if dt in vs else "-")} for dt in g]
    tri = card.peaks.get("triad_gbps", {})
    rows.append({"figure": "triad a=b+s*c", "unit": "GB/s", "1 thread": tri.get("1"), "all cores": tri.get("all"),
                 "size": f"3 x {card.sizes.get('triad_mib', '?')} MiB", "vs fp32 (1 thread, 95% CI)": ""})
    rows.append({"figure": "one small op", "unit": "us", "1 thread": card.peaks.get("small_op_us"),
                 "all cores": None, "size": "torch.add, 1 element", "vs fp32 (1 thread, 95% CI)": ""})
    return rows


def format_card(card: MachineCard, path: Path | None = None) -> str:
    """The card as a readable table (``python -m lab machine``)."""
    caps = card.capabilities
    yes = {True: "yes", False: "no"}
    cache = ", ".join(f"{k} {v // 1024} KiB" if v < 4 * _MIB else f"{k} {v // _MIB} MiB"
                      for k, v in card.caches.items())
    lines = [f"machine card: {card.hardware_id}  (torch {card.torch_version}, measured {card.measured_at}"
             f"{', quick' if card.quick else ''}, {card.duration_s:.0f} s)",
             f"  cpu: {card.cpu_model}; {card.logical_cores} logical cores, {card.usable_cores} usable; "
             f"caches: {cache or 'unknown'}",
             f"  kernels: {caps.get('aten_capability')}; native " + ", ".join(f"{k} {yes[bool(caps.get(f))]}" for k, f
             in (("bf16", "native_bf16"), ("fp16", "native_fp16"), ("int8 VNNI", "int8_vnni"), ("AMX", "amx")))
             + f"; caps: {', '.join(caps.get('caps') or []) or 'none'}",
             f"  int8 kernel: {card.int8_kernel}", ""]
    rows = peak_rows(card)
    head = ["figure", "unit", "1 thread", "all cores", "size", "vs fp32 (1 thread, 95% CI)"]
    cells = [head] + [[r["figure"], r["unit"], _fmt(r["1 thread"], 2 if r["unit"] == "us" else 1),
                       _fmt(r["all cores"]), r["size"], r[head[-1]]] for r in rows]
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(head))]
    lines += ["  " + "  ".join(str(c[i]).ljust(widths[i]) for i in range(len(head))).rstrip() for c in cells]
    lines += ["", *(f"  {s}" for s in limit_sentences(card)), *(f"  note: {s}" for s in card.notes)]
    if path is not None:
        lines.append(f"  cached in {path}")
    return "\n".join(lines)


def add_cli_arguments(parser: Any) -> None:
    """The ``machine`` subcommand's flags (lab/cli)."""
    parser.add_argument("--json", action="store_true", help="print the card as JSON")
    parser.add_argument("--refresh", action="store_true", help="measure again (default: the cached card)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (~4 s)")
    parser.add_argument("--as", dest="as_isa", choices=list(EMULATIONS), metavar="ISA",
                        help=f"the card an {'/'.join(EMULATIONS)} CPU would show: the kernels capped in a child "
                             "process (cached under its own -as-<ISA> hardware id)")


def cli(args: Any) -> int:
    """``python -m lab machine``: the card (cached, or measured with progress on stderr), as a table or JSON."""
    if args.as_isa:
        flags = [f for f, on in (("--json", args.json), ("--refresh", args.refresh), ("--quick", args.quick)) if on]
        root = str(Path(__file__).resolve().parents[2])
        child_env = {**os.environ, **emulation_env(args.as_isa),
                     "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        return subprocess.run([sys.executable, "-m", "lab", "machine", *flags], env=child_env, check=False).returncode
    card = machine_card(refresh=args.refresh, quick=args.quick,
                        progress=lambda m: print(f"machine: {m}", file=sys.stderr, flush=True))
    print(json.dumps(card.to_dict(), indent=1) if args.json else format_card(card, card_path(card.hardware_id)))
    return 0


__all__ = [
    "card_path", "card_summary", "format_card", "GEMM_DTYPES", "limit_sentence", "limit_sentences", "load_card",
    "machine_card", "MachineCard", "measure_card", "peak_rows", "ratio_limit", "save_card",
]
