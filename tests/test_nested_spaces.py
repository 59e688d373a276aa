"""Nested spaces and uses in slices of a parameter (lmckit.symmetry.Nest, Part).

The model is grouped-query attention written out by hand (no lmckit spec inference): two
key/value groups of two query heads each. Its symmetries, as nested spaces: the
key/value groups permute (with their query heads); inside each group the query heads
permute, the query/key basis moves by any invertible map (queries by its inverse
transpose) and the value basis by any invertible map (undone on the output columns).
"""

from __future__ import annotations

import pytest
import torch

from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._transform import (
    HeadPermutation,
    Invertible,
    Nest,
    Orthogonal,
    Part,
    Permutation,
    Space,
    SymmetrySpec,
    Use,
    apply,
)

G, K, D_HEAD, D_MODEL = 3, 2, 3, 5  # groups, query heads per group, head dim, model width


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "wq": randn(G * K * D_HEAD, D_MODEL),
        "wk": randn(G * D_HEAD, D_MODEL),
        "wv": randn(G * D_HEAD, D_MODEL),
        "wo": randn(D_MODEL, G * K * D_HEAD),
    }


def _attention(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``(T, D_MODEL)`` -> ``(T, D_MODEL)``: grouped-query attention, no positions."""
    t = x.shape[0]
    q = (x @ p["wq"].T).reshape(t, G, K, D_HEAD)
    k = (x @ p["wk"].T).reshape(t, G, D_HEAD)
    v = (x @ p["wv"].T).reshape(t, G, D_HEAD)
    scores = torch.einsum("tgjd,sgd->gjts", q, k)
    out = torch.einsum("gjts,sgd->tgjd", scores.softmax(-1), v)
    return out.reshape(t, -1) @ p["wo"].T


def _spec(*, basis: type = Invertible) -> SymmetrySpec:
    rows_q, rows_kv = K * D_HEAD, D_HEAD
    spaces = [
        Space(
            "groups",
            G,
            Permutation(),
            (
                Use("wq", 0, "write", inner=rows_q),
                Use("wk", 0, "write", inner=rows_kv),
                Use("wv", 0, "write", inner=rows_kv),
                Use("wo", 1, "read", inner=rows_q),
            ),
        )
    ]
    for g in range(G):
        q_part, kv_part = Part(0, g * rows_q, rows_q), Part(0, g * rows_kv, rows_kv)
        o_part = Part(1, g * rows_q, rows_q)
        spaces += [
            Space(
                f"query.{g}",
                rows_q,
                HeadPermutation(K, D_HEAD),
                (Use("wq", 0, "write", parts=(q_part,)), Use("wo", 1, "read", parts=(o_part,))),
                nest=Nest("groups", g, "query"),
            ),
            Space(
                f"qk.{g}",
                D_HEAD,
                basis(),
                (
                    Use("wk", 0, "write", parts=(kv_part,)),
                    Use("wq", 0, "read", outer=K, parts=(q_part,)),
                ),
                nest=Nest("groups", g, "qk"),
            ),
            Space(
                f"value.{g}",
                D_HEAD,
                basis(),
                (
                    Use("wv", 0, "write", parts=(kv_part,)),
                    Use("wo", 1, "read", outer=K, parts=(o_part,)),
                ),
                nest=Nest("groups", g, "value"),
            ),
        ]
    return SymmetrySpec(tuple(spaces))


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("basis", [Invertible, Orthogonal])
def test_random_element_of_nested_spaces_keeps_the_function(basis: type) -> None:
    spec, params = _spec(basis=basis), _params()
    x = torch.randn(7, D_MODEL, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for seed in range(3):
        moved = apply(spec, params, random_transform(spec, seed))
        assert not _close(moved, params)
        # orthogonal elements are drawn in float32 (orthogonal to ~1e-7)
        assert torch.allclose(_attention(moved, x), _attention(params, x), atol=1e-5)


def test_a_nested_use_in_another_units_slice_is_refused() -> None:
    # the value basis of group 0 acting on group 1's output columns would change the
    # function; the spec refuses the overlap with group 1's own nested spaces
    spec = _spec()
    wrong = spec["value.0"]
    bad_use = Use("wo", 1, "read", outer=K, parts=(Part(1, K * D_HEAD, K * D_HEAD),))
    spaces = tuple(
        Space(s.name, s.n, s.group, (s.uses[0], bad_use), nest=s.nest) if s is wrong else s
        for s in spec
    )
    with pytest.raises(ValueError, match="axis 1 of 'wo' is used by both 'value.0' and 'query.1'"):
        SymmetrySpec(spaces)


def test_compose_follows_the_parent_permutation() -> None:
    spec, params = _spec(), _params()
    first = random_transform(spec, 3)
    # the group permutation must move units for the re-indexing to matter
    second = random_transform(spec, 4).replace(groups=torch.tensor([1, 2, 0]))
    stepwise = apply(spec, apply(spec, params, first), second)
    assert _close(apply(spec, params, second.compose(first)), stepwise)


def test_inverse_undoes_a_nested_transform() -> None:
    spec, params = _spec(), _params()
    for seed in range(4):
        transform = random_transform(spec, seed)
        back = apply(spec, apply(spec, params, transform), transform.inverse())
        assert _close(back, params)
        assert _close(apply(spec, params, transform.inverse().compose(transform)), params)


def test_apply_leaves_the_input_untouched() -> None:
    spec, params = _spec(), _params()
    copies = {k: v.clone() for k, v in params.items()}
    apply(spec, params, random_transform(spec, 0))
    assert _close(params, copies)


def _space(name: str, uses: tuple[Use, ...], nest: Nest | None = None) -> Space:
    return Space(name, D_HEAD, Orthogonal(), uses, nest=nest)


def test_overlapping_unrelated_uses_are_refused() -> None:
    a = _space("a", (Use("wk", 0, "write", parts=(Part(0, 0, D_HEAD),)),))
    b = _space("b", (Use("wk", 0, "write", parts=(Part(0, 1, D_HEAD),)),))
    with pytest.raises(ValueError, match="axis 0 of 'wk' is used by both 'a' and 'b'"):
        SymmetrySpec((a, b))
    c = _space("c", (Use("wk", 0, "write", parts=(Part(0, D_HEAD, D_HEAD),)),))
    assert len(SymmetrySpec((a, c))) == 2  # disjoint slices


def test_nesting_errors_are_one_line() -> None:
    spec = _spec()
    parent, child = spec.spaces[0], spec.spaces[1]
    with pytest.raises(ValueError, match="not a space listed before it"):
        SymmetrySpec((child, parent, *spec.spaces[2:]))
    with pytest.raises(ValueError, match="one per unit"):
        SymmetrySpec(tuple(s for s in spec if s.name != "qk.1"))
    orth = Space(parent.name, parent.n * K * D_HEAD, Orthogonal(), parent.uses[:1])
    with pytest.raises(ValueError, match="does not move whole units"):
        SymmetrySpec((orth, child))
    with pytest.raises(ValueError, match="unit 5 of .groups., which has 3 units"):
        SymmetrySpec(
            (parent, Space("x", 1, Permutation(), child.uses, nest=Nest("groups", 5, "k")))
        )
    deep = _space("deep", (Use("wv", 1, "read"),), Nest("query.0", 0, "deep"))
    with pytest.raises(ValueError, match="nest one level deep"):
        SymmetrySpec((*spec.spaces, deep))


def test_a_part_outside_the_parameter_is_refused_on_apply() -> None:
    space = _space("a", (Use("wk", 0, "write", parts=(Part(0, 8, D_HEAD),)),))
    spec = SymmetrySpec((space,))
    with pytest.raises(ValueError, match="part 8:11 of 'wk' axis 0 is outside its size 9"):
        apply(spec, _params(), random_transform(spec, 0))


def test_models_of_different_widths_are_refused_when_slices_would_not_line_up() -> None:
    from lmckit.aligners import weight_matching
    from lmckit.symmetry._params import IncompatibleModelsError

    # an input space that B embeds into a wider A, beside spaces living in slices of wk:
    # the slices are laid out for B's shape, which A does not share
    spec = _spec()
    stream = Space("inputs", D_MODEL, Orthogonal(), (Use("wk", 1, "read"), Use("wv", 1, "read")))
    spec = SymmetrySpec((stream, *spec.spaces))
    narrow = {k: v for k, v in _params().items() if k in ("wk", "wv", "wq", "wo")}
    wide = dict(narrow, wk=torch.randn(G * D_HEAD, D_MODEL + 2, dtype=torch.float64))
    wide["wv"] = torch.randn(G * D_HEAD, D_MODEL + 2, dtype=torch.float64)
    with pytest.raises(IncompatibleModelsError, match="lives in slices of 'wk'"):
        weight_matching(spec, wide, narrow)
