"""Spaces the graph proposes that cannot act together, left out one by one.

Inference reads spaces off the graph and proposes more (rotary query/key bases, experts,
gated scales). A proposal can clash with the rest: one parameter axis claimed by two
spaces that are not nested in each other, two spaces of one name, a group that cannot act
on a norm's elementwise weight, nested spaces that are not one per unit of their parent.
Such a clash is a fact about one space, not about the model: :func:`resolve` leaves that
space out (with the spaces nested in it), says why in one line, and keeps the rest, which
the check of the function then verifies. A command fails only when nothing is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from lmckit.symmetry._space_rules import fit_problems, structural_problems
from lmckit.symmetry._transform import Space, SymmetrySpec

__all__ = ["admissible", "first_problem", "resolve"]


def resolve(
    spaces: Sequence[Space], params: Mapping[str, Tensor] | None = None
) -> tuple[list[Space], list[str]]:
    """``spaces`` without those that break a structural rule of a spec (or, given
    ``params``, do not fit them), and the spaces nested in those; one line per space
    left out, saying why.

    Of two spaces in conflict the later one is left out (a parent comes before what is
    nested in it, the spaces read off the graph before the proposals added to them).
    """
    kept = list(spaces)
    notes: list[str] = []
    for _ in range(len(kept) + 1):
        problems = structural_problems(kept)
        if not problems and params is not None:
            problems = fit_problems(kept, params)
        if not problems:
            return kept, notes
        gone: set[int] = set()
        for index, problem in problems:
            if index in gone:
                continue
            space = kept[index]
            # what is nested in it goes with it (unless another space has its name: the
            # nested spaces may be that one's)
            alone = sum(s.name == space.name for s in kept) == 1
            inner = [i for i, s in enumerate(kept)
                     if alone and s.nest is not None and s.nest.parent == space.name]  # fmt: skip
            gone |= {index, *inner}
            also = f" (with {len(inner)} spaces nested in it)" if inner else ""
            group = type(space.group).__name__
            notes.append(f"{space.name} ({group}, n={space.n}){also}: {problem}, so it is left out")
        kept = [s for i, s in enumerate(kept) if i not in gone]
    raise AssertionError("resolving conflicts did not settle")  # pragma: no cover


def admissible(
    spaces: Sequence[Space], params: Mapping[str, Tensor] | None = None
) -> SymmetrySpec | None:
    """The spec of ``spaces`` if they obey every structural rule (and fit ``params``),
    else None: a proposal that cannot be added as it is."""
    return None if first_problem(spaces, params) is not None else SymmetrySpec(tuple(spaces))


def first_problem(
    spaces: Sequence[Space],
    params: Mapping[str, Tensor] | None = None,
    *,
    added: Sequence[Space] | None = None,
) -> str | None:
    """Why ``spaces`` cannot be a spec (fitting ``params``), or None if they can.
    ``added``: only these of them are new, the rest fit already (checked for fit alone)."""
    problems = structural_problems(spaces)
    if not problems and params is not None:
        problems = fit_problems(spaces if added is None else added, params)
    return problems[0][1] if problems else None
