"""How right is the doctor? Predicted vs measured speedup over many models, scored per set of cases.

    python benchmarks/doctor.py [--quick] [--json PATH] [--sets builtin,gallery,hf] [--cases ctr:small,...]
                                [--techniques a,b] [--merge PATH] [--rescore PATH [--recalibrate]]
                                [--cross A.json,B.json] [--rules all|A.json,B.json [--quiet-only]]

The sets, each scored apart (never one pooled number alone, :func:`lab.doctor.scorecard`):

- ``builtin``: every built-in workload at two rungs of its ladder (``--model-scale`` xs and m on the
  ``tiny`` data, each run capped at ``MAX_STEPS`` steps): the cases the doctor's priors and rules were tuned
  on, so **in-sample**;
- ``gallery``: the user-model gallery (``tests/gallery.py``), models built from blocks the built-ins lack;
- ``hf``: the Hugging Face ecosystem gallery (``lab.workloads.hf``: BERT, DistilBERT, GPT-2, ViT, ResNet
  built from configs), skipped with its reason when ``transformers`` or that module is missing;
- ``unseen``: models added after the doctor's compile priors and fused-optimizer share were read off the
  gallery and HF residuals (``tests/gallery_unseen.py``: an unrolled ``LSTMCell``, a 1-D CNN, a dense
  mixture of experts, wide & deep over ``EmbeddingBag``). For those two rules gallery and HF are a re-test;
  this set is the held-out test, and no rule may be fitted on it.
- ``pasted``: models as people paste them (``tests/gallery_pasted.py``, issue 45's patterns), written before the
  risk-aware prescription and the small-attention compile rule, scored before and after them.
- ``fresh``: models as people paste them, a second time (``tests/gallery_fresh.py``: a char-RNN GRU, a keyword
  spotter, a CIFAR ResNet, a padded ``nn.TransformerEncoder`` classifier, a tabular MLP, a two-tower recommender,
  a timm-style ViT), written after the risk-aware rule and the small-attention compile rule; held out for every
  rule change after it.
- ``third``: models as people paste them, a third time (``tests/gallery_third.py``: an MLP-Mixer, a two-layer GCN
  over a dense adjacency buffer, a variational classifier, a weight-normed TCN, a GRU with Bahdanau attention, a
  DLRM-style click model, a MobileNetV2 / V3-style net), written before the run-level scoring and the
  fused-optimizer / small-model rules; held out for every rule change after them.
- ``fourth``: models as people paste them, a fourth time (``tests/gallery_fourth.py``: a llama2.c-style decoder, Kim's
  CNN text classifier, PointNet with a T-Net, a U-Net body, DeepFM, a DenseNet-BC, a Perceiver-style latent
  classifier), written before the quiet-residual calibration; held out for it and every rule change after it.
- ``fifth``: models as people paste them, a fifth time (``tests/gallery_fifth.py``: a WaveNet-style gated dilated
  stack, a ConvNeXt, a pyGAT graph attention network, a capsule network with dynamic routing, GoogLeNet Inception
  modules, a ConvLSTM, an FNet), written after the fourth set's scoring and before any further rule change; held out
  for every rule change after it.

For each case the doctor profiles a baseline and predicts every technique in the list
(:func:`lab.doctor.diagnose`); its intervals are calibrated on the residuals of the *other* cases of this
machine's committed ``doctor.json`` (:mod:`lab.doctor.calibration`, the case itself left out: held out);
then one interleaved ablation measures all of them (:func:`lab.doctor.verify`, 3 repeats per arm, an A/A
arm). Per set: top-1 (the first training pick is the measured best or within its noise, over the run it
was prescribed for: each arm's measured one-off charged, Inductor's cache empty at the start so compile pays a
first run's compile; per step beside it; goal >= 75 % on held-out sets), mean / worst regret
(``1 - measured(top) / best measured``; goals <= 5 % / <= 20 %), Spearman
between predicted and measured, the median |speedup error| (goal <= 15 %), coverage of the nominal 90 %
intervals (goal >= 80 %) and the zero-width intervals (goal 0); per technique the median and max error on the
speedup and on the step time. Each case's rows go into the JSON (``cases``) and the per-set cards into
``scorecards``, so where the doctor is wrong can be read off.

``--quick``: three built-ins at ``tiny`` and two models of each held-out set, training-step techniques without
compile, loader workers and auto (their runs are the slowest). A case is ``workload:size`` or
``workload:size:rung``. ``--cases`` / ``--techniques`` pick a subset; ``--merge PATH`` pools the cases of an
earlier JSON with these; ``--rescore PATH`` measures nothing and recomputes a stored JSON's figures, and with
``--recalibrate`` first widens each stored interval as :mod:`lab.doctor.calibration` would have, from the
other cases of that JSON (a run made before calibration existed: its held-out coverage), and with ``--rule
NAME`` first re-prescribes every case under that rule (:data:`lab.doctor.risk.RULES`; ``current``: the code's).
``--rules`` measures nothing and scores each prescription rule (:data:`lab.doctor.risk.RULES`) on every stored
JSON (``all``: ``results/*/doctor.json`` and ``results/*/heldout/*.json``), one table row per file, set and rule
(:func:`lab.doctor.risk.represcribe_rows`: a rule change scored on stored predictions and measurements);
with ``--recalibrate`` each stored model interval is first re-banded by today's committed calibration of its
machine class, the case left out (what the doctor would print today; note that calibration holds the other
cases of the same files, so it has seen them).
A busy shared 2-core machine: measured speedups carry its noise, and so do the errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gallery import register_gallery  # noqa: E402
from gallery_fifth import register_fifth  # noqa: E402
from gallery_fourth import register_fourth  # noqa: E402
from gallery_fresh import register_fresh  # noqa: E402
from gallery_pasted import register_pasted  # noqa: E402
from gallery_third import register_third  # noqa: E402
from gallery_unseen import register_unseen  # noqa: E402

from lab import RunConfig  # noqa: E402
from lab.doctor import (  # noqa: E402
    Calibration,
    Prediction,
    case_key,
    diagnose,
    format_scorecard,
    load_calibration,
    over_the_run,
    quiet,
    scorecard,
    top1_hit,
    verify,
)
from lab.doctor.risk import RULE, RULES, Rule, represcribe_rows  # noqa: E402
from lab.measure import environment_stamp  # noqa: E402
from lab.measure.contention import ContentionMeter  # noqa: E402
from lab.store import ResultStore  # noqa: E402

QUICK_TECHS = ["bf16", "fp16", "fused_optim", "prefetch", "fast_kernels"]
FULL_TECHS = [*QUICK_TECHS, "workers2", "amp_auto", "compile", "int8_dynamic", "prune50", "prune_channels50"]


BUILTINS = ("ctr", "sequence", "vision", "transformer", "mlp")
RUNGS = ("xs", "m")
MAX_STEPS = 40  # per verification run (full mode): enough steady-state steps for a median step time
HF_MODELS = ("BERT", "DISTILBERT", "GPT2", "VIT", "RESNET")  # lab.workloads.hf's gallery, loaded by spec
SETS = {"builtin": "built-in ladders (in-sample)", "gallery": "user-model gallery (held out)",
        "hf": "Hugging Face gallery (held out)",
        "unseen": "models no doctor rule was fitted on (held out)",
        "pasted": "models as people paste them, built before issue 45's rules (held out)",
        "fresh": "models as people paste them, built after the risk-aware and small-attention rules (held out for "
                 "every rule change after them)",
        "third": "models as people paste them, a third time, built before the run-level scoring and the "
                 "fused-optimizer / small-model rules (held out for every rule change after them)",
        "fourth": "models as people paste them, a fourth time, built before the quiet-residual calibration (held out "
                  "for it)",
        "fifth": "models as people paste them, a fifth time, built after the fourth set's scoring, before any "
                 "further rule change (held out for it)"}
#: The goals of issue 28 on a held-out set: name -> (scorecard key, test).
GOALS = {"top-1 >= 75 %": ("top1", lambda v: v >= 0.75), "mean regret <= 5 %": ("regret_mean", lambda v: v <= 0.05),
         "worst regret <= 20 %": ("regret_worst", lambda v: v <= 0.2),
         "median |speedup error| <= 15 %": ("median_abs_error", lambda v: v <= 0.15),
         "coverage >= 80 % (nominal 90 %)": ("coverage", lambda v: v >= 0.8),
         "no zero-width interval": ("zero_width", lambda v: v == 0)}


#: The held-out sets of models registered from tests/, by the prefix their workloads' names carry and the function
#: that registers them (their names, in order); a set's quick run takes its first two.
PREFIXED = {"gallery": register_gallery, "unseen": register_unseen, "pasted": register_pasted, "fresh": register_fresh,
            "third": register_third, "fourth": register_fourth, "fifth": register_fifth}


def case_set(workload: str) -> str:
    """Which set a case belongs to, by its workload's name (or spec)."""
    for name in PREFIXED:
        if workload.startswith(f"{name}_"):
            return name
    if workload.startswith("hf_") or "workloads.hf:" in workload:
        return "hf"
    return "builtin"


