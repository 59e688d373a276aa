"""Transforms as dense matrices, applied differentiably (for learned matching).

Learned matching holds a continuous ``(m, n)`` matrix per space and needs the
aligned model as a differentiable function of it. :func:`apply_dense` contracts every
use of a space with the matrix itself, which is exact for the groups whose readers
move by ``T`` too (:attr:`lmckit.groups.Group.self_dual`: permutations, head and
padded permutations, orthogonal maps; elementwise parameters of a permutation move as
``P v``); the readers of the other groups (scalings, invertible maps) take the reader
matrix ``T^{-T}`` given beside it (:func:`reader_matrices`). :func:`straight_through`
turns a continuous matrix into the group element it stands for, keeping the gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import Tensor

from lmckit.groups import Group
from lmckit.symmetry._params import Params
from lmckit.symmetry._spaces import with_region
from lmckit.symmetry._transform import SymmetrySpec, act_on_axis

__all__ = ["apply_dense", "reader_matrices", "straight_through"]


def apply_dense(
    spec: SymmetrySpec,
    params: Params,
    matrices: Mapping[str, Tensor],
    readers: Mapping[str, Tensor] | None = None,
) -> Params:
    """Params with each space's dense ``(m, n)`` matrix applied along all its uses.

    Differentiable in ``matrices`` (and ``readers``). Spaces not in ``matrices`` are
    left alone; integer tensors pass through. ``readers`` holds, for spaces whose
    readers do not move by the matrix itself, the ``(m, n)`` matrix their reader axes
    are contracted with instead (:func:`reader_matrices`).
    """
    readers = readers or {}
    unknown = (set(matrices) | set(readers)) - set(spec.names)
    if unknown:
        raise KeyError(f"matrices name unknown spaces {sorted(unknown)}")
    out: Params = {}
    for name, value in params.items():
        if not value.is_floating_point():
            out[name] = value
            continue
        for space, use in spec.uses_of(name):
            if space.name not in matrices:
                continue
            mat = matrices[space.name]
            if use.role == "read" and space.name in readers:
                mat = readers[space.name]
            mat = mat.to(value.dtype)
            act = functools.partial(_left_multiply, mat)
            moved = act_on_axis(use.region(value), use, space.n, act)
            value = with_region(value, use.parts, moved)
        out[name] = value
    return out


def reader_matrices(spec: SymmetrySpec, matrices: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``T^{-T}`` of every square matrix in ``matrices`` whose group is not self-dual.

    Differentiable in ``matrices`` (:meth:`lmckit.groups.Group.dense_reader`: one
    ``n x n`` inverse per such space, ``1 / s`` for a scaling).
    """
    return {
        name: spec[name].group.dense_reader(mat)
        for name, mat in matrices.items()
        if not spec[name].group.self_dual
    }


def _left_multiply(mat: Tensor, x: Tensor) -> Tensor:
    """``mat`` applied to the middle axis of ``x`` (shape ``(outer, n, inner)``)."""
    return torch.einsum("mn,onk->omk", mat, x)


def straight_through(
    group: Group, cont: Tensor, *, relax: bool = False, temperature: float = 1.0, iters: int = 20
) -> Tensor:
    """The matrix of the element ``cont`` stands for, with a gradient for ``cont``.

    With ``relax`` and a group that has a relaxation (:meth:`Group.soft_matrix`:
    Sinkhorn for plain permutations), the soft matrix itself. Otherwise the value is the
    hard projection ``P`` (:meth:`Group.project`, computed on the CPU); its gradient is
    the projection's own where the group has a smooth one (:meth:`Group.smooth_projection`:
    orthogonal maps), else it goes to ``cont`` unchanged (``cont + (P - cont).detach()``:
    permutations, whose projection is piecewise constant).
    """
    if relax:
        soft = group.soft_matrix(cont, temperature=temperature, iters=iters)
        if soft is not None:
            return soft
    hard = group.matrix(group.project(cont.detach().cpu())).to(cont)
    smooth = group.smooth_projection(cont)
    through = cont if smooth is None else smooth
    return through + (hard - through).detach()
