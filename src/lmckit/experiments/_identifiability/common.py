"""What the identifiability experiments share: the paper, and trained pairs in plain form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmckit.experiments._identifiability._asymmetric import create_asym_model, to_plain
from lmckit.experiments._runner import Runner
from lmckit.models import ZooModel, create_model
from lmckit.symmetry._params import Params
from lmckit.training._train import TrainConfig, TrainData

__all__ = ["PAPER", "trained_plain_pair"]

PAPER = "Boehm et al., Beyond Structural Symmetries: LMC via Neuron Identifiability"


def trained_plain_pair(
    run: Runner,
    variant: Mapping[str, Any],
    base_kwargs: Mapping[str, Any],
    data: TrainData,
    config: TrainConfig,
) -> tuple[ZooModel, list[Params]]:
    """Models of seeds ``seed`` and ``seed + 1``, trained (or reloaded), in plain (folded) form.

    ``variant``: ``{"mode": "plain"}`` for the zoo MLP, else the asymmetric kwargs
    (``mode``, ``kappa``, ``num_fixed``; mask and fixed seeds stay 0, shared by all
    runs). Initial weights and data order come from each seed.
    """
    if variant["mode"] == "plain":
        module, a, b = run.train_pair(
            "plain", lambda seed: create_model("mlp", seed=seed, **base_kwargs), data, config
        )
        return module, [a, b]  # type: ignore[return-value]
    module, a, b = run.train_pair(
        f"{variant['mode']}-k{variant['kappa']:g}",
        lambda seed: create_asym_model("asym_mlp", seed=seed, **base_kwargs, **variant),
        data,
        config,
    )
    plain, pa = to_plain(module, a)
    _, pb = to_plain(module, b)
    return plain, [pa, pb]
