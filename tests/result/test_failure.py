"""lab.result.failure on its own: where a failure is placed when the model's files are not in the traceback, and
which statuses count as failed (the run-level behaviour is tests/e2e/test_failures.py)."""

from __future__ import annotations

import torch
from torch import nn

from lab.config import RunConfig
from lab.result.failure import describe, failed, first_line, tag, tagged


def _caught(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the exception is the subject
        return exc
    raise AssertionError("did not raise")


def test_a_value_error_of_the_labs_own_code_is_a_refusal_placed_in_the_lab():
    exc = _caught(lambda: RunConfig(threads=-3))
    f = describe(exc, model=nn.Linear(2, 2), technique="baseline", stage="check", tried="the plain run")
    assert f.status == "refused" and not f.in_user_code and f.where.startswith("lab/config/")
    assert "(the lab's code, not the model's)" in f.line() and "\n" not in f.line()
    assert f.model.startswith("Linear (")


def test_a_torch_error_outside_the_models_files_is_a_failure_not_blamed_on_the_lab():
    exc = _caught(lambda: torch.zeros(2) @ torch.zeros(3))
    f = describe(exc, model=None, technique="quant", stage="after_training", tried="quant.method='dynamic'")
    assert f.status == "failed" and not f.in_user_code and "the lab's code" not in f.line()
    assert f.where.startswith("tests/result/test_failure.py:") and "run without it" in f.hint
    assert f.model == "the model"


def test_the_innermost_stage_tags_an_exception_and_messages_keep_one_line():
    exc = RuntimeError("first\nsecond")
    tag(exc, "quant", "after_training")
    tag(exc, "pruning", "after_training")
    assert tagged(exc) == ("quant", "after_training") and first_line(exc) == "first"
    assert [failed(s) for s in ("ok", "diverged", "error", "failed", "refused")] == [False, False, True, True, True]
