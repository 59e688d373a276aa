"""Registry of merge methods: how the point ``t`` of the path from A to B is made.

Every merge method has one signature (:class:`MergeMethod`)::

    method(params_a, params_b, t, *, model=None, inputs=None) -> Params

``t`` in ``[0, 1]`` (0 is A, 1 is B), ``model`` the module both run through and
``inputs`` a callable returning training input batches, for methods that run the
network (:attr:`MergeInfo.needs_model`, :attr:`MergeInfo.needs_data`).

A method is registered as what path evaluation needs: a factory of the ``prepare``
hook of :func:`lmckit.measure.evaluate_path` (``prepare(theta_t, t)`` fixes up the
interpolated point), built once per path so that what the points share (REPAIR's
endpoint statistics) is measured once; :func:`path_prepare` returns it. The merge
itself is that hook applied to the interpolation (:func:`merge`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from torch import nn

from lmckit._errors import Param, ParameterError
from lmckit._registry import Registry, check_needs, summary
from lmckit.merging._merge import Inputs, has_batchnorm, repair_prepare, reset_prepare
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import Params

__all__ = [
    "MergeInfo",
    "MergeMethod",
    "Prepare",
    "check_t",
    "get_merge_method",
    "list_merge_methods",
    "merge",
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
    """The signature every merge method has (module docstring)."""

    def __call__(
        self,
        params_a: Params,
        params_b: Params,
        t: float,
        *,
        model: nn.Module | None = None,
        inputs: Inputs | None = None,
    ) -> Params: ...


#: ``(model, params_a, params_b, inputs) -> prepare`` (``None``: nothing to fix).
PrepareFactory = Callable[[nn.Module, Params, Params, Inputs], Prepare | None]


@dataclass(frozen=True)
class MergeInfo:
    """A registered merge method and what it needs.

    Attributes:
        name: registry name, e.g. ``"repair"``.
        prepare: builds the hook that fixes up each interpolated point.
        paper: where it comes from (citation and link).
        needs_model: it runs the network (``model=`` is required).
        needs_data: it reads training inputs (``inputs=`` is required).
        needs_batchnorm: it only applies to networks with BatchNorm layers.
    """

    name: str
    prepare: PrepareFactory
    paper: str
    needs_model: bool = False
    needs_data: bool = False
    needs_batchnorm: bool = False

    @property
    def summary(self) -> str:
        """First line of the factory's docstring."""
        return summary(self.prepare)


_METHODS: Registry[MergeInfo] = Registry("merge method")


def register_merge_method(
    name: str,
    *,
    paper: str,
    needs_model: bool = False,
    needs_data: bool = False,
    needs_batchnorm: bool = False,
) -> Callable[[PrepareFactory], PrepareFactory]:
    """Decorator adding a merge method (its ``prepare`` factory) under ``name``."""

    def deco(factory: PrepareFactory) -> PrepareFactory:
        _METHODS.add(
            name, MergeInfo(name, factory, paper, needs_model, needs_data, needs_batchnorm)
        )
        return factory

    return deco


def list_merge_methods() -> list[str]:
    """Names of the registered merge methods, sorted."""
    return _METHODS.names()


def merge_info(name: str) -> MergeInfo:
    """The registry entry of ``name``; ``KeyError`` listing the valid names on a typo."""
    return _METHODS.get(name)


def path_prepare(
    name: str,
    model: nn.Module | None,
    params_a: Params,
    params_b: Params,
    inputs: Inputs | None,
) -> Prepare | None:
    """The ``prepare`` hook of method ``name`` for the path from A to B (``None`` for
    plain interpolation), after checking that the method has what it needs."""
    info = merge_info(name)
    check_needs(Param(name), info, data=inputs is not None, model=model is not None,
                names=("inputs", "model"))  # fmt: skip
    if info.needs_batchnorm and model is not None and not has_batchnorm(model):
        raise ParameterError(f"{{name}} needs a network with BatchNorm layers; "
                             f"{type(model).__name__} has no BatchNorm layers",
                             name=Param(name))  # fmt: skip
    return info.prepare(model, params_a, params_b, inputs)  # type: ignore[arg-type]


def check_t(t: object) -> float:
    """``t`` as a float, the point ``(1 - t) A + t B`` of the path from A (0) to B (1):
    the one check of ``t``.

    Raises:
        TypeError: not a real number (a string, ``True``).
        ParameterError: not finite, or outside ``[0, 1]``.
    """
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"t must be a number in [0, 1], got {t!r}")
    if not (math.isfinite(t) and 0.0 <= t <= 1.0):
        raise ParameterError(f"{{t}} must lie in [0, 1], got {t}", t="t")
    return float(t)


def merge(
    name: str,
    params_a: Params,
    params_b: Params,
    t: float,
    *,
    model: nn.Module | None = None,
    inputs: Inputs | None = None,
) -> Params:
    """The point ``t`` of the path from A to B made by method ``name``."""
    check_t(t)
    theta = interpolate(params_a, params_b, t)
    prepare = path_prepare(name, model, params_a, params_b, inputs)
    return theta if prepare is None else prepare(theta, t)


def get_merge_method(name: str) -> MergeMethod:
    """Method ``name`` with the common signature (``KeyError`` listing the valid names)."""
    merge_info(name)
    return partial(merge, name)


@register_merge_method("interpolate", paper=FRANKLE_2020)
def _interpolate(*_: object) -> None:
    """Interpolation: ``(1 - t) theta_a + t theta_b``, nothing else."""
    return None


@register_merge_method(
    "reset_bn", paper=REPAIR, needs_model=True, needs_data=True, needs_batchnorm=True
)
def _reset_bn(model: nn.Module, _a: Params, _b: Params, inputs: Inputs) -> Prepare:
    """BatchNorm reset: recompute BatchNorm statistics of the point on training data."""
    return reset_prepare(model, inputs)


@register_merge_method("repair", paper=REPAIR, needs_model=True, needs_data=True)
def _repair(model: nn.Module, params_a: Params, params_b: Params, inputs: Inputs) -> Prepare:
    """REPAIR: rescale channels to the endpoints' interpolated statistics."""
    return repair_prepare(model, params_a, params_b, inputs)
