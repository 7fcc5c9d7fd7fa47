"""What every family's config shares: a name prefix for errors, an on/off test, help per field, and the rule
that a family field given while its family is off is an error (it would be silently ignored).

One module per family's config beside this one (``lab/config/<key>.py``, the key being its ``RunConfig`` field):
the config is a value below the families (an ablation derives arms from it, a stored run is read back into it),
so it cannot live in the family's package, which imports the layers above the config.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import ClassVar

from lab.config.checks import fail


class _Family:
    """Shared behaviour of the per-family configs: a prefix for error messages, an on/off test, and the
    rule that a family flag given while its family is off is an error (it would be silently ignored)."""

    family: ClassVar[str] = ""
    #: What switches the family on, for the "needs ..." message.
    SWITCH: ClassVar[str] = ""
    #: Fields that still mean something while the family is off.
    OFF_OK: ClassVar[tuple[str, ...]] = ()
    #: Field name -> one line saying what it means (unit where it has one): its flag's help; the CLI adds the
    #: allowed values and the default (:mod:`lab.config.flags`).
    HELP: ClassVar[dict[str, str]] = {}
    #: Field name -> the values it may take (the tuple its check validates against): its flag's help lists them
    #: (:mod:`lab.config.flags`), so a family states them once, beside the field, and the CLI names no family.
    ALLOWED: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def enabled(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def _name(self, attr: str) -> str:
        return f"{self.family}.{attr}"

    def _refuse_when_off(self) -> None:
        if self.enabled:
            return
        for f in fields(self):  # type: ignore[arg-type]
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            if f.name not in self.OFF_OK and getattr(self, f.name) != default:
                fail(self._name(f.name), getattr(self, f.name),
                     f"needs {self.SWITCH}: the family is off, so the value would be silently ignored")
