"""Top Hessian eigenvalue by power iteration against known spectra."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from lmckit.diagnostics._curvature import (
    hessian_vector_product,
    loss_function,
    path_top_eigenvalues,
    top_hessian_eigenvalue,
)
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate


def _spd(n: int, eigenvalues: list[float], seed: int = 0) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed)))
    return (q * torch.tensor(eigenvalues)) @ q.T


def test_quadratic_model_eigenvalue_is_the_matrix_top_eigenvalue():
    a = _spd(4, [5.0, 2.0, 1.0, 0.5]).double()

    def loss(p):
        x = p["x"]
        return 0.5 * x @ a @ x

    point = {"x": torch.randn(4, dtype=torch.float64)}
    v = {"x": torch.randn(4, dtype=torch.float64)}
    assert torch.allclose(hessian_vector_product(loss, point, v)["x"], a @ v["x"])
    result = top_hessian_eigenvalue(loss, point, iters=200, tol=1e-10)
    assert result.converged
    assert result.value == pytest.approx(5.0, rel=1e-6)


def test_eigenvalue_over_several_tensors_matches_the_full_matrix():
    a = _spd(5, [3.0, 2.5, 1.0, 0.2, 0.1], seed=1).double()

    def loss(p):
        x = torch.cat([p["u"], p["w"].reshape(-1)])
        return 0.5 * x @ a @ x

    point = {"u": torch.zeros(1, dtype=torch.float64), "w": torch.zeros(2, 2, dtype=torch.float64)}
    assert top_hessian_eigenvalue(loss, point, iters=500, tol=1e-10).value == pytest.approx(
        3.0, rel=1e-5
    )


def test_network_eigenvalue_matches_dense_hessian():
    torch.manual_seed(0)
    model, params = create_model("mlp", seed=0, in_features=3, hidden=[4], out_features=2)
    params = {k: v.double() for k, v in params.items()}
    model = model.double()
    gen = torch.Generator().manual_seed(0)
    data = [
        (
            torch.randn(16, 3, generator=gen, dtype=torch.float64),
            torch.randint(0, 2, (16,), generator=gen),
        )
    ]
    loss_fn, trainable = loss_function(model, params, data)
    names = list(trainable)
    sizes = [trainable[n].numel() for n in names]

    def flat_loss(flat):
        parts = torch.split(flat, sizes)
        return loss_fn(
            {n: p.reshape(trainable[n].shape) for n, p in zip(names, parts, strict=True)}
        )

    flat = torch.cat([trainable[n].reshape(-1) for n in names])
    dense = torch.autograd.functional.hessian(flat_loss, flat)
    eig = torch.linalg.eigvalsh(dense)
    top = eig[eig.abs().argmax()]
    result = top_hessian_eigenvalue(loss_fn, trainable, iters=1000, tol=1e-12)
    assert result.value == pytest.approx(float(top), rel=1e-4)
    # the loss function itself is the model's mean cross-entropy
    x, y = data[0]
    expected = torch.nn.functional.cross_entropy(functional_call(model, params, (x,)), y)
    assert float(loss_fn(trainable)) == pytest.approx(float(expected))


def test_path_eigenvalues_at_the_ends_equal_the_endpoints():
    model, a = create_model("mlp", seed=0, in_features=3, hidden=[4], out_features=2)
    _, b = create_model("mlp", seed=1, in_features=3, hidden=[4], out_features=2)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 3, generator=gen), torch.randint(0, 2, (16,), generator=gen))]
    values = path_top_eigenvalues(
        model, lambda t: interpolate(a, b, t), data, [0.0, 1.0], iters=300, tol=1e-8
    )
    fa, pa = loss_function(model, a, data)
    assert values[0] == pytest.approx(
        top_hessian_eigenvalue(fa, pa, iters=300, tol=1e-8).value, rel=1e-4
    )
    with pytest.raises(ValueError):
        loss_function(model, a, [])
