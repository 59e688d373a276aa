"""B's function checked on B: the aligned model against B's own outputs, before writing.

The spec a pair is aligned under is inferred, and checked with random group elements, on
model A. A space can keep A's outputs and still change B's: a BLOOM A near its
initialisation, whose attention adds almost nothing, passes the check of its head order
although per-head ALiBi slopes fix that order in a trained B. So the transform the
method found is run on B itself, on the example inputs, before anything is written: a
space whose part of it changes B's outputs is left out (its element, and those of the
spaces nested in it, reset to the identity; one line each says so), and if B's outputs
still change by more than :data:`B_RTOL`, nothing is aligned: :class:`BFunctionError`.

Cost: two forward passes of B when the transform keeps its function (B's outputs, then
B moved); one more per space only when it does not. The passes are
:class:`lmckit.inference._check.FunctionCheck`'s: in float64 on a copy of up to 134M
parameters, above that in float32 module by module, moving each module's parameters
while it runs (no copy of the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from lmckit.inference._check import FunctionCheck, output_error
from lmckit.inference._inputs import ExampleInputs, bind_inputs, split_inputs
from lmckit.symmetry._transform import SymmetrySpec, Transform

__all__ = ["B_RTOL", "BFunctionCheck", "BFunctionError", "check_b_function"]

#: The largest relative change of B's outputs (``max |y' - y| / max |y|`` over the
#: example inputs) an aligned B may show; true symmetries stay below 1e-10 in float64
#: and about 1e-6 in float32, a broken one moves the outputs by order one.
B_RTOL = 1e-4


class BFunctionError(ValueError):
    """The aligned B computes another function than B (the message says how far)."""


@dataclass(frozen=True)
class BFunctionCheck:
    """What :func:`check_b_function` found.

    Attributes:
        transform: the transform to apply to B: the one given, with the spaces left out
            reset to the identity.
        error: the relative change of B's outputs under ``transform``.
        left_out: one line per space left out (with the spaces nested in it), saying why.
        dropped: the names of the spaces left out, nested ones included.
    """

    transform: Transform
    error: float
    left_out: tuple[str, ...] = ()
    dropped: frozenset[str] = frozenset()

    def metadata(self) -> dict[str, object]:
        """JSON-ready, for what an aligned output records."""
        return {"relative_error": self.error, "rtol": B_RTOL, "left_out": list(self.left_out)}


def check_b_function(
    module: nn.Module,
    params_b: Mapping[str, Tensor],
    transform: Transform,
    example_inputs: ExampleInputs,
    *,
    rtol: float = B_RTOL,
) -> BFunctionCheck:
    """Check that ``transform`` keeps B's outputs; leave out the spaces that do not.

    Args:
        module: B's module (or the module of the form B was aligned in), run in eval mode.
        params_b: B's parameters (in that form), not modified.
        transform: the transform found for B (its ``spec`` names the spaces).
        example_inputs: the inputs B is run on (a tensor, a tuple, a dict of keywords).
        rtol: the largest relative output change accepted.

    Raises:
        BFunctionError: B's outputs still change by more than ``rtol`` once every space
            that changes them alone is left out.
    """
    args, kwargs = split_inputs(example_inputs, module=module)
    bind_inputs(module, args, kwargs)
    was_training = module.training
    module.eval()
    try:
        check = FunctionCheck(module, args, params=params_b, kwargs=kwargs)
        return _settle(check, transform, rtol)
    finally:
        module.train(was_training)


def outputs_changed(
    module: nn.Module,
    params_b: Mapping[str, Tensor],
    aligned: Mapping[str, Tensor],
    example_inputs: ExampleInputs,
) -> float:
    """The relative change of B's outputs from ``params_b`` to ``aligned`` (for a B
    moved by more than one transform, e.g. head bases after a permutation)."""
    args, kwargs = split_inputs(example_inputs, module=module)
    was_training = module.training
    module.eval()
    try:
        before = FunctionCheck(module, args, params=params_b, kwargs=kwargs).reference
        after = FunctionCheck(module, args, params=aligned, kwargs=kwargs).reference
    finally:
        module.train(was_training)
    return output_error(before, after)


def _groups(spec: SymmetrySpec, transform: Transform) -> dict[str, list[str]]:
    """The spaces ``transform`` moves, by top-level space: each with those nested in it
    (a nested element is solved for the units its parent paired, so they go together)."""
    out: dict[str, list[str]] = {}
    for space in spec:
        if space.name not in transform.elements:
            continue
        top = space.name
        while spec[top].nest is not None:
            top = spec[top].nest.parent  # type: ignore[union-attr]
        out.setdefault(top, []).append(space.name)
    return out


def _settle(check: FunctionCheck, transform: Transform, rtol: float) -> BFunctionCheck:
    """The whole transform if it keeps the outputs, else without the spaces that do not."""
    spec = transform.spec
    error = check.error(spec, transform)
    if error <= rtol:
        return BFunctionCheck(transform, error)
    lines: list[str] = []
    dropped: set[str] = set()
    for top, names in _groups(spec, transform).items():
        alone = Transform(spec, {n: transform.elements[n] for n in names})
        moved = check.error(spec, alone)
        if moved <= rtol:
            continue
        space = spec[top]
        inner = len(names) - 1
        also = f" (with {inner} spaces nested in it)" if inner else ""
        lines.append(
            f"{top} ({type(space.group).__name__}, n={space.n}){also}: the element found for "
            f"B changes B's outputs (relative error {moved:.2g}); reset to the identity"
        )
        dropped |= set(names) | {s.name for s in spec.nested_in(top)}
    kept = Transform(spec, {k: v for k, v in transform.elements.items() if k not in dropped})
    error = check.error(spec, kept) if dropped else error
    if error > rtol:
        raise BFunctionError(
            f"the aligned B computes another function than B: its outputs on the example "
            f"inputs change by {error:.2g} (relative; at most {rtol:g} allowed)"
            + (f" even with {', '.join(sorted(dropped))} left out" if dropped else "")
            + "; nothing was aligned"
        )
    return BFunctionCheck(kept, error, tuple(lines), frozenset(dropped))
