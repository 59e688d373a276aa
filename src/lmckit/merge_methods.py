"""Registry of merge methods: how the point ``t`` of the path from A to B is made.

Every merge method has one signature (:class:`MergeMethod`)::

    method(params_a, params_b, t, *, model=None, inputs=None) -> Params

``t`` in ``[0, 1]`` (0 is A, 1 is B), ``model`` the module both run through and
``inputs`` a callable returning training input batches, for methods that run the
network (:attr:`MergeInfo.needs_model`, :attr:`MergeInfo.needs_data`). Path
evaluation uses the same methods as ``prepare`` hooks
(:func:`lmckit.evaluate.evaluate_path`): :func:`path_prepare` builds one, measuring
what a method can share between the points of a path (REPAIR's endpoint statistics)
once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from torch import nn

from lmckit.merge import (
    Inputs,
    has_batchnorm,
    repair,
    repair_prepare,
    reset_batchnorm,
    reset_prepare,
)
from lmckit.params import Params, interpolate

__all__ = [
    "MergeInfo",
    "MergeMethod",
    "Prepare",
    "get_merge_method",
    "list_merge_methods",
    "merge_info",
    "path_prepare",
    "register_merge_method",
]

#: ``prepare(theta_t, t)``: the merged point ``theta_t`` fixed up (see evaluate_path).
Prepare = Callable[[Params, float], Params]

FRANKLE_2020 = (
    "Frankle, Dziugaite, Roy, Carbin, 2020, Linear Mode Connectivity and the Lottery "
    "Ticket Hypothesis, https://arxiv.org/abs/1912.05671"
)
REPAIR = (
    "Jordan, Sedghi, Saukh, Entezari, Neyshabur, 2023, REPAIR: REnormalizing Permuted "
    "Activations for Interpolation Repair, https://arxiv.org/abs/2211.08403"
)


class MergeMethod(Protocol):
    """The signature every registered merge method has (module docstring)."""

    def __call__(
        self,
        params_a: Params,
        params_b: Params,
        t: float,
        *,
        model: nn.Module | None = None,
        inputs: Inputs | None = None,
    ) -> Params: ...


#: builds a path hook: ``(model, params_a, params_b, inputs) -> prepare`` (or None).
PrepareFactory = Callable[[nn.Module, Params, Params, Inputs], Prepare | None]


@dataclass(frozen=True)
class MergeInfo:
    """A registered merge method and what it needs.

    Attributes:
        name: registry name, e.g. ``"repair"``.
        fn: the method.
        paper: where it comes from (citation and link).
        needs_model: it runs the network (``model=`` is required).
        needs_data: it reads training inputs (``inputs=`` is required).
        prepare: builds the ``prepare`` hook path evaluation applies at every point.
    """

    name: str
    fn: MergeMethod
    paper: str
    needs_model: bool
    needs_data: bool
    prepare: PrepareFactory


_METHODS: dict[str, MergeInfo] = {}
F = TypeVar("F", bound=Callable[..., Params])


def register_merge_method(
    name: str,
    *,
    paper: str,
    prepare: PrepareFactory,
    needs_model: bool = False,
    needs_data: bool = False,
) -> Callable[[F], F]:
    """Decorator adding a merge method under ``name``; ``paper`` cites it."""

    def deco(fn: F) -> F:
        if name in _METHODS:
            raise ValueError(f"merge method {name!r} is already registered")
        _METHODS[name] = MergeInfo(name, fn, paper, needs_model, needs_data, prepare)
        return fn

    return deco


def list_merge_methods() -> list[str]:
    """Names of the registered merge methods, sorted."""
    return sorted(_METHODS)


def merge_info(name: str) -> MergeInfo:
    """The registry entry of ``name``; ``KeyError`` listing the valid names on a typo."""
    try:
        return _METHODS[name]
    except KeyError:
        known = ", ".join(sorted(_METHODS))
        raise KeyError(f"unknown merge method {name!r}; known merge methods: {known}") from None


def get_merge_method(name: str) -> MergeMethod:
    """The merge method registered as ``name`` (``KeyError`` listing the valid names)."""
    return merge_info(name).fn


def path_prepare(
    name: str, model: nn.Module, params_a: Params, params_b: Params, inputs: Inputs
) -> Prepare | None:
    """The ``prepare`` hook that makes every point of a path with method ``name``
    (``None`` for plain interpolation, which needs no fix-up)."""
    info = merge_info(name)
    _check_needs(info, model, inputs)
    return info.prepare(model, params_a, params_b, inputs)


def _check_needs(info: MergeInfo, model: nn.Module | None, inputs: Inputs | None) -> None:
    if info.needs_model and model is None:
        raise ValueError(f"merge method {info.name!r} needs model=...")
    if info.needs_data and inputs is None:
        raise ValueError(f"merge method {info.name!r} needs inputs=... (training batches)")
    if info.name == "reset_bn" and model is not None and not has_batchnorm(model):
        raise ValueError("merge method 'reset_bn' needs a network with BatchNorm layers")


@register_merge_method("interpolate", paper=FRANKLE_2020, prepare=lambda *_: None)
def interpolate_merge(
    params_a: Params,
    params_b: Params,
    t: float,
    *,
    model: nn.Module | None = None,
    inputs: Inputs | None = None,
) -> Params:
    """Interpolation: ``(1 - t) theta_a + t theta_b``, nothing else."""
    return interpolate(params_a, params_b, t)


def _reset_prepare(model: nn.Module, _a: Params, _b: Params, inputs: Inputs) -> Prepare:
    return reset_prepare(model, inputs)


@register_merge_method(
    "reset_bn", paper=REPAIR, prepare=_reset_prepare, needs_model=True, needs_data=True
)
def reset_bn_merge(
    params_a: Params,
    params_b: Params,
    t: float,
    *,
    model: nn.Module | None = None,
    inputs: Inputs | None = None,
) -> Params:
    """BatchNorm reset: interpolate, then recompute BatchNorm statistics on training data."""
    _check_needs(merge_info("reset_bn"), model, inputs)
    assert model is not None and inputs is not None
    return reset_batchnorm(model, interpolate(params_a, params_b, t), inputs())


@register_merge_method(
    "repair", paper=REPAIR, prepare=repair_prepare, needs_model=True, needs_data=True
)
def repair_merge(
    params_a: Params,
    params_b: Params,
    t: float,
    *,
    model: nn.Module | None = None,
    inputs: Inputs | None = None,
) -> Params:
    """REPAIR: interpolate, then rescale channels to the endpoints' interpolated statistics."""
    _check_needs(merge_info("repair"), model, inputs)
    assert model is not None and inputs is not None
    return repair(model, params_a, params_b, t, inputs)
