"""Sanity checks on an executed notebook's runs: figures the render refuses to publish because they cannot be true.

Why: an executed copy in the docs is read as "what this lab measured". Two copies once said what no quiet machine
can produce: 02 showed ``auto`` (which had resolved to fp32, so the comparison was fp32 against fp32, an A/A) at
1.25x over fp32, and 05 showed two DDP ranks on a 2-core box at 5.15x over one process using the same two cores
(its baseline had been slowed by a neighbour). Both followed from load, not from the technique. The render
(:mod:`lab.teach.render`) collects every :class:`~lab.result.RunResult` the notebook's kernel holds when its last
cell has run (:func:`held_runs`, executed inside the kernel, nothing added to the notebook) and holds them to
these rules, which are the lab's own:

* **An A/A reads 1.** A run that asked for another precision but resolved to fp32 (``auto`` keeping fp32)
  against the fp32 runs of the same configuration is fp32 against fp32: its speedup interval must contain 1 (the
  rule :func:`lab.ablation.verdicts` applies to the A/A arm) and its estimate must lie within x/ 1.1 of 1
  (:data:`AA_BAND`: a notebook's few short repeats on a shared machine; looser than the x/ 1.03 within which the
  doctor calls a verification quiet enough to calibrate on, :data:`lab.doctor.calibration.QUIET_AA`).
* **p ranks on p cores are no faster than one process on them.** A data-parallel run whose ranks fill the machine's
  cores against a single process of the same workload, size, steps and global batch: the speedup's interval must
  not lie above 1 (same work, same cores, plus the all-reduce).

A rule that finds no runs it applies to says so (``checked == 0``) rather than passing silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lab.measure import bootstrap_ratio_ci
from lab.result import RunResult

#: An A/A estimate further than this factor from 1 is noise too large for the notebook's figures.
AA_BAND = 1.1


@dataclass(frozen=True)
class Finding:
    """One comparison a rule made: which rule, what it compared, the speedup (estimate, lo, hi), and whether it
    holds; ``text`` is the sentence the stamp (or the refusal) prints."""

    rule: str
    what: str
    speedup: tuple[float, float, float]
    ok: bool
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "what": self.what, "speedup": [round(x, 3) for x in self.speedup],
                "ok": self.ok, "text": self.text}


def held_runs(namespace: dict, depth: int = 3) -> list:
    """Every ``RunResult`` in ``namespace`` (a kernel's ``globals()``) and inside its lists, tuples, sets and dict
    values down to ``depth`` levels, each once. Runs in the kernel itself, so it is self-contained (its source is
    sent as the probe cell, :func:`probe_source`) and recognises a run by its class name: it must not import the
    lab into a notebook that never did."""
    found: dict[int, Any] = {}

    def visit(value, level):  # no annotations: this source runs in the kernel, where typing is not imported
        if type(value).__name__ == "RunResult" and hasattr(value, "to_dict"):
            found.setdefault(id(value), value)
        elif level < depth and isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                visit(item, level + 1)
        elif level < depth and isinstance(value, dict):
            for item in value.values():
                visit(item, level + 1)

    for name, value in list(namespace.items()):
        if not name.startswith("_"):
            visit(value, 0)
    return list(found.values())


def probe_source(out_path: str) -> str:
    """The code the render runs in the kernel after the notebook's last cell: :func:`held_runs`' own source, then
    the runs written to ``out_path`` as JSON (a run that cannot be serialised is skipped, never fatal)."""
    import inspect
    import textwrap

    return (textwrap.dedent(inspect.getsource(held_runs)) + "\n\n"
            "def _lab_render_probe(path):\n"
            "    import json\n"
            "    rows = []\n"
            "    try:\n"
            "        runs = held_runs(globals())\n"
            "    except Exception:\n"
            "        runs = []\n"
            "    for run in runs:\n"
            "        try:\n"
            "            rows.append(json.loads(json.dumps(run.to_dict())))\n"
            "        except Exception:\n"
            "            pass\n"
            "    with open(path, 'w') as f:\n"
            "        json.dump(rows, f)\n\n\n"
            f"_lab_render_probe({out_path!r})\n"
            "del held_runs, _lab_render_probe\n")


def _same_but(cfg: dict, *keys: str) -> str:
    """``cfg`` without ``keys``, as a comparable key (JSON text, sorted)."""
    import json

    return json.dumps({k: v for k, v in cfg.items() if k not in keys}, sort_keys=True, default=str)


def _requested(run: RunResult) -> str:
    return str((run.config.get("precision") or {}).get("dtype") or "fp32")


def _resolved(run: RunResult) -> str:
    return str((run.details.get("precision") or {}).get("resolved") or _requested(run))


def _pooled(runs: Iterable[RunResult]) -> list[float]:
    return [t for r in runs for t in r.measured_ms()]


def fp32_twins(runs: Sequence[RunResult]) -> list[Finding]:
    """Runs that asked for another precision and ran fp32, against the fp32 runs of the same configuration (all
    repeats pooled): an A/A. Holds when the interval contains 1 and the estimate is within x/ :data:`AA_BAND`."""
    ok_runs = [r for r in runs if r.status == "ok" and r.measured_ms()]
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in ok_runs:
        if _resolved(r) == "fp32":
            groups.setdefault((_same_but(r.config, "precision"), _requested(r)), []).append(r)
    out = []
    for (key, requested), twins in groups.items():
        base = groups.get((key, "fp32"))
        if requested == "fp32" or not base:
            continue
        est = bootstrap_ratio_ci(_pooled(base), _pooled(twins))
        inside = est[1] <= 1.0 <= est[2] and 1 / AA_BAND <= est[0] <= AA_BAND
        what = f"{twins[0].workload}: {requested} (ran fp32) vs fp32"
        text = (f"{what} reads {est[0]:.2f}x [{est[1]:.2f}, {est[2]:.2f}]: fp32 against fp32, an A/A, "
                + ("within its noise" if inside else
                   ("yet its interval excludes 1" if not est[1] <= 1.0 <= est[2] else f"yet further than x/ "
                    f"{AA_BAND:.1f} from 1") + ": the machine's speed moved during the run, so the notebook's "
                   "speedups are not the technique's"))
        out.append(Finding("A/A reads 1", what, est, inside, text))
    return out


def _world(run: RunResult) -> int:
    return int((run.config.get("ddp") or {}).get("world_size") or 1)


def _global_batch(run: RunResult) -> int:
    ddp = run.details.get("distributed") or {}
    return int(ddp.get("effective_batch") or run.batch_size * _world(run)
               * int((run.config.get("ddp") or {}).get("grad_accum_steps") or 1))


def ranks_on_cores(runs: Sequence[RunResult]) -> list[Finding]:
    """Each data-parallel CPU run whose ranks fill the machine's cores, against each single-process run of the
    same workload, size, steps, seed and precision at the same global batch: the ranks' speedup (baseline step /
    rank step) must not be above 1 beyond its interval."""
    ok_runs = [r for r in runs if r.status == "ok" and r.measured_ms()]
    keys = ("workload", "size", "max_steps", "epochs", "seed", "precision")
    out = []
    for ddp in ok_runs:
        cores = int(ddp.env.get("usable_cores") or ddp.env.get("logical_cores") or 0)
        p = _world(ddp)
        on_gpu = bool(ddp.env.get("cuda_available")) and ddp.config.get("device") != "cpu"
        if p < 2 or not cores or p < cores or on_gpu:
            continue
        for base in ok_runs:
            if _world(base) != 1 or any(base.config.get(k) != ddp.config.get(k) for k in keys) \
                    or _global_batch(base) != _global_batch(ddp):
                continue
            est = bootstrap_ratio_ci(base.measured_ms(), ddp.measured_ms())
            holds = est[1] <= 1.0
            accum = int((ddp.config.get("ddp") or {}).get("grad_accum_steps") or 1)
            what = (f"{ddp.workload}: {p} ranks x batch {ddp.batch_size}"
                    + (f" x {accum} accumulated" if accum > 1 else "")
                    + f" on {cores} cores vs 1 process x {base.config.get('threads')} thread(s) x batch "
                    f"{_global_batch(base)}")
            text = (f"{what} reads {est[0]:.2f}x [{est[1]:.2f}, {est[2]:.2f}]: "
                    + ("not faster beyond noise" if holds else
                       "faster beyond noise, which the same work on the same cores cannot be: the baseline was "
                       "slowed (load), so the notebook's DDP figures are not DDP's"))
            out.append(Finding("ranks on cores", what, est, holds, text))
    return out


#: The rules, in the order the stamp lists them.
RULES = (fp32_twins, ranks_on_cores)


def check_runs(runs: Sequence[RunResult]) -> list[Finding]:
    """Every rule over ``runs``: its findings (an empty list when no rule applies to these runs)."""
    return [f for rule in RULES for f in rule(runs)]


def check_rows(rows: Sequence[dict[str, Any]]) -> list[Finding]:
    """:func:`check_runs` over the JSON rows :func:`probe_source` wrote (a row that is not a run is skipped)."""
    runs = []
    for row in rows:
        try:
            runs.append(RunResult.from_dict(row))
        except (TypeError, ValueError, KeyError):
            continue
    return check_runs(runs)


__all__ = ["AA_BAND", "RULES", "Finding", "check_rows", "check_runs", "fp32_twins", "held_runs", "probe_source",
           "ranks_on_cores"]
