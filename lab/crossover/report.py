"""The map's headline: the figures ``python -m lab bench`` reports, and the crossovers as sentences.

Goals hold at the largest *dense* rung, the ``mlp`` ladder's (the plain-PyTorch MLP the targets
were measured on), each a share of its ceiling on the machine that measured it (:mod:`lab.goals`): bf16 training
step and dynamic int8 inference >= 50 % of the card's bf16 / int8 over fp32 GEMM ratio (once >= 1.8x and >= 2.5x,
constants of one CPU), half-width channel pruning >= 0.75 x its MACs ratio; every top-rung figure's note says its
share of its ceiling; the lab's figure there must agree with plain PyTorch's at the same size (95 %
intervals overlap, :mod:`.reference`); and the predicted crossover within one rung of the measured one for
>= 75 % of the workload x technique x axis pairs. Other workloads' figures are reported without a goal.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from lab.crossover.mapping import MAP_FILE, agreement
from lab.crossover.names import in_current_names
from lab.goals import gemm_goal, map_row_ceiling
from lab.result import to_jsonable

GOAL_WORKLOAD = "mlp"
#: Technique x axis held against the card's GEMM ratio of this dtype at the dense ladder's top rung.
GEMM_GOALS = {("bf16", "train_step"): "bf16", ("int8_eager", "inference"): "int8"}
PRUNE_SHARE_OF_MACS_RATIO = 0.75
AGREEMENT_GOAL = 0.75
#: An ``auto`` row reaches at least this share of its best candidate's speedup at the top rung.
AUTO_SHARE_GOAL = 0.9
#: Each ``auto`` technique of the map -> its axis and candidates (``fp32``: the baseline itself, 1.0x).
AUTO_CANDIDATES = {"amp_auto": ("train_step", ("fp32", "bf16", "fp16")),
                   "int8_auto": ("inference", ("int8_static_legacy", "int8_static"))}
_MACS_RATIO = re.compile(r"([0-9.]+)x fewer MACs")
_STORED_RATIO = re.compile(r"int8 layers ([0-9.]+)x smaller as stored")
#: int8 layers (PT2E's stored format) at least this many times smaller than in fp32.
INT8_SIZE_GOAL = 3.9
#: The stack the map times at the top rung: channels 50 % + PT2E static int8, inference, on the vision ladder's
#: top rung.
STACK, STACK_PARTS, STACK_WORKLOAD, STACK_GOAL = ("prune_channels50+int8_static", ("prune_channels50", "int8_static"),
                                                  "vision", 5.0)


def _largest(rows: list[dict[str, Any]], workload: str, technique: str, axis: str) -> dict[str, Any] | None:
    got = [r for r in rows if r["workload"] == workload and r["technique"] == technique and r["axis"] == axis
           and r["speedup"] is not None]
    return max(got, key=lambda r: r["params"], default=None)


def _figure(name: str, value: float | None, *, unit: str = "x", ci: list[float] | None = None,
            goal: str | None = None, met: bool | None = None, note: str = "") -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "ci95": ci, "goal": goal, "met": met, "note": note,
            "family": "crossover"}


def figures(the_map: dict[str, Any]) -> list[dict[str, Any]]:
    """Benchmark figures (the envelope ``lab bench`` reads): agreement, then per workload the largest
    measured rung's speedup of each technique x axis, goals on the Transformer's."""
    rows = the_map["rows"]
    ok, n = agreement(the_map["crossovers"])
    out = [_figure("crossover predicted within one rung of measured", ok / n if n else None, unit="share",
                   goal=f">= {AGREEMENT_GOAL:.0%}", met=(ok / n >= AGREEMENT_GOAL) if n else None,
                   note=f"{ok} of {n} workload x technique x axis pairs")]
    pairs = sorted({(r["workload"], r["technique"], r["axis"]) for r in rows})
    card = the_map.get("machine_card") or (the_map.get("env") or {}).get("machine_card")
    threads = the_map.get("threads") or 1
    for wl, tech, axis in pairs:
        r = _largest(rows, wl, tech, axis)
        if r is None:
            continue
        goal, met = None, None
        if wl == GOAL_WORKLOAD and (tech, axis) in GEMM_GOALS:
            got = gemm_goal(r["speedup"], card, GEMM_GOALS[(tech, axis)], threads)
            goal, met = got["goal"], got["met"]
        match = _MACS_RATIO.search(r.get("why") or "")
        if wl == GOAL_WORKLOAD and tech == "prune_channels50" and match:
            need = PRUNE_SHARE_OF_MACS_RATIO * float(match.group(1))
            goal, met = f">= {need:.2f}x (0.75 x its MACs ratio)", r["speedup"] >= need
        if wl == STACK_WORKLOAD and tech == STACK:
            goal, met = f"> {STACK_GOAL:g}x", r["speedup"] > STACK_GOAL
        out.append(_figure(f"{wl} {r['rung']} ({r['params'] / 1e6:.2g} M params) {tech} {axis.replace('_', ' ')}",
                           r["speedup"], ci=[r["ci_lo"], r["ci_hi"]], goal=goal, met=met,
                           note=(r.get("regime") or "") + (f"; base {r['base_ms']:.3g} ms" if r["base_ms"] else "")
                           + ceiling_note(r if "ceiling" in r else {**r, **map_row_ceiling(r, card, threads)})
                           + (stack_note(rows, r) if tech == STACK else "")))
    return out + auto_share_figures(rows) + int8_size_figures(rows) + reference_figures(the_map.get("reference") or [])


def ceiling_note(r: dict[str, Any]) -> str:
    """``"; 48 % of its ceiling 4.39x (card: bf16 GEMM peak 4.39x fp32 ...): why"``, or where it has none, why."""
    if r.get("share_of_ceiling") is not None:
        return (f"; {100 * r['share_of_ceiling']:.0f} % of its ceiling {r['ceiling']:.2f}x ({r['ceiling_basis']})"
                + (f": {r['share_why']}" if r.get("share_why") else ""))
    return f"; no ceiling: {r['ceiling_basis']}" if r.get("ceiling_basis") else ""


def stack_note(rows: list[dict[str, Any]], r: dict[str, Any]) -> str:
    """The stacked row's parts at the same rung and their product: what stacking kept of each. Pruned
    channels leave narrower int8 layers, whose kernels run further from their peak, so the stack can fall
    short of the product; it can also exceed it where compiling the int8 graph removes more of the pruned
    model's overhead than of the dense one's."""
    parts = {t: next((x["speedup"] for x in rows if x["workload"] == r["workload"] and x["rung"] == r["rung"]
                      and x["technique"] == t and x["axis"] == r["axis"] and x["speedup"] is not None), None)
             for t in STACK_PARTS}
    if any(v is None for v in parts.values()):
        return ""
    product = math.prod(parts.values())
    return ("; parts at this rung: " + ", ".join(f"{t} {v:.2f}x" for t, v in parts.items())
            + f", product {product:.2f}x, the stack {r['speedup'] / product:.0%} of it")


def int8_size_figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, at the largest rung with a PT2E int8 row: how much smaller its int8 layers are as stored
    (from the row's note, :func:`lab.crossover.arms.int8_share_note`), goal >= 3.9x. The format's bound grows
    with the weights per output channel, so the top rung's wide layers are where the goal can hold."""
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        r = _largest(rows, wl, "int8_static", "inference")
        match = _STORED_RATIO.search((r or {}).get("why") or "")
        if match:
            value = float(match.group(1))
            out.append(_figure(f"{wl} {r['rung']} ({r['params'] / 1e6:.2g} M params) int8_static int8 layers "
                               "size ratio", value, goal=f">= {INT8_SIZE_GOAL:g}x", met=value >= INT8_SIZE_GOAL,
                               note="fp32 bytes / int8 bytes of the int8 layers as PT2E stores them (int8 weights "
                                    "and zero points, fp32 scales and biases)"))
    return out


