"""Spaces that fail the symmetry check: left out, or replaced by what of them holds.

Inference proposes spaces from the graph; the function has the last word. A space whose
random element changes the outputs is not kept, and is not allowed to take the rest of
the spec with it (:func:`drop_failing`, used by
:func:`lmckit.inference.analyze_symmetries`):

* a space that moves whole units (attention heads) is left out, and the spaces nested in
  it stay, one per unit, nested in nothing: the bases inside heads whose order is fixed
  still move head by head (they are verified again);
* a space whose group has a smaller one (an orthogonal map: a permutation) is kept in
  that group if the check accepts it (nested spaces of one kind change together: they
  must stay alike);
* anything else is left out, with the spaces nested in it.

Each gets a one-line reason. Spaces that keep the outputs alone but not together are
kept in spec order as long as they keep them together.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from lmckit.groups import CenteredOrthogonal, Group, Invertible, Orthogonal, Permutation
from lmckit.inference._check import FunctionCheck, SpecCheckError, verify
from lmckit.inference._check_elements import random_check_element
from lmckit.inference._conflicts import resolve
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform

__all__ = ["drop_failing", "smaller_group"]


def smaller_group(group: Group) -> Group | None:
    """The largest proper subgroup worth trying when ``group`` fails the check (an
    invertible map: orthogonal; an orthogonal map: a permutation), else None."""
    if isinstance(group, Invertible):
        return Orthogonal()
    if isinstance(group, Orthogonal | CenteredOrthogonal):
        return Permutation()
    return None


def drop_failing(
    check: FunctionCheck,
    module: nn.Module,
    spec: SymmetrySpec,
    *,
    seed: int = 0,
    rtol: float = 1e-5,
) -> tuple[SymmetrySpec, list[str]]:
    """``spec`` without what of it changes the outputs (see the module docstring), and
    one line per space left out or made smaller, saying why. What is kept is verified.

    Raises:
        SpecCheckError: outputs that are not deterministic (nothing can be checked).
    """
    dropped: list[str] = []
    for _ in range(2 * len(spec) + 2):
        try:
            verify(check, module, spec, (), None, seed=seed, rtol=rtol, diagnose=False)
            return spec, dropped
        except SpecCheckError:
            if check.repeat_error() > rtol * check.scale:
                raise
            failing = _failing_spaces(check, spec, seed, rtol)
        if failing:
            spaces, lines = _degrade(spec, failing)
        else:
            spaces, lines = _kept_together(check, spec, seed, rtol)
        spaces, clashes = resolve(spaces, check.layout)
        dropped += lines + clashes
        spec = SymmetrySpec(tuple(spaces))
    raise SpecCheckError("the spec does not settle: spaces keep failing")  # pragma: no cover


def _describe(space: Space, error: float) -> str:
    group = type(space.group).__name__
    return (
        f"{space.name} ({group}, n={space.n}): a random element changes the outputs "
        f"(relative error {error:.2g})"
    )


def _degrade(spec: SymmetrySpec, failing: dict[str, float]) -> tuple[list[Space], list[str]]:
    """``spec``'s spaces with each failing one left out, its nested spaces kept on their
    own, or its group made smaller (a nested family all at once)."""
    lines: list[str] = []
    gone: set[str] = set()
    free: set[str] = set()  # nested spaces whose parent is left out
    smaller: dict[str, Group] = {}
    for name, error in failing.items():
        space = spec[name]
        family = _family(spec, space)
        inner = spec.nested_in(name)
        sub = smaller_group(space.group)
        if inner and space.group.units(space.n):
            gone.add(name)
            free |= {s.name for s in inner}
            lines.append(
                f"{_describe(space, error)}, so it is left out; the {len(inner)} spaces "
                "nested in it are kept, each on its own"
            )
        elif sub is not None and not any(u.role == "elementwise" for u in space.uses):
            smaller |= {s.name: sub for s in family}
            lines.append(f"{_describe(space, error)}, so it is kept as {sub.name} only")
        else:
            gone |= {s.name for s in family} | {s.name for s in inner}
            also = f" (with {len(inner)} spaces nested in it)" if inner else ""
            kind = f" and the {len(family) - 1} spaces alike in its parent" * (len(family) > 1)
            lines.append(f"{_describe(space, error)}{also}{kind}, so it is left out")
    spaces = []
    for space in spec:
        if space.name in gone:
            continue
        if space.name in free:
            space = dataclasses.replace(space, nest=None, inside=space.nest)
        if space.name in smaller:
            space = dataclasses.replace(space, group=smaller[space.name])
        spaces.append(space)
    return spaces, lines


def _family(spec: SymmetrySpec, space: Space) -> list[Space]:
    """``space`` and the spaces of its kind nested in the other units of its parent
    (they must stay alike), or ``space`` alone."""
    if space.nest is None or space.nest.unit is None:
        return [space]
    return spec.family(space.nest.parent, space.nest.kind)


def _failing_spaces(
    check: FunctionCheck, spec: SymmetrySpec, seed: int, rtol: float
) -> dict[str, float]:
    """``{space: relative error}`` of the spaces whose random element alone changes the
    outputs (parents before the spaces nested in them)."""
    tolerance = rtol * check.scale
    generator = torch.Generator().manual_seed(seed + 1)
    failing: dict[str, float] = {}
    for space in spec:
        if space.nest is not None and space.nest.parent in failing:
            continue  # goes with its parent
        alone = Transform(spec, {space.name: random_check_element(space, generator)})
        error = check.error(spec, alone, keep_within=tolerance)
        if error > tolerance:
            failing[space.name] = error
    return failing


def _kept_together(
    check: FunctionCheck, spec: SymmetrySpec, seed: int, rtol: float
) -> tuple[list[Space], list[str]]:
    """Spaces that each keep the outputs alone but not together: added in spec order (a
    kind of nested spaces all at once) while a random element of the ones added keeps
    the outputs with those before them already moved."""
    tolerance = rtol * check.scale
    generator = torch.Generator().manual_seed(seed + 2)
    kept: list[Space] = []
    lines = []
    done: set[str] = set()
    for space in spec:
        if space.name in done:
            continue
        members = _family(spec, space)
        done |= {s.name for s in members}
        names = {s.name for s in kept}
        if space.nest is not None and space.nest.parent not in names:
            continue  # its parent was not kept
        trial = SymmetrySpec((*kept, *members))
        elements = {s.name: random_check_element(s, generator) for s in members}
        error = check.error(trial, Transform(trial, elements), keep_within=tolerance)
        if error <= tolerance:
            kept += members
        else:
            lines.append(
                f"{_describe(space, error)} once the spaces before it are moved (it keeps "
                "them alone), so it is left out"
            )
    return kept, lines
