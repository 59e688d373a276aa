"""Symmetry discovery: the :class:`~lmckit.symmetry.SymmetrySpec` of any module, from its graph.

``infer_spec(module, example_inputs)`` traces the module (:mod:`lmckit.inference._trace`),
interprets every op abstractly (:mod:`lmckit.inference._interpret`: which axes share units,
what each op lets those units do), turns the result into spaces
(:mod:`lmckit.inference._emit`) and verifies them (:func:`lmckit.inference.check_spec`)
before returning. Nothing is guessed: an axis touched by an op the rules do not
understand is left out, and the reason is kept in :attr:`SymmetryAnalysis.left_out`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from lmckit.inference._analysis import Analysis, AttentionSite, ScaleSite
from lmckit.inference._check import FunctionCheck
from lmckit.inference._conflicts import admissible, resolve
from lmckit.inference._emit import Emitted, emit_spaces
from lmckit.inference._experts import DRAWS, decide_experts, understood
from lmckit.inference._experts import first_choices as experts_first_choices
from lmckit.inference._gating import decide_gates
from lmckit.inference._gating import first_choices as gates_first_choices
from lmckit.inference._inputs import ExampleInputs, split_inputs
from lmckit.inference._interpret import interpret
from lmckit.inference._left_out import drop_failing
from lmckit.inference._qk_basis import decide_candidates
from lmckit.inference._qk_basis import first_choices as qk_first_choices
from lmckit.inference._trace import SpecInferenceError, TracedGraph
from lmckit.inference._traced_once import traced_once
from lmckit.symmetry._params import layout, module_params
from lmckit.symmetry._transform import Space, SymmetrySpec

__all__ = ["SymmetryAnalysis", "analyze_symmetries", "infer_spec"]


@dataclass(frozen=True)
class SymmetryAnalysis:
    """An inferred spec and what the graph said besides.

    Attributes:
        spec: the spaces found (verified unless ``check=False``).
        left_out: why things a user might expect are not in the spec (an op the rules
            do not understand, a slice through a feature axis, ...), one line each.
        scales: parameter vectors scaling feature axes (norm scales), for the rewrites
            that fold them into their readers.
        attention: the attention sites of the graph.
        traced: the traced graph.
        analysis: the abstract values (per node, per axis) the spec was read from.
    """

    spec: SymmetrySpec
    left_out: tuple[str, ...]
    scales: tuple[ScaleSite, ...]
    attention: tuple[AttentionSite, ...]
    traced: TracedGraph
    analysis: Analysis

    def report(self) -> str:
        """Spaces, groups and what was left out, as text for people."""
        lines = [f"{len(self.spec)} spaces:"]
        for space in self.spec:
            kind = type(space.group).__name__
            lines.append(f"  {space.name:<28} {kind:<16} n={space.n:<6} {len(space.uses)} uses")
        if self.left_out:
            lines.append("left out:")
            lines += [f"  {line}" for line in self.left_out]
        return "\n".join(lines)


def analyze_symmetries(
    module: nn.Module,
    example_inputs: ExampleInputs,
    *,
    kwargs: Mapping[str, Any] | None = None,
    names: Mapping[str, str] | None = None,
    params: Mapping[str, Tensor] | None = None,
    uniform: Iterable[str] = (),
    check: bool = True,
    decide: bool = True,
    seed: int = 0,
) -> SymmetryAnalysis:
    """Infer ``module``'s symmetries and keep everything the analysis learned.

    Args:
        module: any ``nn.Module`` that ``torch.export`` traces.
        example_inputs: inputs of a forward pass: a tensor (the one input), a tuple of
            the positional inputs, or a dict of keyword inputs (a small batch; use a
            batch of at least 2 so that no axis is confused with a broadcast one).
        kwargs: further keyword inputs of the forward pass.
        names: space names by the module path of their first writer, as patterns with
            numbered fields, e.g. ``{"layers.{i}": "hidden.{i}"}``; unnamed spaces are
            called ``residual`` (written by several modules), ``heads.{k}`` (attention
            heads) or after their first writer module.
        params: the weights to verify the spec at (default: the module's own).
        uniform: keys of parameters that hold one value throughout (e.g. norm scales
            folded to ones, :func:`~lmckit.inference._fold.fold_norm_scales`): they constrain
            no axis and are in no space. Checked against ``params``.
        check: verify the spec (random group elements must not change the outputs)
            before returning; a space that fails is left out, with the reason in
            :attr:`SymmetryAnalysis.left_out` (:func:`~lmckit.inference._left_out.drop_failing`).
        decide: settle the proposals the graph cannot decide alone (rotary query/key
            bases, experts chosen by a router, gated scales) by running the module,
            which reads every parameter's value. ``False`` leaves them out of the spec;
            with ``check=False`` too, no value is read but those of ``uniform`` (for
            callers that need the graph's analysis, not the spec).
        seed: seed of the check's random elements.

    Raises:
        TypeError: example inputs of another type, or that ``forward`` cannot take.
        SpecInferenceError: the module does not trace (naming why), or (a
            :class:`~lmckit.inference.SpecCheckError`) outputs that are not
            deterministic, or spaces that keep the outputs alone but not together.
    """
    args, kw = split_inputs(example_inputs, kwargs, module=module)
    traced = traced_once(module, args, kwargs=kw)
    values = module_params(module) if params is None else params
    constant = _checked_uniform(values, uniform)
    analysis = interpret(traced, uniform=constant)
    emitted = emit_spaces(analysis, names)
    # a space the graph proposes that clashes with the others is left out, not the spec
    shapes = layout(values)
    spaces, clashes = resolve(emitted.spaces, shapes)
    for line in clashes:
        analysis.note(line)
    proposals = decide and bool(emitted.candidates or analysis.experts or analysis.products)
    was_training = module.training
    module.eval()
    try:
        # one float64 copy of the parameters serves every check: the proposals the graph
        # cannot decide (rotary query/key bases, experts chosen by a router, gated
        # scales) and the verification of the whole spec
        function = None
        if proposals or (check and spaces):
            function = FunctionCheck(module, args, params=params, kwargs=kw)
        verified = False
        if proposals and function is not None:
            # first, every proposal in its first choice and every space at once: one pass
            # that, when it holds, decides all of them and verifies the whole spec
            hopeful, routers, notes = decide_all_at_once(analysis, spaces, emitted, function, seed)
            if hopeful is not None:
                spaces, verified = hopeful, True
                for note in notes:
                    analysis.note(note)
                for topk in routers:
                    understood(analysis, topk)
            else:
                spaces, notes = decide_candidates(spaces, emitted.candidates, function, seed=seed)
                spaces, more = decide_experts(analysis, spaces, function, seed=seed)
                spaces = decide_gates(analysis, spaces, function, seed=seed)
                for note in notes + more:
                    analysis.note(note)
        spaces, clashes = resolve(spaces, shapes)
        for line in clashes:
            analysis.note(line)
        spec = SymmetrySpec(tuple(spaces))
        if check and len(spec) and function is not None and not verified:
            # a space the function refuses is left out and reported, not the whole spec
            spec, dropped = drop_failing(function, module, spec, seed=seed)
            for line in dropped:
                analysis.note(line)
    finally:
        module.train(was_training)
    return SymmetryAnalysis(
        spec,
        tuple(analysis.notes),
        tuple(analysis.scales),
        tuple(analysis.attention),
        traced,
        analysis,
    )


def decide_all_at_once(
    analysis: Analysis,
    spaces: list[Space],
    emitted: Emitted,
    function: FunctionCheck,
    seed: int,
) -> tuple[list[Space] | None, list[str], list[str]]:
    """Every proposal in its first choice, checked together with every other space: the
    spaces if random elements of all of them keep the function (the mixtures' expert
    permutations with a few draws, as :func:`~lmckit.inference._experts.decide_experts`
    does), else ``None``; the routers whose top-k the experts explain; and a note per
    proposal that could not be added at all."""
    hopeful, notes = qk_first_choices(spaces, emitted.candidates, function.layout)
    hopeful, routers = experts_first_choices(analysis, hopeful)
    hopeful = gates_first_choices(analysis, hopeful)
    spec = admissible(hopeful, function.layout)
    if spec is None:  # proposals that clash: decided one by one instead
        return None, [], []
    tolerance = 1e-5 * function.scale
    draws = DRAWS if routers else 1
    for k in range(draws):
        error = function.random_error(spec, spec.names, seed + k, keep_within=tolerance)
        if not error <= tolerance:
            return None, [], []
    return hopeful, routers, notes


def infer_spec(
    module: nn.Module,
    example_inputs: ExampleInputs,
    *,
    kwargs: Mapping[str, Any] | None = None,
    names: Mapping[str, str] | None = None,
    params: Mapping[str, Tensor] | None = None,
    uniform: Iterable[str] = (),
    check: bool = True,
    seed: int = 0,
) -> SymmetrySpec:
    """The symmetry spec of ``module``, inferred from its traced graph and verified.

    See :func:`analyze_symmetries` for the arguments and for what was left out.
    """
    return analyze_symmetries(
        module,
        example_inputs,
        kwargs=kwargs,
        names=names,
        params=params,
        uniform=uniform,
        check=check,
        seed=seed,
    ).spec


def _checked_uniform(values: Mapping[str, Tensor], uniform: Iterable[str]) -> frozenset[str]:
    """The keys of ``uniform``, each checked to hold one value throughout in ``values``."""
    constant = frozenset(uniform)
    for key in sorted(constant):
        tensor = values.get(key)
        if tensor is None or not bool((tensor == tensor.flatten()[0]).all()):
            raise SpecInferenceError(f"uniform parameter {key!r} is missing or not constant")
    return constant
