"""Verify a symmetry spec on a module: random group elements must not change its outputs.

This is the library's central invariant made executable. The check runs in float64
where the module allows it, so a true symmetry leaves the outputs equal to ~1e-12 and
any broken one (a forgotten bias, BatchNorm statistics that do not move, a nonlinearity
that does not commute with rotations) shows as an error of order one. A large model is
checked in float32, module by module (:mod:`lmckit.measure._streamed`): each module's parameters
are cast and moved while it runs, so the check holds no copy of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.func import functional_call

from lmckit.inference._check_elements import random_check_element
from lmckit.inference._inputs import ExampleInputs, bind_inputs, split_inputs
from lmckit.inference._trace import SpecInferenceError, prediction
from lmckit.measure._streamed import streamed_call
from lmckit.symmetry._params import LazyParams, Params, as_module, layout, meta_of, module_params
from lmckit.symmetry._params import dtype_of as read_dtype
from lmckit.symmetry._transform import (
    Space,
    SymmetrySpec,
    Transform,
    apply_to_param,
    as_spec,
    check_transform,
)

__all__ = [
    "FLOAT64_CHECK_BYTES",
    "FunctionCheck",
    "SpecCheckError",
    "check_spec",
    "output_error",
    "verify",
]


#: The largest float64 copy of a model's parameters a check makes (1 GiB, 134M
#: parameters). Larger models are checked in float32 with a 1000 times looser tolerance:
#: a broken symmetry still moves the outputs by order one, and a float32 model's check
#: then holds no copy of its parameters at all.
FLOAT64_CHECK_BYTES = 2**30


class SpecCheckError(SpecInferenceError):
    """A spec's group element changes the module's outputs; the message names the space."""


def _leaves(output: Any) -> list[Tensor]:
    output = prediction(output)
    if hasattr(output, "to_tuple"):  # Hugging Face ModelOutput
        output = output.to_tuple()
    return [x for x in pytree.tree_leaves(output) if isinstance(x, Tensor)]


def output_error(reference: Sequence[Tensor], other: Sequence[Tensor]) -> float:
    """Largest ``max |a - b| / max |b|`` over the float outputs (inf on shape mismatch)."""
    worst = 0.0
    for ref, out in zip(reference, other, strict=True):
        if not ref.is_floating_point():
            if not torch.equal(ref, out):
                return float("inf")
            continue
        if ref.shape != out.shape:
            return float("inf")
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        diff = float((ref.double() - out.double()).abs().max()) if ref.numel() else 0.0
        worst = max(worst, diff / max(scale, 1e-30))
    return worst


def _runner(
    module: nn.Module, example_inputs: Sequence[Any], kwargs: Mapping[str, Any], dtype: torch.dtype
) -> Callable[[Mapping[str, Tensor]], list[Tensor]]:
    """The module's outputs at given parameters: a whole state dict, or a
    :class:`~lmckit.symmetry._params.LazyParams` put in module by module as each runs."""
    inputs = [x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() else x
              for x in example_inputs]  # fmt: skip

    def run(params: Mapping[str, Tensor]) -> list[Tensor]:
        with torch.no_grad():
            if isinstance(params, LazyParams):
                return _leaves(streamed_call(module, params, *inputs, **kwargs))
            return _leaves(functional_call(module, dict(params), tuple(inputs), dict(kwargs)))

    return run


def _cast(params: Mapping[str, Tensor], dtype: torch.dtype) -> Params:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in params.items()}


class _Moved(LazyParams):
    """``source`` in ``dtype``, moved by ``moves`` in turn, each tensor computed when read."""

    def __init__(self, source: Mapping[str, Tensor], dtype: torch.dtype) -> None:
        super().__init__(source)
        self.dtype = dtype
        self.moves: list[tuple[SymmetrySpec, Transform]] = []

    def __getitem__(self, key: str) -> Tensor:
        value = self.source[key]
        if not value.is_floating_point():
            return value
        value = value.detach().to(self.dtype)
        for spec, transform in self.moves:
            if any(s.name in transform.elements for s, _ in spec.uses_of(key)):
                value = apply_to_param(spec, key, value, transform)
        return value

    def dtype_of(self, key: str) -> torch.dtype:
        dtype = read_dtype(self.source, key)
        return self.dtype if dtype.is_floating_point else dtype

    def meta(self, key: str) -> Tensor:
        return meta_of(self.source, key).to(self.dtype_of(key))


class FunctionCheck:
    """A module's outputs at some parameters, and how far transformed parameters move
    them: in float64 where the module allows it and the copy is at most
    :data:`FLOAT64_CHECK_BYTES` (a true symmetry then changes the outputs by ~1e-12, a
    broken one by order one), else in float32 with a 1000 times looser tolerance,
    module by module: each module's parameters are cast and moved while it runs
    (:func:`lmckit.measure._streamed.streamed_call`), so a bfloat16 model is never copied whole
    in float32 (a module that reads another module's parameters is checked on a whole
    float32 copy instead).

    Attributes:
        layout: shapes and dtypes of the parameters (meta tensors), for checks of fit.
        scale: how much looser than float64's the check's tolerance is (1 or 1000).

    Args:
        module: the module (put in eval mode for the check's duration by the caller).
        example_inputs: positional inputs.
        params: the parameters (default: the module's own).
        kwargs: keyword inputs.
    """

    def __init__(
        self,
        module: nn.Module,
        example_inputs: Sequence[Any],
        *,
        params: Mapping[str, Tensor] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        given = module_params(module) if params is None else params
        kwargs = kwargs or {}
        self._moved: _Moved | None = None  # the parameters, when checked module by module
        self.layout = layout(given)
        numel = sum(v.numel() for v in self.layout.values() if v.is_floating_point())
        # a float64 copy of a large model costs more memory than its precision tells
        if numel * 8 <= FLOAT64_CHECK_BYTES:
            try:
                self._prepare(module, example_inputs, kwargs, given, torch.float64)
                self.scale = 1.0
                return
            except (RuntimeError, TypeError):  # a module that hard-codes float32 somewhere
                pass
        self.scale = 1e3
        try:
            self._prepare(module, example_inputs, kwargs, given, torch.float32, streamed=True)
        except (RuntimeError, TypeError, IndexError, ValueError):
            # a module reads a tensor of another module outside that one's forward (Kimi's
            # linear attention reads its convolution's weight): the empty stand-in fails
            self._prepare(module, example_inputs, kwargs, given, torch.float32)

    def _prepare(
        self,
        module: nn.Module,
        example_inputs: Sequence[Any],
        kwargs: Mapping[str, Any],
        params: Mapping[str, Tensor],
        dtype: torch.dtype,
        *,
        streamed: bool = False,
    ) -> None:
        """The runner, the parameters in ``dtype`` and the reference outputs: a whole
        copy, or (``streamed``) each module's own cast and moved while it runs."""
        run = _runner(module, example_inputs, kwargs, dtype)
        held: Mapping[str, Tensor]
        if streamed:
            held = _Moved(params, dtype)
        else:
            held = self.params = _cast(params, dtype)
        self.reference = run(held)  # raises before anything is kept when it cannot run
        self._moved = held if isinstance(held, _Moved) else None
        self._run = lambda: run(held)

    def repeat_error(self) -> float:
        """The relative output error of a second run at the same parameters: zero for a
        deterministic module (active dropout makes it order one)."""
        return output_error(self.reference, self._run())

    def error(
        self, spec: SymmetrySpec, transform: Transform, *, keep_within: float | None = None
    ) -> float:
        """The relative output error of the parameters moved by ``transform``.

        The parameters are moved one at a time in place of the check's own copy, or,
        checked module by module, as each module runs. Where the error is within
        ``keep_within`` they stay moved: they compute the same function, so later
        checks against the same reference outputs hold. Otherwise they are moved back
        by the inverse (exact for permutations, to ~1e-16 for the rest in float64).
        """
        check_transform(spec, self.layout, transform)
        touched: list[str] = []
        if self._moved is not None:
            self._moved.moves.append((spec, transform))
        else:
            moving = set(transform.elements)
            touched = [n for n, v in self.params.items() if v.is_floating_point()
                       and any(s.name in moving for s, _ in spec.uses_of(n))]  # fmt: skip
            for name in touched:
                self.params[name] = apply_to_param(spec, name, self.params[name], transform)
        error = float("inf")
        try:
            error = output_error(self.reference, self._run())
            return error
        finally:
            if keep_within is None or not error <= keep_within:
                if self._moved is not None:
                    self._moved.moves.pop()
                elif touched:
                    back = transform.inverse()
                    for name in touched:
                        self.params[name] = apply_to_param(spec, name, self.params[name], back)

    def random_error(
        self,
        spec: SymmetrySpec,
        names: Sequence[str],
        seed: int,
        *,
        keep_within: float | None = None,
    ) -> float:
        """:meth:`error` of a random element of the spaces ``names`` (others fixed)."""
        generator = torch.Generator().manual_seed(seed)
        elements = {name: random_check_element(spec[name], generator) for name in names}
        return self.error(spec, Transform(spec, elements), keep_within=keep_within)


def check_spec(
    module: nn.Module,
    spec: SymmetrySpec,
    example_inputs: ExampleInputs,
    *,
    params: Mapping[str, Tensor] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    rtol: float = 1e-5,
    diagnose: bool = True,
) -> dict[str, float]:
    """Check that random elements of every space of ``spec`` preserve ``module``'s outputs.

    All spaces are moved together first (one forward pass); only if that fails is each
    space checked alone, to name the one that breaks.

    Args:
        module: the module (run in eval mode through ``functional_call``).
        spec: the spec to verify.
        example_inputs: a tensor (the one input, e.g. a batch of token ids ``(2, 8)``),
            a tuple of the positional inputs, or a dict of keyword inputs.
        params: the parameters to check at (default: the module's state dict).
        kwargs: further keyword inputs.
        seed: seed of the random group elements.
        rtol: largest relative output error accepted (in float64; 1e3 times larger when
            the module only runs in float32).
        diagnose: on failure, compare with the inferred spec to name the parameter that
            breaks the function (traces the module once more).

    Returns:
        The relative output error of the joint check, per space when some failed.

    Raises:
        TypeError: example inputs of another type, or that ``forward`` cannot take.
        SpecCheckError: naming the first space whose random element changes the outputs,
            and the parameter that breaks it where one can be found; or outputs that
            differ between two runs (active dropout), which no check can compare.
    """
    module = as_module(module, "module")
    spec = as_spec(spec)
    example_inputs, kwargs = split_inputs(example_inputs, kwargs, module=module)
    bind_inputs(module, example_inputs, kwargs)
    params = dict(module_params(module) if params is None else params)
    spec.validate(params)
    was_training = module.training
    module.eval()
    try:
        check = FunctionCheck(module, example_inputs, params=params, kwargs=kwargs)
        return verify(check, module, spec, example_inputs, kwargs, seed=seed, rtol=rtol,
                      diagnose=diagnose)  # fmt: skip
    finally:
        module.train(was_training)


def verify(
    check: FunctionCheck,
    module: nn.Module,
    spec: SymmetrySpec,
    example_inputs: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    *,
    seed: int = 0,
    rtol: float = 1e-5,
    diagnose: bool = True,
) -> dict[str, float]:
    """:func:`check_spec` on a :class:`FunctionCheck` already made (module in eval mode,
    inputs split); its parameters are left moved by whatever passed."""
    rtol *= check.scale
    again = check.repeat_error()
    if again > rtol:
        raise SpecCheckError(
            f"{type(module).__name__}'s outputs are not deterministic: two runs on the "
            f"same inputs and weights differ (relative error {again:.2g}), so no "
            "symmetry can be checked; is dropout active (F.dropout(..., training=True), "
            "a module that samples)? make the forward pass deterministic"
        )
    generator = torch.Generator().manual_seed(seed)
    joint = Transform(spec, {s.name: random_check_element(s, generator) for s in spec})
    # what passes stays moved (the same function): no pass back over every parameter
    error = check.error(spec, joint, keep_within=rtol)
    if error <= rtol:
        return {"all": error}
    errors = {}
    for space in spec:
        alone = Transform(spec, {space.name: random_check_element(space, generator)})
        errors[space.name] = check.error(spec, alone, keep_within=rtol)
        if errors[space.name] > rtol:
            detail = ""
            if diagnose:
                detail = _diagnose(module, spec, space, example_inputs, kwargs)
            raise SpecCheckError(
                f"space {space.name!r} ({type(space.group).__name__}, n={space.n}) changes "
                f"the outputs (relative error {errors[space.name]:.2g}){detail}"
            )
    return errors


def _diagnose(
    module: nn.Module,
    spec: SymmetrySpec,
    space: Space,
    example_inputs: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
) -> str:
    """Which parameter makes ``space`` break the function, read off the inferred spec."""
    from lmckit.inference._infer import analyze_symmetries

    try:
        inferred = analyze_symmetries(module, example_inputs, kwargs=kwargs, check=False).spec
    except SpecInferenceError:
        return ""
    mine = {(u.param, u.axis) for u in space.uses}
    best = max(
        inferred, key=lambda s: len(mine & {(u.param, u.axis) for u in s.uses}), default=None
    )
    if best is None or not mine & {(u.param, u.axis) for u in best.uses}:
        first = space.uses[0]
        return f": the module's graph gives {first.param!r} (axis {first.axis}) no symmetry at all"
    theirs = {(u.param, u.axis): u for u in best.uses}
    order = list(module_params(module))
    missing = sorted(set(theirs) - mine, key=lambda pa: order.index(pa[0]) if pa[0] in order else 0)
    if missing:
        param, axis = missing[0]
        return f": parameter {param!r} (axis {axis}) moves with this space but the spec omits it"
    extra = sorted(mine - set(theirs), key=lambda pa: order.index(pa[0]) if pa[0] in order else 0)
    if extra:
        param, axis = extra[0]
        return f": parameter {param!r} (axis {axis}) is in the spec but not in this space"
    for use in space.uses:
        other = theirs[(use.param, use.axis)]
        if (use.outer, use.inner) != (other.outer, other.inner):
            return (
                f": parameter {use.param!r} (axis {use.axis}) has blocks outer={use.outer}, "
                f"inner={use.inner}; the graph says outer={other.outer}, inner={other.inner}"
            )
    if type(space.group) is not type(best.group):
        return f": the graph allows {type(best.group).__name__}, not {type(space.group).__name__}"
    return ""
