"""A technique's exception turned into one line and a record: no traceback reaches the user.

Why one place: a user's model meets a technique at many moments (prepared before training, trained under a
policy, pruned, converted to int8, evaluated, measured), and each moment once ended a run in a torch traceback
whose last lines are the lab's or torch's, rarely the user's. :class:`lab.technique.TechniqueChain` tags an
exception with the technique and the stage it ran (:func:`tag`); :func:`lab.train.run` tags what the run does
itself (the fit, the evaluations, the measurements) and turns whatever escaped into a :class:`Failure`
(:func:`describe`): the technique, the stage, the exception in one line, the line of the *user's* code that
raised (the last frame of the traceback inside a file of the model's own classes or of the workload's
functions), what the lab tried (the family's settings) and what the user can do.

``status``: ``refused`` where the lab itself declined mid-run (a ``ValueError`` raised in the lab's code: it
carries its own reason and way out), ``failed`` otherwise. Before any work a refusal is still raised as a
``ValueError`` (one line, exit status 2 on the command line), never recorded.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sysconfig
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

#: Statuses of a run that did not finish its work: ``error`` (records stored before a failure and a refusal
#: were told apart), ``failed``, ``refused``. Readers of records test membership here, never ``== "error"``.
FAILED_STATUSES: tuple[str, ...] = ("error", "failed", "refused")
#: The attribute :func:`tag` sets on an exception: ``(technique, stage)`` of the innermost technique stage it left.
TAG = "_lab_stage"
#: The attribute :func:`lab.train.run` sets on an exception it re-raises: its :class:`Failure`.
FAILURE = "lab_failure"

_LAB = Path(__file__).resolve().parents[1]  # the lab package
_TORCH_PREFIXES = ("torch", "torchao", "torch_pruning", "lab", "builtins", "functools", "typing", "abc")
_STDLIB = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def failed(status: str | None) -> bool:
    """Whether a record's ``status`` says it did not finish (``error`` / ``failed`` / ``refused``)."""
    return status in FAILED_STATUSES


def tag(exc: BaseException, technique: str, stage: str) -> None:
    """Remember on ``exc`` the technique and stage it left first (an inner stage wins over an outer one: a QAT
    fine-tune inside ``quant.after_training`` stays quant's)."""
    if getattr(exc, TAG, None) is None:
        with contextlib.suppress(AttributeError, TypeError):  # an exception type with __slots__: left untagged
            setattr(exc, TAG, (technique, stage))


def tagged(exc: BaseException) -> tuple[str, str] | None:
    return getattr(exc, TAG, None)