def hf_available() -> str | None:
    """Why the Hugging Face set cannot run here (``None``: it can)."""
    try:
        import transformers  # noqa: F401

        from lab.workloads import hf  # noqa: F401
    except ImportError as exc:
        return f"skipped: {exc} (the [hf] extra and lab.workloads.hf are needed)"
    return None


def cases(quick: bool, sets: list[str]) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """The cases of ``sets`` and, per set left out, why."""
    out: list[tuple[str, ...]] = []
    why: dict[str, str] = {}
    for s in sets:  # in the order asked
        if s == "builtin":
            out += ([(w, "tiny") for w in BUILTINS[:3]] if quick else [(w, "tiny", r) for w in BUILTINS for r in RUNGS])
        elif s in PREFIXED:
            names = list(PREFIXED[s]())
            out += [(u, "tiny") for u in (names[:2] if quick else names)]
        elif (reason := hf_available()) is None:
            out += [(f"lab.workloads.hf:{m}", "tiny") for m in (HF_MODELS[:2] if quick else HF_MODELS)]
        else:
            why["hf"] = reason
    return out, why


def parse_case(text: str) -> tuple[str, ...]:
    """``workload:size[:rung]``; a spec workload (``lab.workloads.hf:BERT``, ``mine.py:make``) keeps its colon."""
    parts = text.split(":")
    if len(parts) > 1 and (parts[0].startswith("lab.") or parts[0].endswith(".py")):
        parts = [f"{parts[0]}:{parts[1]}", *parts[2:]]
    return tuple(parts) if len(parts) > 1 else (parts[0], "tiny")


