"""Spaces that cannot act together are left out one by one, never the whole spec.

Per rule of a spec (names, nesting, families of nested spaces, overlaps, fit to the
parameters): :func:`~lmckit.inference._conflicts.resolve` leaves out the later space of a clash
(with what is nested in it) and says why in one line; what is left is a valid spec.
:func:`~lmckit.inference._left_out.drop_failing` does the same for the check of the function:
a head permutation that fails leaves its nested bases standing, an orthogonal space that
fails is kept as a permutation, spaces that fail only together are kept in order.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from lmckit.groups import Orthogonal, Permutation, RotaryPlanes
from lmckit.inference import check_spec
from lmckit.inference._check import FunctionCheck
from lmckit.inference._conflicts import resolve
from lmckit.inference._left_out import _kept_together, drop_failing
from lmckit.symmetry._transform import Nest, Part, Space, SymmetrySpec, Use

PARAMS = {
    "up": torch.zeros(6, 4),
    "down": torch.zeros(4, 6),
    "norm": torch.zeros(6),
}


def _heads() -> list[Space]:
    """Two units of three on ``up``'s rows and ``down``'s columns, a basis in each."""
    parent = Space(
        "heads", 2, Permutation(), (Use("up", 0, "write", 1, 3), Use("down", 1, "read", 1, 3))
    )
    inner = [
        Space(
            f"heads.value.{u}", 3, Orthogonal(),
            (Use("up", 0, "write", parts=(Part(0, 3 * u, 3),)),
             Use("down", 1, "read", parts=(Part(1, 3 * u, 3),))),
            nest=Nest("heads", u, "value"),
        )
        for u in range(2)
    ]  # fmt: skip
    return [parent, *inner]


def test_a_valid_spec_is_kept_whole() -> None:
    spaces, notes = resolve(_heads(), PARAMS)
    assert [s.name for s in spaces] == ["heads", "heads.value.0", "heads.value.1"] and not notes


def test_the_later_of_two_spaces_on_one_axis_is_left_out_with_what_nests_in_it() -> None:
    clash = Space("other", 6, Orthogonal(), (Use("up", 0, "write"),))
    spaces, notes = resolve([clash, *_heads()], PARAMS)
    assert [s.name for s in spaces] == ["other"]
    assert len(notes) == 1 and notes[0].startswith("heads (Permutation, n=2) (with 2 spaces")
    assert "axis 0 of 'up' is used by both 'other' and 'heads'" in notes[0]
    SymmetrySpec(tuple(spaces))  # what is left is a spec


def test_a_second_space_of_one_name_is_left_out() -> None:
    again = Space("heads", 4, Permutation(), (Use("down", 0, "write"),))
    spaces, notes = resolve([*_heads(), again], PARAMS)
    assert len(spaces) == 3 and spaces[0].n == 2
    assert notes == [
        "heads (Permutation, n=4): duplicate space names: ['heads'], so it is left out"
    ]


def test_a_family_that_is_not_one_per_unit_is_left_out() -> None:
    parent, first, _ = _heads()
    spaces, notes = resolve([parent, first], PARAMS)
    assert [s.name for s in spaces] == ["heads"]
    assert "must be one per unit" in notes[0]


def test_a_group_that_cannot_act_on_a_norms_weight_is_left_out() -> None:
    rotary = Space(
        "planes", 6, RotaryPlanes(6), (Use("up", 0, "write"), Use("norm", 0, "elementwise"))
    )
    spaces, notes = resolve([rotary], PARAMS)
    assert spaces == [] and "cannot act on elementwise parameter 'norm'" in notes[0]
    # without the parameters, only the structure is judged
    assert resolve([rotary])[0] == [rotary]


def test_the_spec_still_refuses_what_it_refused_in_one_line() -> None:
    clash = Space("other", 6, Orthogonal(), (Use("up", 0, "write"),))
    with pytest.raises(ValueError, match="axis 0 of 'up' is used by both 'other' and 'heads'"):
        SymmetrySpec((clash, *_heads()))
    with pytest.raises(ValueError, match=r"duplicate space names: \['heads'\]"):
        SymmetrySpec((*_heads(), _heads()[0]))


class _ScaledHeads(nn.Module):
    """``x -> down(c_h * up(x)_h)``: two heads of three, head ``h`` scaled by a constant
    ``c_h``. The constants fix the heads' order; the basis inside each head is free."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 6, bias=False)
        self.down = nn.Linear(6, 4, bias=False)
        self.register_buffer("c", torch.tensor([1.0, 3.0]), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x).unflatten(-1, (2, 3)) * self.c[:, None]
        return self.down(h.flatten(-2))


