"""How right is the doctor? Predicted vs measured speedup over many models, and top-1 hits.

    python benchmarks/doctor.py [--quick] [--json PATH] [--cases ctr:small,...] [--techniques a,b] [--merge PATH]

For each case (a built-in workload at a size, or a model of the user-model gallery in ``tests/gallery.py``)
the doctor profiles a baseline and predicts every technique in the case's list (:func:`lab.doctor.diagnose`);
then one interleaved ablation measures all of them (:func:`lab.doctor.verify`, 3 repeats per arm, an A/A
arm). Figures: the median absolute error of predicted vs measured speedup over every (case, technique)
(goal <= 25 %), and the share of cases whose top-ranked training technique is the measured best or within
noise of it (its measured interval reaches the best measured speedup; goal >= 70 %). Each case's rows go
into the JSON (``cases``), so where the doctor is wrong can be read off.

``--quick``: three built-ins at ``tiny`` and two gallery models, training-step techniques without compile,
loader workers and auto (their runs are the slowest); full: every built-in workload at two rungs of its
model-size ladder (``--model-scale`` xs and m, on the ``tiny`` data, each run capped at ``MAX_STEPS`` steps:
the doctor's figures are step times, and the ladder changes the model, not the data), the whole gallery,
and the inference techniques too. A case is ``workload:size`` or ``workload:size:rung``.
``--cases`` / ``--techniques`` pick a subset; ``--merge PATH`` pools the cases of an earlier JSON with these
(a second rung measured later) and recomputes the figures over all of them; ``--rescore PATH`` measures
nothing and recomputes a stored JSON's figures. Besides the two goals it reports the top pick's share of
the best measured speedup (mean over cases): how much a user who tries only the first pick leaves.
A busy shared 2-core machine: measured speedups carry its noise, and so do the errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gallery import register_gallery  # noqa: E402

from lab import RunConfig  # noqa: E402
from lab.doctor import accuracy, diagnose, top1_hit, verify  # noqa: E402
from lab.measure import median  # noqa: E402
from lab.store import ResultStore  # noqa: E402

QUICK_TECHS = ["bf16", "fp16", "fused_optim", "prefetch", "fast_kernels"]
FULL_TECHS = [*QUICK_TECHS, "workers2", "amp_auto", "compile", "int8_dynamic", "prune50", "prune_channels50"]


BUILTINS = ("ctr", "sequence", "vision", "transformer", "mlp")
RUNGS = ("xs", "m")
MAX_STEPS = 40  # per verification run (full mode): enough steady-state steps for a median step time


def cases(quick: bool) -> list[tuple[str, ...]]:
    gallery = list(register_gallery())
    if quick:
        return [(w, "tiny") for w in BUILTINS[:3]] + [(g, "tiny") for g in gallery[:2]]
    return [(w, "tiny", r) for w in BUILTINS for r in RUNGS] + [(g, "tiny") for g in gallery]


def run_case(workload: str, size: str, techs: list[str], store: ResultStore, rung: str | None = None,
             max_steps: int | None = None) -> dict:
    cfg = RunConfig(workload=workload, size=size, threads=1, latency_repeats=8, model_scale=rung,
                    max_steps=max_steps)
    t0 = time.perf_counter()
    d = diagnose(cfg, techniques=techs)
    rows = verify(d, len(d.predictions), repeats=3, store=store, record=False)
    acc = accuracy(rows)
    return {"workload": workload, "size": size, "model_scale": rung, "params": d.baseline.param_count,
            "macs_per_sample": d.baseline.macs_per_sample, "step_ms": d.train.step_ms,
            "shares": {k: round(v, 4) for k, v in d.train.shares().items() if v > 0},
            "top": d.top().technique if d.top() else None, "top1_hit": top1_hit(rows), "rows": rows,
            "skipped": d.skipped, "median_abs_error": acc["median_abs_error"], "wall_s": time.perf_counter() - t0}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny rung and two gallery models")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--cases", default="", help="workload:size,... instead of the default set")
    p.add_argument("--techniques", default="", help="comma-separated, instead of the default set")
    p.add_argument("--merge", metavar="PATH", help="pool with the cases of this earlier doctor JSON")
    p.add_argument("--rescore", metavar="PATH", help="measure nothing: recompute this doctor JSON's figures "
                                                    "(written back to --json when given)")
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.rescore:
        rescore(args.rescore, args.json)
        return
    techs = [t for t in args.techniques.split(",") if t] or (QUICK_TECHS if args.quick else FULL_TECHS)
    todo = [tuple(c.split(":", 2)) for c in args.cases.split(",") if c] or cases(args.quick)
    done = json.loads(Path(args.merge).read_text())["cases"] if args.merge else []
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "doctor.sqlite") as store:
        register_gallery()
        for workload, size, *rung in todo:
            c = run_case(workload, size, techs, store, rung=rung[0] if rung else None,
                         max_steps=None if args.quick else MAX_STEPS)
            done.append(c)
            where = f"{workload}/{size}" + (f"/{rung[0]}" if rung else "")
            print(f"{where} ({c['params']:,} params): top {c['top']} hit={c['top1_hit']} median |error| "
                  f"{c['median_abs_error'] if c['median_abs_error'] is None else round(100 * c['median_abs_error'])} % "
                  f"({c['wall_s']:.0f} s)")
            for r in c["rows"]:
                m = "n/a" if r["measured"] is None else f"{r['measured']:.2f}"
                print(f"    {r['technique']:<17} predicted {r['predicted']:.2f} measured {m}")
    emit("doctor", args, figures_of(done), cases=done,
         note="shared 2-core machine, busy with other work while measured")


def top_share(case: dict) -> float | None:
    """The top pick's measured training speedup over the best measured one: what following the doctor's
    first pick gets of the best technique it measured (1.0: the top pick was the best)."""
    on = [r for r in case["rows"] if r["axis"] == "train_step" and r["measured"] is not None]
    if not on:
        return None
    return on[0]["measured"] / max(r["measured"] for r in on)


def figures_of(done: list[dict]) -> list[dict]:
    """The benchmark's figures over its cases (also what ``--rescore`` recomputes from a stored JSON)."""
    rows = [r for c in done for r in c["rows"]]
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    hits = [c["top1_hit"] for c in done if c["top1_hit"] is not None]
    mae = median(errs) if errs else float("nan")
    hit_rate = sum(hits) / len(hits) if hits else float("nan")
    inside = accuracy(rows)["inside_interval"]
    shares = [s for c in done if (s := top_share(c)) is not None]
    share = sum(shares) / len(shares) if shares else float("nan")
    return [
        figure("median |predicted / measured - 1|", 100 * mae, unit="%", goal="<= 25 %", met=bool(mae <= 0.25),
               family="doctor", note=f"{len(errs)} (case, technique) pairs over {len(done)} cases"),
        figure("top-1 hit rate (measured best or within noise)", 100 * hit_rate, unit="%", goal=">= 70 %",
               met=bool(hit_rate >= 0.7), family="doctor", note=f"{sum(hits)} of {len(hits)} cases"),
        figure("measured inside the predicted interval", 100 * (inside or 0.0), unit="%", family="doctor"),
        figure("top pick's share of the best measured speedup (mean)", 100 * share, unit="%", family="doctor",
               note=f"worst case {100 * min(shares):.0f} %" if shares else ""),
    ]


def rescore(path: str, out: str | None) -> None:
    """Recompute the figures of a stored doctor JSON (its cases, env and time kept) and print them."""
    data = json.loads(Path(path).read_text())
    data["figures"] = figures_of(data["cases"])
    for f in data["figures"]:
        print(f"{f['name']:<56} {f['value']:>7.1f} {f['unit']}  {f['note']}")
    if out:
        Path(out).write_text(json.dumps(data, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