def run_case(workload: str, size: str, techs: list[str], store: ResultStore, rung: str | None = None,
             max_steps: int | None = None, calibration: Calibration | None = None,
             measure: tuple[str, ...] = ()) -> dict:
    cfg = RunConfig(workload=workload, size=size, threads=1, latency_repeats=8, model_scale=rung,
                    max_steps=max_steps)
    t0 = time.perf_counter()
    meter = ContentionMeter().start()  # how busy the machine was over the case (issue 45: scores taken busy say so)
    key = case_key({"workload": workload, "size": size, "model_scale": rung})
    d = diagnose(cfg, techniques=techs, calibration=calibration.without(key) if calibration else None,
                 measure=measure)
    rows = verify(d, len(d.predictions), repeats=3, store=store, record=False)
    for r in rows:  # what the rule decided on, so a rule change is scored offline (--rescore --rules)
        r.update(run_steps=d.run.steps if d.run else None, run_step_ms=d.run.step_ms if d.run else None,
                 noise=d.noise)
    card = scorecard([{"rows": rows}])
    busy = meter.stop()
    return {"workload": workload, "size": size, "model_scale": rung, "set": case_set(workload),
            "params": d.baseline.param_count, "macs_per_sample": d.baseline.macs_per_sample,
            "step_ms": d.train.step_ms, "shares": {k: round(v, 4) for k, v in d.train.shares().items() if v > 0},
            "rate_source": d.rate_source, "top": d.top().technique if d.top() else None,
            "top1_hit": top1_hit(over_the_run(rows)), "rows": rows, "skipped": d.skipped,
            "median_abs_error": card["median_abs_error"], "wall_s": time.perf_counter() - t0,
            "contention": busy.to_dict() if busy else None}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny rung and two models of each held-out set")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated subset of: {', '.join(SETS)}")
    p.add_argument("--cases", default="", help="workload:size,... instead of the default set")
    p.add_argument("--techniques", default="", help="comma-separated, instead of the default set")
    p.add_argument("--measure", default="", help="what the doctor times on each model itself, as `lab doctor "
                   "--measure` does (compile; default none: the map / chain / prior)")
    p.add_argument("--merge", metavar="PATH", help="pool with the cases of this earlier doctor JSON")
    p.add_argument("--rescore", metavar="PATH", help="measure nothing: recompute this doctor JSON's figures "
                                                    "(written back to --json when given)")
    p.add_argument("--cross", metavar="A.json,B.json", help="measure nothing: score each JSON's prescription (its "
                   "rows' order and prescribed flags) on each JSON's measurements, case by case (two rules on the same "
                   "measurements: what changed the scores, the rule or the noise)")
    p.add_argument("--rule", choices=["current", *RULES], help="with --rescore: re-prescribe each case under this "
                   "rule first (from its stored predictions)")
    p.add_argument("--rules", metavar="all|A.json,B.json", help="measure nothing: score every prescription rule on "
                   "these stored JSONs (all: every committed doctor JSON), one markdown row per file, set and rule")
    p.add_argument("--recalibrate", action="store_true", help="with --rescore: widen each stored interval by the "
                                                              "other cases' residuals first (leave one case out); "
                                                              "with --rules: re-band each stored model interval "
                                                              "with this machine class's committed calibration, "
                                                              "the case left out")
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.cross:
        cross_score(*args.cross.split(","))
        return
    if args.rules:
        rules_table(args.rules, recalibrate=args.recalibrate)
        return
    if args.rescore:
        rescore(args.rescore, args.json, recalibrate=args.recalibrate, rule=args.rule)
        return
    sets = [x for x in args.sets.split(",") if x]
    unknown = [x for x in sets if x not in SETS]
    if unknown:
        raise SystemExit(f"--sets {','.join(unknown)} is invalid: allowed: {', '.join(SETS)}")
    techs = [t for t in args.techniques.split(",") if t] or (QUICK_TECHS if args.quick else FULL_TECHS)
    todo, left_out = cases(args.quick, sets)
    if args.cases:
        todo = [parse_case(c) for c in args.cases.split(",") if c]
    done = json.loads(Path(args.merge).read_text())["cases"] if args.merge else []
    cal = load_calibration(environment_stamp()["hardware_id"])
    print(f"intervals calibrated on {cal.source} (each case left out of its own band)")
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "doctor.sqlite") as store:
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # compile's measured one-off is a first run's, cold
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
            print("Inductor's cache starts empty (TORCHINDUCTOR_CACHE_DIR unset): compile pays a first run's compile")
        for register in PREFIXED.values():  # --cases may name any set's workload
            register()
        for workload, size, *rung in todo:
            c = run_case(workload, size, techs, store, rung=rung[0] if rung else None,
                         max_steps=None if args.quick else MAX_STEPS, calibration=cal,
                         measure=tuple(m for m in args.measure.split(",") if m))
            done.append(c)
            if args.json:  # every finished case kept, so a long run stopped early can still be rescored
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json + ".partial").write_text(json.dumps({"cases": done}, indent=2, default=str))
            where = f"{workload}/{size}" + (f"/{rung[0]}" if rung else "")
            err = c["median_abs_error"]
            load = c["contention"] or {}
            print(f"{where} [{c['set']}] ({c['params']:,} params): top {c['top']} hit={c['top1_hit']} median "
                  f"|error| {'n/a' if err is None else round(100 * err)} % ({c['wall_s']:.0f} s; other processes "
                  f"{load.get('others_cores', float('nan')):.2f} cores, load {load.get('load1', float('nan')):.1f})")
            for r in c["rows"]:
                m = "n/a" if r["measured"] is None else f"{r['measured']:.2f}"
                print(f"    {r['technique']:<17} predicted {r['predicted']:.2f} [{r['predicted_lo']:.2f}, "
                      f"{r['predicted_hi']:.2f}] measured {m}")
    figures, cards = figures_of(done, left_out)
    print_cards(cards)
    emit("doctor", args, figures, cases=done, scorecards=cards, sets_left_out=left_out, calibration=cal.source,
         note="measured speedups carry the machine's noise: the A/A rows give it, load_average how busy it was")
    if args.json:  # the finished JSON replaces the per-case checkpoint
        Path(args.json + ".partial").unlink(missing_ok=True)