def auto_share(rows: list[dict[str, Any]], workload: str, auto: str) -> dict[str, Any] | None:
    """At ``workload``'s largest rung where ``auto`` was measured: its speedup as a share of the best measured
    candidate's (:data:`AUTO_CANDIDATES`), and which one that was; ``None`` where there is no such rung."""
    axis, candidates = AUTO_CANDIDATES[auto]
    r = _largest(rows, workload, auto, axis)
    if r is None:
        return None
    here = {c: 1.0 if c == "fp32" else next((x["speedup"] for x in rows if x["workload"] == workload
                                             and x["rung"] == r["rung"] and x["technique"] == c
                                             and x["axis"] == axis and x["speedup"] is not None), None)
            for c in candidates}
    measured = {c: v for c, v in here.items() if v is not None}
    if not measured or (auto == "int8_auto" and len(measured) < 2):
        return None
    best = max(measured, key=measured.__getitem__)
    return {"rung": r["rung"], "params": r["params"], "auto": r["speedup"], "best": best,
            "best_speedup": measured[best], "share": r["speedup"] / measured[best], "candidates": measured}


def auto_share_figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and ``auto`` technique: its share of the best candidate at the top rung, goal >= 90 %."""
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        for auto, (axis, _) in AUTO_CANDIDATES.items():
            got = auto_share(rows, wl, auto)
            if got is None:
                continue
            cands = ", ".join(f"{c} {v:.2f}x" for c, v in got["candidates"].items())
            where = f"{wl} {got['rung']} ({got['params'] / 1e6:.2g} M params) {auto} {axis.replace('_', ' ')}"
            out.append(_figure(f"{where}: share of the best candidate", got["share"], unit="share",
                               goal=f">= {AUTO_SHARE_GOAL:.0%}", met=got["share"] >= AUTO_SHARE_GOAL,
                               note=f"{auto} {got['auto']:.2f}x; best {got['best']} ({cands})"))
    return out


def reference_figures(reference: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per compared technique x axis: the lab's and plain PyTorch's speedup at the same size, the goal on
    their agreement (intervals overlap); the absolute targets stay on the map's own rows above."""
    out = []
    for r in reference:
        where = f"mlp {r['rung']} {r['technique']} {r['axis'].replace('_', ' ')}"
        if r["plain"] is not None:
            out.append(_figure(f"{where}: plain PyTorch", r["plain"], ci=[r["plain_lo"], r["plain_hi"]],
                               note=r.get("why") or "nothing from lab: torch.optim / torch.autocast / torch.ao"))
        if r["lab"] is not None:
            out.append(_figure(f"{where}: lab vs plain PyTorch", r["lab"] / r["plain"] if r["plain"] else None,
                               unit="ratio of speedups", goal="95 % intervals overlap", met=r["agrees"],
                               note=f"lab {r['lab']:.2f}x [{r['lab_lo']:.2f}, {r['lab_hi']:.2f}], plain "
                                    f"{r['plain']:.2f}x [{r['plain_lo']:.2f}, {r['plain_hi']:.2f}]"))
    return out


