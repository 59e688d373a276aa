"""Gated branches: a scale per unit traded between a branch and the layers reading it.

A gated MLP multiplies two branches unit by unit, ``h = act(gate x) * (up x)``, and a
linear layer reads ``h``. Scaling unit ``i`` of the plain linear branch by ``s_i != 0``
(its row of ``up``) and dividing the reader's column ``i`` by ``s_i`` keeps the
function. The graph says where: a product of two activations (recorded by the
elementwise rules), one of whose factors comes from a linear layer through views alone
and feeds nothing else, and whose value flows only into linear layers. The scaling is a
space spanning the units of the permutation space those rows live in
(:class:`~lmckit.symmetry.Nest` with ``unit=None``), proposed here and kept when a check
of the function says so.
"""

from __future__ import annotations

from torch.fx import Node

from lmckit.groups import Scaling
from lmckit.inference._analysis import Analysis
from lmckit.inference._check import FunctionCheck
from lmckit.inference._conflicts import admissible
from lmckit.inference._graph import TRANSPARENT, op_name
from lmckit.inference._readers import readers_of
from lmckit.symmetry._transform import Nest, Space, Use

__all__ = ["decide_gates", "first_choices"]

#: a proposal is kept when its random elements move the outputs by at most this much
RTOL = 1e-5


def _plain_branch(an: Analysis, node: Node) -> tuple[str, int, str | None] | None:
    """``(weight key, output axis, bias key)`` of the linear layer ``node`` is, through
    views, if nothing else reads the way between them."""
    params = an.traced.params
    while op_name(node) in TRANSPARENT:
        parent = node.args[0]
        if not isinstance(parent, Node) or len(parent.users) != 1:
            return None
        node = parent
    if op_name(node) == "linear":
        weight, bias, axis = node.args[1], (node.args[2] if len(node.args) > 2 else None), 0
    elif op_name(node) == "addmm":  # (in, out) weights: Hugging Face's Conv1D
        weight, bias, axis = node.args[2], node.args[0], 1
    else:
        return None
    if not isinstance(weight, Node) or weight.name not in params or len(weight.users) != 1:
        return None
    bias_key = params[bias.name] if isinstance(bias, Node) and bias.name in params else None
    return params[weight.name], axis, bias_key


def _proposal(an: Analysis, node: Node, spaces: list[Space]) -> Space | None:
    readers = readers_of(node, dict(an.traced.params))
    if isinstance(readers, str) or not readers:
        return None
    operands = [a for a in node.args if isinstance(a, Node)]
    branches = [b for a in operands if len(a.users) == 1 and (b := _plain_branch(an, a))]
    if not branches:
        return None
    weight, axis, bias = branches[-1]  # one branch is enough: the other may not be plain
    parent = next(
        (s for s in spaces if s.nest is None and any(
            (u.param, u.axis) == (weight, axis) for u in s.uses)),
        None,
    )  # fmt: skip
    if parent is None or parent.group.units(parent.n) != parent.n:
        return None
    uses = [Use(weight, axis, "write")] + ([Use(bias, 0, "write")] if bias else [])
    uses += [Use(r.weight, r.axis, "read") for r in readers]
    name = f"{parent.name}.scale"
    return Space(name, parent.n, Scaling(), tuple(uses), nest=Nest(parent.name, None, "scale"))


def _proposals(an: Analysis, spaces: list[Space]) -> list[Space]:
    nodes = {n.name: n for n in an.traced.graph.nodes}
    proposals = [p for name in an.products if (p := _proposal(an, nodes[name], spaces))]
    return list({p.name: p for p in proposals}.values())


def first_choices(an: Analysis, spaces: list[Space]) -> list[Space]:
    """``spaces`` with the scale of every gated branch, unchecked."""
    return spaces + _proposals(an, spaces)


def decide_gates(
    an: Analysis, spaces: list[Space], check: FunctionCheck, *, seed: int = 0
) -> list[Space]:
    """``spaces`` with the scale of each gated branch that a check of the function keeps
    (all together when they pass together, else each alone)."""
    proposals = _proposals(an, spaces)

    def passes(added: list[Space]) -> bool:
        spec = admissible(spaces + added, check.layout)
        if spec is None:  # clashes with another space: not added
            return False
        tolerance = RTOL * check.scale
        error = check.random_error(spec, [s.name for s in added], seed, keep_within=tolerance)
        return error <= tolerance

    if not proposals:
        return spaces
    if passes(proposals):
        return spaces + proposals
    return spaces + [p for p in proposals if passes([p])]