def set_cards(done: list[dict]) -> dict[str, dict]:
    """One :func:`lab.doctor.scorecard` per set present (in :data:`SETS` order)."""
    by: dict[str, list[dict]] = {}
    for c in done:
        by.setdefault(c.get("set") or case_set(c["workload"]), []).append(c)
    return {s: scorecard(by[s]) for s in SETS if s in by}


def figures_of(done: list[dict], left_out: dict[str, str] | None = None) -> tuple[list[dict], dict[str, dict]]:
    """The benchmark's figures, per set (also what ``--rescore`` recomputes from a stored JSON)."""
    cards = set_cards(done)
    out = []
    for s, card in cards.items():
        held = s != "builtin"

        def pct(key: str, c: dict = card) -> float:
            v = c[key]
            return float("nan") if v is None else 100 * v

        def goal(name: str, c: dict = card, held: bool = held) -> tuple[str | None, bool | None]:
            key, test = GOALS[name]
            return (name, None if c[key] is None else bool(test(c[key]))) if held else (None, None)

        tag = f"[{s}] "
        out += [
            figure(tag + "top-1 hit rate (measured best or within noise)", pct("top1"), unit="%",
                   goal=goal("top-1 >= 75 %")[0], met=goal("top-1 >= 75 %")[1], family="doctor",
                   note=f"{card['top1_hits']} of {card['top1_n']} cases; {SETS[s]}"),
            figure(tag + "mean regret (1 - top pick / best measured)", pct("regret_mean"), unit="%",
                   goal=goal("mean regret <= 5 %")[0], met=goal("mean regret <= 5 %")[1], family="doctor"),
            figure(tag + "worst regret", pct("regret_worst"), unit="%", goal=goal("worst regret <= 20 %")[0],
                   met=goal("worst regret <= 20 %")[1], family="doctor"),
            figure(tag + "median |predicted / measured - 1|", pct("median_abs_error"), unit="%",
                   goal=goal("median |speedup error| <= 15 %")[0], met=goal("median |speedup error| <= 15 %")[1],
                   family="doctor", note=f"{card['pairs']} pairs over {card['cases']} cases; max "
                                         f"{pct('max_abs_error'):.0f} %"),
            figure(tag + "measured inside the predicted 90 % interval", pct("coverage"), unit="%",
                   goal=goal("coverage >= 80 % (nominal 90 %)")[0], met=goal("coverage >= 80 % (nominal 90 %)")[1],
                   family="doctor", note=f"zero-width intervals: {card['zero_width']}"),
            figure(tag + "... inside it once floored at the check's own A/A deviation", pct("coverage_at_aa"),
                   unit="%", family="doctor"),
            figure(tag + "A/A arm |A/A - 1|, worst case (the noise floor)",
                   float("nan") if card["aa_noise"]["max"] is None else 100 * card["aa_noise"]["max"], unit="%",
                   family="doctor", note="median " + ("n/a" if card["aa_noise"]["median"] is None
                                                      else f"{100 * card['aa_noise']['median']:.0f} %")),
            figure(tag + "Spearman(predicted, measured), mean over cases",
                   float("nan") if card["spearman_mean"] is None else card["spearman_mean"], unit="",
                   family="doctor"),
        ]
    for s, why in (left_out or {}).items():
        out.append(figure(f"[{s}] top-1 hit rate (measured best or within noise)", float("nan"), unit="%",
                          family="doctor", note=why))
    return out, cards


