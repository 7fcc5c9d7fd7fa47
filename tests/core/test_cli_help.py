"""The command line explains itself (issue 42): every flag of every subcommand has a help line, every config field
a meaning next to it (``HELP`` on its config class) with the allowed values and the default added by the flags'
generator; ``--json [PATH]`` is one spelling everywhere; ``--grad-accum-steps`` is gradient accumulation's flag
(``--ddp-grad-accum-steps``: a deprecated alias that warns)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from lab.cli import SUBCOMMANDS, build_parser, config_from_args, main
from lab.config import FAMILIES, PruneConfig, RunConfig
from lab.config.flags import ALIASES, ALLOWED, CHOICES, RENAMED

#: Subcommands whose ``--json`` takes an optional PATH.
JSON_COMMANDS = ("run", "doctor", "project", "crossover", "threads", "machine", "recommend")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _action(command: str, flag: str) -> argparse.Action:
    return next(a for a in _options(_subparsers()[command]) if flag in a.option_strings)


def _field_keys() -> list[str]:
    top = [f.name for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES]
    return top + [f"{fam}.{f.name}" for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)]


def undocumented_options(parser: argparse.ArgumentParser) -> list[str]:
    """``command --flag`` for every option without a help line; a hidden option (``argparse.SUPPRESS``) is
    allowed only as a deprecated alias (``--db``, ``--ddp-grad-accum-steps``)."""
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = []
    for name, sub in subs.items():
        for action in _options(sub):
            hidden = action.help == argparse.SUPPRESS and "Deprecated" in type(action).__name__
            if not hidden and not (isinstance(action.help, str) and action.help.strip()
                                   and action.help != argparse.SUPPRESS):
                missing.append(f"{name} {action.option_strings[0]}")
    return missing


def test_every_option_of_every_subcommand_has_a_help_line():
    assert set(_subparsers()) == {c.NAME for c in SUBCOMMANDS}
    assert all(c.HELP for c in SUBCOMMANDS)
    assert undocumented_options(build_parser()) == []


def test_the_walk_catches_a_flag_without_help():
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    subs["runs"].add_argument("--undocumented")
    subs["run"].add_argument("--hidden", help=argparse.SUPPRESS)
    assert sorted(undocumented_options(parser)) == ["run --hidden", "runs --undocumented"]


@pytest.mark.parametrize("cls", [RunConfig, *FAMILIES.values()], ids=lambda c: c.__name__)
def test_every_config_field_has_one_help_line_and_every_help_entry_a_field(cls):
    names = {f.name for f in dataclasses.fields(cls)} - set(FAMILIES if cls is RunConfig else ())
    assert set(cls.HELP) - names == set(), "HELP names fields that do not exist"
    assert names - set(cls.HELP) == set(), "fields without a HELP line"
    assert all(isinstance(t, str) and t.strip() and "\n" not in t for t in cls.HELP.values())


def test_help_is_no_field_so_configs_and_their_hashes_are_unchanged(monkeypatch):
    assert all("HELP" not in {f.name for f in dataclasses.fields(c)} for c in (RunConfig, *FAMILIES.values()))
    d = RunConfig().to_dict()
    assert "HELP" not in d and all("HELP" not in d.get(fam, {}) for fam in FAMILIES)  # a late family off: absent
    missing = {k: v for k, v in PruneConfig.HELP.items() if k != "amount"}
    monkeypatch.setattr(PruneConfig, "HELP", missing)  # a field left without its line is caught
    with pytest.raises(AssertionError):
        test_every_config_field_has_one_help_line_and_every_help_entry_a_field(PruneConfig)


def test_a_flag_names_its_meaning_allowed_values_and_default():
    keys = set(_field_keys())
    assert set(ALLOWED) <= keys and set(CHOICES) <= keys and set(ALIASES) <= keys and set(RENAMED) <= keys
    prune = _action("run", "--prune").help
    assert prune.startswith(PruneConfig.HELP["method"])
    assert f"allowed: {', '.join(PruneConfig.METHODS)}; default: none" in prune
    for key, values in ALLOWED.items():
        names = values.names() if hasattr(values, "names") else values
        flag = ALIASES.get(key) or RENAMED.get(key) or "--" + key.replace(".", "-").replace("_", "-")
        assert "allowed: " + ", ".join(names) in _action("run", flag).help, key
    assert "(default: 25.0)" in _action("run", "--ddp-bucket-cap-mb").help
    assert _action("run", "--compute-compile").help.endswith("(default: off)")
    assert _action("run", "--prune-layers").help.endswith("(default: empty)")


@pytest.mark.parametrize("command", [c.NAME for c in SUBCOMMANDS])
def test_help_prints_for_every_subcommand(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--" in out


def test_grad_accum_steps_is_its_own_flag_and_the_ddp_spelling_warns(capsys):
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["run", "--grad-accum-steps", "4"]))
    assert cfg.ddp.grad_accum_steps == 4 and capsys.readouterr().err == ""
    cfg = config_from_args(parser.parse_args(["run", "--ddp-grad-accum-steps", "3"]))
    assert cfg.ddp.grad_accum_steps == 3
    err = capsys.readouterr().err
    assert err == "lab: warning: --ddp-grad-accum-steps is deprecated; use --grad-accum-steps\n"
    assert main(["run", "--grad-accum-steps", "0"]) == 2
    assert "ddp.grad_accum_steps=0 is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("command", JSON_COMMANDS)
def test_json_is_one_spelling_a_bare_switch_or_a_path(command):
    action = _action(command, "--json")
    assert action.nargs == "?" and action.const == "-" and action.default is None and action.metavar == "PATH"
    parser = build_parser()
    assert parser.parse_args([command]).json is None
    assert parser.parse_args([command, "--json"]).json == "-"
    assert parser.parse_args([command, "--json", "out/x.json"]).json == "out/x.json"


def test_run_json_path_writes_the_result_and_prints_the_text(tmp_path, capsys):
    out = tmp_path / "sub" / "result.json"
    argv = ["run", "--workload", "ctr", "--size", "tiny", "--max-steps", "6", "--latency-repeats", "0",
            "--no-store", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "auc" in text and f"wrote {out}" in text
    assert json.loads(out.read_text())["status"] == "ok"
    assert main([*argv[:-1], str(tmp_path)]) == 2  # a folder is refused before the run
    assert "--json" in capsys.readouterr().err


def test_machine_json_bare_prints_it_and_a_path_writes_it(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from lab.measure import machine

    card = SimpleNamespace(hardware_id="test-cpu", to_dict=lambda: {"hardware_id": "test-cpu"})
    monkeypatch.setattr(machine, "machine_card", lambda **_k: card)
    monkeypatch.setattr(machine, "format_card", lambda c, path=None: f"CARD {c.hardware_id}")
    assert main(["machine", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"hardware_id": "test-cpu"}
    assert main(["machine", "--json", str(tmp_path / "card.json")]) == 0
    assert capsys.readouterr().out.startswith("CARD test-cpu\nwrote ")
    assert json.loads((tmp_path / "card.json").read_text()) == {"hardware_id": "test-cpu"}


def test_crossover_json_bare_prints_the_map_and_a_path_writes_it(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    import lab.crossover
    from lab.measure import machine

    committed = sorted(Path(__file__).resolve().parents[2].glob("benchmarks/results/*/crossover-quick.json"))
    if not committed:
        pytest.skip("no committed quick crossover map")
    the_map = lab.crossover.load_map(committed[0])
    monkeypatch.setattr(machine, "machine_card", lambda **_k: None)
    monkeypatch.setattr(lab.crossover, "build_map", lambda *a, **k: the_map)
    assert main(["crossover", "--quick", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["technique"] for r in printed["rows"]] == [r["technique"] for r in the_map["rows"]]
    out = tmp_path / "map.json"
    assert main(["crossover", "--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1] == f"wrote {out}" and len(printed.splitlines()) > 1
    assert len(lab.crossover.load_map(out)["rows"]) == len(the_map["rows"])


def test_no_help_line_offers_an_empty_list_of_choices():
    """``ablate --recipe``'s help read "one of (default: stacked)": the recipe registry was still empty when the
    parser was built, in a fresh process (a test process that had imported lab.recipes hid it). So: a fresh one."""
    import re
    import subprocess
    import sys

    code = ("import json, argparse; from lab.cli import build_parser; p = build_parser(); "
            "subs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices; "
            "print(json.dumps({f'{n} {a.option_strings[0]}': a.help for n, s in subs.items() for a in s._actions "
            "if a.option_strings and isinstance(a.help, str)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    helps = json.loads(out.stdout.strip().splitlines()[-1])
    empty = {flag: h for flag, h in helps.items() if re.search(r"(one of|of:|allowed:)\s*(\(|\)|,|$)", h)}
    assert not empty, empty
    assert "stacked, top_stack" in helps["ablate --recipe"]
