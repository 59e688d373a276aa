"""Bases inside attention heads: orthogonal maps that align matched heads' weights.

A head's queries and keys can be rotated together (``q -> R q``, ``k -> R k`` keeps
every score ``q . k``), and its values against its output columns (``v -> S v``,
``W_o -> W_o S^T`` keeps what the head writes), for any orthogonal ``R`` and ``S`` of
size ``head_dim``. The QK/OV circuits that match heads (:mod:`lmckit.aligners._weight.circuits`)
do not see these maps, and neither does any :class:`~lmckit.symmetry.SymmetrySpec`
space (Q, K and V share one axis there), but interpolation does: two matched heads
whose projections sit in unrelated bases average to a head that computes neither.

:func:`match_head_bases` solves, per head, the two Procrustes problems
``max_R <[Q_a|K_a], R [Q_b|K_b]>`` and ``max_S <V_a, S V_b> + <O_a, O_b S^T>`` on the
bias-augmented projections; :func:`apply_head_bases` applies them, and
:func:`head_bases_matching` is the aligner (registered as ``head_bases``): its result's
``apply`` rotates the bases. Use it after a transform has matched heads and the
residual stream (``params_b`` already aligned), e.g.

    moved = weight_matching(spec, params_a, params_b).apply(params_b)
    moved = head_bases_matching(spec, params_a, moved).apply(moved)

The result computes the same function as ``params_b`` (tested to 1e-5).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lmckit.aligners._registry import register_aligner
from lmckit.aligners._result import AlignmentResult, SpaceDiagnostics
from lmckit.aligners._weight.circuits import projection
from lmckit.aligners._width import GENERALIZED_LMC
from lmckit.data import Dataset
from lmckit.symmetry._params import Params, check_compatible
from lmckit.symmetry._transform import CircuitPart, HeadPermutation, Space, SymmetrySpec, Transform

__all__ = [
    "HeadBases",
    "HeadBasesResult",
    "align_head_bases",
    "apply_head_bases",
    "head_bases_matching",
    "match_head_bases",
]


@dataclass(frozen=True)
class HeadBases:
    """Per head space: ``(qk, ov)``, each ``(heads, head_dim, head_dim)`` orthogonal."""

    maps: Mapping[str, tuple[Tensor, Tensor]]


def _head_spaces(spec: SymmetrySpec) -> list[tuple[Space, HeadPermutation]]:
    """Head spaces whose projections this module rotates: one key/value head per query
    head, ``(out, in)`` weights, not nested (nested spaces of a spec hold such maps
    themselves)."""
    out = []
    for space in spec:
        c = space.circuits
        if c is None or not isinstance(space.group, HeadPermutation) or space.nest is not None:
            continue
        parts = (c.query, c.key, c.value)
        if c.output_transposed or any(p.transposed for p in parts):
            continue
        if c.kv_heads not in (None, space.group.heads):
            continue
        out.append((space, space.group))
    return out


def _polar(mats: Tensor) -> Tensor:
    """Batched nearest orthogonal matrices ``U V^T`` of ``(..., k, k)``."""
    u, _, vt = torch.linalg.svd(mats.double())
    return (u @ vt).float()


def _output_columns(params: Mapping[str, Tensor], param: str, heads: int) -> Tensor:
    """``(heads, d_out, head_dim)``: each head's columns of the output weight."""
    o = params[param].float()
    return o.reshape(o.shape[0], heads, -1).permute(1, 0, 2)


