"""One answer a person can act on: the recommendation card, built from the ablation's measurement and the
doctor's prediction by one rule, read by every face (``python -m lab recommend``, the dashboard's card above
its tabs, the Doctor tab), so no two of them name different winners.

The rule, in the order a reader should trust the evidence:

1. **A measurement beats a prediction.** An ablation of this workload at this size on this machine measured
   each arm side by side with an interval; an arm is recommended ("Use X") only when it passes the verdict's
   own bar (:func:`lab.ablation.verdicts.qualifying`: its interval's lower end above 1 *and* above the A/A arm's,
   its accuracy loss inside the budget), best lower end first. Nothing else may be called a winner.
2. **A table that cannot crown crowns nothing here either**: a preview (too few runs), a baseline that did not
   learn, a busy machine, an A/A interval that excludes 1. The card says which, in the verdict's words, and
   keeps only the predictions, labelled as such.
3. **A prediction is advice to measure, never a verdict**: an option the doctor prescribes (over the run, one-off
   costs charged, faster than the baseline with P >= 0.8 and a gain beyond the A/A noise:
   :func:`lab.doctor.risk.prescribe`; a prediction made before that rule: its interval's lower end above 1) and no
   trusted ablation measured is listed as "predicted, not measured yet"; one predicted to lose (upper end below 1)
   goes under "does not pay here" with its reason.
4. **Where both exist and disagree** (the measured interval and the predicted one do not overlap on the same
   axis), the card says so and trusts the measurement: it ran here, on this model, beside its baseline.

Which stored ablation is "the measurement" (:func:`choose_ablation`): the newest of this workload and size, measured
on this machine, that can give a verdict, a Doctor verification as much as a full ablation; a newer preview (a
verification with 1 repeat), busy or unstable one does not displace it, and the card names what it read and what it
passed over, and why.

Every card names what it holds at (the machine's hardware id, the workload, its size, the thread count), and
ends in code: the options of the pick, which :mod:`lab.portable` writes out as a plain-PyTorch file.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from lab.ablation.record import build_record
from lab.ablation.summary import AA_ARM
from lab.ablation.verdicts import noise_bar, qualifying, verdict
from lab.measure.stats import as_float

if TYPE_CHECKING:
    import pandas as pd

    from lab.doctor.diagnosis import Diagnosis
    from lab.doctor.stored import StoredDiagnosis
    from lab.store import ResultStore

MEASURED, PREDICTED = "measured", "predicted"
#: Metric names as a person reads them.
METRIC_WORDS = {"auc": "AUC", "accuracy": "accuracy", "top1": "top-1 accuracy"}
#: The speed columns a card can be read on, as a person says them.
AXIS_WORDS = {"train_speedup": "training (end to end)", "step_speedup": "training step",
              "infer_speedup": "inference"}
#: The doctor's axis that predicts each speed column.
PREDICTED_AXIS = {"train_speedup": "train_step", "step_speedup": "train_step", "infer_speedup": "inference"}
#: The measured column a prediction on each doctor axis is compared with.
MEASURED_COLUMN = {"train_step": "step_speedup", "inference": "infer_speedup"}


def interval_text(value: float, lo: float, hi: float) -> str:
    """``1.23x [1.10, 1.40]``; a zero-width interval is a single point, never printed as an interval."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or f"{lo:.2f}" == f"{hi:.2f}":
        return f"{value:.2f}x (one point: no interval)"
    return f"{value:.2f}x [{lo:.2f}, {hi:.2f}]"


