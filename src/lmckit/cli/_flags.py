"""The library's parameters as a command's flags: where the command line translates.

The library words its errors and hints with Python's names (``t``, ``circuits=True``,
:mod:`lmckit._errors`); :func:`flag_spelling` writes the same parameters as the
flags of the command being run (``--t``, ``--circuits``, ``--method learned``), read
from the command's own options, so that no message is spelled twice.
"""

from __future__ import annotations

import click

from lmckit._errors import UNSET, Param, Spelling, python_spelling

__all__ = ["flag_spelling"]


def _flag(param: Param, options: dict[str, click.Option]) -> click.Option | None:
    """The option that sets ``param``: by its name, its flag, or (a choice made by a flag
    of its own, ``fix='repair'`` as ``--repair``) by its value."""
    dashed = "--" + param.name.replace("_", "-")
    by_flag = {o: opt for opt in options.values() for o in opt.opts + opt.secondary_opts}
    found = options.get(param.name) or by_flag.get(dashed)
    if found is None and isinstance(param.value, str):
        own = by_flag.get("--" + param.value.replace("_", "-"))
        if own is not None and own.is_flag:
            return own
    return found


def _spelled(param: Param, option: click.Option) -> str:
    flag = option.opts[0]
    if param.value is UNSET or option.is_flag and isinstance(param.value, str):
        return flag
    if option.is_flag and isinstance(param.value, bool):
        if param.value or not option.secondary_opts:
            return flag if param.value else f"no {flag}"
        return option.secondary_opts[0]
    return f"{flag} {param.value}"


def flag_spelling(command: click.Command | None) -> Spelling:
    """How ``command`` writes a parameter: ``--t``, ``--circuits`` / ``--no-circuits``,
    ``--method learned``; a parameter it has no option for keeps Python's words."""
    options = {
        p.name: p for p in (command.params if command else []) if isinstance(p, click.Option)
    }
    options = {k: v for k, v in options.items() if k is not None}

    def spell(param: Param) -> str:
        option = _flag(param, options)
        return python_spelling(param) if option is None else _spelled(param, option)

    return spell
