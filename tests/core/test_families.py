"""One name per technique: the family registry walked against every place that names a technique.

Each family registers its option strings next to its code (``lab/<family>/options.py``); the CLI, the recipes,
the crossover map, the doctor and the recipe read that one table (:data:`lab.registry.OPTIONS`). These tests fail
when a place keeps a vocabulary of its own again: a map row that is no option, an option defined twice or outside
its family, a stored map whose old names no longer read, a CLI that does not list an option, an option its family
cannot write as plain PyTorch without saying why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lab
from lab.cli import build_parser
from lab.config import RunConfig
from lab.crossover import TECHNIQUES as MAP_TECHNIQUES
from lab.crossover import current_name, in_current_names
from lab.doctor.rates import map_names
from lab.recipes import from_techniques
from lab.registry import FAMILIES, FAMILY_ORDER, OLD_MAP_NAMES, OPTIONS, PREDICTORS
from lab.technique import AXES, NotPortable, Option, Portable, Technique, register_option

LAB = Path(lab.__file__).parent
#: Options built by a helper in their family's module (``masks(0.5)``), not written out as ``Option("name"``.
GENERATED = {"prune30", "prune50", "prune70"}
#: Options the doctor has no predictor for, with the reason (a new option must say why).
NOT_PREDICTED: dict[str, str] = {
    **dict.fromkeys(("adam8bit", "adam4bit"), "a memory lever whose step time is torchao's compiled low-bit update, "
                    "for which nothing measures a rate yet (benchmarks/memory.py measures its bytes and step time)"),
    **dict.fromkeys(("accum2", "accum4"), "a memory lever (the same step in smaller pieces): its step time is "
                    "measured by the budget search (lab run --memory-budget), not predicted"),
    "fsdp2": "a memory lever across data-parallel ranks; the doctor profiles one process's step",
    "offload_optim": "a memory lever on CUDA only (the optimizer stepped on the host); nothing measures the host "
                     "update and the transfers' rate yet",
}
#: Options the recipe (``python -m lab recipe``) cannot write as plain PyTorch, with the reason (a new option must
#: say why); every other option's family writes its part (:meth:`lab.technique.Technique.portable`).
NOT_PORTABLE: dict[str, str] = {
    "fast_kernels": "the workload's own faster model code (ctr: index_select lookups), not a change of the loop",
    **dict.fromkeys(("accum2", "accum4"), "gradient accumulation that keeps the batch (memory.micro_batches) is "
                    "not written out by the recipe yet: lab refuses it in `python -m lab recipe` with that reason"),
    "offload_optim": "torchao's CPUOffloadOptimizer runs on CUDA only, and every recipe file is checked against the "
                     "lab's run on a CPU: the line would go unchecked (docs/memory.md gives it)",
}


def test_every_option_belongs_to_a_family_in_the_order_and_every_family_but_distributed_has_some():
    assert set(FAMILIES.names()) == set(FAMILY_ORDER)
    families = {o.family for o in OPTIONS.values()}
    assert families <= set(FAMILY_ORDER)
    # Data-parallel training is a launcher choice (ranks), compared by the `distributed` recipe by world size.
    assert set(FAMILY_ORDER) - families == {"distributed"}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_is_a_valid_config_that_changes_its_own_family(name):
    option = OPTIONS[name]
    cfg = RunConfig().with_overrides(**option.overrides)  # the values, validated (families register keys only)
    assert cfg != RunConfig() and option.axes and set(option.axes) <= set(AXES) and option.description
    changed = {key.split(".")[0] for key in option.overrides if "." in key}
    config_key = {"pruning": "prune", "distributed": "ddp"}.get(option.family, option.family)
    assert changed == {config_key}, f"{name} ({option.family}) sets {changed}"


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_is_defined_once_in_its_familys_options_module(name):
    option = OPTIONS[name]
    home = LAB / option.family / "options.py"
    assert home.is_file(), f"{name}: the {option.family} family has no options.py"
    if name in GENERATED:
        assert 'f"prune{round(amount * 100)}"' in home.read_text(), name
        return
    pattern = re.compile(rf'(?:Option|_\w+)\(\s*"{re.escape(name)}"')  # Option("x", ...) or a family's _int8("x", ...)
    defined = [p.relative_to(LAB) for p in LAB.rglob("*.py") if pattern.search(p.read_text())]
    assert defined == [home.relative_to(LAB)], f"{name} is defined in {defined}"


def test_the_cli_lists_every_option_where_it_takes_techniques():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for command in ("ablate", "project", "doctor", "recipe"):
        action = next(a for a in sub.choices[command]._actions if "--techniques" in a.option_strings)
        assert all(name in action.help for name in OPTIONS), command


def test_every_option_stacks_in_a_recipe_under_its_own_name():
    ablation = from_techniques("walk", RunConfig(size="tiny"), [[n] for n in OPTIONS])
    assert set(OPTIONS) <= set(ablation.arms) and all(ablation.techniques[n] == (n,) for n in OPTIONS)


def test_every_map_row_is_an_option_or_a_stack_of_options_on_axes_the_map_times():
    for name, axes in MAP_TECHNIQUES.items():
        assert all(part in OPTIONS for part in name.split("+")), name
        assert set(axes) <= {"train_step", "inference"}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_doctor_predicts_every_option_under_its_own_name(name):
    fields = [f for f in PREDICTORS if f in OPTIONS[name].overrides]
    assert fields or name in NOT_PREDICTED, f"no doctor predictor reads any field {name} sets"
    assert map_names(name)[0] == name  # its own map row first, never another option's


def test_old_map_names_read_as_todays_and_never_shadow_an_option_in_a_fresh_map():
    assert set(OLD_MAP_NAMES.values()) <= {*MAP_TECHNIQUES}
    stored = {"rows": [{"technique": old, "axis": "inference"} for old in OLD_MAP_NAMES],
              "fits": [{"technique": "bf16+fused_optimizer"}], "env": {}}
    now = in_current_names(stored)
    assert [r["technique"] for r in now["rows"]] == list(OLD_MAP_NAMES.values())
    assert now["fits"][0]["technique"] == "bf16+fused_optim"  # a stack is renamed part by part
    assert stored["rows"][0]["technique"] in OLD_MAP_NAMES  # the stored map itself is left as written
    assert current_name("int8_static") == "int8_static"
    # prune50 is an option today (masks) and an old map name (channels): only a stored map is translated.
    assert current_name("prune50") == "prune_channels50" and OPTIONS["prune50"].overrides["prune.method"] == \
        "l1_unstructured"


def test_the_committed_maps_read_in_option_names(tmp_path):
    from lab.crossover import load_maps

    maps = load_maps(LAB.parent / "benchmarks" / "results")
    assert maps
    for _, the_map in maps:
        for row in the_map["rows"]:
            assert all(part in OPTIONS for part in row["technique"].split("+")), row["technique"]


def test_a_users_option_is_validated_and_a_bad_family_or_field_refused():
    with pytest.raises(ValueError, match="family='nope' is invalid"):
        register_option(Option("x_test", {"precision.dtype": "bf16"}, "nope"))
    with pytest.raises(ValueError, match="override 'precision.nope' is invalid"):
        register_option(Option("x_test", {"precision.nope": 1}, "precision"))
    with pytest.raises(ValueError, match="without '\\+'"):
        Option("a+b", {"precision.dtype": "bf16"}, "precision")
    assert "x_test" not in OPTIONS


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_has_a_portable_part_written_by_its_family_or_a_reason_listed(name):
    option = OPTIONS[name]
    family = FAMILIES.get(option.family)
    cfg = RunConfig(workload="ctr", size="tiny").with_overrides(**option.overrides)  # ctr: has fast kernels
    assert type(family).portable is not Technique.portable, f"the {option.family} family writes no portable part"
    if name in NOT_PORTABLE:
        with pytest.raises(NotPortable):
            family.portable(cfg)
        return
    part = family.portable(cfg)
    assert isinstance(part, Portable) and part.comment, name
    code = [line for field in ("imports", "helpers", "setup", "wrap", "fit_setup", "step", "unwrap", "after_training",
                               "inference") for line in getattr(part, field)]
    assert not any(re.search(r"\b(import|from) lab\b", line) for line in code), name


def test_a_family_that_writes_no_portable_part_refuses_its_options_instead_of_dropping_them():
    class Silent(Technique):
        name = "precision"  # owns bf16, fp16, amp_auto, but writes no part

    assert Silent().portable(RunConfig()) is None  # off: nothing to write
    with pytest.raises(NotPortable, match="precision family writes no plain-PyTorch part"):
        Silent().portable(RunConfig().with_overrides(**OPTIONS["bf16"].overrides))