def print_cards(cards: dict[str, dict]) -> None:
    for s, card in cards.items():
        print(format_scorecard(card, f"{s}: {SETS[s]}"))


def recalibrated_cases(data_cases: list[dict]) -> list[dict]:
    """Each stored row's interval widened as :mod:`lab.doctor.calibration` would have widened it at prediction
    time, from the residuals of the *other* cases of the same JSON (the model's own interval kept as
    ``model_lo`` / ``model_hi``)."""
    import math

    cal = Calibration.from_cases(data_cases, "the other cases of this JSON")
    out = []
    for c in data_cases:
        mine = cal.without(case_key(c))
        rows = []
        for r in c["rows"]:
            lo, hi = r.get("model_lo") or r["predicted_lo"], r.get("model_hi") or r["predicted_hi"]
            q, _ = mine.band(r["technique"], r["axis"])
            w = max(q, mine.noise_floor())
            s = r["predicted"]
            rows.append({**r, "model_lo": lo, "model_hi": hi, "predicted_lo": min(lo, s * math.exp(-w)),
                         "predicted_hi": max(hi, s * math.exp(w))})
        out.append({**c, "rows": rows})
    return out


def cross_score(*paths: str) -> None:
    """Print the scorecard headline of every (prescription of JSON i, measurements of JSON j) over the cases both
    hold: the rows in JSON i's order with its ``prescribed`` flags (none before prescriptions existed: the first row
    is the pick), their measured speedups, intervals and A/A read from JSON j by technique."""
    data = {p: {case_key(c): c for c in json.loads(Path(p).read_text())["cases"]} for p in paths}
    keys = [k for k in data[paths[0]] if all(k in d for d in data.values())]
    cols = ("measured", "measured_lo", "measured_hi", "aa_measured")
    for rule in paths:
        for meas in paths:
            cases = []
            for k in keys:
                got = {r["technique"]: r for r in data[meas][k]["rows"]}
                cases.append({"rows": [{**r, **{c: got.get(r["technique"], {}).get(c) for c in cols}}
                                       for r in data[rule][k]["rows"] if r["technique"] in got]})
            s = scorecard(cases)
            print(f"prescription of {rule} on the measurements of {meas}: top-1 {s['top1_hits']}/{s['top1_n']}, regret "
                  f"mean {100 * s['regret_mean']:.0f} % / worst {100 * s['regret_worst']:.0f} %, pick slower than the "
                  f"baseline {s['slower']}/{s['top1_n']} ({s['slower_beyond_noise']} beyond the A/A noise), nothing "
                  f"prescribed {s['nothing_prescribed']}")