def accuracy_text(row: Any) -> str:
    """The accuracy change with its direction, in the metric's own name: "AUC change -0.12 pt [-0.30, +0.05]
    (higher is better)". The table stores a *loss* (positive = worse); a person reads a change."""
    loss, lo, hi = as_float(row.get("acc_loss_pt")), as_float(row.get("acc_loss_lo")), as_float(row.get("acc_loss_hi"))
    if math.isnan(loss):
        return ""
    name = str(row.get("metric_name") or "accuracy")
    name = METRIC_WORDS.get(name, name)
    unit = row.get("loss_unit") or "pt"
    if unit == "pt":  # a higher-is-better fraction: the change is minus the loss
        change, clo, chi, direction = -loss, -hi, -lo, "higher is better"
    else:  # a lower-is-better metric keeps its own units; its loss is its change
        change, clo, chi, direction, unit = loss, lo, hi, "lower is better", ""
    unit = f" {unit}" if unit else ""
    if math.isnan(clo) or math.isnan(chi):
        band = ""
    elif _signed(clo) == _signed(chi):  # one seed's repeats agree exactly: no interval, never "[x, x]"
        band = " (one seed: no interval)"
    else:
        band = f" [{_signed(clo)}, {_signed(chi)}]"
    return f"{name} change {_signed(change)}{unit}{band} ({direction})"


def _signed(x: float) -> str:
    """``+0.12`` / ``-0.12``; a change that rounds to zero reads ``0.00``, never ``-0.00``."""
    text = f"{x:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text


@dataclass(frozen=True)
class Evidence:
    """One option (or stack) and what says it pays or not: a measured row or a predicted one."""

    name: str
    options: tuple[str, ...]
    source: str  # MEASURED | PREDICTED
    axis: str  # in words (:data:`AXIS_WORDS`)
    speedup: float
    lo: float
    hi: float
    accuracy: str = ""
    peak_memory_mb: float | None = None
    why: str = ""

    def figure(self) -> str:
        if math.isnan(self.speedup):
            return "no figure"
        said = "predicted " if self.source == PREDICTED else ""
        return f"{said}{interval_text(self.speedup, self.lo, self.hi)} {self.axis}"

    def sentence(self) -> str:
        parts = [self.figure()] if not math.isnan(self.speedup) else []
        if self.accuracy:
            parts.append(self.accuracy)
        if self.peak_memory_mb is not None and math.isfinite(self.peak_memory_mb):
            parts.append(f"peak memory {self.peak_memory_mb:,.0f} MB")
        text = f"{self.name}: " + ", ".join(parts) if parts else self.name
        if not self.why:
            return text
        return f"{text} ({self.why})" if parts else f"{text}: {self.why}"


@dataclass(frozen=True)
class Recommendation:
    """The card: what to use, what to try, what does not pay here, and what it holds at."""

    workload: str
    size: str
    hardware_id: str
    threads: int | None
    axis: str
    use: tuple[Evidence, ...] = ()
    to_try: tuple[Evidence, ...] = ()
    not_here: tuple[Evidence, ...] = ()
    notes: tuple[str, ...] = ()
    verdict: str = ""  # the ablation's verdict sentence, the one its tab prints
    crowns: bool = False  # a trusted ablation stood behind the card (a winner or a measured "nothing pays")
    busy: bool = False
    sources: tuple[str, ...] = field(default_factory=tuple)  # what the card was built from, in words
    read: str | None = None  # the key of the stored ablation the card read (:func:`choose_ablation`)

    @property
    def pick(self) -> Evidence | None:
        return self.use[0] if self.use else None

    @property
    def options(self) -> tuple[str, ...]:
        """The options the card's code applies: the pick's (empty: the plain loop, nothing pays)."""
        return self.pick.options if self.pick else ()

    def holds_at(self) -> str:
        threads = f", {self.threads} thread(s)" if self.threads else ""
        return f"holds at: {self.hardware_id}, workload {self.workload} at size {self.size}{threads}"

    def headline(self) -> str:
        if self.pick is not None:
            then = [e.name for e in self.use[1:3]]
            return f"Use {self.pick.sentence()}" + (f"; then {', '.join(then)}" if then else "") + "."
        if self.busy:
            return f"No recommendation: {self.verdict}."
        tried = f" Predicted to pay, not measured yet: {self.to_try[0].name}." if self.to_try else ""
        if self.crowns:
            return f"Keep the baseline: nothing measured here beats it beyond noise on {self.axis}.{tried}"
        if self.to_try:
            return (f"Try {self.to_try[0].sentence()}: not measured yet, so not a verdict; run the ablation "
                    "with it to confirm.")
        if self.verdict:
            return f"No recommendation yet: {self.verdict}."
        return (f"No recommendation yet for {self.workload} at size {self.size}: run the ablation (a measurement) "
                "or the doctor (a prediction).")

    def lines(self) -> list[str]:
        """The card as plain text (the CLI prints it; the dashboard draws the same lines)."""
        out = [self.headline()]
        out += [f"  also beats the baseline: {e.sentence()}" for e in self.use[3:]]
        in_headline = not self.use and not self.busy and not self.crowns and bool(self.to_try)
        out += [f"  predicted to pay (not measured yet): {e.sentence()}" for e in self.to_try[int(in_headline):]]
        if self.not_here:
            out.append("Does not pay here:")
            out += [f"  {e.sentence()}" for e in self.not_here]
        out += [f"Note: {n}" for n in self.notes]
        out.append(self.holds_at() + (f"; from {', '.join(self.sources)}" if self.sources else ""))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headline": self.headline(), "options": list(self.options)}