def _cross_products(
    spec: SymmetrySpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> dict[str, tuple[Tensor, Tensor]]:
    """Per head space, the ``(heads, head_dim, head_dim)`` QK and OV cross-products of
    A's heads against B's (whose polar factors are the best within-head maps)."""
    check_compatible(params_a, params_b)
    spaces = _head_spaces(spec)
    if not spaces:
        raise ValueError("the spec has no attention head spaces with circuits")
    out = {}
    for space, group in spaces:
        c = space.circuits
        assert c is not None
        h = group.heads
        q = [projection(p, c.query, c.query_bias, h) for p in (params_a, params_b)]
        k = [projection(p, c.key, c.key_bias, h) for p in (params_a, params_b)]
        v = [projection(p, c.value, c.value_bias, h) for p in (params_a, params_b)]
        o = [_output_columns(p, c.output, h) for p in (params_a, params_b)]
        # rows of A's head against rows of B's
        qk = q[0] @ q[1].transpose(1, 2) + k[0] @ k[1].transpose(1, 2)
        ov = v[0] @ v[1].transpose(1, 2) + o[0].transpose(1, 2) @ o[1]
        out[space.name] = (qk, ov)
    return out


def match_head_bases(
    spec: SymmetrySpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> HeadBases:
    """Orthogonal within-head maps taking ``params_b``'s heads onto ``params_a``'s.

    ``params_b`` must already have its heads (and residual stream) aligned to
    ``params_a``: head ``h`` of one is compared with head ``h`` of the other.
    """
    crosses = _cross_products(spec, params_a, params_b)
    return HeadBases({name: (_polar(qk), _polar(ov)) for name, (qk, ov) in crosses.items()})


def _rotate_rows(
    out: dict[str, Tensor], part: CircuitPart | None, maps: Tensor, heads: int
) -> None:
    """Rows of ``part`` (head by head) multiplied by ``maps[h]`` in place in ``out``."""
    if part is None:
        return
    value = out[part.param]
    rows = part.index(value.shape[0], heads)
    block = value[rows]
    shaped = block.reshape(heads, -1, *block.shape[1:])
    moved = torch.einsum("hij,hj...->hi...", maps.to(value.dtype), shaped)
    new = value.clone()
    new[rows] = moved.reshape(block.shape)
    out[part.param] = new


def apply_head_bases(spec: SymmetrySpec, params: Params, bases: HeadBases) -> Params:
    """``params`` with each head's queries and keys rotated by ``qk[h]``, its values by
    ``ov[h]`` and its output columns by ``ov[h]^T``: the same function."""
    out = dict(params)
    for space, group in _head_spaces(spec):
        if space.name not in bases.maps:
            continue
        c = space.circuits
        assert c is not None
        qk, ov = bases.maps[space.name]
        h = group.heads
        for weight, bias, maps in (
            (c.query, c.query_bias, qk),
            (c.key, c.key_bias, qk),
            (c.value, c.value_bias, ov),
        ):
            _rotate_rows(out, weight, maps, h)
            _rotate_rows(out, bias, maps, h)
        o = out[c.output]
        cols = o.reshape(o.shape[0], h, -1)
        out[c.output] = torch.einsum("dhj,hij->dhi", cols, ov.to(o.dtype)).reshape(o.shape)
    return out


def align_head_bases(spec: SymmetrySpec, params_a: Params, params_b: Params) -> Params:
    """``params_b`` with its heads' bases matched to ``params_a``'s (same function).

    Kept for existing callers; new code uses :func:`head_bases_matching`.
    """
    return apply_head_bases(spec, params_b, match_head_bases(spec, params_a, params_b))


@dataclass(frozen=True)
class HeadBasesResult(AlignmentResult):
    """An identity ``transform`` plus the within-head maps, which no spec space holds;
    :meth:`apply` rotates them into a parameter set."""

    bases: HeadBases = field(default_factory=lambda: HeadBases({}))

    def apply(self, params: Params) -> Params:
        return apply_head_bases(self.transform.spec, params, self.bases)


def _traces(maps: Sequence[Tensor], cross: Sequence[Tensor]) -> float:
    """``sum_h <R_h, X_h>`` over the QK and OV maps and their cross-products."""
    return sum(float((r.double() * x.double()).sum()) for r, x in zip(maps, cross, strict=True))


@register_aligner("head_bases", paper=GENERALIZED_LMC)
def head_bases_matching(
    spec: SymmetrySpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    config: None = None,
    *,
    model: nn.Module | None = None,
    data: Dataset | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
) -> HeadBasesResult:
    """Head bases: orthogonal maps aligning the bases inside already matched heads.

    Data-free and exact (the function of ``params_b`` is unchanged); ``params_b`` must
    already have its heads matched to ``params_a``'s (e.g. by weight matching).
    ``spaces`` report, per head space, ``sum_h <R_h, X_h>`` over the QK and OV
    cross-products ``X_h`` at the identity and at the solution. ``config``, ``model``,
    ``data``, ``seed``, ``progress`` and ``device`` are accepted for the common aligner
    signature and unused.
    """
    start = time.perf_counter()
    bases = match_head_bases(spec, params_a, params_b)
    crosses = _cross_products(spec, params_a, params_b)
    diagnostics = {
        name: SpaceDiagnostics(
            _traces(tuple(torch.eye(x.shape[-1]).expand_as(x) for x in cross), cross),
            _traces(bases.maps[name], cross),
        )
        for name, cross in crosses.items()
    }
    return HeadBasesResult(
        transform=Transform.identity(spec),
        spaces=diagnostics,
        seconds=time.perf_counter() - start,
        bases=bases,
    )
