"""A form as named steps: :class:`Rewrite` (one exact step) and :class:`AlignForm` (two
models in a form, the steps that put a model in it, the spec to align under).

A form is reached from a model's own architecture by exact steps, each named by an
identifier (``"to_zoo"``, ``"fold_norms"``, ``"untie:KEY"``, ``"rmsnorm"``,
``"circuits"``), worked out once on model A (:func:`lmckit.forms._recipe.form_of`) and applied
to model B in turn (:meth:`AlignForm.with_b`); how a form is named to people is derived
from its steps (:func:`step_label`), never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from torch import Tensor, nn

from lmckit.inference._inputs import ExampleInputs
from lmckit.symmetry._transform import SymmetrySpec

__all__ = ["REWRITING_STEPS", "STEP_LABELS", "AlignForm", "Rewrite", "step_label"]


#: How each step of a form is named to people (``untie:KEY``: ``KEY untied``; the
#: conversion to lmckit's own model is not a change of form and is not named).
STEP_LABELS = {
    "to_zoo": "",
    "fold_norms": "norm scales folded",
    "rmsnorm": "RMSNorm form",
    "circuits": "circuit form",
}
#: Steps after which the module is a new architecture of lmckit's own.
REWRITING_STEPS = frozenset({"rmsnorm", "circuits"})


def step_label(name: str) -> str:
    """How the step ``name`` is named to people (``""``: not named)."""
    if name.startswith("untie:"):
        return f"{name.removeprefix('untie:')} untied"
    return STEP_LABELS[name]


@dataclass(frozen=True)
class Rewrite:
    """One exact step of a form, named: how a model's parameters are put in it.

    Attributes:
        name: an identifier: ``"to_zoo"`` (a Hugging Face folder as lmckit's own
            model), ``"fold_norms"``, ``"untie:KEY"``, ``"rmsnorm"``, ``"circuits"``.
        before: the module whose parameters the step takes.
        after: the module of the parameters it gives.
        apply: one model's parameters (of ``before``) in the step's form (of ``after``),
            the same function.
    """

    name: str
    before: nn.Module = field(repr=False)
    after: nn.Module = field(repr=False)
    apply: Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]] = field(repr=False)


@dataclass(frozen=True)
class AlignForm:
    """Two models in the form they are aligned in, and the spec to align under.

    Attributes:
        module: the form's module (the given one unless a step rewrote it).
        a, b: both models' parameters in that form (same functions as given); with
            norm scales folded, a :class:`~lmckit.inference._fold.FoldedParams` that computes
            each folded weight when it is read (no float32 copy of a bfloat16 model).
        spec: the symmetry spec of that form, with the groups ``symmetry`` chose.
        steps: the form's steps in order (:class:`Rewrite`): :meth:`put` takes another
            model of the same architecture through them.
        folded: keys of the norm scales folded into their readers (now all ones).
        inputs: the example inputs the spec was inferred from (a tensor, a tuple of
            positional inputs or a dict of keyword inputs, as given).
    """

    module: nn.Module
    a: Mapping[str, Tensor]
    b: Mapping[str, Tensor]
    spec: SymmetrySpec
    steps: tuple[Rewrite, ...] = ()
    folded: frozenset[str] = frozenset()
    inputs: ExampleInputs = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The steps' identifiers, in order."""
        return tuple(step.name for step in self.steps)

    @property
    def rewritten(self) -> bool:
        """The module is a new architecture (RMSNorm form, circuits): results are only
        comparable with ``a`` in this form, and are written in lmckit's form."""
        return any(name in REWRITING_STEPS for name in self.names)

    @property
    def form(self) -> str:
        """What was done, e.g. ``"norm scales folded"``, ``"RMSNorm form and circuit
        form"``; empty when nothing was."""
        return " and ".join(label for label in map(step_label, self.names) if label)

    def put(self, params: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        """Another model of the given architecture in this form (each step in turn)."""
        for step in self.steps:
            params = step.apply(params)
        return params

    def with_b(self, params: Mapping[str, Tensor]) -> AlignForm:
        """This form with ``params`` (of the given architecture) put in it as ``b``."""
        return replace(self, b=self.put(params))

    def after(self, steps: tuple[Rewrite, ...]) -> AlignForm:
        """This form reached after ``steps`` (e.g. the conversion to lmckit's model)."""
        return replace(self, steps=(*steps, *self.steps))
