"""What the CPU can do as the kernels see it (lab.measure.cpu): the oneDNN cap masks the flags, both sides of
every capability are derived from the flags (pure, any machine), and a child process capped at AVX2 is gated
as an AVX2 machine, with a hardware id of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.measure import ONEDNN_ISA_LEVELS, allowed_flags, capabilities_of, environment_stamp, mask_flags

SPR = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                 "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile", "aes"})
ZEN3 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "aes"})
LEVELS = [name for name, _ in ONEDNN_ISA_LEVELS]


def test_an_amx_xeon_and_a_zen3_read_as_themselves():
    spr, zen = capabilities_of(SPR, {}, "AVX512"), capabilities_of(ZEN3, {}, "AVX2")
    assert (spr.native_bf16, spr.native_fp16, spr.int8_vnni, spr.amx, spr.emulated) == (True, True, True, True, False)
    assert (zen.native_bf16, zen.native_fp16, zen.int8_vnni, zen.amx) == (False, False, False, False)
    assert "avx512_bf16" in zen.missing("bf16") and "hidden" not in zen.missing("bf16")


@pytest.mark.parametrize(("cap", "bf16", "vnni", "amx"), [("AVX2", False, False, False),
                                                           ("AVX512_CORE", False, False, False),
                                                           ("AVX512_CORE_VNNI", False, True, False),
                                                           ("AVX512_CORE_BF16", True, True, False),
                                                           ("AVX512_CORE_AMX", True, True, True),
                                                           ("DEFAULT", True, True, True)])
def test_the_onednn_cap_hides_what_its_level_does_not_allow(cap, bf16, vnni, amx):
    """The levels measured here (bf16 matmul 0.27 ms native, 7.5 ms at AVX512_CORE, 124 ms at AVX2; PT2E int8
    error 0.012 from AVX512_CORE_VNNI up, 0.121 below)."""
    c = capabilities_of(SPR, {"ONEDNN_MAX_CPU_ISA": cap}, "AVX512")
    assert (c.native_bf16, c.int8_vnni, c.amx) == (bf16, vnni, amx)
    assert c.emulated == (cap not in ("DEFAULT", "AVX512_CORE_AMX"))  # nothing this CPU has is above those
    assert "aes" in c.effective_flags  # a flag no level governs stays
    if not bf16:
        assert f"hidden by ONEDNN_MAX_CPU_ISA={cap}" in c.missing("bf16")


def test_aten_capability_alone_is_recorded_but_does_not_hide_onednn_instructions():
    """Measured: ATEN_CPU_CAPABILITY=avx2 alone leaves bf16 matmul and PT2E int8 at their native figures."""
    c = capabilities_of(SPR, {"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2")
    assert c.native_bf16 and c.int8_vnni and c.caps == ("ATEN_CPU_CAPABILITY=avx2",)


@given(st.sets(st.sampled_from(sorted(SPR))), st.sampled_from(LEVELS), st.sampled_from(LEVELS))
def test_a_higher_cap_never_allows_less_and_masking_only_removes(flags, low, high):
    flags = frozenset(flags)
    if LEVELS.index(low) > LEVELS.index(high):
        low, high = high, low
    lo, _ = mask_flags(flags, {"ONEDNN_MAX_CPU_ISA": low})
    hi, _ = mask_flags(flags, {"ONEDNN_MAX_CPU_ISA": high})
    assert lo <= hi <= flags and lo <= allowed_flags(low) | (flags - allowed_flags(LEVELS[-1]))


def test_a_child_capped_at_avx2_is_gated_as_an_avx2_machine():
    """See an AVX2 machine from any machine: the same code in a process with oneDNN capped at AVX2 calls bf16
    emulated, picks 7-bit int8 activations, and stamps its figures with an id of their own."""
    code = ("import json; from lab.measure import environment_stamp, cpu_capabilities; "
            "from lab.precision import capability; from lab.quant import reduce_range_choice; "
            "print(json.dumps({'id': environment_stamp()['hardware_id'], 'native': environment_stamp()['native'], "
            "'bf16': capability('bf16').native, 'why': capability('bf16').reason, "
            "'rr': reduce_range_choice('auto', 'pt2e')['used']}))")
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env}, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    host = environment_stamp()["hardware_id"]
    # A cap that hides nothing (the host is itself an AVX2-class CPU) is no emulation: the host's own id. A
    # suite run under the cap already (the whole suite as an AVX2 machine sees it) is its own capped host.
    capped = host.endswith("-as-avx2")
    hides = "-avx2-" not in host and not capped
    assert got["id"] == (host + "-as-avx2" if hides else host)
    assert got["native"]["emulated"] is (hides or capped) and not got["native"]["native_bf16"]
    assert got["bf16"] is False and got["rr"] is True and "emulated" in got["why"]


def test_a_capped_process_compiles_into_its_own_inductor_cache():
    from lab.measure import separate_inductor_cache

    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    folder = separate_inductor_cache(env)
    assert folder.endswith("torchinductor_lab_as_avx2") and env["TORCHINDUCTOR_CACHE_DIR"] == folder
    assert separate_inductor_cache({}) is None  # the host's own processes keep whatever they use
    mine = {"ONEDNN_MAX_CPU_ISA": "AVX2", "TORCHINDUCTOR_CACHE_DIR": "/x"}
    assert separate_inductor_cache(mine) is None and mine["TORCHINDUCTOR_CACHE_DIR"] == "/x"
