"""One cell of a models x techniques matrix (tests/e2e/test_gallery.py, tests/e2e/test_zoo.py): the run trains, or
``lab.run`` refuses it before any training step, in one line that says why. Never a traceback mid-run, never a
silent no-op: what each cell's record must show is the caller's check."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lab import RunConfig, RunResult, run


def run_cell(cfg: RunConfig, refusal: Sequence[str] | None) -> RunResult | None:
    """``run(cfg)``'s result; where ``refusal`` lists words, instead check that the run is refused with a one-line
    ``ValueError`` holding every word, before a training step or the first evaluation, and return ``None``."""
    events: list[dict] = []
    if refusal is None:
        return run(cfg, progress=events.append)
    with pytest.raises(ValueError) as err:
        run(cfg, progress=events.append)
    msg = str(err.value)
    assert "\n" not in msg and all(word in msg for word in refusal), msg
    assert not [e for e in events if "step" in e or e.get("phase") == "eval_before"]  # nothing trained
    return None
