"""Attention written out by hand: ``softmax(q @ k^T * scale + mask) @ v``.

Research code and some ``transformers`` families (DeBERTa) compute attention with plain
matrix products instead of ``scaled_dot_product_attention``. The heads are found either
way (a product of two activations per slice moves whole heads, see
:func:`lmckit.inference._layers.contract`), but the attention itself -- which operands are
queries, keys and values -- is what names the bases inside heads (query/key, value),
proposes rotary-plane rotations where positions pin the query/key basis, and gives the
heads their QK/OV circuits. :func:`eager_site` reads it off the product that applies
the attention weights to the values: its first operand is a softmax (through dropout
and casts), whose input is a product of two activations (through scalings, masks,
added position terms and functions of each score, such as a soft cap), the second of
them the keys transposed.
"""

from __future__ import annotations

from torch.fx import Node

from lmckit.inference._analysis import Analysis, AttentionSite
from lmckit.inference._graph import op_name

__all__ = ["eager_site"]

#: ops between the softmax and the product with the values (views merge or split the
#: leading axes: heads into the batch, as DeBERTa does)
_TO_VALUES = {"dropout", "to", "_to_copy", "contiguous", "clone", "alias", "detach", "type_as",
              "view", "reshape", "_unsafe_view"}  # fmt: skip
#: ops between the scores' product and the softmax (the scale, masks, position terms,
#: and functions of each score: Gemma 2 caps them with ``c * tanh(s / c)``)
_TO_SOFTMAX = _TO_VALUES | {"mul", "div", "add", "sub", "masked_fill", "where", "tanh",
                            "clamp", "clamp_min", "clamp_max"}  # fmt: skip
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax"}
#: products of queries and keys: ``baddbmm(bias, q, k^T)`` adds a table to them (ALiBi)
_PRODUCTS = {"matmul", "bmm", "baddbmm"}
#: ops a key may pass through after its transpose (a scale applied to ``k^T``)
_KEY_SCALE = _TO_VALUES | {"mul", "div"}


def _back(node: object, through: set[str], stop: set[str], depth: int = 0) -> Node | None:
    """The first node of an op in ``stop`` found walking back from ``node`` through ops
    in ``through`` (every node argument is followed, first ones first)."""
    if not isinstance(node, Node) or depth > 16:
        return None
    op = op_name(node)
    if op in stop:
        return node
    if op not in through:
        return None
    for arg in node.args:
        found = _back(arg, through, stop, depth + 1)
        if found is not None:
            return found
    return None


def _untransposed(node: object) -> Node | None:
    """The keys whose last two axes ``node`` swaps (through a scaling), else None."""
    found = _back(node, _KEY_SCALE, {"transpose", "t"})
    if found is None:
        return None
    if op_name(found) == "transpose":
        shape = getattr(found.meta.get("val"), "shape", None)
        if shape is None:
            return None
        ndim = len(shape)
        dims = [d % ndim for d in found.args[1:3] if isinstance(d, int)]
        if sorted(dims) != [ndim - 2, ndim - 1]:
            return None
    key = found.args[0]
    return key if isinstance(key, Node) else None


def eager_site(an: Analysis, node: Node) -> AttentionSite | None:
    """The attention whose weights the product ``node`` applies to its values, or None."""
    probs, values = node.args[0], node.args[1]
    softmax = _back(probs, _TO_VALUES, _SOFTMAX)
    if softmax is None or not an.is_activation(values):
        return None
    scores = _back(softmax.args[0], _TO_SOFTMAX, _PRODUCTS)
    if scores is None:
        return None
    first = 1 if op_name(scores) == "baddbmm" else 0
    queries, keys_t = scores.args[first], scores.args[first + 1]
    keys = _untransposed(keys_t)
    if keys is None or not (an.is_activation(queries) and an.is_activation(keys)):
        return None
    assert isinstance(queries, Node) and isinstance(values, Node)
    return AttentionSite(node.name, queries.name, keys.name, values.name)