@dataclass(frozen=True)
class Failure:
    """What went wrong, in the words the record and the one line use."""

    status: str  # "failed" | "refused"
    technique: str  # a family ("quant"), several ("precision+compute") or "baseline" (no family on)
    stage: str  # "after_training", "training", "evaluate", "measure", ...
    exception: str  # the exception's type name
    message: str  # its message's first line
    model: str  # the model's class, module-qualified
    where: str | None  # "file.py:LINE in function": the last frame in the user's code (else the lab's, said)
    code: str | None  # that source line
    in_user_code: bool
    tried: str  # what the lab did at that stage (the family's settings)
    hint: str  # what the user can do

    def line(self) -> str:
        """One line: who failed at which stage, the exception, where, what was tried and what to do."""
        where = ""
        if self.where:
            code = f" `{self.code}`" if self.code else ""
            where = f" at {self.where}{code}" + (" (the lab's code, not the model's)" if self.where.startswith("lab/")
                                                 and not self.in_user_code else "")
        return (f"{self.technique} {self.status} at {self.stage} on {self.model}: {self.exception}: "
                f"{self.message}{where}; tried {self.tried}; {self.hint}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def user_files(model: nn.Module | None, functions: Iterable[Callable | None] = ()) -> set[str]:
    """Files of the user's code: those defining the classes of ``model``'s modules (and their bases) outside
    torch and the lab, and those defining ``functions`` (a workload's ``make_model``, ``loss``, ``evaluate``)."""
    files: set[str] = set()
    classes = {cls for m in (model.modules() if model is not None else ()) for cls in type(m).__mro__}
    for cls in classes:
        if cls.__module__.split(".")[0] in _TORCH_PREFIXES:
            continue
        try:
            files.add(str(Path(inspect.getsourcefile(cls) or "").resolve()))
        except (TypeError, OSError):
            continue
    for fn in functions:
        code = getattr(fn, "__code__", None)
        if code is not None:
            files.add(str(Path(code.co_filename).resolve()))
    return {f for f in files if f and not f.startswith(str(_LAB)) and not f.startswith(_STDLIB)}


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc`` and of the exceptions it was raised from or during, causes first."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return [f for e in reversed(chain) for f in traceback.extract_tb(e.__traceback__)]


def _short(path: str) -> str:
    """``path`` relative to the lab's checkout (``lab/quant/int8.py``, ``tests/...``), else to the working
    directory, else as it is."""
    p = Path(path).resolve()
    for root in (_LAB.parent, Path.cwd()):
        if p.is_relative_to(root):
            return str(p.relative_to(root))
    return str(p)


def raised_at(exc: BaseException, files: set[str]) -> tuple[str | None, str | None, bool]:
    """``(where, code, in_user_code)``: the last frame of ``exc``'s traceback in one of ``files``; else the last in
    the lab's code; else the last frame."""
    frames = _frames(exc)
    mine = [f for f in frames if str(Path(f.filename).resolve()) in files]
    lab = [f for f in frames if str(Path(f.filename).resolve()).startswith(str(_LAB))]
    frame = (mine or lab or frames or [None])[-1]
    if frame is None:
        return None, None, False
    code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip() or None
    return f"{_short(frame.filename)}:{frame.lineno} in {frame.name}", code, bool(mine)


def _class_name(cls: type) -> str:
    """``Faulty (tests/faulty_models.py)``: a class by its file, whose module name a spec loader made up."""
    try:
        return f"{cls.__qualname__} ({_short(inspect.getsourcefile(cls) or '')})"
    except (TypeError, OSError):
        return f"{cls.__module__}.{cls.__qualname__}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:400] if text else type(exc).__name__


def describe(exc: BaseException, *, model: nn.Module | None, functions: Iterable[Callable | None] = (),
             technique: str, stage: str, tried: str, hint: str | None = None,
             status: str | None = None) -> Failure:
    """The :class:`Failure` of ``exc``, raised while ``technique`` ran ``stage`` on ``model``. ``hint`` (what to
    do) defaults to one derived from where it raised; ``status`` to ``refused`` for the lab's own ``ValueError``
    and ``failed`` otherwise."""
    where, code, mine = raised_at(exc, user_files(model, functions))
    lab_refusal = isinstance(exc, ValueError) and not mine and where is not None and where.startswith("lab/")
    status = status or ("refused" if lab_refusal else "failed")
    model_name = "the model" if model is None else _class_name(type(model))
    if hint is None:
        off = "run without it" if technique != "baseline" else "check the model on one batch"
        if mine:
            hint = f"the model's own code raised under {technique}: fix that line, or {off}"
        elif lab_refusal:
            hint = "the lab declined (its reason above)"
        else:
            hint = f"{off}, and report the lab's line above with the model if the model is not at fault"
    return Failure(status=status, technique=technique, stage=stage, exception=type(exc).__name__,
                   message=first_line(exc), model=model_name, where=where, code=code, in_user_code=mine,
                   tried=tried, hint=hint)


def frames_text(exc: BaseException, limit: int = 6) -> list[str]:
    """The last ``limit`` frames as ``file:line in function``: kept in the record for whoever debugs it, in place
    of a traceback."""
    return [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in _frames(exc)[-limit:]]


__all__ = ["FAILED_STATUSES", "FAILURE", "Failure", "describe", "failed", "first_line", "frames_text",
           "raised_at", "tag", "tagged", "user_files"]
