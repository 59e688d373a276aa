"""The form in which a pair of models is aligned: one call, :func:`prepare_pair`.

Aligning two checkpoints starts by choosing the symmetry to align under and, for
transformers, the form of the network that exposes it:

* ``symmetry=None``: the architecture's own spec, models as they are;
* ``"permutation"``: orthogonal spaces become permutation spaces (the
  permutations-only ablation);
* ``"orthogonal"``: a spec with orthogonal spaces is kept; a LayerNorm transformer (a
  ``residual`` space, ``norm="layer"``) is first rewritten to its RMSNorm form, whose
  residual stream is orthogonal (:func:`lmckit.rewrites.layernorm_to_rmsnorm`);
* ``circuits=True``: attention heads are rewritten as their QK/OV circuits
  (:func:`lmckit.rewrites.heads_to_circuits`), keeping the groups the symmetry chose.

Every rewrite is exact (same function). The interface is deliberately small: the
internals will move to symmetry inference without changing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmckit.checkpoint import Checkpoint
from lmckit.symmetry import HeadPermutation, Orthogonal, Permutation, SymmetrySpec

__all__ = ["SYMMETRIES", "PreparedPair", "circuit_form", "prepare_pair"]

#: Values of ``prepare_pair``'s ``symmetry`` besides ``None``.
SYMMETRIES = ("permutation", "orthogonal")


@dataclass(frozen=True)
class PreparedPair:
    """Two checkpoints in the form they are aligned in, and the spec to align under.

    Attributes:
        a, b: the models, rewritten where the form needs it (same functions as given).
        spec: the symmetry spec of that form, with the groups ``symmetry`` chose.
        rewritten: whether ``a`` and ``b`` differ in form from the checkpoints given (then
            an aligned B is only comparable with this ``a``, not the original).
        form: a short description of the form, e.g. ``"RMSNorm form and circuit form"``;
            empty when not rewritten.
    """

    a: Checkpoint
    b: Checkpoint
    spec: SymmetrySpec
    rewritten: bool
    form: str = ""


def circuit_form(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with its attention heads rewritten as QK/OV circuits (exact).

    A checkpoint already in circuit form is returned as is.

    Raises:
        ValueError: the model has no attention heads.
    """
    from lmckit.rewrites import heads_to_circuits

    if getattr(ckpt.model, "attention", None) == "circuits":
        return ckpt
    try:
        module, params = heads_to_circuits(ckpt.model, ckpt.params)
    except (ValueError, AttributeError):
        raise ValueError(f"--circuits: {ckpt.config.name} has no attention heads") from None
    return Checkpoint(module, params, module.config)


def _symmetry_pair(
    a: Checkpoint, b: Checkpoint, symmetry: str | None
) -> tuple[Checkpoint, Checkpoint, SymmetrySpec, bool]:
    spec = a.model.symmetry_spec()
    if symmetry is None:
        return a, b, spec, False
    if symmetry == "permutation":
        ortho = {s.name: Permutation() for s in spec if isinstance(s.group, Orthogonal)}
        return a, b, spec.with_groups(**ortho), False
    if any(isinstance(s.group, Orthogonal) for s in spec):
        return a, b, spec, False
    if "residual" in spec.names and getattr(a.model, "norm", None) == "layer":
        from lmckit.rewrites import layernorm_to_rmsnorm

        rewritten = []
        for ckpt in (a, b):
            module, params = layernorm_to_rmsnorm(ckpt.model, ckpt.params)
            rewritten.append(Checkpoint(module, params, module.config))
        ra, rb = rewritten
        return ra, rb, ra.model.symmetry_spec(), True
    raise ValueError(
        f"--symmetry orthogonal: {a.config.name} has no orthogonal-capable residual stream "
        f"(its spaces {', '.join(spec.names)} allow permutations only)"
    )


def prepare_pair(
    a: Checkpoint, b: Checkpoint, *, symmetry: str | None = None, circuits: bool = False
) -> PreparedPair:
    """The pair and spec to align ``b`` to ``a`` under ``symmetry`` (module docstring).

    Args:
        a, b: two checkpoints of one architecture.
        symmetry: ``None`` (the architecture's groups), ``"permutation"`` or
            ``"orthogonal"``.
        circuits: rewrite attention heads as QK/OV circuits first.

    Raises:
        ValueError: an unknown symmetry, a symmetry the architecture cannot have, or
            circuits for a model without attention heads.
    """
    if symmetry is not None and symmetry not in SYMMETRIES:
        raise ValueError(
            f"symmetry must be one of {', '.join(SYMMETRIES)} or None, got {symmetry!r}"
        )
    a, b, spec, rewritten = _symmetry_pair(a, b, symmetry)
    if circuits:
        a, b = circuit_form(a), circuit_form(b)
        full = a.model.symmetry_spec()
        # keep the groups the symmetry chose (the permutations-only ablation); circuit
        # heads are plain permutations of whole circuits
        kept = {
            s.name: spec[s.name].group
            for s in full
            if s.name in spec.names and not isinstance(spec[s.name].group, HeadPermutation)
        }
        spec, rewritten = full.with_groups(**kept), True
    rms = getattr(a.model, "norm", None) == "rms"
    names = [f for f, on in (("RMSNorm form", rms), ("circuit form", circuits)) if on]
    return PreparedPair(a, b, spec, rewritten, " and ".join(names) if rewritten else "")