def represcribed(data: dict, rule: Rule, *, recalibrate: bool = False) -> list[dict]:
    """The stored cases of a doctor JSON with each case's rows re-prescribed under ``rule``
    (:func:`lab.doctor.risk.represcribe_rows`); rows that stored no A/A noise take this machine class's committed
    calibration's (:meth:`lab.doctor.Calibration.noise_floor`), the floor their intervals were made with.
    ``recalibrate``: first re-band each row's model interval (``model_lo`` / ``model_hi``) with that committed
    calibration, the case itself left out (what a prediction made today would print; the stored run figures are
    dropped and recomputed, compile charged its prior)."""
    hw = (data.get("env") or {}).get("hardware_id", "")
    cal = load_calibration(hw) if hw else Calibration()
    noise = cal.noise_floor()
    out = []
    for c in data["cases"]:
        rows = [{**r, "noise": r.get("noise", noise)} for r in c["rows"]]
        if recalibrate:
            mine = cal.without(case_key(c))
            rows = [_rebanded(r, mine) for r in rows]
        out.append({**c, "rows": represcribe_rows(rows, rule=rule, steps=MAX_STEPS)})
    return out


def _rebanded(r: dict, cal: Calibration) -> dict:
    """A stored row's interval as ``cal`` bands it today (:meth:`lab.doctor.Calibration.apply`), its run figures
    dropped (they were computed from the old interval)."""
    if r.get("model_lo") is None or r.get("model_hi") is None:
        return r
    p = cal.apply(Prediction(r["technique"], r.get("axis", "train_step"), r["predicted"], r["model_lo"],
                             r["model_hi"], ""))
    return {**r, "predicted_lo": p.lo, "predicted_hi": p.hi, "noise": cal.noise_floor(), "run_speedup": None,
            "run_lo": None, "run_hi": None}


