"""The command line: results for good input. Bad input (one line, exit status 2, before any work) is one table,
the fault suite's: tests/e2e/test_faults_cli.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from lab.cli import main


def test_run_store_list_export(tmp_path, capsys):
    db = tmp_path / "cli.sqlite"
    argv = ["run", "--workload", "ctr", "--size", "tiny", "--max-steps", "10", "--latency-repeats", "2",
            "--store", str(db), "--label", "cli-test", "--no-progress"]
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["status"] == "ok" and payload["steps"] == 10 and payload["metric_name"] == "auc"
    assert payload["config"]["max_steps"] == 10

    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "auc" in text and "median step" in text and "env: torch" in text and str(db) in text

    assert main(["runs", "--store", str(db)]) == 0
    listing = capsys.readouterr().out
    assert listing.count("cli-test") == 2 and "(2 shown" in listing

    out = tmp_path / "runs.csv"
    assert main(["export", "--store", str(db), "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert len(df) == 2 and set(df["workload"]) == {"ctr"}


def test_family_flags_reach_the_config():
    from lab.cli import build_parser, config_from_args

    args = build_parser().parse_args(["run", "--loader", "dataloader", "--num-workers", "2", "--pin-memory",
                                      "--prefetch-factor", "4", "--threads", "1", "--world-size", "2",
                                      "--ddp-timeout-s", "30",
                                      "--precision", "bf16", "--precision-fp32-modules", "fc,emb", "--epochs", "none"])
    cfg = config_from_args(args)
    assert cfg.data.loader == "dataloader" and cfg.data.num_workers == 2 and cfg.data.pin_memory
    assert cfg.data.prefetch_factor == 4 and cfg.threads == 1 and cfg.ddp.timeout_s == 30.0
    assert cfg.precision.dtype == "bf16" and cfg.precision.fp32_modules == ("fc", "emb") and cfg.epochs is None


@pytest.mark.parametrize(("argv", "needle"), [
    (["--prune-amount", "0.5"], "prune.amount=0.5 is invalid: needs prune.method (--prune)"),
    (["--prune-layers", "nosuch"], "prune.layers=('nosuch',) is invalid: needs prune.method"),
    (["--quant-calibration-batches", "8"], "quant.calibration_batches=8 is invalid: needs quant.method"),
    (["--ddp-backend", "gloo"], "ddp.backend='gloo' is invalid: needs ddp.world_size > 1"),
    (["--data-prefetch-depth", "4"], "data.prefetch_depth=4 is invalid"),
    (["--loader", "naive", "--data-prefetch-depth", "4"], "holds no prefetch queue"),
    (["--loader", "thread", "--pin-memory"], "does not pin"),
    (["--max-steps", "2", "--warmup-steps", "50"], "no step would be measured"),
    (["--threads", "100000"], "threads=100000 is invalid"),
], ids=lambda v: "_".join(v) if isinstance(v, list) else None)
def test_a_flag_that_would_be_ignored_is_one_line_and_exit_2(argv, needle, capsys):
    from lab.cli import main

    assert main(["run", "--workload", "ctr", "--size", "tiny", "--no-store", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_python_dash_m_lab_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lab", "run", "--workload", "sequence", "--size", "tiny",
                           "--no-store", "--latency-repeats", "2"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "accuracy" in proc.stdout and "untrained" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "lab", "run", "--lr", "-1"], capture_output=True, text=True,
                         timeout=240)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "lr=-1.0 is invalid" in bad.stderr


@pytest.mark.parametrize("command", [["ablate", "--size", "tiny", "--repeats", "1"], ["doctor", "--size", "tiny"]])
def test_store_is_one_flag_everywhere_and_db_an_alias_that_warns(command, tmp_path):
    """``--store`` in every subcommand that opens the results store; ``--db`` (the old name in ablate / doctor)
    still parses, into the same field, with a one-line deprecation warning."""
    from lab.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([*command, "--store", str(tmp_path / "a.sqlite")]).store == str(tmp_path / "a.sqlite")
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        args = parser.parse_args([*command, "--db", str(tmp_path / "b.sqlite")])
    assert args.store == str(tmp_path / "b.sqlite")
    assert err.getvalue() == "lab: warning: --db is deprecated; use --store\n"
    for sub in (["runs"], ["export", "--out", str(tmp_path / "x.csv")], ["run"]):
        assert "store" in vars(parser.parse_args(sub))


def _raise_in_a_thread(filename: str, exc: BaseException) -> None:
    """Raise ``exc`` in a thread from code whose frame claims ``filename`` and report it the way multiprocessing's
    resource sharer does (``sys.excepthook`` called from its own ``except``)."""
    import threading

    code = compile("import sys\ndef serve(exc):\n    try:\n        raise exc\n    except BaseException:\n"
                   "        sys.excepthook(*sys.exc_info())\n", filename, "exec")
    scope: dict = {}
    exec(code, scope)
    t = threading.Thread(target=scope["serve"], args=(exc,))
    t.start()
    t.join()


def test_a_dead_workers_fd_handshake_is_left_out_of_stderr_and_nothing_else(capsys, monkeypatch):
    """Ctrl-C during a run with DataLoader workers printed multiprocessing's resource-sharer thread's
    ConnectionResetError above "lab: interrupted" (intermittent, seen on an AMD EPYC)."""
    import sys

    from lab.cli import quiet_worker_handshakes

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    quiet_worker_handshakes()
    once = sys.excepthook
    quiet_worker_handshakes()  # idempotent: one wrapper
    assert sys.excepthook is once
    sharer = "/usr/lib/python3.11/multiprocessing/resource_sharer.py"
    _raise_in_a_thread(sharer, ConnectionResetError(104, "Connection reset by peer"))
    assert "ConnectionResetError" not in capsys.readouterr().err
    _raise_in_a_thread(sharer, ValueError("a real bug in that thread"))  # not a dead peer: still shown
    _raise_in_a_thread("/work/mine.py", ConnectionResetError(104, "elsewhere"))  # another module's: still shown
    err = capsys.readouterr().err
    assert "a real bug in that thread" in err and "elsewhere" in err


def test_a_loader_iterator_cut_short_by_ctrl_c_is_not_a_traceback_and_other_unraisables_still_are(monkeypatch):
    """Ctrl-C during a DataLoader iterator's construction left it without ``_workers``; its ``__del__`` then printed
    "Exception ignored in ... AttributeError" above "lab: interrupted" (the fault suite caught it once in CI)."""
    import signal
    import sys
    from types import SimpleNamespace

    from lab.cli import catch_interrupts
    from lab.loop import INTERRUPTED

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the suite's own SIGINT handler stays as it is
    catch_interrupts()

    class _MultiProcessingDataLoaderIter:
        def __del__(self) -> None: ...

    cut = SimpleNamespace(exc_type=AttributeError, exc_value=AttributeError(
        "'_MultiProcessingDataLoaderIter' object has no attribute '_workers'"), exc_traceback=None, err_msg=None,
        object=_MultiProcessingDataLoaderIter.__del__)
    other = SimpleNamespace(exc_type=AttributeError, exc_value=AttributeError("'Foo' object has no attribute 'x'"),
                            exc_traceback=None, err_msg=None, object=object())
    try:
        sys.unraisablehook(cut)
        sys.unraisablehook(other)
    finally:
        INTERRUPTED.clear()
    assert seen == [other]
