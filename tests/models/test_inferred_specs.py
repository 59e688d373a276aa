"""Inference finds exactly the zoo's hand-written specs, for every model and option."""

from __future__ import annotations

import pytest
from tests.models.reference_specs import REFERENCE_SPECS
from tests.models.test_zoo import SMALL, _cases

from lmckit.inference import infer_spec
from lmckit.models import create_model
from lmckit.symmetry._transform import SymmetrySpec


def structure(spec: SymmetrySpec) -> dict[str, tuple]:
    """Name -> (group, n, uses as a set, circuits) of the spaces that are not nested in
    others (the hand-written specs stop at whole heads; the nested ones are checked
    below); read and write act alike for the groups inference emits (permutations and
    orthogonal maps: ``T^{-T} = T``)."""
    out = {}
    for s in (s for s in spec if s.nest is None):
        uses = frozenset(
            (u.param, u.axis, u.outer, u.inner, u.compare, u.role == "elementwise") for u in s.uses
        )
        out[s.name] = (s.group, s.n, uses, s.circuits)
    return out


@pytest.mark.parametrize(("name", "norm", "activation", "attention"), _cases())
def test_inferred_spec_is_the_hand_written_one(name, norm, activation, attention) -> None:
    kwargs = dict(SMALL[name].kwargs, norm=norm)
    if activation is not None:
        kwargs["activation"] = activation
    if attention is not None:
        kwargs["attention"] = attention
    module, _ = create_model(name, **kwargs)
    oracle = structure(REFERENCE_SPECS[name](module))
    inferred = infer_spec(module, module.example_inputs(), names=module.space_names)
    assert structure(inferred) == oracle
    # the spec every caller of the zoo gets (inferred once per architecture, then kept)
    assert structure(module.symmetry_spec()) == oracle
