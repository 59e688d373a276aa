"""Mixtures of experts: the permutation of experts, and the units inside each expert.

A mixture computes every token through the few experts its router ranks highest. The
experts' weights are stacked on one axis and multiplied segment by segment (a grouped
matrix product, :func:`lmckit.spec.layers._grouped_mm`); the segments come from sorting
tokens by the router's top choices. Permuting the experts together with the router's
rows leaves every choice, and so the function, unchanged -- but the graph says so only
through index arithmetic (top-k, sort, histograms, offsets) that the op rules do not
follow. So the permutation is proposed from the graph's structure (the stacked weights
whose offsets come from one router's top-k) and decided by a check of the function, as
are the units inside each expert: one permutation per expert, nested in the expert
permutation, in place of the one permutation for all experts the graph gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torch.fx import Node

from lmckit.spec.analysis import Analysis, ExpertSite
from lmckit.spec.check import FunctionCheck
from lmckit.spec.conflicts import admissible
from lmckit.spec.graph import op_name
from lmckit.symmetry import Nest, Part, Permutation, Space, Use

__all__ = ["DRAWS", "decide_experts", "first_choices", "understood"]

#: a proposal is kept when its random elements move the outputs by at most this much
RTOL = 1e-5
#: random elements a proposal is checked with
DRAWS = 3
#: ops a router's scores pass through on the way to their top-k
_SCORES = {"softmax", "_softmax", "sigmoid", "to", "_to_copy", "view", "reshape", "float",
           "contiguous", "clone", "alias"}  # fmt: skip
#: arithmetic with constants on the way (a fixed preference, a temperature): the check
#: decides whether the experts stay exchangeable
_ARITHMETIC = {"add", "sub", "mul", "div"}


def _find_topk(node: Node, depth: int = 0) -> Node | None:
    """The top-k that ``node`` (offsets of a grouped product) is computed from."""
    if depth > 16:
        return None
    for arg in node.all_input_nodes:
        if op_name(arg) == "topk":
            return arg
        found = _find_topk(arg, depth + 1)
        if found is not None:
            return found
    return None


def _router(an: Analysis, topk: Node) -> tuple[str, str | None] | None:
    """The weight and bias keys of the linear layer whose scores ``topk`` ranks."""
    node = topk.args[0]
    params = an.traced.params
    while isinstance(node, Node) and op_name(node) in _SCORES | _ARITHMETIC:
        varying = [
            a for a in node.all_input_nodes if not getattr(an.values.get(a.name), "const", True)
        ]
        if len(varying) != 1:
            return None
        node = varying[0]
    if not isinstance(node, Node) or op_name(node) != "linear":
        return None
    weight, bias = node.args[1], (node.args[2] if len(node.args) > 2 else None)
    if not isinstance(weight, Node) or weight.name not in params:
        return None
    bias_key = params[bias.name] if isinstance(bias, Node) and bias.name in params else None
    return params[weight.name], bias_key


def _proposal(
    an: Analysis, sites: Sequence[ExpertSite], spaces: Sequence[Space], name: str
) -> tuple[Space, list[Space], Space | None, str] | None:
    """The expert permutation of one mixture, the per-expert unit spaces to nest in it,
    the one shared unit space they replace, and the router's top-k node."""
    nodes = {n.name: n for n in an.traced.graph.nodes}
    topk = _find_topk(nodes[sites[0].offsets])
    router = _router(an, topk) if topk is not None else None
    if router is None:
        return None
    experts = an.traced.shapes[sites[0].weight][0]
    if an.traced.shapes[router[0]][0] != experts:
        return None
    keys = list(dict.fromkeys(s.weight for s in sites))
    uses = [Use(router[0], 0, "write")] + ([Use(router[1], 0, "write")] if router[1] else [])
    uses += [Use(key, 0, "write") for key in keys]
    parent = Space(name, experts, Permutation(), tuple(uses))
    assert topk is not None
    shared = next((s for s in spaces if {u.param for u in s.uses} == set(keys)), None)
    if shared is None or shared.nest is not None:
        return parent, [], None, topk.name
    inner = []
    for e in range(experts):
        nested = tuple(dataclasses.replace(u, parts=(Part(0, e, 1), *u.parts)) for u in shared.uses)
        inner.append(
            Space(f"{name}.units.{e}", shared.n, shared.group, nested, nest=Nest(name, e, "units"))
        )
    return parent, inner, shared, topk.name


def _mixtures(an: Analysis) -> list[list[ExpertSite]]:
    by_offsets: dict[str, list[ExpertSite]] = {}
    for site in an.experts:
        by_offsets.setdefault(site.offsets, []).append(site)
    return list(by_offsets.values())


def understood(an: Analysis, topk: str) -> None:
    """The router's top-k is understood once its experts are in the spec: no note."""
    an.notes[:] = [n for n in an.notes if f"(node {topk!r})" not in n]


def first_choices(an: Analysis, spaces: list[Space]) -> tuple[list[Space], list[str]]:
    """``spaces`` with every mixture's experts and the units of each (in place of the
    shared unit space), unchecked: what :func:`decide_experts` keeps when everything
    passes; and the routers' top-k nodes, understood if so."""
    routers = []
    for i, sites in enumerate(_mixtures(an)):
        found = _proposal(an, sites, spaces, f"experts.{i}")
        if found is None:
            continue
        parent, inner, shared, topk = found
        spaces = [s for s in spaces if s is not shared] + [parent, *inner]
        routers.append(topk)
    return spaces, routers


def decide_experts(
    an: Analysis, spaces: list[Space], check: FunctionCheck, *, seed: int = 0
) -> tuple[list[Space], list[str]]:
    """``spaces`` with each mixture's expert permutation (and the units of each expert)
    that a check of the function keeps; notes for what it does not."""
    notes: list[str] = []
    for i, sites in enumerate(_mixtures(an)):
        found = _proposal(an, sites, spaces, f"experts.{i}")
        if found is None:
            notes.append(f"{sites[0].weight}: experts whose router lmckit cannot find")
            continue
        parent, inner, shared, _ = found
        tries = [[s for s in spaces if s is not shared] + [parent, *inner]] if inner else []
        tries.append([*spaces, parent])
        for candidate in tries:
            spec = admissible(candidate, check.layout)
            if spec is None:  # clashes with another space: not added
                continue
            moved = [parent.name, *(s.name for s in inner if s in candidate)]
            # a few draws: one random permutation may fix the experts that break it
            tolerance = RTOL * check.scale
            errors = (check.random_error(spec, moved, seed + k, keep_within=tolerance)
                      for k in range(DRAWS))  # fmt: skip
            if max(errors) <= tolerance:
                spaces = candidate
                understood(an, found[3])
                break
        else:
            notes.append(f"{parent.uses[0].param}: permuting the experts changes the function")
    return spaces, notes
