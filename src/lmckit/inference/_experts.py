"""Mixtures of experts: the permutation of experts, and the units inside each expert.

A mixture computes every token through the few experts its router ranks highest. The
experts' weights are stacked on one axis and multiplied segment by segment (a grouped
matrix product, :func:`lmckit.inference._layers._grouped_mm`); the segments come from sorting
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

import torch
from torch.fx import Node

from lmckit.inference._analysis import Analysis, ExpertSite
from lmckit.inference._check import FunctionCheck
from lmckit.inference._conflicts import admissible
from lmckit.inference._graph import op_name
from lmckit.symmetry._transform import Nest, Part, Permutation, Space, Use

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


@dataclasses.dataclass(frozen=True)
class _Router:
    """The linear layer whose scores a mixture's top-k ranks: its weight and bias keys,
    per-expert parameter vectors added to the scores on the way (DeepSeek's correction
    bias), and the top-k nodes the choice is made with (the mask of group-limited
    routing is made by top-k of its own)."""

    weight: str
    bias: str | None
    added: tuple[str, ...]
    topks: tuple[str, ...]
    #: groups of consecutive experts the mask ranks first (a top-k over the scores viewed
    #: as ``(groups, experts / groups)``): only permutations that keep them may hold
    groups: int = 1


#: ops that give a parameter's values unchanged but for their dtype or layout
_CASTS = {"to", "_to_copy", "type_as", "alias", "clone", "contiguous"}


def _parameter(an: Analysis, node: object) -> str | None:
    """The state-dict key of the parameter ``node`` is (through casts), else None."""
    while isinstance(node, Node) and op_name(node) in _CASTS:
        node = node.args[0]
    return an.traced.params.get(node.name) if isinstance(node, Node) else None


def _behind(node: Node, depth: int = 16) -> list[Node]:
    """``node`` and the nodes it is computed from, at most ``depth`` steps back."""
    seen, frontier = {node}, [node]
    for _ in range(depth):
        frontier = [a for n in frontier for a in n.all_input_nodes if a not in seen]
        seen.update(frontier)
    return list(seen)


def _topks_behind(node: Node) -> set[str]:
    """The top-k nodes ``node`` is computed from (a routing mask)."""
    return {n.name for n in _behind(node) if op_name(n) == "topk"}


def _router(an: Analysis, topk: Node) -> _Router | None:
    """The router of the scores ``topk`` ranks, followed back through normalisations,
    arithmetic with constants, per-expert parameter vectors added to them, and masks
    that leave some experts out (group-limited routing); else None."""
    node = topk.args[0]
    experts = int(node.meta["val"].shape[-1]) if isinstance(node, Node) else 0
    added: list[str] = []
    topks = [topk.name]
    groups = 1
    while isinstance(node, Node) and op_name(node) in _SCORES | _ARITHMETIC | {"masked_fill"}:
        if op_name(node) == "masked_fill" and isinstance(node.args[0], Node):
            if isinstance(node.args[1], Node):
                topks += sorted(_topks_behind(node.args[1]))
                groups = max(groups, _groups(node.args[1], experts))
            node = node.args[0]
            continue
        varying = [
            a for a in node.all_input_nodes if not getattr(an.values.get(a.name), "const", True)
        ]
        vectors = [a for a in varying if (key := _parameter(an, a)) is not None
                   and an.traced.shapes[key] == (experts,)]  # fmt: skip
        if op_name(node) == "add" and len(varying) == 2 and len(vectors) == 1:
            added.append(str(_parameter(an, vectors[0])))
            varying.remove(vectors[0])
        if len(varying) != 1:
            return None
        node = varying[0]
    if not isinstance(node, Node) or op_name(node) != "linear":
        return None
    weight = _parameter(an, node.args[1])
    bias = _parameter(an, node.args[2]) if len(node.args) > 2 else None
    if weight is None:
        return None
    return _Router(weight, bias, tuple(added), tuple(dict.fromkeys(topks)), groups)


#: ops that lay the experts' axis out as ``(groups, experts / groups)``
_GROUPING = {"view", "reshape", "_unsafe_view", "expand", "unflatten"}


def _groups(mask: Node, experts: int) -> int:
    """The groups of consecutive experts a routing mask is made of: the most groups of a
    view of scores (or of the mask) as ``(groups, experts / groups)`` behind it, else 1."""
    found = 1
    for node in _behind(mask):
        value = node.meta.get("val")
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
        if op_name(node) in _GROUPING and len(shape) >= 2 and min(shape[-2:]) > 1:
            if shape[-1] * shape[-2] == experts:
                found = max(found, int(shape[-2]))
    return found


def _proposal(
    an: Analysis, sites: Sequence[ExpertSite], spaces: Sequence[Space], name: str
) -> tuple[Space, list[Space], Space | None, _Router] | None:
    """The expert permutation of one mixture, the per-expert unit spaces to nest in it,
    the one shared unit space they replace, and the router."""
    nodes = {n.name: n for n in an.traced.graph.nodes}
    topk = _find_topk(nodes[sites[0].offsets])
    router = _router(an, topk) if topk is not None else None
    if router is None:
        return None
    experts = an.traced.shapes[sites[0].weight][0]
    if an.traced.shapes[router.weight][0] != experts:
        return None
    keys = list(dict.fromkeys(s.weight for s in sites))
    moved = [router.weight, *([router.bias] if router.bias else []), *router.added]
    uses = [Use(k, 0, "write", compare=k not in an.traced.statistics) for k in moved]
    uses += [Use(key, 0, "write") for key in keys]
    parent = Space(name, experts, Permutation(), tuple(uses))
    shared = next((s for s in spaces if {u.param for u in s.uses} == set(keys)), None)
    if shared is None or shared.nest is not None:
        return parent, [], None, router
    inner = []
    for e in range(experts):
        nested = tuple(dataclasses.replace(u, parts=(Part(0, e, 1), *u.parts)) for u in shared.uses)
        inner.append(
            Space(f"{name}.units.{e}", shared.n, shared.group, nested, nest=Nest(name, e, "units"))
        )
    return parent, inner, shared, router


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
    routers: list[str] = []
    for i, sites in enumerate(_mixtures(an)):
        found = _proposal(an, sites, spaces, f"experts.{i}")
        if found is None:
            continue
        parent, inner, shared, router = found
        spaces = [s for s in spaces if s is not shared] + [parent, *inner]
        routers += router.topks
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
        parent, inner, shared, router = found
        for candidate in _tries(spaces, parent, inner, shared, router.groups):
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
                for topk in router.topks:
                    understood(an, topk)
                break
        else:
            notes.append(f"{parent.uses[0].param}: permuting the experts changes the function")
    return spaces, notes


def _tries(
    spaces: list[Space], parent: Space, inner: list[Space], shared: Space | None, groups: int
) -> list[list[Space]]:
    """The specs to check, the largest first: every permutation of the experts, then
    (routing limited to groups of experts) those that map each group onto a group; each
    with the units of every expert, then with one unit space for all."""
    parents = [parent]
    if groups > 1:
        parents.append(dataclasses.replace(parent, group=Permutation(blocks=groups)))
    tries = []
    for mover in parents:
        if inner:
            tries.append([s for s in spaces if s is not shared] + [mover, *inner])
        tries.append([*spaces, mover])
    return tries
