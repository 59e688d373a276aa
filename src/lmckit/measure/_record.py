"""Results kept as JSON: one way to write them, read them back and refuse a bad file.

A result class defines ``to_dict`` (its JSON form) and ``_from_fields`` (the inverse,
free to raise ``KeyError`` or ``TypeError`` on a missing or mistyped field); this
mixin adds :meth:`JsonRecord.to_json`, :meth:`JsonRecord.from_dict` and
:meth:`JsonRecord.load`, so that a hand-edited or truncated file is a one-line
``ValueError`` naming the result, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

__all__ = ["JsonRecord"]


class JsonRecord:
    """Mixin: JSON text, dict and file forms of a result (module docstring)."""

    #: what the result is called in errors, e.g. ``"path result"``
    record_name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _from_fields(cls, data: Mapping[str, Any]) -> Self:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read :meth:`to_dict`'s form back; a ``ValueError`` names what is missing."""
        try:
            return cls._from_fields(data)
        except KeyError as err:
            raise ValueError(f"{cls.record_name} is missing {err}") from None
        except TypeError as err:
            # e.g. "loss": null or "meta": 3 in a hand-edited JSON file
            raise ValueError(f"{cls.record_name} is malformed: {err}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls.from_dict(json.loads(Path(path).read_text()))
