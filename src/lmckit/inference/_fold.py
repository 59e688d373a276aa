"""Fold norm scales into the layers that read them: ``R (g * y + b) = (R diag(g)) y + R b``.

A norm's elementwise scale ``g`` acts unit by unit, so a residual stream it scales keeps
only its permutation symmetry. When every consumer of the scaled value is a linear
reader, ``g`` can be multiplied into the readers' input columns and replaced by ones, and
a LayerNorm's shift ``b`` added to the readers' biases and replaced by zeros (or, when a
reader has no bias, kept as ``b / g``: a vector the stream carries): the
function is unchanged, the module class is unchanged (its scale parameter is just all
ones), and the stream admits orthogonal maps -- every one under an RMSNorm, which
commutes with rotations, and under a LayerNorm the ones that fix the mean direction
(:class:`~lmckit.groups.CenteredOrthogonal`), since its mean subtraction commutes with
exactly those. Analysed again with the folded scales declared uniform (constant
along every axis: see ``uniform`` of :func:`lmckit.inference.analyze_symmetries`), the
stream's space becomes :class:`~lmckit.groups.Orthogonal` (RMSNorm) or
:class:`~lmckit.groups.CenteredOrthogonal` (LayerNorm).

Everything is read from the graph: the scale sites found by the analysis and, for each,
the readers its output flows into. The folded model is a :class:`FoldedParams`: each
reader is multiplied by its scale when it is read, so folding a bfloat16 model costs no
float32 copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.fx import Node

from lmckit.inference._infer import SymmetryAnalysis
from lmckit.inference._readers import Reader, readers_of
from lmckit.symmetry._params import LazyParams

__all__ = ["FoldedParams", "FoldedScales", "Reader", "fold_norm_scales", "readers_of"]


class FoldedParams(LazyParams):
    """Parameters with norm scales folded into their readers, computed when read.

    A reader's weight is read as the stored weight times its scale along its input
    axis, in float32 at least (a bfloat16 model is rounded once, when a result is
    stored, not here); the few tensors folding changes otherwise (scales, shifts,
    readers' biases) are held. Everything else is the source's own tensor.

    Args:
        source: the parameters as given; not modified.
        factors: reader weight key -> ``(scale, axis)`` pairs multiplied into it (the
            scale in the dtype the weight is read in, as long as its axis).
        replaced: keys -> their folded values (scales, shifts, biases).
    """

    def __init__(
        self,
        source: Mapping[str, Tensor],
        factors: Mapping[str, list[tuple[Tensor, int]]],
        replaced: Mapping[str, Tensor],
    ) -> None:
        super().__init__(source)
        self.factors, self.replaced = dict(factors), dict(replaced)

    def __getitem__(self, key: str) -> Tensor:
        if key in self.replaced:
            return self.replaced[key]
        value = self.source[key]
        factors = self.factors.get(key)
        if not factors:
            return value
        return _scaled(value, factors)

    def rows(self, key: str, start: int, stop: int) -> Tensor:
        if key in self.replaced:
            return self.replaced[key][start:stop]
        factors = self.factors.get(key)
        value = self.source[key][start:stop]
        if not factors:
            return value
        # a scale along axis 0 is cut like the rows; along any other axis it applies whole
        cut = [(scale[start:stop] if axis == 0 else scale, axis) for scale, axis in factors]
        return _scaled(value, cut)

    def dtype_of(self, key: str) -> torch.dtype:
        if key in self.replaced:
            return self.replaced[key].dtype
        dtype = self.source[key].dtype
        return _wide(dtype) if key in self.factors else dtype

    def stored_dtype(self, key: str) -> torch.dtype:
        return self.source[key].dtype

    def meta(self, key: str) -> Tensor:
        return torch.empty(self.source[key].shape, dtype=self.dtype_of(key), device="meta")


def _scaled(value: Tensor, factors: list[tuple[Tensor, int]]) -> Tensor:
    """``value`` times each ``(scale, axis)``, in float32 at least: one new tensor,
    scaled in place."""
    out = value.to(_wide(value.dtype), copy=True)
    for scale, axis in factors:
        out.movedim(axis, -1).mul_(scale)
    return out


def _wide(dtype: torch.dtype) -> torch.dtype:
    """Folded products are computed in float32 at least."""
    return torch.promote_types(dtype, torch.float32)


@dataclass(frozen=True)
class FoldedScales:
    """The result of :func:`fold_norm_scales`.

    Attributes:
        params: the parameters with every foldable scale folded (scales set to one),
            each reader computed when read.
        scales: keys of the folded scale and shift parameters (now scaling by one: all
            ones, or all zeros for a scale stored as ``1 + w``; shifts all zeros).
        readers: key of each reader weight that absorbed a scale (or shift) -> its key.
        skipped: scales that could not be folded, with the reason.
        tied: for scales skipped because a reader's weight is tied to another use:
            the reader's own state-dict name -> the name it is tied to (untied by
            :func:`lmckit.inference._untie.untied_module`, the scale folds).
    """

    params: FoldedParams
    scales: frozenset[str]
    readers: dict[str, str]
    skipped: tuple[str, ...]
    tied: dict[str, str] = field(default_factory=dict)


def fold_norm_scales(analysis: SymmetryAnalysis, params: Mapping[str, Tensor]) -> FoldedScales:
    """Fold every norm scale whose value only linear layers read (see module docstring).

    Args:
        analysis: the module's symmetry analysis (its scale sites and graph).
        params: parameters of that module (tied weights once, as lmckit keeps them);
            not modified.
    """
    graph_params = dict(analysis.traced.params)
    nodes = {n.name: n for n in analysis.traced.graph.nodes}
    unjudged = analysis.traced.unjudged()
    users_of = _users_of(graph_params, nodes)
    replaced: dict[str, Tensor] = {}
    factors: dict[str, list[tuple[Tensor, int]]] = {}
    folded: set[str] = set()
    readers: dict[str, str] = {}
    skipped: list[str] = []
    tied: dict[str, str] = {}

    def current(key: str) -> Tensor:
        return replaced[key] if key in replaced else params[key]

    for site in analysis.scales:
        if site.weight is None:
            continue  # affine-free; a LayerNorm's shift writes the stream (it stays)
        scale = graph_params[site.weight]
        found = readers_of(nodes[site.node], graph_params, unjudged)
        if isinstance(found, str):
            skipped.append(f"{scale}: {found}")
            continue
        shared = [r for r in found if users_of.get(r.weight, 0) > 1]
        if shared:
            skipped.append(f"{scale}: its reader {shared[0].weight} is also used elsewhere (tied)")
            tied |= _own_keys(shared, analysis.traced.aliases)
            continue
        g = current(scale).double() + site.offset
        shift = graph_params[site.bias] if site.bias is not None else None
        biased = all(r.bias is not None and users_of.get(r.bias, 0) == 1 for r in found)
        if shift is not None and not biased and not bool((g.abs() > 1e-6 * g.abs().max()).all()):
            skipped.append(f"{scale}: a reader has no bias and the scale has zeros")
            continue
        for r in found:
            weight = params[r.weight]
            if shift is not None and biased:
                # W (g * z + b) + c = (W diag g) z + (W b + c): the readers take the shift
                assert r.bias is not None
                w64 = FoldedParams(params, factors, {})[r.weight].double().movedim(r.axis, -1)
                bias = current(r.bias)
                replaced[r.bias] = (bias.double() + w64 @ current(shift).double()).to(
                    _wide(bias.dtype)
                )
                del w64
            factors.setdefault(r.weight, []).append((g.to(_wide(weight.dtype)), r.axis))
            readers[r.weight] = scale
        if shift is not None:
            # no reader bias: g * z + b = g * (z + b / g), the shift stays and writes the
            # stream (a LayerNorm with a uniform scale keeps the maps fixing the mean)
            value = current(shift)
            if biased:
                replaced[shift] = torch.zeros_like(value)
                folded.add(shift)
            else:
                replaced[shift] = (value.double() / g).to(_wide(value.dtype))
        replaced[scale] = torch.full_like(current(scale), 1.0 - site.offset)  # offset + w = 1
        folded.add(scale)
    out = FoldedParams(params, factors, replaced)
    return FoldedScales(out, frozenset(folded), readers, tuple(skipped), tied)


def _users_of(graph_params: Mapping[str, str], nodes: Mapping[str, Node]) -> dict[str, int]:
    """How many graph nodes read each parameter (over all its placeholders)."""
    users_of: dict[str, int] = {}
    for ph, key in graph_params.items():  # a tied weight may be lifted more than once
        # an assertion of a weight's dtype (before a cast) reads nothing of it
        used = [u for u in nodes[ph].users if "_assert_tensor_metadata" not in str(u.target)]
        users_of[key] = users_of.get(key, 0) + len(used)
    return users_of


def _own_keys(readers: list[Reader], aliases: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Each reader's own name for its tied weight (the alias inside the module that
    reads it) -> the name lmckit keeps it under; readers whose own name is that name,
    or cannot be told, are left out."""
    out = {}
    for r in readers:
        own = [k for k in aliases.get(r.weight, ()) if k.rpartition(".")[0] == r.module]
        if own:
            out[own[0]] = r.weight
    return out
