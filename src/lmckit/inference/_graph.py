"""Small facts about nodes of a traced graph, shared by the passes that read it."""

from __future__ import annotations

from torch.fx import Node

__all__ = ["TRANSPARENT", "is_inplace", "op_name", "stack"]

#: ops that pass a value on unchanged but for its layout (views, copies, casts)
TRANSPARENT = {
    "view", "reshape", "_unsafe_view", "transpose", "permute", "contiguous", "clone",
    "alias", "to", "_to_copy", "dropout", "detach", "unsqueeze", "squeeze", "t", "flatten",
}  # fmt: skip


def op_name(node: Node) -> str:
    """``linear`` for ``aten.linear.default``, ``getitem`` for ``operator.getitem``."""
    target = getattr(node.target, "overloadpacket", node.target)
    return str(getattr(target, "__name__", target))


def is_inplace(node: Node) -> bool:
    """Whether ``node`` is an in-place op (``add_``, ``copy_``): it changes its first
    operand, so its effect is read through that tensor, not through its result."""
    name = op_name(node)
    return node.op == "call_function" and name.endswith("_") and not name.endswith("__")


def stack(node: Node) -> list[str]:
    """Paths of the modules ``node`` runs inside, outermost first."""
    modules = node.meta.get("nn_module_stack") or {}
    return [str(path) for path, _cls in modules.values()]
