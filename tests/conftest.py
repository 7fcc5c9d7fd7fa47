"""Shared fixtures: a tiny user-defined workload (registered through the public door), a private results store
per test, so no test touches the default database, and torch's RNG seeded per test, so none depends on the
order."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import settings
from toy_workload import TOY

from lab.measure import CpuCapabilities, cpu_capabilities
from lab.workloads import Workload, register_workload

#: No time limit on a hypothesis example: its default (200 ms) is a timing assertion, and on a shared 2-core box,
#: with a second pytest-xdist worker beside it, a pure-Python example can miss it for reasons of its own.
settings.register_profile("lab", deadline=None)
settings.load_profile("lab")

#: One marker per CPU capability (docs/architecture.md section 5, rule 12). ``@pytest.mark.native_bf16`` runs a test
#: only where the kernels have native bf16, ``@pytest.mark.native_bf16(False)`` only where they do not; elsewhere it
#: is skipped with the instructions that decide it. Every test that carries one, or asks for the ``cpu_caps`` fixture
#: (one test checking both sides), is also marked ``capability``: ``make test`` runs those again with the kernels
#: capped at AVX2 (``make test-avx2``), so an AMX box sees what an AVX2 user sees.
CAPABILITY_MARKERS = ("native_bf16", "native_fp16", "int8_vnni", "amx")
_NEEDS = {"native_bf16": "bf16", "native_fp16": "fp16", "int8_vnni": "int8_vnni", "amx": "amx"}


def pytest_configure(config) -> None:
    for name in CAPABILITY_MARKERS:
        config.addinivalue_line("markers", f"{name}(present=True): runs only where the CPU's kernels have (or, "
                                           f"with False, lack) {name}; skipped with the reason elsewhere")
    config.addinivalue_line("markers", "capability: the expectation depends on the CPU (rerun by make test-avx2)")


#: ``make test-avx2`` collects only the test files naming one of these (the Makefile's CAPABILITY_WORDS).
CAPABILITY_WORDS = ("capability", *CAPABILITY_MARKERS, "cpu_caps")


def _names_a_capability_word(path, seen: dict) -> bool:
    """Whether the Makefile's ``grep -rlE CAPABILITY_WORDS tests --include='test_*.py'`` selects ``path``."""
    if path not in seen:
        text = path.read_text(encoding="utf-8") if path.suffix == ".py" else ""
        seen[path] = path.name.startswith("test_") and any(w in text for w in CAPABILITY_WORDS)
    return seen[path]


def pytest_collection_modifyitems(config, items) -> None:
    caps = cpu_capabilities()
    seen: dict = {}
    unseen = set()
    for item in items:
        marks = [m for name in CAPABILITY_MARKERS for m in item.iter_markers(name)]
        if marks or "cpu_caps" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.capability)
        if item.get_closest_marker("capability") and not _names_a_capability_word(item.path, seen):
            unseen.add(str(item.path))
        for mark in marks:
            want = mark.args[0] if mark.args else True
            have = getattr(caps, mark.name)
            if have != want:
                why = caps.missing(_NEEDS[mark.name]) if want else f"this CPU's kernels have {mark.name}"
                item.add_marker(pytest.mark.skip(reason=f"needs {'' if want else 'no '}{mark.name}: {why}"))
    if unseen:
        raise pytest.UsageError(f"capability tests in {sorted(unseen)}, files that `make test-avx2` does not collect: "
                                f"name one of {CAPABILITY_WORDS} in the file (a marker, or a comment saying why)")


@pytest.fixture(scope="session")
def cpu_caps() -> CpuCapabilities:
    """What this CPU's kernels can do (the ISA caps applied): for a test that asserts the side it is on."""
    return cpu_capabilities()


@pytest.fixture(scope="session")
def toy_workload() -> Workload:
    return register_workload(TOY, overwrite=True)


@pytest.fixture(autouse=True)
def _seeded_torch():
    """Every test starts from the same torch RNG state, whatever ran before it in the random order
    (pytest-randomly reseeds ``random`` and numpy, not torch): an unseeded model init otherwise followed the
    previous tests' draws, and an int8 error bound on an untrained ctr model failed once in CI that way."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def private_store(tmp_path, monkeypatch):
    """Every test gets its own results database via the documented environment variable."""
    path = tmp_path / "results.sqlite"
    monkeypatch.setenv("LAB_RESULTS_DB", str(path))
    return path


@pytest.fixture(autouse=True)
def _no_settling(request, monkeypatch):
    """No wait for a quiet machine before each ablation run (lab.measure.contention.settle): up to 2 s per run
    on a busy CI box, and the suite asserts no timings; tests/measure/test_contention.py tests the wait itself.
    ``LAB_SETTLE_MAX_S=0`` reaches the workers the dashboard tests start (processes of their own, which the
    attribute does not reach): a page polled by AppTest keeps the box busy, so each tiny run was waited for and
    measured again up to twice. The browser test's worker waits as a user's would."""
    from lab.measure import contention

    monkeypatch.setattr(contention, "SETTLE_MAX_S", 0.0)
    if request.node.get_closest_marker("browser") is None:
        monkeypatch.setenv("LAB_SETTLE_MAX_S", "0")


@pytest.fixture(autouse=True)
def _restore_main_module():
    """Streamlit's AppTest runs a page as ``__main__`` and leaves it there; a data-parallel run spawned by a
    later test would then re-run that temporary script in every rank (multiprocessing's spawn re-imports
    ``__main__`` from its path). Each test gets the process's own ``__main__`` back."""
    main = sys.modules.get("__main__")
    attrs = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    yield
    if main is not None:
        sys.modules["__main__"] = main
        for k, v in attrs.items():
            setattr(main, k, v)


@pytest.fixture(autouse=True)
def _machine_identity_unpoisoned():
    """A test that patches ``/proc/cpuinfo`` or the ISA cap while a cached stamp fills keeps the fake machine in
    ``lab.measure.env``'s caches for every later test: one did (a CPU called "Some ARM"), and two tests far
    away failed in CI, an AVX2-capped child compared with the fake id and a dashboard card saved under it. The
    identity is read (so cached, from the real machine) before each test, and a test that still leaves it
    changed fails here, by name, with the caches cleared for the next."""
    from lab.measure import env

    before = env._device_stamp("cpu")["hardware_id"]
    yield
    after = env._device_stamp("cpu")["hardware_id"]
    if after != before:
        for cache in (env._cpu_info, env.cpu_signature, env._static_stamp, env._device_stamp):
            cache.cache_clear()
        pytest.fail(f"this test left the machine's cached identity changed ({before} -> {after}): clear "
                    "lab.measure.env's caches after patching what they read")
