"""Minimal graphs for the op rules: trace a module of one to three ops, interpret it, and
read what the rules said about each node's axes.

A rule's test builds the smallest module that runs its op, then asserts what the rule
must leave behind: which axes are one variable (:func:`same`), how much symmetry each
keeps (:func:`level`), the blocks a glued or cut axis is made of (:func:`blocks`), the
roles of parameter axes, and, through :func:`spaces`, the checked spaces that follow.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.fx import Node

from lmckit.inference import analyze_symmetries
from lmckit.inference._analysis import Analysis, Value
from lmckit.inference._graph import op_name
from lmckit.inference._interpret import interpret
from lmckit.inference._lattice import Level, Var
from lmckit.inference._trace import trace
from lmckit.symmetry._transform import SymmetrySpec

__all__ = [
    "Level", "blocks", "interpreted", "leaves", "level", "node", "param_axis", "same", "seeded",
    "spaces", "value",
]  # fmt: skip


def interpreted(module: nn.Module, *inputs: Any) -> Analysis:
    """The rules' analysis of ``module``'s graph on ``inputs`` (nothing emitted or checked)."""
    return interpret(trace(module, inputs))


def node(an: Analysis, op: str, index: int = 0) -> Node:
    """The ``index``-th node of the graph running op ``op`` (``"cat"``, ``"linear"``)."""
    found = [n for n in an.traced.graph.nodes if n.op == "call_function" and op_name(n) == op]
    return found[index]


def value(an: Analysis, op: str, index: int = 0) -> Value:
    """The abstract value of the ``index``-th node running ``op``."""
    out = an.values[node(an, op, index).name]
    assert isinstance(out, Value)
    return out


def param_axis(an: Analysis, key: str, axis: int) -> Var:
    """The variable (root) of a parameter's axis."""
    return an.lattice.find(an.param_vars[key][axis])


def leaves(an: Analysis, factors: list[Var]) -> list[Var]:
    return an.lattice.leaves(factors)


def level(an: Analysis, factors: list[Var]) -> Level:
    """The least level of the leaves of an axis (``FREE`` for an axis of size one)."""
    found = leaves(an, factors)
    return min((v.level for v in found), default=Level.FREE)


def same(an: Analysis, a: list[Var], b: list[Var]) -> bool:
    """Whether two axes are the same units (the same leaves)."""
    return leaves(an, a) == leaves(an, b)


def blocks(an: Analysis, factors: list[Var]) -> list[tuple[int, Var]] | None:
    """The blocks ``(start, variable)`` an axis of one variable is glued or cut from."""
    found = leaves(an, factors)
    assert len(found) == 1, found
    return an.lattice.pieces(found[0])


def spaces(module: nn.Module, *inputs: Any) -> SymmetrySpec:
    """The checked spec of ``module`` (random elements keep its outputs)."""
    return analyze_symmetries(module, inputs).spec


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """``module`` with every parameter redrawn from ``seed`` (norm scales not ones)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module.eval()
