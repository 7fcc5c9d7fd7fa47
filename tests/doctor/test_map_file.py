"""The stored crossover map's file is located by one function (:func:`lab.doctor.rates.crossover_path`): this
machine's, or ``$LAB_CROSSOVER_JSON``'s; a named machine's is always that machine's file."""

from __future__ import annotations

import re
from pathlib import Path

import lab
from lab.bench import BENCH_DIR
from lab.doctor.rates import crossover_path, find_crossover, stored_maps
from lab.measure import environment_stamp

ROOT = Path(lab.__file__).resolve().parents[1]


def test_this_machines_map_or_the_variables_and_a_named_machines_own(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_CROSSOVER_JSON", raising=False)
    mine = BENCH_DIR / "results" / environment_stamp()["hardware_id"] / "crossover.json"
    assert crossover_path() == mine
    assert crossover_path("hw1", tmp_path) == tmp_path / "hw1" / "crossover.json"
    monkeypatch.setenv("LAB_CROSSOVER_JSON", str(tmp_path / "elsewhere.json"))
    assert crossover_path() == tmp_path / "elsewhere.json"  # "this machine's map" follows the variable
    assert crossover_path("hw1", tmp_path) == tmp_path / "hw1" / "crossover.json"  # the doctor's: the run's machine
    assert find_crossover("hw1", tmp_path) is None
    for hw in ("b", "a"):
        (tmp_path / hw).mkdir()
        (tmp_path / hw / "crossover.json").write_text("{}")
    assert stored_maps(tmp_path) == [tmp_path / "a" / "crossover.json", tmp_path / "b" / "crossover.json"]


def test_no_other_module_computes_the_maps_path():
    """The variable's name and a path built from the file's name appear only where the function lives."""
    built = re.compile(r'LAB_CROSSOVER_JSON"|/ "crossover\.json"|"\*/crossover\.json"|"crossover\.json"')
    found = {str(p.relative_to(ROOT)) for folder in ("lab", "dashboard", "benchmarks")
             for p in (ROOT / folder).rglob("*.py") if built.search(p.read_text())}
    assert found == {"lab/doctor/rates.py", "lab/crossover/mapping.py"}, found
