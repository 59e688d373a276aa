"""Embedding an RMSNorm transformer exactly into a wider one (:func:`embed_in_wider`).

A rectangular orthogonal map ``O`` (``m x n``, ``O^T O = I``) embeds an RMSNorm model of
residual width ``n`` into one of width ``m``: head and MLP units are padded with zero
units (queries rescaled by ``sqrt(head_dim' / head_dim)`` to undo the wider attention
scale), readers of the norms rescaled by ``sqrt(n / m)`` and ``eps`` by ``n / m``. What
changes is read from the model's traced graph and inferred spec, as for the other
rewrites (:mod:`lmckit.forms._rewrites`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lmckit.forms._rewrites import (
    Rewritable,
    check_rewritten_keys,
    norm_readers,
    rebuilt,
    rewrite_analysis,
    shared_weights,
)
from lmckit.groups import HeadPermutation, Orthogonal
from lmckit.inference._infer import SymmetryAnalysis
from lmckit.models._registry import ZooModel
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import Space, SymmetrySpec, Transform, apply

__all__ = ["embed_in_wider"]


def _padding(rows: int, cols: int) -> Tensor:
    """``[I; 0]``: embeds ``cols`` units as the first of ``rows`` (zero units after)."""
    return torch.eye(rows, cols)


def _head_padding(group: HeadPermutation, head_dim: int) -> Tensor:
    """Block-diagonal ``[I; 0]`` per head: ``heads * head_dim`` x ``heads * group.head_dim``."""
    return torch.block_diag(*[_padding(head_dim, group.head_dim)] * group.heads)


def _residual(spaces: list[Space], rewrite: str) -> Space:
    rotations = [s for s in spaces if isinstance(s.group, Orthogonal)]
    if len(rotations) != 1:
        raise ValueError(
            f"{rewrite} needs one orthogonal residual stream (see layernorm_to_rmsnorm)"
        )
    return rotations[0]


def embed_in_wider(
    module: ZooModel,
    params: Params,
    width: int,
    *,
    inner: int | None = None,
    rotation: Tensor | int = 0,
) -> tuple[ZooModel, Params]:
    """Embed an RMSNorm transformer into one of residual width ``width``, exactly.

    Args:
        module: a model whose residual stream is orthogonal (:class:`Rewritable`).
        params: its parameters; not modified.
        width: the new residual width ``m >= n``; a multiple of the number of heads.
        inner: the new width of the other (MLP) spaces (default: scaled like the
            residual width).
        rotation: ``(m, n)`` matrix with orthonormal columns, or a seed for a random one.

    Returns:
        ``(module', params')``: the wider model (same outputs) and its parameters.
    """
    model: Rewritable = module  # type: ignore[assignment]
    analysis = rewrite_analysis(module)
    spec = analysis.spec
    residual = _residual(list(spec), "embed_in_wider")
    n = residual.n
    heads = [s for s in spec if isinstance(s.group, HeadPermutation)]
    if any(s.circuits is None for s in heads) or len(heads) == 0:
        raise ValueError("embed_in_wider needs projected heads: embed before heads_to_circuits")
    units = [s for s in spec if s is not residual and s not in heads]
    inner = round(units[0].n * width / n) if inner is None else inner
    if width < n or any(inner < s.n for s in units):
        raise ValueError(f"cannot embed width {n} into {width} (MLP {units[0].n} into {inner})")
    elements: dict[str, object] = {residual.name: _embedding(spec, residual, width, rotation)}
    scales: dict[str, float] = {}
    for space in heads:
        group = space.group
        assert isinstance(group, HeadPermutation)
        if width % group.heads:
            raise ValueError(f"width {width} does not split into {group.heads} heads")
        head_dim = width // group.heads
        elements[space.name] = _head_padding(group, head_dim)
        scales[space.name] = math.sqrt(head_dim / group.head_dim)
    for space in units:
        elements[space.name] = _padding(inner, space.n)
    # every space is mapped by a (rectangular) matrix with orthonormal columns
    flat = spec.with_groups(**{s.name: Orthogonal() for s in spec})
    work = apply(flat, params, Transform(flat, elements))
    _scale_queries(work, heads, scales)
    _rescale_norm_readers(work, analysis, module, math.sqrt(n / width))
    new = rebuilt(module, model.widened_kwargs(width, inner))
    check_rewritten_keys(new, work)
    return new, work


def _embedding(spec: SymmetrySpec, residual: Space, width: int, rotation: Tensor | int) -> Tensor:
    """The residual stream's ``(width, n)`` embedding: ``rotation`` checked to have
    orthonormal columns, or a random one drawn from the seed ``rotation``."""
    n = residual.n
    if isinstance(rotation, int):
        flat = spec.with_groups(**{residual.name: Orthogonal()})
        drawn = random_transform(flat, rotation, widths={residual.name: width})[residual.name]
        assert isinstance(drawn, Tensor)
        embedding = drawn
    else:
        embedding = rotation
    if tuple(embedding.shape) != (width, n):
        raise ValueError(f"rotation must be ({width}, {n}), got {tuple(embedding.shape)}")
    if not torch.allclose(
        embedding.double().T @ embedding.double(), torch.eye(n, dtype=torch.float64), atol=1e-5
    ):
        raise ValueError("rotation must have orthonormal columns")
    return embedding


def _scale_queries(work: Params, heads: list[Space], scales: dict[str, float]) -> None:
    """The wider heads' scores are scaled by ``1/sqrt(head_dim')``: pre-scale the queries."""
    for space in heads:
        circuits, group = space.circuits, space.group
        assert circuits is not None and isinstance(group, HeadPermutation)
        for part in (circuits.query, circuits.query_bias):
            if part is None:
                continue
            x = work[part.param].clone()
            x[part.index(x.shape[0], group.heads)] *= scales[space.name]
            work[part.param] = x


def _rescale_norm_readers(
    work: Params, analysis: SymmetryAnalysis, module: ZooModel, factor: float
) -> None:
    """An RMSNorm of width ``m`` sees ``|O x|^2 / m``: its output grows by ``sqrt(m / n)``,
    so every reader of a norm is scaled by ``factor = sqrt(n / m)``."""
    shared = shared_weights(analysis)
    for _, _, readers in norm_readers(analysis, "rms", module):
        for reader in readers:
            if reader.weight in shared:  # rescaling it would rescale its other use too
                raise ValueError(f"{reader.weight!r} is shared (tied): untie shared weights first")
            work[reader.weight] = work[reader.weight] * factor
