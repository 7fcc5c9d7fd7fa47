"""Command line: ``python -m lab run | runs | export | ablate | project | recipe | recommend | bench | doctor |
crossover | threads | machine``.

One module per subcommand (``lab/cli/<name>.py``: ``NAME``, ``HELP``, ``add_arguments(parser)``,
``main(args) -> int``), listed in :data:`SUBCOMMANDS`. The configuration flags of ``run``, ``ablate``, ``recipe`` and
``doctor`` mirror :class:`lab.config.RunConfig`: a top-level field ``batch_size`` is ``--batch-size``, a family
field ``data.num_workers`` is ``--data-num-workers``, and the common ones have short aliases (``--precision``,
``--loader``, ``--num-workers``, ``--prune``, ``--quant``, ``--world-size``). Flags are generated from the
dataclasses, so a new config field is a new flag with no CLI change, and a field whose values live in a
registry (``data.loader``, ``data.storage``) offers that registry's names. Every flag has a help line: a config
flag's is its field's ``HELP`` line with the allowed values and the default. Gradient accumulation is
``--grad-accum-steps`` (``--ddp-grad-accum-steps``: a deprecated alias). The threads study is ``threads``
(``crossover --threads-study``: a deprecated alias). The results store is ``--store``
everywhere (``--db``: a deprecated alias); ``--json`` prints JSON instead of the text and ``--json PATH`` writes
it there. Every user error is one line on stderr and exit status 2, never a
traceback; a failed rank is exit 1; Ctrl-C is exit 130.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import PurePath
from types import TracebackType
from typing import Any

from lab.cli import (
    ablate,
    bench,
    crossover,
    doctor,
    export,
    machine,
    project,
    recipe,
    recommend,
    run,
    runs,
    threads,
)
from lab.cli.options import UsageError, config_from_args
from lab.distributed.launch import RankFailure

#: The subcommands, in ``--help`` order.
SUBCOMMANDS = (run, runs, export, ablate, project, recipe, recommend, bench, doctor, crossover, threads, machine)
#: Subcommands that load ``LAB_WORKLOADS`` first, so a broken entry is one line even for a built-in run.
LOADS_WORKLOADS = ("run", "ablate", "doctor", "project", "recipe", "recommend")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m lab", description="Training-efficiency lab")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in SUBCOMMANDS:
        command.add_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def _from_resource_sharer(exc_type: type[BaseException] | None, tb: TracebackType | None) -> bool:
    """A connection error raised in multiprocessing's resource sharer (``multiprocessing/resource_sharer.py``)."""
    if exc_type is None or not issubclass(exc_type, (ConnectionError, EOFError)):
        return False
    return any(PurePath(f.filename).parts[-2:] == ("multiprocessing", "resource_sharer.py")
               for f in traceback.extract_tb(tb))


def quiet_worker_handshakes() -> None:
    """Leave out of stderr the traceback of a DataLoader worker's fd handshake that a Ctrl-C cut short.

    A worker hands its batches' shared-memory file descriptors to the main process through multiprocessing's
    resource-sharer thread, which reports any error by calling ``sys.excepthook`` itself. Ctrl-C reaches the
    workers too (one process group), and a handshake it cut printed ``ConnectionResetError`` above
    "lab: interrupted", intermittently (the fault suite caught it on an AMD EPYC, 2 runs in 8 with the other core
    busy). Set before the loaders fork their workers, the filter is theirs too. Only that module's connection
    errors are left out: a dead worker is still reported by the DataLoader in the main thread. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "_lab_quiet", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not _from_resource_sharer(exc_type, tb):
            previous(exc_type, exc, tb)

    hook._lab_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _half_built_loader(unraisable: Any) -> bool:
    """A DataLoader iterator whose ``__init__`` a Ctrl-C cut short (before it had ``_workers``), complaining from its
    ``__del__``: torch prints that as "Exception ignored in ... AttributeError: ... '_workers'"."""
    return (isinstance(unraisable.exc_value, AttributeError) and "_workers" in str(unraisable.exc_value)
            and "DataLoaderIter.__del__" in repr(unraisable.object))


def catch_interrupts() -> None:
    """Ctrl-C sets :data:`lab.loop.INTERRUPTED` before raising ``KeyboardInterrupt``, and a KeyboardInterrupt that
    Python could not raise (one inside an at-fork handler while a DataLoader starts its workers: reported to
    ``sys.unraisablehook``) is not printed as a traceback: the flag stops the work at the next step or run; nor is
    the ``__del__`` complaint of the DataLoader iterator that Ctrl-C cut short (:func:`_half_built_loader`).
    Only in the main thread (signal handlers live there); idempotent."""
    import signal
    import threading

    from lab.loop import INTERRUPTED

    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigint(signum: int, frame: Any) -> None:
        INTERRUPTED.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    previous = sys.unraisablehook
    if getattr(previous, "_lab_quiet", False):
        return

    def unraisable(info: Any) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):
            INTERRUPTED.set()
            return
        if _half_built_loader(info):  # the same Ctrl-C, seen from the iterator it cut short: said once, by the flag
            return
        previous(info)

    unraisable._lab_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = unraisable


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 a run failed, 2 a usage or configuration error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_worker_handshakes()
    catch_interrupts()
    try:
        args = build_parser().parse_args(argv)
        if args.command in LOADS_WORKLOADS:
            from lab.workloads import list_workloads

            list_workloads()
        return next(c for c in SUBCOMMANDS if args.command == c.NAME).main(args)
    except SystemExit as exc:  # argparse's --help
        return int(exc.code or 0)
    except (UsageError, ValueError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 2
    except RankFailure as exc:  # a data-parallel rank died, hung or raised: the job failed, one line names it
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130


__all__ = ["SUBCOMMANDS", "UsageError", "build_parser", "catch_interrupts", "config_from_args", "main",
           "quiet_worker_handshakes"]


if __name__ == "__main__":
    sys.exit(main())