def _options_of(row: Any) -> tuple[str, ...]:
    techniques = str(row.get("techniques") or "")
    return tuple(t for t in techniques.split("+") if t) or (str(row["arm"]),)


def _measured(row: Any, speed: str, why: str = "") -> Evidence:
    return Evidence(name=str(row["arm"]), options=_options_of(row), source=MEASURED, axis=AXIS_WORDS[speed],
                    speedup=as_float(row[speed]), lo=as_float(row[f"{speed}_lo"]), hi=as_float(row[f"{speed}_hi"]),
                    accuracy=accuracy_text(row), peak_memory_mb=as_float(row.get("peak_memory_mb")), why=why)


def _predicted(p: Any, speed: str) -> Evidence:
    """A prediction as evidence: over the run (one-off costs charged, :mod:`lab.doctor.risk`) where the doctor
    priced it so, per step otherwise."""
    over = getattr(p, "run_speedup", None) is not None
    axis = AXIS_WORDS["infer_speedup" if p.axis == "inference" else "step_speedup"]
    return Evidence(name=p.technique, options=(p.technique,), source=PREDICTED,
                    axis=f"{axis}, over the run" if over else axis,
                    speedup=p.run_speedup if over else p.speedup, lo=p.run_lo if over else p.lo,
                    hi=p.run_hi if over else p.hi, why=p.reason)


def _pays(p: Any) -> bool:
    """The doctor's own rule where it ran (:func:`lab.doctor.risk.prescribe`: P(faster over the run) >= 0.8
    and a gain beyond the A/A noise); the interval's lower end above 1 for a prediction made before it."""
    prescribed = getattr(p, "prescribed", None)
    return bool(prescribed) if prescribed is not None else p.lo > 1.0


def _loses(p: Any) -> bool:
    hi = getattr(p, "run_hi", None)
    return (hi if hi is not None else p.hi) < 1.0


def _measured_part(table: pd.DataFrame, speed: str, budget_pt: float
                   ) -> tuple[list[Evidence], list[Evidence], list[str], dict[str, Any]]:
    """(use, does not pay, notes, the verdict) from one ablation table, by the verdict's own rule."""
    said = verdict(table, budget_pt, speed)
    if said.get("reason") not in ("winner", "none"):
        return [], [], [], said
    use = [_measured(r, speed) for _, r in qualifying(table, budget_pt, speed).iterrows()]
    winners = {e.name for e in use}
    record = build_record(table)  # each arm's "why" said once, as the Ablation tab says it (not once per run)
    bar = noise_bar(table, speed)
    not_here, within = [], []
    for _, r in table.iterrows():
        arm = str(r["arm"])
        if arm in ("baseline", AA_ARM) or arm in winners:
            continue
        if r["status"] == "error":
            not_here.append(Evidence(arm, _options_of(r), MEASURED, AXIS_WORDS[speed], math.nan, math.nan,
                                     math.nan, why=str(r.get("error") or "refused or failed: see its runs")))
            continue
        value, lo, hi = as_float(r[speed]), as_float(r[f"{speed}_lo"]), as_float(r[f"{speed}_hi"])
        if math.isnan(value):
            continue  # an axis this arm cannot change (post-training int8 on training time): not a candidate
        if hi < 1.0:
            tags = "; ".join(record.arms[arm].why) if arm in record.arms else ""
            not_here.append(_measured(r, speed, why=tags or "slower than the baseline beyond noise"))
        elif lo > bar:
            not_here.append(_measured(r, speed, why=f"faster, but its accuracy loss may exceed the {budget_pt:g} "
                                                   f"{r.get('loss_unit') or 'pt'} budget"))
        else:
            within.append(arm)
    notes = [f"within noise of the baseline (neither faster nor slower beyond the A/A arm's interval): "
             f"{', '.join(within)}"] if within else []
    return use, not_here, notes, said


