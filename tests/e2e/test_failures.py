"""No traceback from a technique, ever (issue 45, item 1): a fault-injecting model (tests/faulty_models.py) that
raises at a chosen stage is driven through every technique family; each run ends in one line and a record whose
status says ``failed`` (or ``refused``), naming the technique, the stage, the model's class and the line of the
model's own file that raised, what the lab tried and what the user can do; a technique that can take another way
does, and says so in ``why``. No timing assertions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from faulty_models import InjectedFault

from lab import RunConfig, run
from lab.result.failure import FAILURE, failed
from lab.technique import Technique, TechniqueChain, default_chain

SPEC = str(Path(__file__).resolve().parents[1] / "faulty_models.py")
FILE = "tests/faulty_models.py"


def _cfg(fault: str, **overrides) -> RunConfig:
    return RunConfig(workload=f"{SPEC}:{fault.upper()}", size="tiny", threads=1, latency_repeats=0,
                     warmup_steps=1).with_overrides(**overrides)


#: fault, overrides -> (technique, stage, the function of the model's file that raised, what "tried" names)
CASES = {
    "forward, no technique": ("forward", {}, "baseline", "training", "forward", "no technique"),
    "forward, data + compute": ("forward", {"data.loader": "thread", "compute.fused_optimizer": True},
                                "data+compute", "training", "forward", "data.loader='thread'"),
    "autocast, bf16": ("autocast", {"precision.dtype": "bf16"}, "precision", "training", "forward",
                       "precision.dtype='bf16'"),
    "recompute, checkpointing": ("recompute", {"memory.checkpoint": "blocks"}, "memory", "training", "forward",
                                 "memory.checkpoint='blocks'"),
    "backward, adam8bit": ("backward", {"memory.optimizer_state": "int8"}, "memory", "training", "backward",
                           "memory.optimizer_state='int8'"),
    "masks": ("prune", {"prune.method": "l1_unstructured", "prune.amount": 0.5}, "pruning", "after_training",
              "forward", "prune.method='l1_unstructured'"),
    "int8 weight dtype": ("int8", {"quant.method": "dynamic", "quant.flow": "legacy"}, "quant", "after_training",
                          "forward", "quant.method='dynamic'"),
    "deepcopy, int8": ("deepcopy", {"quant.method": "dynamic", "quant.flow": "legacy"}, "quant", "after_training",
                       "__deepcopy__", "quant.flow='legacy'"),
    "state_dict": ("state_dict", {}, "baseline", "measure", "state_dict", "no technique"),
    "final evaluation": ("evaluate", {}, "baseline", "evaluate", "forward", "no technique"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fault_is_one_line_and_a_failed_record_naming_the_models_line(case):
    fault, overrides, technique, stage, function, tried = CASES[case]
    r = run(_cfg(fault, **overrides), on_error="record")
    f = r.details["failure"]
    assert r.status == "failed" and failed(r.status), r.error
    assert "\n" not in r.error and "Traceback" not in r.error
    assert (f["technique"], f["stage"], f["in_user_code"]) == (technique, stage, True), r.error
    assert re.search(rf"{re.escape(FILE)}:\d+ in {function}\b", f["where"]), f["where"]
    assert f["model"] == f"Faulty ({FILE})" and f["code"] and tried in f["tried"]
    assert r.error == (f"{technique} failed at {stage} on Faulty ({FILE}): {f['exception']}: {f['message']} at "
                       f"{f['where']} `{f['code']}`; tried {f['tried']}; {f['hint']}")
    assert ("run without it" in f["hint"]) == (technique != "baseline")
    assert f["frames"] and all(":" in line for line in f["frames"])
    if fault == "int8":  # torch's own error, on the user's line that reads .weight.dtype
        assert f["exception"] == "AttributeError" and "weight.dtype" in f["code"]
    else:
        assert f["exception"] == "InjectedFault"


def test_a_technique_that_can_take_another_way_does_and_says_so():
    """torch.export cannot trace a forward that raises while traced: dynamic int8 takes the legacy flow, which
    swaps modules (no tracing), and the record says why; the run is ok and its int8 layers are counted."""
    r = run(_cfg("compile", **{"quant.method": "dynamic"}))
    q = r.details["quant"]
    assert r.status == "ok" and q["flow"] == "legacy" and q["flow_asked"] == "pt2e"
    assert q["swap"]["n_swapped"] == 3 and r.int8_macs_per_sample > 0
    assert any("fell back to legacy" in w and "InjectedFault" in w for w in r.why), r.why


@pytest.mark.slow  # two Inductor compiles of the int8 graph (batch 1, then the one that fails)
def test_a_graph_inductor_cannot_compile_takes_the_legacy_flow_and_says_so():
    """PT2E dynamic int8 of a Linear -> ReLU -> residual block: where torchao's Inductor pass asserts on it (at
    the run's evaluation batch, after quantization), the legacy flow takes the model and the record says why;
    where it compiles, the PT2E graph runs int8. Never a failed run."""
    r = run(_cfg("none", **{"quant.method": "dynamic"}), on_error="record")
    assert r.status == "ok", r.error
    q = r.details["quant"]
    if q["flow"] == "legacy":
        assert q["flow_asked"] == "pt2e" and "Inductor could not compile the int8 graph" in q["flow_fallback"]
        assert any("fell back to legacy" in w for w in r.why) and q["swap"]["n_swapped"] == 3
    else:
        assert q["swap"]["graph"]["int8_linear"] == 3


def test_on_error_raise_keeps_the_exception_and_adds_the_line():
    with pytest.raises(RuntimeError) as err:  # the spec's own InjectedFault (the file is loaded apart)
        run(_cfg("autocast", **{"precision.dtype": "bf16"}))
    assert type(err.value).__name__ == InjectedFault.__name__
    failure = getattr(err.value, FAILURE)
    assert failure.technique == "precision" and failure.line() in err.value.__notes__


class _Tracer(Technique):
    """A technique whose preflight runs the model under autocast (as a tracer or a probe would)."""

    name = "tracer"

    def preflight(self, ctx, model) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(ctx.data.train[0][:2])


def test_a_model_that_raises_in_a_techniques_preflight_is_refused_before_training():
    events: list[dict] = []
    chain = TechniqueChain([*default_chain(), _Tracer()])
    with pytest.raises(ValueError) as err:
        run(_cfg("autocast"), techniques=chain, progress=events.append)
    msg = str(err.value)
    assert msg.startswith("tracer refused at preflight on Faulty") and "\n" not in msg
    assert re.search(rf"{re.escape(FILE)}:\d+ in forward", msg) and "run without tracer" in msg
    assert not [e for e in events if "step" in e]


def test_the_command_line_prints_the_line_never_a_traceback(capsys):
    from lab.cli import main

    code = main(["run", "--workload", f"{SPEC}:STATE_DICT", "--size", "tiny", "--threads", "1", "--no-store",
                 "--no-progress", "--warmup-steps", "1", "--latency-repeats", "0"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    assert "status=failed" in out and f"baseline failed at measure on Faulty ({FILE})" in out


def test_a_data_parallel_rank_that_raises_names_the_models_line():
    """DDP x 2 (one spawn): the rank's exception reaches the launcher as the rank's one line."""
    from lab.distributed import RankFailure

    with pytest.raises(RankFailure) as err:
        run(_cfg("backward", batch_size=16, **{"ddp.world_size": 2, "ddp.timeout_s": 60}), on_error="record")
    msg = str(err.value)
    assert "\n" not in msg and re.search(r"rank \d raised InjectedFault: distributed\+?\w* failed at training", msg)
    assert re.search(rf"{re.escape(FILE)}:\d+ in backward", msg), msg


def test_a_workload_whose_data_code_raises_is_refused_before_any_work_naming_its_line():
    with pytest.raises(ValueError, match=rf"make_data raised InjectedFault: fault injected in make_data at "
                                         rf"{re.escape(FILE)}:\d+ in make_data") as err:
        run(_cfg("bad_data"))
    assert "\n" not in str(err.value)
