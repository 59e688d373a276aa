"""Named entries of one extension type: the machinery behind every lmckit registry.

Models, aligners, merge methods and experiments are each registered by name with a
decorator and looked up with ``list_*`` / ``get_*``. A :class:`Registry` holds the
entries of one type: a name is taken once (a second registration under it is an
error, not a silent replacement), and an unknown name is a ``KeyError`` that lists the
valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from lmckit._errors import Param, ParameterError

__all__ = ["Declared", "Registry", "check_needs", "summary"]

T = TypeVar("T")


def summary(entry: object) -> str:
    """The first line of ``entry``'s docstring (``""`` without one): what a listing shows."""
    return ((getattr(entry, "__doc__", None) or "").strip().splitlines() or [""])[0]


class Registry(Generic[T]):
    """Entries of one kind by name.

    Args:
        kind: what an entry is, for messages (``"aligner"``: "unknown aligner 'x';
            known aligners: ...").
        load: called before every lookup, for registries whose entries register
            themselves when their modules are imported (it imports them).
    """

    def __init__(self, kind: str, *, load: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._load = load
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        """Register ``entry`` under ``name``; ``ValueError`` if the name is taken."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            self._load()
        return self._entries

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._loaded())

    def get(self, name: str) -> T:
        """The entry of ``name``; ``KeyError`` listing the valid names if there is none."""
        entries = self._loaded()
        try:
            return entries[name]
        except KeyError:
            known = ", ".join(sorted(entries))
            raise KeyError(f"unknown {self.kind} {name!r}; known {self.kind}s: {known}") from None


class Declared(Protocol):
    """What a registered method declares it needs (aligners and merge methods alike)."""

    @property
    def needs_data(self) -> bool: ...

    @property
    def needs_model(self) -> bool: ...


def check_needs(
    chosen: Param,
    info: Declared,
    *,
    data: bool,
    model: bool = True,
    names: tuple[str, str] = ("data", "model"),
) -> None:
    """Refuse a method run without what it declares it needs: the one check of a
    declared need, for every registry.

    Args:
        chosen: the parameter that chose the method, as the caller named it
            (``Param("method", "learned")``, ``Param("fix", "repair")``).
        info: the method's registry entry.
        data, model: whether the run has data and a model.
        names: the caller's parameters that give the data and the model.

    Raises:
        ParameterError: naming the method and what it lacks.
    """
    if info.needs_model and not model:
        raise ParameterError("{chosen} runs the network: give {model}", chosen=chosen,
                             model=names[1])  # fmt: skip
    if info.needs_data and not data:
        raise ParameterError("{chosen} needs training data: give {data}", chosen=chosen,
                             data=names[0])  # fmt: skip
