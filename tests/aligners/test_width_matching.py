"""Width-heterogeneous alignment: exact embeddings, planted recovery, barrier drops."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from lmckit.aligners import WidthMatchingConfig, width_matching
from lmckit.aligners._width import PaddedPermutation, naive_embedding, space_widths
from lmckit.data import Dataset, batches
from lmckit.measure._evaluate import evaluate_path
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import (
    Orthogonal,
    Permutation,
    SemiPermutation,
    Space,
    SymmetrySpec,
    Use,
    apply,
)
from lmckit.training._train import TrainConfig, fit


def _mlp(width: int, seed: int, activation: str = "relu"):
    return create_model(
        "mlp",
        seed=seed,
        in_features=64,
        hidden=[width, width],
        out_features=10,
        activation=activation,
    )


def _with(spec: SymmetrySpec, group: object) -> SymmetrySpec:
    return spec.with_groups(**{name: group for name in spec.names})


class Residual(nn.Module):
    """``embed -> (+ fc2 gelu fc1) -> head``: a linear residual stream of width ``d``."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Linear(64, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.head = nn.Linear(d, 10)
        self.d, self.hidden = d, hidden

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x.flatten(1))
        return self.head(h + self.fc2(nn.functional.gelu(self.fc1(h))))

    def spec(self) -> SymmetrySpec:
        res = Space(
            "residual",
            self.d,
            Orthogonal(),
            tuple(
                Use(p, 0, "write") for p in ("embed.weight", "embed.bias", "fc2.weight", "fc2.bias")
            )
            + (Use("fc1.weight", 1, "read"), Use("head.weight", 1, "read")),
        )
        ffn = Space(
            "ffn",
            self.hidden,
            PaddedPermutation(),
            (
                Use("fc1.weight", 0, "write"),
                Use("fc1.bias", 0, "write"),
                Use("fc2.weight", 1, "read"),
            ),
        )
        return SymmetrySpec((res, ffn))


def _residual(d: int, hidden: int, seed: int) -> tuple[Residual, Params]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = Residual(d, hidden)
    return module, {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize(
    ("group", "activation"),
    [(SemiPermutation(), "relu"), (PaddedPermutation(), "relu"), (PaddedPermutation(), "gelu")],
)
def test_random_embeddings_preserve_the_function(outputs, group: object, activation: str) -> None:
    narrow, pn = _mlp(8, 0, activation)
    wide, _ = _mlp(20, 1, activation)
    spec = _with(narrow.symmetry_spec(), group)
    t = random_transform(spec, 4, widths={"hidden.0": 20, "hidden.1": 20})
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        outputs(wide, apply(spec, pn, t), x), outputs(narrow, pn, x), atol=1e-5, rtol=0
    )


def test_rectangular_orthogonal_residual_embedding_preserves_the_function(outputs) -> None:
    narrow, pn = _residual(6, 10, 0)
    wide, _ = _residual(9, 14, 1)
    spec = narrow.spec()
    t = random_transform(spec, 2, widths={"residual": 9, "ffn": 14})
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        outputs(wide, apply(spec, pn, t), x), outputs(narrow, pn, x), atol=1e-5, rtol=0
    )


def test_matching_recovers_a_planted_semi_permutation() -> None:
    narrow, pn = _mlp(8, 0)
    spec = _with(narrow.symmetry_spec(), SemiPermutation())
    planted = random_transform(spec, 7, widths={"hidden.0": 20, "hidden.1": 20})
    wide = apply(spec, pn, planted)
    result = width_matching(spec, wide, pn)
    assert result.converged
    for name in spec.names:
        assert torch.equal(result.transform[name].assign, planted[name].assign)
    sim = width_matching(spec, wide, pn, WidthMatchingConfig(coefficients="similarity"))
    for name in spec.names:  # similarity coefficients split unit j into its copies too
        assert torch.equal(sim.transform[name].assign, planted[name].assign)


def test_matching_recovers_a_planted_rectangular_orthogonal_embedding() -> None:
    narrow, pn = _residual(6, 10, 0)
    spec = narrow.spec()
    planted = random_transform(spec, 3, widths={"residual": 9, "ffn": 14})
    wide = apply(spec, pn, planted)
    result = width_matching(spec, wide, pn, WidthMatchingConfig(max_iter=50))
    embedded = apply(spec, pn, result.transform)
    for k in wide:
        torch.testing.assert_close(embedded[k], wide[k], atol=1e-4, rtol=0)
    o = result.transform["residual"]
    torch.testing.assert_close(o.T @ o, torch.eye(6), atol=1e-5, rtol=0)


def test_naive_embedding_shapes_and_elements() -> None:
    narrow, pn = _mlp(8, 0)
    _, pw = _mlp(20, 1)
    spec = _with(narrow.symmetry_spec(), SemiPermutation())
    widths = space_widths(spec, pw)
    assert widths == {"hidden.0": 20, "hidden.1": 20}
    t = naive_embedding(spec, widths)
    assert torch.equal(t["hidden.0"].assign, torch.arange(20) % 8)
    embedded = apply(spec, pn, t)
    assert {k: v.shape for k, v in embedded.items()} == {k: v.shape for k, v in pw.items()}
    padded = naive_embedding(_with(narrow.symmetry_spec(), PaddedPermutation()), widths)
    PaddedPermutation().validate(padded["hidden.1"], 8)
    assert torch.equal(padded["hidden.1"].slots, torch.arange(8))
    assert PaddedPermutation().dims(padded["hidden.1"]) == (20, 8)


def test_square_group_with_different_widths_is_a_value_error() -> None:
    narrow, pn = _mlp(8, 0)
    _, pw = _mlp(20, 1)
    spec = _with(narrow.symmetry_spec(), Permutation())
    with pytest.raises(ValueError, match="width .8 -> 20. but its group Permutation is square"):
        width_matching(spec, pw, pn)
    with pytest.raises(ValueError):
        WidthMatchingConfig(coefficients="nearest")


def test_aligned_embedding_lowers_the_barrier_to_the_wide_model(
    outputs, mlp_pair, digits: Dataset
) -> None:
    wide_model, wide, _, _ = mlp_pair  # 64 -> 64 -> 64 -> 10
    narrow_model, init = _mlp(24, 5)
    narrow = fit(
        narrow_model,
        init,
        digits,
        TrainConfig(epochs=6, batch_size=64, lr=3e-3),
        seed=5,
        progress=False,
    ).params
    spec = _with(narrow_model.symmetry_spec(), SemiPermutation())
    test = lambda: batches(digits.x_test, digits.y_test, 500)  # noqa: E731
    naive = apply(spec, narrow, naive_embedding(spec, space_widths(spec, wide)))
    aligned = apply(spec, narrow, width_matching(spec, wide, narrow).transform)
    # both embeddings are the narrow model itself, so the path ends agree
    x = digits.x_test[:50]
    torch.testing.assert_close(
        outputs(wide_model, aligned, x), outputs(narrow_model, narrow, x), atol=1e-4, rtol=0
    )
    before = evaluate_path(wide_model, wide, naive, test).barrier_loss
    after = evaluate_path(wide_model, wide, aligned, test).barrier_loss
    assert after < 0.6 * before
