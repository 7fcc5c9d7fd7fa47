"""The recommendation card: one rule over the ablation's measurement and the doctor's prediction
(lab.doctor.recommendation). Planted tables (the columns lab.ablation.summarize writes) and planted predictions,
so each rule is checked on the case it exists for: noise never wins, a busy machine crowns nothing, a
measurement beats a prediction that disagrees with it, a prediction is never called a verdict."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planted import planted_ablation

from lab.ablation.summary import COLUMNS
from lab.ablation.verdicts import verdict
from lab.doctor.amdahl import Prediction
from lab.doctor.recommendation import accuracy_text, interval_text, recommend

HW = "test-cpu-avx2-2c"


def _row(arm: str, speed: tuple[float, float, float] | None, *, step: tuple[float, float, float] | None = None,
         loss: tuple[float, float, float] = (0.0, -0.2, 0.2), status: str = "ok", busy: int = 0,
         techniques: str | None = None, why: str = "", error: str | None = None) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(arm=arm, techniques=techniques if techniques is not None else ("" if arm in ("baseline", "aa") else arm),
               status=status, n_ok=3 if status != "error" else 0, n_runs=3, metric_name="auc", loss_unit="pt",
               baseline_learned=True, busy_runs=busy, others_cores=1.5 if busy else 0.0, why=why, error=error,
               hardware_id=HW, threads=1, peak_memory_mb=400.0)
    if speed is not None:
        row.update(train_speedup=speed[0], train_speedup_lo=speed[1], train_speedup_hi=speed[2])
        step = step or speed
        row.update(step_speedup=step[0], step_speedup_lo=step[1], step_speedup_hi=step[2])
    row.update(acc_loss_pt=loss[0], acc_loss_lo=loss[1], acc_loss_hi=loss[2])
    return row


def _table(*rows: dict) -> pd.DataFrame:
    base = _row("baseline", (1.0, 1.0, 1.0), loss=(0.0, 0.0, 0.0))
    return pd.DataFrame([base, *rows], columns=COLUMNS)


def _diagnosis(*predictions: Prediction, workload: str = "ctr", size: str = "tiny") -> SimpleNamespace:
    return SimpleNamespace(cfg=SimpleNamespace(workload=workload, size=size, threads=1), predictions=list(predictions),
                           rate_source="planted rates", hardware_id=HW)


def _p(name: str, value: float, lo: float, hi: float, axis: str = "train_step") -> Prediction:
    return Prediction(technique=name, axis=axis, speedup=value, lo=lo, hi=hi, reason=f"planted reason for {name}")


def test_a_measured_winner_leads_the_card_the_verdicts_winner_and_the_rest_are_sorted_out() -> None:
    table = _table(_row("aa", (1.0, 0.95, 1.05)), _row("bf16", (1.6, 1.4, 1.8)), _row("workers2", (1.2, 1.1, 1.3)),
                   _row("prune50", (0.7, 0.6, 0.8), why="masks do not skip work on dense kernels"),
                   _row("fast_kernels", (1.02, 0.97, 1.08)), _row("int8_eager", None, status="error",
                                                                  error="refused: no int8 engine"))
    card = recommend(table, workload="ctr", size="tiny")
    assert card.pick is not None and card.pick.name == verdict(table)["winner"] == "bf16"
    assert [e.name for e in card.use] == ["bf16", "workers2"]  # best lower end first
    assert card.headline().startswith("Use bf16: 1.60x [1.40, 1.80] training (end to end)")
    assert "then workers2" in card.headline()
    assert "AUC change 0.00 pt [-0.20, +0.20]" in card.headline() and "peak memory 400 MB" in card.headline()
    slow = {e.name: e for e in card.not_here}
    assert set(slow) == {"prune50", "int8_eager"}
    assert "dense kernels" in slow["prune50"].why and "no int8 engine" in slow["int8_eager"].why
    assert any("fast_kernels" in n and "within noise" in n for n in card.notes)
    assert card.options == ("bf16",)
    text = "\n".join(card.lines())
    assert f"holds at: {HW}, workload ctr at size tiny, 1 thread(s)" in text


def test_noise_never_wins_a_drifting_baseline_and_a_noisy_aa_crown_nothing() -> None:
    """The arm's interval clears 1 but not the A/A arm's upper end: the baseline run again reached as far."""
    table = _table(_row("aa", (1.3, 0.9, 1.6)), _row("bf16", (1.5, 1.2, 1.9)))
    card = recommend(table, workload="ctr", size="tiny")
    assert card.pick is None and card.crowns
    assert card.headline().startswith("Keep the baseline: nothing measured here beats it beyond noise")


def test_a_busy_machine_crowns_nothing_and_says_so_keeping_predictions_labelled() -> None:
    table = _table(_row("aa", (1.0, 0.95, 1.05), busy=1), _row("bf16", (2.0, 1.8, 2.2), busy=2))
    card = recommend(table, _diagnosis(_p("fast_kernels", 1.5, 1.3, 1.7)), workload="ctr", size="tiny")
    assert card.pick is None and card.busy and not card.crowns
    assert card.headline().startswith("No recommendation: measured while this machine was busy")
    assert [e.name for e in card.to_try] == ["fast_kernels"] and card.to_try[0].source == "predicted"
    text = "\n".join(card.lines())
    assert "predicted to pay (not measured yet): fast_kernels: predicted 1.50x [1.30, 1.70]" in text
    assert "busy machine: the card shows predictions only" in text
    alone = recommend(table, workload="ctr", size="tiny")  # no predictions: the warning is the headline, said once
    assert alone.headline().startswith("No recommendation: measured while this machine was busy")
    assert not [line for line in alone.lines()[1:] if "busy" in line], alone.lines()


def test_where_prediction_and_measurement_disagree_the_card_trusts_the_measurement_and_says_why() -> None:
    table = _table(_row("aa", (1.0, 0.95, 1.05)), _row("compile", (0.8, 0.7, 0.9), step=(0.75, 0.7, 0.8)))
    card = recommend(table, _diagnosis(_p("compile", 1.23, 1.1, 1.97), _p("bf16", 1.3, 1.2, 1.4)),
                     workload="ctr", size="tiny")
    assert card.pick is None
    note = next(n for n in card.notes if n.startswith("compile:"))
    assert "predicted 1.23x [1.10, 1.97]" in note and "measured 0.75x [0.70, 0.80]" in note
    assert "trusts the measurement" in note
    assert "compile" not in {e.name for e in card.to_try}  # the measurement, not the prediction, speaks
    assert {e.name for e in card.not_here} == {"compile"}
    assert [e.name for e in card.to_try] == ["bf16"]  # not measured: advice to measure


def test_a_prediction_alone_is_advice_to_measure_never_a_verdict_and_an_interval_reaching_below_1_is_not_advice():
    card = recommend(None, _diagnosis(_p("compile", 1.23, 0.69, 1.97), _p("fast_kernels", 1.6, 1.3, 1.9),
                                      _p("prune50", 0.9, 0.8, 0.95), _p("int8_static", 3.0, 2.0, 4.0, "inference")),
                     workload="ctr", size="tiny")
    assert card.pick is None and card.use == ()
    assert [e.name for e in card.to_try] == ["fast_kernels"]  # compile's lower end 0.69: not advised
    assert card.headline().startswith("Try fast_kernels: predicted 1.60x [1.30, 1.90] training step")
    assert "not a verdict" in card.headline()
    assert [e.name for e in card.not_here] == ["prune50"]  # the inference prediction is another axis
    infer = recommend(None, _diagnosis(_p("int8_static", 3.0, 2.0, 4.0, "inference")), workload="ctr", size="tiny",
                      speed="infer_speedup")
    assert [e.name for e in infer.to_try] == ["int8_static"]


def test_a_card_without_evidence_says_what_to_run_and_bad_input_is_refused_before_work() -> None:
    card = recommend(None, None, workload="ctr", size="tiny")
    assert card.pick is None and "run the ablation" in card.headline()
    with pytest.raises(ValueError, match="speed='fast' is invalid"):
        recommend(None, workload="ctr", size="tiny", speed="fast")
    with pytest.raises(ValueError, match="a card reads one workload at one size"):
        recommend(None, _diagnosis(workload="vision"), workload="ctr", size="tiny")


def test_a_preview_table_names_no_winner_and_the_card_says_why() -> None:
    table = _table(_row("bf16", (2.0, math.nan, math.nan)))
    table["n_ok"] = 1
    card = recommend(table, workload="ctr", size="tiny")
    assert card.pick is None and not card.crowns
    assert card.headline().startswith("No recommendation yet: n = 1: no interval")


def test_a_zero_width_interval_is_a_point_and_accuracy_reads_as_a_change_with_its_direction() -> None:
    assert interval_text(0.75, 0.75, 0.75) == "0.75x (one point: no interval)"
    assert interval_text(1.2, 1.1, 1.3) == "1.20x [1.10, 1.30]"
    gain = {"acc_loss_pt": -4.1, "acc_loss_lo": -5.0, "acc_loss_hi": -3.0, "metric_name": "auc", "loss_unit": "pt"}
    assert accuracy_text(gain) == "AUC change +4.10 pt [+3.00, +5.00] (higher is better)"
    loss = {"acc_loss_pt": 0.02, "acc_loss_lo": 0.01, "acc_loss_hi": 0.03, "metric_name": "loss", "loss_unit": "loss"}
    assert accuracy_text(loss) == "loss change +0.02 [+0.01, +0.03] (lower is better)"


def test_the_cards_options_write_the_plain_pytorch_file_of_the_pick() -> None:
    from lab import RunConfig
    from lab.portable import from_techniques

    table = _table(_row("aa", (1.0, 0.95, 1.05)), _row("bf16", (1.6, 1.4, 1.8)))
    card = recommend(table, workload="ctr", size="tiny")
    recipe = from_techniques(card.options, RunConfig(workload="ctr", size="tiny"))
    assert "torch.autocast" in recipe.text and "bfloat16" in recipe.text
    compile(recipe.text, "recipe.py", "exec")


_speed = st.tuples(st.floats(0.3, 3.0), st.floats(0.0, 0.6), st.floats(0.0, 0.6)).map(
    lambda t: (t[0], t[0] * (1 - t[1] / 2), t[0] * (1 + t[2])))


@settings(max_examples=60, deadline=None)
@given(aa=_speed, arms=st.lists(st.tuples(_speed, st.floats(-1.0, 3.0)), min_size=1, max_size=5),
       busy=st.booleans(), budget=st.floats(0.0, 2.0))
def test_the_card_never_crowns_what_the_verdict_does_not(aa, arms, busy, budget) -> None:
    """One rule: whatever the table, the card's pick is the verdict's winner (or neither names one)."""
    rows = [_row("aa", aa, busy=int(busy))] + [_row(f"t{i}", s, loss=(lo, lo - 0.3, lo + 0.3))
                                                for i, (s, lo) in enumerate(arms)]
    table = _table(*rows)
    card = recommend(table, workload="ctr", size="tiny", budget_pt=budget)
    assert (card.pick.name if card.pick else None) == verdict(table, budget)["winner"]
    for e in card.use:  # every arm the card lists as beating the baseline cleared the A/A arm's upper end
        assert e.lo > max(1.0, aa[2])


# ------------------------------------------------------------------------------ from the store, and the CLI


def test_the_card_reads_the_last_finished_ablation_in_the_store_and_the_cli_prints_it_with_its_code(
        toy_workload, private_store, tmp_path, monkeypatch, capsys):
    from lab.cli import main
    from lab.doctor.recommendation import card_from_store
    from lab.store import ResultStore

    with ResultStore(private_store) as store:
        ab = planted_ablation(store, toy_workload.name)
        card = card_from_store(store, toy_workload.name, "tiny")
        assert card.pick is not None and card.pick.name == "fused_optim" and card.pick.source == "measured"
        assert card.pick.lo > 1.5 and ab.key in card.lines()[-1]
        other = card_from_store(store, toy_workload.name, "small")  # another size: nothing measured
        assert other.pick is None and "run the ablation" in other.headline()
    out = tmp_path / "recipe.py"
    code = main(["recommend", "--workload", toy_workload.name, "--size", "tiny", "--store", str(private_store),
                 "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert said.out.startswith("Use fused_optim: ") and "python -m lab recipe --workload" in said.out
    text = out.read_text()
    assert "fused=True" in text and "Use fused_optim" in text  # the code carries the figure it came from
    compile(text, str(out), "exec")
    assert main(["recommend", "--workload", toy_workload.name, "--store", str(private_store), "--json"]) == 0
    assert '"headline": "Use fused_optim' in capsys.readouterr().out


def test_an_ablation_from_another_machine_is_not_this_machines_evidence(toy_workload, private_store, monkeypatch):
    from lab.doctor.recommendation import card_from_store
    from lab.store import ResultStore

    with ResultStore(private_store) as store:
        planted_ablation(store, toy_workload.name)
        card = card_from_store(store, toy_workload.name, "tiny", here="other-cpu-avx2-8c")
    assert card.pick is None and card.hardware_id == "other-cpu-avx2-8c"
    assert "not on this machine (other-cpu-avx2-8c): left out" in card.notes[0]


def test_the_card_reads_the_newest_ablation_that_can_give_a_verdict_and_says_which(toy_workload, private_store):
    """A Doctor verification is stored as an ablation (``doctor@...``) and is the newest: with 1 repeat it is a preview
    and must not displace the full ablation's verdict (the card names both); once it has 3 repeats it is the newest
    measurement that gives a verdict, and the card reads it."""
    from lab.doctor.recommendation import card_from_store
    from lab.store import ResultStore

    with ResultStore(private_store) as store:
        full = planted_ablation(store, toy_workload.name)  # fused_optim at 0.5x the baseline's time: 2x
        check = planted_ablation(store, toy_workload.name, name="doctor", repeats=1, fused=0.25)  # 4x, a preview
        assert check.key.startswith("doctor@") and check.key != full.key
        card = card_from_store(store, toy_workload.name, "tiny")
        assert card.read == full.key and card.pick is not None and card.pick.name == "fused_optim"
        assert card.pick.speedup == pytest.approx(2.0, rel=0.05)  # the full ablation's figure, not the preview's
        assert card.sources[0].startswith(f"the ablation {full.key} (3 arms, 3 run(s) per arm, ended ")
        passed = [n for n in card.notes if check.key in n]
        assert len(passed) == 1 and passed[0].startswith(f"the Doctor's verification {check.key} (3 arms, 1 run(s)")
        assert "is newer but gives no verdict (n = 1: no interval" in passed[0] and full.key in passed[0]
        planted_ablation(store, toy_workload.name, name="doctor", repeats=3, fused=0.25)  # resumed to 3 repeats
        card = card_from_store(store, toy_workload.name, "tiny")
    assert card.read == check.key and card.pick.speedup == pytest.approx(4.0, rel=0.05)
    assert card.sources[0].startswith(f"the Doctor's verification {check.key} (3 arms, 3 run(s) per arm")
    assert not [n for n in card.notes if "gives no verdict" in n]


def _stored(key: str, table: pd.DataFrame, ended: float):
    from lab.doctor.recommendation import StoredAblation

    return StoredAblation(key, table, ended, verdict(table))


def test_a_newer_busy_or_foreign_ablation_leaves_the_verdict_to_the_newest_that_can_give_one() -> None:
    """The rule on planted tables, newest first: a busy one is passed over with its warning kept on the card, one
    from another machine is left out and said; when none can give a verdict the newest here is read (its reason is
    the card's)."""
    from lab.doctor.recommendation import choose_ablation

    quiet = _stored("card@ctr/tiny/t1#1", _table(_row("aa", (1.0, 0.95, 1.05)), _row("bf16", (1.6, 1.4, 1.8))), 1.0)
    busy = _stored("doctor@ctr/tiny/t1#2", _table(_row("aa", (1.0, 0.9, 1.1)), _row("bf16", (2.0, 1.5, 2.5), busy=2)),
                   2.0)
    foreign = quiet.table.assign(hardware_id="other-cpu-8c")
    read, notes = choose_ablation([_stored("card@ctr/tiny/t1#3", foreign, 3.0), busy, quiet], HW)
    assert read is quiet
    assert notes[0].startswith("the ablation card@ctr/tiny/t1#3") and "not on this machine" in notes[0]
    assert notes[1].startswith("the Doctor's verification doctor@ctr/tiny/t1#2") and "busy" in notes[1]
    read, notes = choose_ablation([busy], HW)  # nothing else: the busy one is read, and crowns nothing
    assert read is busy and notes == []
    card = recommend(read.table, workload="ctr", size="tiny")
    assert card.pick is None and card.busy
    assert choose_ablation([_stored("card@ctr/tiny/t1#3", foreign, 3.0)], HW)[0] is None


def test_bad_cli_input_is_one_line_before_any_work(capsys) -> None:
    from lab.cli import main

    assert main(["recommend", "--size", "huge"]) == 2
    assert "--size 'huge' is invalid" in capsys.readouterr().err
    assert main(["recommend", "--budget-pt", "-1"]) == 2
    assert main(["recommend", "--workload", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "nope" in err


def test_a_stored_diagnosis_outlives_its_page_and_the_card_reads_the_newest_of_this_machine(private_store):
    from lab.doctor.recommendation import card_from_store
    from lab.doctor.stored import last_diagnosis, save_diagnosis
    from lab.store import ResultStore

    def made(hw: str, *predictions: Prediction) -> SimpleNamespace:
        d = _diagnosis(*predictions)
        d.cfg.workload_spec = None
        d.hardware_id = hw
        d.to_dict = lambda: {"rate_source": "planted rates", "predictions": [p.to_dict() for p in predictions]}
        return d

    with ResultStore(private_store) as store:
        assert last_diagnosis(store, "ctr", "tiny", HW) is None  # no table yet: nothing, not an error
        save_diagnosis(store, made(HW, _p("bf16", 1.5, 1.2, 1.8)))
        save_diagnosis(store, made(HW, _p("fast_kernels", 1.6, 1.3, 1.9)))  # the newer
        save_diagnosis(store, made("other-cpu-8c", _p("compile", 3.0, 2.0, 4.0)))
        kept = last_diagnosis(store, "ctr", "tiny", HW)
        assert [p.technique for p in kept.predictions] == ["fast_kernels"] and kept.predictions[0].lo == 1.3
        assert last_diagnosis(store, "ctr", "small", HW) is None
        card = card_from_store(store, "ctr", "tiny", here=HW)
    assert [e.name for e in card.to_try] == ["fast_kernels"] and card.headline().startswith("Try fast_kernels")
    assert any(n.startswith("the doctor's prediction is the stored one from") for n in card.notes)


def test_the_card_follows_the_doctors_prescription_over_the_run_where_the_doctor_priced_one() -> None:
    """One rule: a prediction the doctor's risk rule did not prescribe (its run interval, compile's one-off cost
    charged, does not clear 1) is not advised on the card, even where its per-step interval clears 1."""
    from dataclasses import replace

    compile_ = replace(_p("compile", 1.3, 1.1, 1.5), run_speedup=0.4, run_lo=0.3, run_hi=0.5, prescribed=False)
    fused = replace(_p("fused_optim", 1.1, 1.05, 1.2), run_speedup=1.1, run_lo=1.05, run_hi=1.2, prescribed=True)
    card = recommend(None, _diagnosis(compile_, fused), workload="ctr", size="tiny")
    assert [e.name for e in card.to_try] == ["fused_optim"]
    assert card.to_try[0].axis == "training step, over the run"
    assert [e.name for e in card.not_here] == ["compile"] and card.not_here[0].hi == 0.5


def test_a_pick_that_is_the_workloads_own_model_code_says_why_it_has_no_file_and_one_seed_is_no_interval() -> None:
    """Measured idle here: 'Use fast_kernels: 1.88x [1.64, 1.95]', and the card printed a recipe command that
    refuses fast_kernels; a single seed's exact accuracy read '[+4.12, +4.12]'."""
    from lab.doctor.recommendation import code_line

    table = _table(_row("aa", (1.0, 0.95, 1.05)), _row("fast_kernels", (1.88, 1.64, 1.95), loss=(0.0, 0.0, 0.0)),
                   _row("bf16+prune50", (0.72, 0.69, 0.77), techniques="bf16+prune50", loss=(-4.12, -4.12, -4.12)))
    card = recommend(table, workload="ctr", size="tiny")
    assert card.pick.name == "fast_kernels"
    said = code_line(card, "ctr", "tiny")
    assert said.startswith("no plain-PyTorch file for fast_kernels: compute.fast_kernels is the workload's own")
    fused = recommend(_table(_row("aa", (1.0, 0.95, 1.05)), _row("fused_optim", (1.5, 1.3, 1.7))), workload="ctr",
                      size="tiny")
    assert code_line(fused, "ctr", "tiny").startswith("the code: python -m lab recipe --workload ctr --size tiny "
                                                      "--techniques fused_optim")
    assert code_line(recommend(None, workload="ctr", size="tiny"), "ctr", "tiny") is None
    assert "AUC change +4.12 pt (one seed: no interval)" in card.not_here[0].accuracy
