"""The CPU hardware id carries the ISA class: two CPUs behind one generic VM model name ("AMD EPYC": a Zen 3
with AVX2 only and a Zen 4 with native AVX-512 bf16) must never share a results folder or a crossover map."""

from __future__ import annotations

import pytest

from lab.measure import env
from lab.measure.cpu import hardware_flags

ZEN3 = {"avx2", "fma", "f16c", "sse4_2"}
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"}
SPR = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(("flags", "cls"), [(ZEN3, "avx2"), (ZEN4, "avx512bf16"), (SPR, "amx"),
                                            (ZEN3 | {"avx512f"}, "avx512"), ({"asimd", "fp"}, ""), (set(), "")])
def test_isa_class_follows_the_flags_that_decide_native_kernels(flags: set[str], cls: str) -> None:
    assert env.isa_class(flags) == cls


def test_two_cpus_with_one_model_name_get_two_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = []
    for flags in (ZEN3, ZEN4):
        monkeypatch.setattr(env, "hardware_flags", lambda f=frozenset(flags): f)
        monkeypatch.setattr(env, "_cpu_info", lambda: ("AMD EPYC", ()))
        env._device_stamp.cache_clear()
        ids.append(env._device_stamp("cpu")["hardware_id"])
    env._device_stamp.cache_clear()
    assert ids[0] != ids[1]
    assert ids[0].startswith("amd-epyc-avx2-") and ids[1].startswith("amd-epyc-avx512bf16-")


def test_this_machines_id_names_its_own_class() -> None:
    cls = env.isa_class(hardware_flags())
    hw = env.environment_stamp()["hardware_id"]
    assert (f"-{cls}-" in hw) if cls else True
