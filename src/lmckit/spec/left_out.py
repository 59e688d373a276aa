"""Spaces that fail the symmetry check, found and left out.

Inference proposes spaces from the graph; the function has the last word. A space whose
random element changes the outputs (heads whose order ALiBi slopes fix, say) is left
out with the spaces nested in it, and a one-line reason, instead of failing the whole
spec (:func:`drop_failing`, used by :func:`lmckit.spec.infer.analyze_symmetries`).
"""

from __future__ import annotations

import torch
from torch import nn

from lmckit.spec.check import FunctionCheck, SpecCheckError, verify
from lmckit.spec.check_elements import random_check_element
from lmckit.symmetry import SymmetrySpec, Transform

__all__ = ["drop_failing"]


def drop_failing(
    check: FunctionCheck,
    module: nn.Module,
    spec: SymmetrySpec,
    *,
    seed: int = 0,
    rtol: float = 1e-5,
) -> tuple[SymmetrySpec, list[str]]:
    """``spec`` without the spaces whose random elements change the outputs (and the
    spaces nested in them), and one line per space left out, saying why.

    For inference: a space the graph analysis proposed but the function refuses (e.g.
    heads whose order per-head constants such as ALiBi slopes fix) is left out, not the
    whole spec; nothing that changes the function is kept. The rest is verified again.

    Raises:
        SpecCheckError: outputs that are not deterministic (nothing can be checked), or
            random elements of the remaining spaces that still change the outputs
            together although each keeps them alone.
    """
    dropped: list[str] = []
    for _ in range(len(spec) + 1):
        try:
            verify(check, module, spec, (), None, seed=seed, rtol=rtol, diagnose=False)
            return spec, dropped
        except SpecCheckError as err:
            failing = _failing_spaces(check, spec, seed, rtol)
            if not failing:
                raise SpecCheckError(f"{err} (every space keeps the outputs alone)") from None
        gone = set()
        for name, error in failing.items():
            inner = [s.name for s in spec.nested_in(name)]
            gone |= {name, *inner}
            also = f" (with {len(inner)} spaces nested in it)" if inner else ""
            group = type(spec[name].group).__name__
            dropped.append(
                f"{name} ({group}, n={spec[name].n}){also}: a random element changes the "
                f"outputs (relative error {error:.2g}), so it is left out"
            )
        spec = SymmetrySpec(tuple(s for s in spec if s.name not in gone))
    raise SpecCheckError("the spec does not settle: spaces keep failing")  # pragma: no cover


def _failing_spaces(
    check: FunctionCheck, spec: SymmetrySpec, seed: int, rtol: float
) -> dict[str, float]:
    """``{space: relative error}`` of the spaces whose random element alone changes the
    outputs (parents before the spaces nested in them)."""
    tolerance = rtol * check.scale
    generator = torch.Generator().manual_seed(seed + 1)
    failing: dict[str, float] = {}
    for space in spec:
        if space.nest is not None and space.nest.parent in failing:
            continue  # goes with its parent
        alone = Transform(spec, {space.name: random_check_element(space, generator)})
        error = check.error(spec, alone, keep_within=tolerance)
        if error > tolerance:
            failing[space.name] = error
    return failing