def _size(params: float | None) -> str:
    if params is None:
        return "never on this ladder"
    if params <= 0:
        return "any size"
    return f"{params / 1e6:.2g} M" if params >= 1e5 else f"{params / 1e3:.3g} k"


def headline_lines(the_map: dict[str, Any]) -> list[str]:
    """One line per workload x technique x axis: measured crossover (params), predicted, agreement."""
    lines = []
    for c in the_map["crossovers"]:
        lines.append(f"{c['workload']:<12} {c['technique']:<16} {c['axis']:<10} measured from "
                     f"{_size(c['measured_params']):<22} predicted from {_size(c['predicted_params']):<22}"
                     + ("" if c.get("within_one_rung") is None else
                        ("  (within one rung)" if c["within_one_rung"] else "  (more than one rung apart)")))
    ok, n = agreement(the_map["crossovers"])
    lines.append(f"predicted within one rung of measured: {ok} of {n} pairs")
    busy = (the_map.get("contention") or {}).get("sentence")
    if busy:  # every figure above was timed on a busy machine
        lines.append(f"WARNING: {busy}")
    return lines


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "n/a"
    return f"{_size(r['params'])}: {r['speedup']:.2f}× [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}]"


def markdown_table(the_map: dict[str, Any]) -> str:
    """The crossover page's table (docs/crossover.md): per technique x axis x workload the smallest and
    largest measured rung with CI, and the measured and predicted crossovers; then the plain-PyTorch check of
    the dense ladder."""
    rows = [r for r in the_map["rows"] if r["speedup"] is not None]
    cross = {(c["workload"], c["technique"], c["axis"]): c for c in the_map["crossovers"]}
    lines = ["| technique | axis | workload | smallest rung: speedup [95 % CI] | largest rung: speedup [95 % CI] "
             "| pays from (measured) | predicted from |", "|---|---|---|---|---|---|---|"]
    keys = dict.fromkeys((r["workload"], r["technique"], r["axis"]) for r in rows)
    order = {a: i for i, a in enumerate(("train_step", "inference"))}
    for wl, tech, axis in sorted(keys, key=lambda k: (k[0], order.get(k[2], 9))):
        got = sorted((r for r in rows if (r["workload"], r["technique"], r["axis"]) == (wl, tech, axis)),
                     key=lambda r: r["params"])
        c = cross.get((wl, tech, axis), {})
        measured = _size(c.get("measured_params")) if c else "n/a"
        predicted = _size(c.get("predicted_params")) if c else "n/a"
        measured = "not on this ladder" if measured == "never on this ladder" else measured
        predicted = "never" if predicted == "never on this ladder" else predicted
        lines.append(f"| {tech} | {axis.replace('_', ' ')} | {wl} | {_cell(got[0])} | {_cell(got[-1])} "
                     f"| {measured} | {predicted} |")
    ok, n = agreement(the_map["crossovers"])
    lines += ["", f"Predicted within one rung of measured: {ok} of {n} pairs"
                  f"{f' ({ok / n:.0%})' if n else ''}; wall time {the_map.get('wall_s', 0):.0f} s; "
                  f"threads {the_map.get('threads', 1)}; {'quick' if the_map.get('quick') else 'full'} map."]
    ref = the_map.get("reference") or []
    if ref:
        lines += ["", f"Plain PyTorch beside the lab at the dense ladder's largest rung (`mlp` {ref[0]['rung']}, "
                      "same model and batch, arms interleaved in one loop):", "",
                  "| technique | axis | lab [95 % CI] | plain PyTorch [95 % CI] | intervals overlap | target |",
                  "|---|---|---|---|---|---|"]
        for r in ref:
            lab = "—" if r["lab"] is None else f"{r['lab']:.2f}× [{r['lab_lo']:.2f}, {r['lab_hi']:.2f}]"
            plain = "—" if r["plain"] is None else f"{r['plain']:.2f}× [{r['plain_lo']:.2f}, {r['plain_hi']:.2f}]"
            agree = "—" if r["agrees"] is None else ("yes" if r["agrees"] else "no")
            target = "—" if r["target"] is None else (f"≥ {r['target']:.2f}×" + (" (0.75 × MACs ratio)"
                                                                                 if r["macs_ratio"] else ""))
            lines.append(f"| {r['technique']} | {r['axis'].replace('_', ' ')} | {lab} | {plain} | {agree} "
                         f"| {target} |")
    return "\n".join(lines)


