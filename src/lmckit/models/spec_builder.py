"""Build the uses of a space from the modules that write into and read from it.

Zoo models describe their spaces by naming modules; these helpers turn a module into
the parameter axes it contributes, so no model spells out parameter names by hand.
"""

from __future__ import annotations

from torch import nn

from lmckit.symmetry import Group, Probe, Space, Use

__all__ = ["reads", "space", "writes"]

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def writes(name: str, module: nn.Module) -> list[Use]:
    """Uses of a module whose output channels live in the space (axis 0 of its tensors)."""
    if isinstance(module, _NORMS):
        # norms act unit by unit: their parameters and statistics only follow
        # permutations (role "elementwise"), unlike a writer's weight and bias
        uses = [
            Use(f"{name}.{p}", 0, "elementwise") for p, _ in module.named_parameters(recurse=False)
        ]
        for bname, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                uses.append(Use(f"{name}.{bname}", 0, "elementwise", compare=False))
        return uses
    return [Use(f"{name}.{p}", 0, "write") for p, _ in module.named_parameters(recurse=False)]


def reads(name: str, module: nn.Module, *, inner: int = 1) -> list[Use]:
    """Uses of a Linear or Conv whose input channels live in the space (weight axis 1)."""
    if not isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d):
        raise TypeError(f"{name}: cannot read a space with {type(module).__name__}")
    return [Use(f"{name}.weight", 1, "read", inner=inner)]


def space(
    name: str,
    n: int,
    group: Group,
    *,
    writers: list[tuple[str, nn.Module]],
    readers: list[tuple[str, nn.Module]],
    probes: list[Probe] | None = None,
) -> Space:
    """A space from its writer and reader modules (``(qualified name, module)`` pairs)."""
    uses: list[Use] = []
    for mname, module in writers:
        uses += writes(mname, module)
    for mname, module in readers:
        uses += reads(mname, module)
    return Space(name, n, group, tuple(uses), tuple(probes or ()))