def rules_table(which: str, *, recalibrate: bool = False) -> None:
    """Print one markdown row per (file, set, rule): top-1, regret, pick slower than the baseline (beyond the
    A/A), nothing prescribed; ``stored`` is the prescription the file holds (its first row when it predates
    prescriptions), each rule in :data:`lab.doctor.risk.RULES` re-prescribes from the stored predictions."""
    root = Path(__file__).resolve().parent / "results"
    paths = (sorted([*root.glob("*/doctor.json"), *root.glob("*/heldout/*.json")]) if which == "all"
             else [Path(p) for p in which.split(",") if p])
    print("| file | set | rule | top-1 | regret mean / worst | slower than baseline (beyond A/A) | nothing prescribed |"
          " quiet cases: slower beyond A/A |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        data = json.loads(path.read_text())
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        variants = {"stored": data["cases"],
                    **{k: represcribed(data, r, recalibrate=recalibrate) for k, r in RULES.items()}}
        for s in SETS:
            for rule, cs in variants.items():
                mine = [c for c in cs if (c.get("set") or case_set(c["workload"])) == s]
                if not mine:
                    continue
                card = scorecard(mine)
                q = scorecard([c for c in mine if quiet(c)]) if any(quiet(c) for c in mine) else None
                print(f"| {name} | {s} | {rule} | {card['top1_hits']}/{card['top1_n']} | "
                      f"{100 * (card['regret_mean'] or 0):.0f} % / {100 * (card['regret_worst'] or 0):.0f} % | "
                      f"{card['slower']} ({card['slower_beyond_noise']}) | {card['nothing_prescribed']} | "
                      + (f"{q['slower_beyond_noise']}/{q['top1_n']} |" if q else "n/a |"))


def rescore(path: str, out: str | None, *, recalibrate: bool = False, rule: str | None = None) -> None:
    """Recompute the figures of a stored doctor JSON (its cases, env and time kept) and print them; ``rule``:
    re-prescribe each case under that rule first (``current``: :data:`lab.doctor.risk.RULE`)."""
    data = json.loads(Path(path).read_text())
    if recalibrate:
        data["cases"] = recalibrated_cases(data["cases"])
        data["calibration"] = "recalibrated on rescore: each case banded by the other cases of this JSON"
    if rule:
        data["cases"] = represcribed(data, RULE if rule == "current" else RULES[rule])
        data["rule"] = rule
    data["figures"], data["scorecards"] = figures_of(data["cases"], data.get("sets_left_out"))
    for f in data["figures"]:
        print(f"{f['name']:<64} {f['value']:>7.1f} {f['unit']}  {f['note']}")
    print_cards(data["scorecards"])
    if out:
        Path(out).write_text(json.dumps(data, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
