"""The widths of a pair's spaces for weight matching: equal, or A wider than B.

Along a space whose group is rectangular (``SemiPermutation``, ``PaddedPermutation``,
``Orthogonal``) model A may be wider than model B: each space's width is read from A's
parameters, every parameter of A is checked to have B's shape at those widths, and the
descent starts from the group's plain embedding of B's units into A's.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmckit.symmetry._params import IncompatibleModelsError, Params, check_compatible, layout
from lmckit.symmetry._transform import SymmetrySpec, Transform

__all__ = ["check_init", "checked_widths", "space_widths", "start_transform"]


def space_widths(spec: SymmetrySpec, params: Mapping[str, Tensor]) -> dict[str, int]:
    """Width of every space of ``spec`` in ``params`` (read from the first use)."""
    out = {}
    for space in spec:
        use = space.uses[0]
        if use.param not in params:
            raise ValueError(f"space {space.name!r} uses missing parameter {use.param!r}")
        size = use.region_shape(params[use.param].shape)[use.axis]
        if size % (use.outer * use.inner):
            raise ValueError(f"{use.param!r} axis {use.axis} does not fit space {space.name!r}")
        out[space.name] = size // (use.outer * use.inner)

    return out


def _check_widths(
    spec: SymmetrySpec, params_a: Params, params_b: Params, widths: Mapping[str, int]
) -> None:
    """Every parameter of A has B's shape with each space's axis at A's width."""
    check_compatible(
        {k: v.flatten()[:0] for k, v in params_a.items()},
        {k: v.flatten()[:0] for k, v in params_b.items()},
    )
    for name, b in params_b.items():
        want = list(b.shape)
        for space, use in spec.uses_of(name):
            if use.parts:
                # a slice is placed in B's layout: it means nothing in a wider A
                if params_a[name].shape != b.shape:
                    raise IncompatibleModelsError(
                        f"space {space.name!r} lives in slices of {name!r}, whose shape "
                        f"differs between the models ({tuple(params_a[name].shape)} and "
                        f"{tuple(b.shape)}); align models of different widths without the "
                        "spaces nested in heads (the spaces whose nest is None)"
                    )
                continue
            want[use.axis % b.ndim] = use.outer * widths[space.name] * use.inner
        if list(params_a[name].shape) != want:
            raise IncompatibleModelsError(
                f"parameter {name!r} has shape {tuple(params_a[name].shape)} in the first "
                f"model; the spec's widths {dict(widths)} give {tuple(want)}"
            )


def start_transform(spec: SymmetrySpec, widths: Mapping[str, int]) -> Transform:
    """Identity for square spaces, the group's plain embedding for wider ones."""
    elements = {}
    for space in spec:
        m = widths[space.name]
        if m < space.n:
            raise ValueError(
                f"space {space.name!r}: the first model's width {m} is below the second's "
                f"{space.n}; embed the narrow model into the wide one"
            )
        elements[space.name] = space.group.embedding(space.n, m)
    return Transform(spec, elements)


def check_init(spec: SymmetrySpec, init: Transform, start: Transform) -> None:
    """``init`` holds group members of the start's shapes (a one-line error if not)."""
    for space in spec:
        element = init[space.name]
        try:
            space.group.validate(element, space.n)
        except ValueError as err:
            raise ValueError(f"init for space {space.name!r}: {err}") from None
        got, want = space.group.dims(element), space.group.dims(start[space.name])
        if got != want:
            raise ValueError(
                f"init for space {space.name!r} maps {got[1]} -> {got[0]} "
                f"units, the models need {want[1]} -> {want[0]}"
            )


def checked_widths(spec: SymmetrySpec, params_a: Params, params_b: Params) -> dict[str, int]:
    """Each space's width in A, after checking the pair fits the spec and is finite."""
    # compatibility first: models of different widths must be reported as such (naming
    # the first mismatched parameter), not as a spec that does not fit one of them; on
    # shapes alone (a lazily computed tensor is not built for this)
    shapes_a, shapes_b = layout(params_a), layout(params_b)
    if any(s.group.rectangular for s in spec):
        spec.validate(shapes_b)
        widths = space_widths(spec, shapes_a)
        _check_widths(spec, shapes_a, shapes_b, widths)
    else:
        check_compatible(shapes_a, shapes_b)
        spec.validate(shapes_b)
        widths = {s.name: s.n for s in spec}
    return widths
