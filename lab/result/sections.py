"""Where a technique family's figures live in a record: ``result.details[<family name>]``, the name the family is
registered under (:data:`lab.registry.FAMILIES`), so a reader who knows the family knows the key.

Why an alias table: records were once filed under the config's keys or an option's name (``details["prune"]`` for
the pruning family, ``details["ddp"]`` for distributed, ``details["compile"]`` for compute), and results databases
and JSON files written then are still read. :data:`OLD_SECTION_NAMES` is the one place those old keys are known:
:func:`in_current_names` renames them when a record is loaded (:meth:`lab.result.RunResult.from_dict`), and
:func:`section`, the one accessor a reader uses, also reads them from a plain ``details`` dict that did not come
through a record (a JSON file read as it is). Nothing new is written under an old key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: An old top-level ``details`` key -> the registered name of the family whose figures it held.
OLD_SECTION_NAMES: dict[str, str] = {"prune": "pruning", "ddp": "distributed", "compile": "compute"}


def _details(record: Any) -> Mapping[str, Any]:
    """``record.details`` of a :class:`lab.result.RunResult`, or a ``details`` dict itself."""
    return (record.details if hasattr(record, "details") else record) or {}


def section(record: Any, family: str) -> dict[str, Any]:
    """The family ``family``'s figures in ``record`` (a ``RunResult`` or its ``details`` dict), read
    under its registered name or, in a record stored before, its old key; ``{}`` where the family wrote none.
    The dict returned is the record's own (a caller that updates it updates the record)."""
    details = _details(record)
    found = details.get(family)
    if found is None:
        found = next((details[old] for old, new in OLD_SECTION_NAMES.items() if new == family and old in details),
                     None)
    return found if isinstance(found, dict) else {}


def in_current_names(details: Mapping[str, Any]) -> dict[str, Any]:
    """``details`` with every old section key renamed to its family's name (a new key present wins over an old
    one); other keys, and the order, kept."""
    out: dict[str, Any] = {}
    for key, value in details.items():
        new = OLD_SECTION_NAMES.get(key, key)
        if new != key and new in details:
            continue  # the current name is there too: the record already speaks today's names
        out[new] = value
    return out


__all__ = ["OLD_SECTION_NAMES", "in_current_names", "section"]
