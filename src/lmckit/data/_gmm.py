"""Synthetic Gaussian mixtures on a low-dimensional subspace of a larger space."""

from __future__ import annotations

import math

import torch

from lmckit.data._dataset import Dataset

__all__ = ["MAX_GMM_VALUES", "make_gmm"]

#: Most float64 values a mixture may need (1 GiB): checked before anything is allocated.
MAX_GMM_VALUES = 1 << 27


def make_gmm(
    *,
    dim: int = 32,
    intrinsic_dim: int = 8,
    classes: int = 10,
    n_train: int = 4000,
    n_test: int = 1000,
    noise: float = 0.0,
    separation: float = 3.0,
    seed: int = 0,
) -> Dataset:
    """A ``classes``-component Gaussian mixture with a chosen intrinsic dimension.

    In a latent space of ``intrinsic_dim`` dimensions, each class mean lies in a random
    direction at distance ``separation`` from the origin, and samples are the mean plus
    standard normal noise (so ``separation`` is in units of the within-class std). The
    latent points are mapped to ``dim`` dimensions by a random matrix with orthonormal
    columns, which keeps distances, and ``noise`` adds isotropic Gaussian noise of that
    std in all ``dim`` dimensions. With ``noise=0`` the data has rank ``intrinsic_dim``.

    Labels are balanced (class sizes differ by at most one) and in random order.

    Args:
        dim: ambient dimension; ``x`` has shape ``(N, dim)``.
        intrinsic_dim: latent dimension, ``1 <= intrinsic_dim <= dim``.
        classes: number of mixture components, one class each.
        n_train: training samples.
        n_test: test samples, from the same mixture.
        noise: std of the ambient noise, ``>= 0``.
        separation: distance of each class mean from the origin, ``>= 0``.
        seed: seeds a private generator; the same arguments give the same data.
    """
    if dim < 1 or not 1 <= intrinsic_dim <= dim:
        raise ValueError(
            f"need 1 <= intrinsic_dim <= dim, got intrinsic_dim={intrinsic_dim}, dim={dim}"
        )
    if classes < 1:
        raise ValueError(f"classes must be >= 1, got {classes}")
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be >= 1, got {n_train} and {n_test}")
    if not (0 <= noise < math.inf and 0 <= separation < math.inf):
        raise ValueError(
            f"noise and separation must be finite and >= 0, got {noise} and {separation}"
        )
    # sized before anything is drawn: samples, class means and the basis, in float64
    values = (
        (n_train + n_test) * (dim + intrinsic_dim) + classes * intrinsic_dim + dim * intrinsic_dim
    )
    if values > MAX_GMM_VALUES:
        raise ValueError(
            f"a mixture of {n_train} + {n_test} samples in {dim} dimensions with {classes} "
            f"classes needs {values:,} values, more than the {MAX_GMM_VALUES:,} allowed"
        )

    gen = torch.Generator().manual_seed(seed)
    # Work in float64 so that the orthonormal basis is exact to float32 precision.
    directions = torch.randn(classes, intrinsic_dim, generator=gen, dtype=torch.float64)
    means = separation * directions / directions.norm(dim=1, keepdim=True).clamp_min(1e-12)
    # QR of a Gaussian matrix gives orthonormal columns spanning a uniformly random subspace.
    basis, _ = torch.linalg.qr(torch.randn(dim, intrinsic_dim, generator=gen, dtype=torch.float64))

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % classes
        y = y[torch.randperm(n, generator=gen)]
        z = means[y] + torch.randn(n, intrinsic_dim, generator=gen, dtype=torch.float64)
        # Drawn even when noise=0, so that one seed gives the same clean points at every
        # noise level and only the added noise differs.
        x = z @ basis.T + noise * torch.randn(n, dim, generator=gen, dtype=torch.float64)
        return x.to(torch.float32), y.to(torch.int64)

    x_train, y_train = sample(n_train)
    x_test, y_test = sample(n_test)
    return Dataset("gmm", x_train, y_train, x_test, y_test, num_classes=classes)