def _disagreement(p: Any, row: Any) -> str | None:
    """A sentence when the prediction's interval and the measured one (same axis) do not overlap."""
    column = MEASURED_COLUMN.get(p.axis)
    if column is None:
        return None
    value, lo, hi = as_float(row.get(column)), as_float(row.get(f"{column}_lo")), as_float(row.get(f"{column}_hi"))
    if math.isnan(lo) or math.isnan(hi) or (lo <= p.hi and p.lo <= hi):
        return None
    return (f"{p.technique}: the doctor predicted {interval_text(p.speedup, p.lo, p.hi)} on the {AXIS_WORDS[column]}, "
            f"the ablation measured {interval_text(value, lo, hi)}; the card trusts the measurement (it ran here, on "
            "this model, beside its baseline)")


def recommend(table: pd.DataFrame | None = None, diagnosis: Diagnosis | StoredDiagnosis | None = None, *, workload: str,
              size: str, hardware_id: str | None = None, threads: int | None = None,
              speed: str = "train_speedup", budget_pt: float = 1.0) -> Recommendation:
    """The card for ``workload`` at ``size`` from an ablation ``table`` (:func:`lab.ablation.summarize`) and a
    doctor ``diagnosis`` of the same workload and size, either or both absent, by the module's rule. ``speed``
    is the table's column the card reads (training end to end by default); the doctor's predictions on the
    matching axis join it."""
    if speed not in AXIS_WORDS:
        raise ValueError(f"speed={speed!r} is invalid: allowed: {', '.join(AXIS_WORDS)}")
    if diagnosis is not None and (diagnosis.cfg.workload, diagnosis.cfg.size) != (workload, size):
        raise ValueError(f"the diagnosis is of {diagnosis.cfg.workload}/{diagnosis.cfg.size}, the card of "
                         f"{workload}/{size}: a card reads one workload at one size")
    use: list[Evidence] = []
    not_here: list[Evidence] = []
    notes: list[str] = []
    said: dict[str, Any] = {}
    sources: list[str] = []
    rows: dict[str, Any] = {}
    if table is not None and len(table):
        use, not_here, notes, said = _measured_part(table, speed, budget_pt)
        rows = {str(r["techniques"] or r["arm"]): r for _, r in table.iterrows() if r["status"] != "error"}
        first = table.iloc[0]
        hardware_id = hardware_id or first.get("hardware_id")
        threads = threads or (int(first["threads"]) if as_float(first.get("threads")) > 0 else None)
        sources.append(f"an ablation of {len(table) - 1 - int((table['arm'] == AA_ARM).any())} arm(s)")
    trusted = said.get("reason") in ("winner", "none")
    to_try: list[Evidence] = []
    if diagnosis is not None:
        hardware_id = hardware_id or diagnosis.hardware_id
        threads = threads or diagnosis.cfg.threads
        sources.append(f"the doctor's prediction ({diagnosis.rate_source})")
        measured_names = {e.name for e in (*use, *not_here)}
        for p in diagnosis.predictions:
            if p.axis != PREDICTED_AXIS[speed]:
                continue
            row = rows.get(p.technique)
            if trusted and row is not None:
                if (said_ := _disagreement(p, row)) is not None:
                    notes.append(said_)
                continue
            if p.technique in measured_names:
                continue
            if _pays(p):
                to_try.append(_predicted(p, speed))
            elif _loses(p):
                not_here.append(_predicted(p, speed))
        to_try.sort(key=lambda e: e.lo, reverse=True)
    if said.get("reason") == "busy":  # the headline says the warning; with predictions, what the card shows instead
        if diagnosis is not None:
            notes.insert(0, "the ablation's figures were taken on a busy machine: the card shows predictions only")
    elif said and not trusted and to_try:  # the headline advises a prediction: the verdict's reason is said here
        notes.insert(0, f"the ablation names no winner: {said['text']}")
    return Recommendation(workload=workload, size=size, hardware_id=hardware_id or "this machine", threads=threads,
                          axis=AXIS_WORDS[speed], use=tuple(use), to_try=tuple(to_try), not_here=tuple(not_here),
                          notes=tuple(notes), verdict=str(said.get("text") or ""), crowns=trusted,
                          busy=said.get("reason") == "busy", sources=tuple(sources))


