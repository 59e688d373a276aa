"""Random group elements of a spec, and how far an element is from the identity."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from lmckit.runtime._seeds import generator
from lmckit.symmetry._spaces import SymmetrySpec
from lmckit.symmetry._transform import Transform, as_spec

__all__ = ["distance_to_identity", "random_transform"]


def random_transform(
    spec: SymmetrySpec,
    seed: int | torch.Generator,
    *,
    widths: Mapping[str, int] | None = None,
) -> Transform:
    """Draw a random element of every space.

    Args:
        spec: the spec.
        seed: an integer seed in ``[0, 2**64 - 1]`` or a ``torch.Generator``.
        widths: for rectangular groups, target sizes ``m`` per space (default ``n``).

    Raises:
        TypeError / ValueError: a spec or seed of the wrong kind or range, named.
    """
    spec = as_spec(spec)
    gen = generator(seed)
    widths = dict(widths or {})
    elements = {}
    for space in spec:
        m = widths.pop(space.name, None)
        elements[space.name] = space.group.random(space.n, gen, m=m)
    if widths:
        raise KeyError(f"widths name unknown spaces {sorted(widths)}")
    return Transform(spec, elements)


def distance_to_identity(spec: SymmetrySpec, transform: Transform) -> dict[str, float]:
    """Per space: Frobenius distance of the element's matrix to the identity, over ``sqrt(n)``."""
    out = {}
    for space in spec:
        mat = space.group.matrix(transform[space.name])
        if mat.shape[0] != mat.shape[1]:
            out[space.name] = float("nan")
            continue
        eye = torch.eye(mat.shape[0], dtype=mat.dtype)
        out[space.name] = float(torch.linalg.norm(mat - eye) / math.sqrt(mat.shape[0]))
    return out
