"""Fold norm scales into the layers that read them: ``R (g * y) = (R diag(g)) y``.

A norm's elementwise scale ``g`` acts unit by unit, so a residual stream it scales keeps
only its permutation symmetry. When every consumer of the scaled value is a linear
reader, ``g`` can be multiplied into the readers' input columns and replaced by ones:
the function is unchanged, the module class is unchanged (its scale parameter is just
all ones), and the stream -- normalised by an RMSNorm, which commutes with rotations --
admits orthogonal maps. Analysed again with the folded scales declared uniform (constant
along every axis: see ``uniform`` of :func:`lmckit.spec.analyze_symmetries`), the
stream's space becomes :class:`~lmckit.groups.Orthogonal`.

Everything is read from the graph: the scale sites found by the analysis and, for each,
the readers its output flows into.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmckit.params import Params
from lmckit.spec.infer import SymmetryAnalysis
from lmckit.spec.readers import Reader, readers_of

__all__ = ["FoldedScales", "Reader", "fold_norm_scales", "readers_of"]


@dataclass(frozen=True)
class FoldedScales:
    """The result of :func:`fold_norm_scales`.

    Attributes:
        params: the parameters with every foldable scale folded (scales set to one).
        scales: keys of the folded scale parameters (now all ones).
        readers: key of each reader weight that absorbed a scale -> that scale's key.
        skipped: scales that could not be folded, with the reason.
    """

    params: Params
    scales: frozenset[str]
    readers: dict[str, str]
    skipped: tuple[str, ...]


def fold_norm_scales(analysis: SymmetryAnalysis, params: Params) -> FoldedScales:
    """Fold every norm scale whose value only linear layers read (see module docstring).

    Args:
        analysis: the module's symmetry analysis (its scale sites and graph).
        params: parameters of that module (tied weights once, as lmckit keeps them);
            not modified.
    """
    graph_params = dict(analysis.traced.params)
    nodes = {n.name: n for n in analysis.traced.graph.nodes}
    users_of: dict[str, int] = {}
    for ph, key in graph_params.items():  # a tied weight may be lifted more than once
        users_of[key] = users_of.get(key, 0) + len(nodes[ph].users)
    out = dict(params)
    folded: set[str] = set()
    readers: dict[str, str] = {}
    skipped: list[str] = []
    for site in analysis.scales:
        if site.weight is None or site.kind == "layer":
            continue  # affine-free, or a LayerNorm (its mean needs the LayerNorm rewrite)
        scale = graph_params[site.weight]
        found = readers_of(nodes[site.node], graph_params)
        if isinstance(found, str):
            skipped.append(f"{scale}: {found}")
            continue
        shared = [r.weight for r in found if users_of.get(r.weight, 0) > 1]
        if shared:
            skipped.append(f"{scale}: its reader {shared[0]} is also used elsewhere (tied)")
            continue
        g = out[scale].double()
        for weight, axis in ((r.weight, r.axis) for r in found):
            shape = [1] * out[weight].ndim
            shape[axis] = -1
            out[weight] = (out[weight].double() * g.reshape(shape)).to(out[weight].dtype)
            readers[weight] = scale
        out[scale] = torch.ones_like(out[scale])
        folded.add(scale)
    return FoldedScales(out, frozenset(folded), readers, tuple(skipped))