def code_line(card: Recommendation, workload: str, size: str) -> str | None:
    """How to take the card's pick away as code: the ``lab recipe`` command that writes it, or why it cannot be
    written (a workload's own fast kernels are its model code, not a change to a training loop). None: no pick."""
    if not card.options:
        return None
    from lab.config import RunConfig
    from lab.portable import from_techniques

    try:
        from_techniques(card.options, RunConfig(workload=workload, size=size))
    except ValueError as exc:
        return f"no plain-PyTorch file for {' + '.join(card.options)}: {exc}"
    return (f"the code: python -m lab recipe --workload {workload} --size {size} --techniques "
            f"{','.join(card.options)} --out mine.py")


#: How many of a workload's newest finished ablations the card looks through for one that can give a verdict.
LOOK_BACK = 10
#: The name of the doctor's verification ablation (:func:`lab.doctor.verification.verify_predictions`).
VERIFICATION = "doctor"


def _age(t: float) -> str:
    minutes = max(0.0, time.time() - t) / 60
    return f"{minutes:.0f} min ago" if minutes < 120 else f"{minutes / 60:.0f} h ago"


@dataclass(frozen=True)
class StoredAblation:
    """A finished ablation of the card's workload and size as the card reads it: its key, its table (the one the
    Ablation tab draws: :func:`lab.ablation.summarize` of its stored runs), when it ended and its verdict."""

    key: str
    table: pd.DataFrame
    ended: float
    said: dict[str, Any]

    @property
    def verdict_given(self) -> bool:
        """Its verdict names a winner or a measured "nothing beats the baseline": it can stand behind a card."""
        return self.said.get("reason") in ("winner", "none")

    @property
    def hardware_id(self) -> str | None:
        return self.table.iloc[0].get("hardware_id") or None

    def describe(self) -> str:
        """It in one phrase: "the Doctor's verification doctor@ctr/tiny/t1#ab12cd34 (3 arms, 1 run(s) per arm, ..."."""
        what = "the Doctor's verification" if self.key.startswith(f"{VERIFICATION}@") else "the ablation"
        t = self.table  # every arm counted, the baseline and the A/A arm too, as the Ablation tab counts them
        ok = t.loc[t["status"] != "error", "n_ok"]
        n = int(ok.min()) if len(ok) else 0
        return f"{what} {self.key} ({len(t)} arms, {n} run(s) per arm, ended {_age(self.ended)})"


def stored_ablations(store: ResultStore, workload: str, size: str, *, speed: str = "train_speedup",
                     budget_pt: float = 1.0) -> Iterator[StoredAblation]:
    """The finished ablations of ``workload`` at ``size`` in ``store`` (the doctor's verifications among them),
    newest first, at most :data:`LOOK_BACK`, each with its table and its verdict on ``speed``; one without a stored
    baseline run is skipped (nothing to divide by)."""
    from lab.ablation import from_spec, load_ablation, summarize
    from lab.jobs import done_jobs

    for job in itertools.islice(done_jobs(store, workload, size), LOOK_BACK):
        ablation, repeats, seeds = from_spec(job["spec"])
        runs = load_ablation(ablation, store, repeats, seeds)
        if not runs.get("baseline"):
            continue
        table = summarize(runs, techniques=ablation.techniques, axes=ablation.axes)
        yield StoredAblation(job["key"], table, float(job["heartbeat"] or job["started"] or 0.0),
                             verdict(table, budget_pt, speed))