def _module_spec() -> tuple[nn.Module, SymmetrySpec, Tensor]:
    torch.manual_seed(0)
    module = _ScaledHeads().eval()
    spaces = [
        Space(s.name, s.n, s.group, tuple(Use(f"{u.param}.weight", *vars_of(u)) for u in s.uses),
              nest=s.nest)
        for s in _heads()
    ]  # fmt: skip
    return module, SymmetrySpec(tuple(spaces)), torch.randn(5, 4)


def vars_of(use: Use) -> tuple:  # type: ignore[type-arg]
    return (use.axis, use.role, use.outer, use.inner, use.compare, use.parts)


def test_a_failing_unit_permutation_leaves_its_nested_spaces_standing() -> None:
    module, spec, x = _module_spec()
    check = FunctionCheck(module, (x,))
    kept, lines = drop_failing(check, module, spec)
    assert [s.name for s in kept] == ["heads.value.0", "heads.value.1"]
    assert all(s.nest is None and s.inside == Nest("heads", i, "value") for i, s in enumerate(kept))
    assert len(lines) == 1 and "the 2 spaces nested in it are kept, each on its own" in lines[0]
    assert check_spec(module, kept, (x,))["all"] < 1e-12


class _Relu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 6)
        self.down = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(torch.relu(self.up(x)))


def test_an_orthogonal_space_that_fails_is_kept_as_permutations() -> None:
    torch.manual_seed(0)
    module, x = _Relu().eval(), torch.randn(5, 4)
    uses = (Use("up.weight", 0, "write"), Use("up.bias", 0, "write"), Use("down.weight", 1, "read"))
    spec = SymmetrySpec((Space("hidden", 6, Orthogonal(), uses),))
    kept, lines = drop_failing(FunctionCheck(module, (x,)), module, spec)
    assert kept["hidden"].group == Permutation()
    assert "so it is kept as Permutation only" in lines[0]


class _Coupled:
    """A stand-in check: the outputs change only when ``a`` and ``b`` are both moved."""

    scale = 1.0

    def __init__(self) -> None:
        self.moved: set[str] = set()

    def error(self, spec: SymmetrySpec, transform, *, keep_within: float) -> float:  # type: ignore[no-untyped-def]
        moved = self.moved | set(transform.elements)
        error = 1.0 if {"a", "b"} <= moved else 0.0
        if error <= keep_within:
            self.moved = moved
        return error


def test_spaces_that_fail_only_together_are_kept_in_order() -> None:
    spaces = tuple(Space(n, 6, Permutation(), (Use(p, 0, "write"),)) for n, p in
                   (("a", "up"), ("b", "down"), ("c", "norm")))  # fmt: skip
    kept, lines = _kept_together(_Coupled(), SymmetrySpec(spaces), 0, 1e-5)  # type: ignore[arg-type]
    assert [s.name for s in kept] == ["a", "c"]
    assert len(lines) == 1 and lines[0].startswith("b (Permutation, n=6)")


def test_an_op_whose_rule_fails_is_left_out_and_the_rest_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmckit.inference import analyze_symmetries
    from lmckit.inference._rules import RULES

    def broken(*_: object) -> None:
        raise ValueError("a layout no rule foresaw")

    monkeypatch.setitem(RULES, torch.ops.aten.relu, broken)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    analysis = analyze_symmetries(module.eval(), torch.randn(4, 4))
    assert any(
        "its rule failed (ValueError: a layout no rule foresaw)" in x for x in analysis.left_out
    )
    # the units the broken op touches are left out; the other hidden layer is kept
    assert [s.n for s in analysis.spec] == [5]


def test_spaces_inside_one_unit_of_fixed_heads_may_share_its_slice() -> None:
    """The query heads of a key/value group and the basis inside each of them, their
    parent left out: they act on different factors of the group's rows, and commute."""
    rows = (Part(0, 0, 6),)
    query = Space("h.query.0", 6, Permutation(), (Use("up", 0, "write", parts=rows),),
                  inside=Nest("h", 0, "query"))  # fmt: skip
    basis = Space("h.qk.0", 3, Orthogonal(), (Use("up", 0, "write", 2, parts=rows),),
                  inside=Nest("h", 0, "qk"))  # fmt: skip
    assert resolve([query, basis], PARAMS) == ([query, basis], [])
    elsewhere = Space("g.qk.0", 3, Orthogonal(), (Use("up", 0, "write", 2, parts=rows),),
                      inside=Nest("g", 0, "qk"))  # fmt: skip
    spaces, notes = resolve([query, elsewhere], PARAMS)
    assert spaces == [query] and "used by both 'h.query.0' and 'g.qk.0'" in notes[0]