def _common_top_rungs(maps: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Per workload: the largest rung every map measured (the machines compared at the same model)."""
    order = ("xs", "s", "m", "l", "xl")
    common: dict[str, set[str]] | None = None
    for _, m in maps:
        have: dict[str, set[str]] = {}
        for r in m["rows"]:
            have.setdefault(r["workload"], set()).add(r["rung"])
        common = have if common is None else {w: common[w] & have[w] for w in common.keys() & have.keys()}
    return {w: max(rungs, key=lambda r: order.index(r) if r in order else -1)
            for w, rungs in (common or {}).items() if rungs}


def load_maps(results_root: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """``(hardware id, map)`` for every ``results_root/<hardware-id>/crossover.json`` (the id the map was
    stamped with, the folder's name when it has none); unreadable files are left out."""
    out = []
    for path in sorted(Path(results_root).glob(f"*/{MAP_FILE}")):
        try:
            the_map = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(the_map, dict) and "rows" in the_map:
            out.append(((the_map.get("env") or {}).get("hardware_id") or path.parent.name, in_current_names(the_map)))
    return out


def _share_cell(the_map: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """``"; 73 % of its ceiling"`` (the median over ``rows`` of the share of each one's ceiling on this map's
    card), ``"; no card"`` where the map has none and the technique's ceiling needs one, else empty."""
    card = the_map.get("machine_card") or (the_map.get("env") or {}).get("machine_card")
    got = [map_row_ceiling(r, card, the_map.get("threads") or 1) for r in rows]
    shares = sorted(g["share_of_ceiling"] for g in got if g["share_of_ceiling"] is not None)
    if shares:
        n = len(shares)
        mid = shares[n // 2] if n % 2 else (shares[n // 2 - 1] + shares[n // 2]) / 2
        return f"; {100 * mid:.0f} % of its ceiling"
    return "; no card" if any(g["ceiling_basis"] == "no card" for g in got) else ""


def cross_hardware_table(maps: list[tuple[str, dict[str, Any]]]) -> str:
    """Technique x machine: per technique x axis and machine, the speedup at each workload's largest rung that
    every machine measured (the same model and batch), as the median over workloads with its range, and how
    many of them pay (CI above 1). ``maps``: (hardware id, crossover map) pairs, each labelled with its own id
    and whether it was a quick map; a technique a machine did not measure reads "—"."""
    if not maps:
        return "_No crossover map yet: run `python -m lab crossover --quick` (about 2-3 minutes)._"
    top = _common_top_rungs(maps)
    keys = dict.fromkeys((r["technique"], r["axis"]) for _, m in maps for r in m["rows"])
    order = {a: i for i, a in enumerate(("train_step", "inference"))}
    head = ["technique", "axis", *[f"{hw} ({'quick' if m.get('quick') else 'full'} map)" for hw, m in maps]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tech, axis in sorted(keys, key=lambda k: (order.get(k[1], 9), k[0])):
        cells = []
        for _, m in maps:
            got = [r for r in m["rows"] if (r["technique"], r["axis"]) == (tech, axis) and r["speedup"] is not None
                   and top.get(r["workload"]) == r["rung"]]
            if not got:
                here = [r for r in m["rows"] if (r["technique"], r["axis"]) == (tech, axis)
                        and top.get(r["workload"]) == r["rung"]]
                slow = sum(1 for r in here if "slower than fp32 on a single call" in (r.get("why") or ""))
                cells.append(f"> 8× slower on {slow} of {len(here)}: not timed" if slow else "not in this map")
                continue
            vals = sorted(r["speedup"] for r in got)
            mid = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
            pays = sum(1 for r in got if r["ci_lo"] is not None and r["ci_lo"] > 1)
            cells.append(f"{mid:.2f}× ({vals[0]:.2f}–{vals[-1]:.2f}); pays on {pays} of {len(got)}"
                         + _share_cell(m, got))
        lines.append(f"| {tech} | {axis.replace('_', ' ')} | " + " | ".join(cells) + " |")
    rungs = ", ".join(f"{w} {r}" for w, r in sorted(top.items()))
    lines += ["", f"Median speedup over the workloads at the largest rung every machine measured ({rungs}), "
                  "its range, on how many of them the 95 % CI is above 1, and the median share of its ceiling on that "
                  "machine's card (GEMM ratio for a precision; for int8 over the share of MACs in int8 where the row "
                  "says it; MACs ratio for channel pruning; `no card`: the "
                  "map predates the card). Each column is that machine's own map (1 thread); a quick map has fewer "
                  "techniques and rounds."]
    return "\n".join(lines)


CROSS_START = "<!-- cross-hardware:start"
CROSS_END = "<!-- cross-hardware:end -->"


def write_cross_hardware(page: str | Path, results_root: str | Path) -> bool:
    """Regenerate the technique x machine table from every ``results_root/*/crossover.json``: into
    ``results_root/cross-hardware.md`` (the report across machines) and between ``page``'s cross-hardware
    markers (the results page, docs/results.md, section "Techniques across machines"). Returns False (the
    page left as it is) when the page has no markers."""
    table = cross_hardware_table(load_maps(results_root))
    Path(results_root, "cross-hardware.md").write_text("# Techniques across machines\n\n" + table + "\n")
    page = Path(page)
    text = page.read_text()
    if CROSS_START not in text or CROSS_END not in text:
        return False
    head, rest = text.split(CROSS_START, 1)
    marker_line, _, rest = rest.partition("\n")
    _, tail = rest.split(CROSS_END, 1)
    page.write_text(f"{head}{CROSS_START}{marker_line}\n{table}\n{CROSS_END}{tail}")
    return True


def _finite_or_null(obj: Any) -> Any:
    # Standard JSON has no NaN / Infinity, and the readers (lab doctor, a browser) are not Python.
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite_or_null(v) for v in obj]
    return obj


def write_strict_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as standard JSON (NaN / inf become null), creating the folder: the map and the threads
    study both go through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite_or_null(to_jsonable(obj)), indent=1, allow_nan=False))
    return path
