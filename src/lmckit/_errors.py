"""Errors in what the caller asked for, worded for whoever asked: Python or the command line.

The library names its parameters as Python spells them (``t``, ``method='learned'``,
``circuits=True``); the command line names the same ones as flags (``--t``,
``--method learned``, ``--circuits``). A message is written once, as a template whose
``{fields}`` are parameters (:class:`Param`); :class:`ParameterError` renders it in
Python's words, and the command line renders the same template with its flags
(:meth:`ParameterError.render`, called in one place: :mod:`lmckit.cli`). Text that is not
an error but names a parameter (a hint printed beside a result) is a :class:`Worded`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "UNSET",
    "Param",
    "ParameterError",
    "Spelling",
    "Worded",
    "literal",
    "python_spelling",
    "worded",
]

#: ``Param.value`` of a parameter named without a value (``t``, not ``t=0.5``).
UNSET: object = object()


@dataclass(frozen=True)
class Param:
    """A parameter named in a message, with the value it is named with (if any).

    Attributes:
        name: the Python parameter's name (``"head_bases"``).
        value: the value it is named with (``True``: ``head_bases=True``); unset: the
            name alone.
    """

    name: str
    value: object = UNSET


#: How a parameter is written: Python's words (:func:`python_spelling`) or a command's flags.
Spelling = Callable[[Param], str]


def python_spelling(param: Param) -> str:
    """``name`` or ``name=value`` (the value's ``repr``), as a Python caller writes it."""
    return param.name if param.value is UNSET else f"{param.name}={param.value!r}"


def _params(named: Mapping[str, Param | str]) -> dict[str, Param]:
    return {k: v if isinstance(v, Param) else Param(v) for k, v in named.items()}


@dataclass(frozen=True)
class Worded:
    """Text that names parameters: a ``str.format`` template and its fields.

    Attributes:
        template: the text; each ``{field}`` is a key of ``params`` (literal braces
            doubled).
        params: the parameters the fields name.
    """

    template: str
    params: Mapping[str, Param] = field(default_factory=dict)

    def render(self, spelling: Spelling = python_spelling) -> str:
        """The text with every parameter written by ``spelling``."""
        try:
            return self.template.format_map({k: spelling(p) for k, p in self.params.items()})
        except (KeyError, ValueError, IndexError):  # a stray brace: the text as written
            return self.template

    def __str__(self) -> str:
        return self.render()


def literal(text: object) -> str:
    """``text`` for a template, its braces doubled (a path, a value the caller gave)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def worded(template: str, **params: Param | str) -> Worded:
    """A :class:`Worded`; a ``str`` field value is a parameter named without a value."""
    return Worded(template, _params(params))


class ParameterError(ValueError):
    """A parameter's value, or a combination of values, the library refuses.

    ``str(err)`` is the message in Python's words (``"t must lie in [0, 1], got 2"``);
    :meth:`render` writes it with another spelling (the command line's flags).

    Args:
        template: the message, a ``str.format`` template whose fields are parameters
            (literal braces doubled).
        params: each field's parameter (a ``str``: named without a value).
    """

    def __init__(self, template: str, **params: Param | str) -> None:
        self.worded = Worded(template, _params(params))
        super().__init__(self.worded.render())

    def render(self, spelling: Spelling) -> str:
        """The message with every parameter written by ``spelling``."""
        return self.worded.render(spelling)
