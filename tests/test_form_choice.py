"""The form a pair is aligned in: chosen from measured data (``PREFERRED_FORMS``), forced
by the caller, refused with a reason; recorded and read back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmckit.forms._choice import FORMS, PREFERRED_FORMS, FormChoice, choose_form
from lmckit.forms._recipe import aligned_form
from lmckit.models import create_model

X = torch.randn(4, 6)


@pytest.fixture(scope="module")
def gpt2():
    return create_model("gpt2", vocab_size=17, n_layer=1, n_head=2, n_embd=8, context=8, seed=0)


def test_default_is_the_first_preferred_form_the_model_can_take(gpt2) -> None:
    module, params = gpt2
    for (method, symmetry), order in PREFERRED_FORMS.items():
        choice = choose_form(module, method=method, symmetry=symmetry)
        assert choice.name == order[0] and choice.chosen
        assert choice.circuits == FORMS[order[0]].circuits
        assert not choice.to_zoo  # already lmckit's own model


def test_a_changed_preference_is_a_change_of_data(gpt2, monkeypatch) -> None:
    module, params = gpt2
    monkeypatch.setitem(PREFERRED_FORMS, ("weight", "permutation"), ("projected", "circuits"))
    assert choose_form(module, symmetry="permutation").name == "projected"
    monkeypatch.setitem(PREFERRED_FORMS, ("weight", "permutation"), ("circuits", "projected"))
    assert choose_form(module, symmetry="permutation").name == "circuits"


def test_forms_a_model_cannot_take_fall_through(gpt2, monkeypatch) -> None:
    monkeypatch.setitem(PREFERRED_FORMS, ("weight", None), ("circuits", "projected"))
    mlp = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    choice = choose_form(mlp)
    assert choice.name == "projected" and not choice.circuits
    # bases inside heads are aligned in the projected form only
    module, gparams = gpt2
    assert choose_form(module, head_bases=True).name == "projected"


def test_forced_forms_and_their_refusals(gpt2) -> None:
    module, params = gpt2
    forced = choose_form(module, circuits=False)
    assert forced.name == "projected" and not forced.chosen
    mlp = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    with pytest.raises(ValueError, match="the circuit form rewrites lmckit.s own transformers"):
        choose_form(mlp, circuits=True)
    with pytest.raises(ValueError, match="head_bases=True aligns bases inside heads"):
        choose_form(module, circuits=True, head_bases=True)
    with pytest.raises(ValueError, match="symmetry must be one of"):
        choose_form(module, symmetry="rotations")


def test_the_chosen_form_is_the_form_aligned_in(gpt2) -> None:
    module, params = gpt2
    choice = choose_form(module, symmetry="orthogonal", circuits=True)
    form = aligned_form(module, params, params, symmetry=choice.symmetry, circuits=choice.circuits)
    assert form.module.config.kwargs["attention"] == "circuits"
    assert "circuit form" in form.form


def test_the_record_round_trips_and_junk_reads_as_none() -> None:
    choice = FormChoice("circuits", "orthogonal", True, True, True, False)
    assert FormChoice.from_dict(choice.to_dict()) == choice
    assert "circuits" in choice.describe() and "as asked" in choice.describe()
    for junk in (None, [], {"name": "nope"}, {**choice.to_dict(), "circuits": "yes"},
                 {**choice.to_dict(), "symmetry": "rotations"}):  # fmt: skip
        assert FormChoice.from_dict(junk) is None