def choose_ablation(found: Iterable[StoredAblation], here: str) -> tuple[StoredAblation | None, list[str]]:
    """Which stored ablation the card reads, and what it says about the ones it passed over. The rule:

    - **the newest measured on this machine that can give a verdict** (a winner, or a measured "nothing beats the
      baseline": :func:`lab.ablation.verdicts.verdict`), a Doctor verification as much as a full ablation: a
      verification measures the prescription, and when it is the newest such measurement it speaks;
    - a newer one that cannot (a preview, n < 3 runs per arm, as a verification with 1 repeat is; a busy machine;
      an unstable A/A arm; a baseline that did not learn) does not displace it, and the card names it with its
      reason (a busy one's warning stays on the card);
    - when none can, the newest one here, whose reason the card then gives as its own;
    - one measured on another machine is not this machine's evidence: left out, and said.
    """
    passed: list[StoredAblation] = []
    elsewhere: StoredAblation | None = None
    for ab in found:
        if ab.hardware_id and ab.hardware_id != here:
            elsewhere = elsewhere or ab
            continue
        if ab.verdict_given:
            return ab, _passed_notes(passed, ab, elsewhere, here)
        passed.append(ab)
    read = passed[0] if passed else None
    return read, _passed_notes(passed[1:], read, elsewhere, here) if read else _passed_notes([], None, elsewhere, here)


def _passed_notes(passed: list[StoredAblation], read: StoredAblation | None, elsewhere: StoredAblation | None,
                  here: str) -> list[str]:
    notes = []
    if elsewhere is not None and (read is None or elsewhere.ended > read.ended):
        notes.append(f"{elsewhere.describe()} was measured on {elsewhere.hardware_id}, not on this machine ({here}): "
                     "left out; run it here")
    if read is not None and read.verdict_given:
        notes += [f"{ab.describe()} is newer but gives no verdict ({ab.said.get('text')}): the card reads "
                  f"{read.describe()}, the newest that does" for ab in passed]
    return notes


def card_from_store(store: ResultStore | None, workload: str, size: str,
                    diagnosis: Diagnosis | StoredDiagnosis | None = None, *,
                    speed: str = "train_speedup", budget_pt: float = 1.0, here: str | None = None) -> Recommendation:
    """The card every face shows: the stored ablation of ``workload`` at ``size`` that :func:`choose_ablation` picks
    (the newest that can give a verdict) and the doctor's ``diagnosis`` (if any), combined by :func:`recommend`; the
    card names the ablation it read (its sources) and any newer one it passed over (its notes). Without a
    ``diagnosis``, the newest one stored for this workload and size on this machine (:mod:`lab.doctor.stored`) is
    read. ``store`` None: nothing stored; ``here``: this machine's hardware id (default:
    :func:`lab.measure.environment_stamp`'s)."""
    from lab.doctor.stored import last_diagnosis
    from lab.measure import environment_stamp

    here = here or environment_stamp()["hardware_id"]
    read, passed = (choose_ablation(stored_ablations(store, workload, size, speed=speed, budget_pt=budget_pt), here)
                    if store is not None else (None, []))
    stored_note = None
    if diagnosis is None and store is not None:  # the doctor's last word on this model here, if it spoke
        diagnosis = last_diagnosis(store, workload, size, here)
        if diagnosis is not None:
            stored_note = f"the doctor's prediction is the stored one from {diagnosis.age_text()}"
    card = recommend(read.table if read else None, diagnosis, workload=workload, size=size, hardware_id=here,
                     speed=speed, budget_pt=budget_pt)
    notes = (*passed, *((stored_note,) if stored_note else ()), *card.notes)
    sources = tuple(read.describe() if read and s.startswith("an ablation") else s for s in card.sources)
    return replace(card, notes=notes, sources=sources, read=read.key if read else None)


__all__ = ["LOOK_BACK", "MEASURED", "PREDICTED", "VERIFICATION", "Evidence", "Recommendation", "StoredAblation",
           "accuracy_text", "card_from_store", "choose_ablation", "code_line", "interval_text", "recommend",
           "stored_ablations"]
