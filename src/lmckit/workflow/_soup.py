"""Soups of loaded models (:mod:`lmckit.merging._soups`), each optionally aligned to the first.

A soup averages weights, so the ingredients must share units: independently trained
models are aligned to the first by weight matching first (``align="weight"``), models
fine-tuned from one start need not be. A soup is one model of the ingredients'
architecture, written in their format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lmckit.data import Dataset, batches
from lmckit.data._fit import check_data_fits
from lmckit.formats._io import LoadedModel
from lmckit.measure._evaluate import Metrics, evaluate
from lmckit.measure._measure import MERGE_METHOD_OF_FIX, EvalSettings, resolve_fix, train_inputs
from lmckit.merging._methods import path_prepare
from lmckit.merging._soups import greedy_soup, uniform_soup
from lmckit.plan._plan import plan_alignment
from lmckit.plan._request import AlignRequest
from lmckit.symmetry._params import Params

__all__ = ["SOUP_ALIGNS", "SoupResult", "make_soup"]

#: How ingredients are aligned to the first before averaging.
SOUP_ALIGNS = ("none", "weight")


@dataclass(frozen=True)
class SoupResult:
    """A soup and how it compares with its ingredients.

    Attributes:
        params: the soup's weights (the first ingredient's architecture).
        members: ingredients in the soup (indices into the input), in the order added.
        ingredients: each ingredient's loss and metric on the evaluation split.
        soup: the soup's.
        meta: how it was made (greedy, the split it was chosen on, alignment).
    """

    params: Params
    members: list[int]
    ingredients: list[Metrics]
    soup: Metrics
    meta: dict[str, Any] = field(default_factory=dict)


def _aligned(models: Sequence[LoadedModel], seed: int, progress: bool) -> list[Params]:
    """Every model after the first, weight-matched to it in its own architecture (one
    plan, made on the first, run on each of the others)."""
    first = models[0]
    request = AlignRequest(symmetry="permutation", circuits=False, seed=seed)
    plan = plan_alignment(first, request)
    out = [dict(first.params)]
    for other in models[1:]:
        pair = plan.run(other, progress=progress)
        if pair.form.names or pair.reference is not None:
            raise ValueError(
                f"{other.path} aligns to {first.path} only in another form ({pair.form.form}): "
                "align it with `lmckit align` and soup models of one form"
            )
        out.append({k: v.float() for k, v in pair.params.items()})
    return out


def make_soup(
    models: Sequence[LoadedModel],
    data: Dataset,
    settings: EvalSettings | None = None,
    *,
    greedy: bool = False,
    align: str = "none",
    seed: int = 0,
    progress: bool = False,
) -> SoupResult:
    """The uniform soup of ``models`` or, with ``greedy``, Wortsman et al.'s greedy soup
    chosen on the validation split (the training split when ``data`` has none); both
    reported on the settings' split, each averaged candidate fixed as a path's points
    are (a BatchNorm reset where there is BatchNorm).

    Raises:
        ValueError: fewer than two models, an unknown ``align``, or a fix other than
            ``auto``, ``none`` or ``reset_bn``.
    """
    settings = settings or EvalSettings()
    if len(models) < 2:
        raise ValueError(f"a soup needs at least two models, got {len(models)}")
    if align not in SOUP_ALIGNS:
        raise ValueError(f"align must be one of {', '.join(SOUP_ALIGNS)}, got {align!r}")
    if settings.fix == "repair":
        raise ValueError("fix 'repair' is for two models; use auto, none or reset_bn")
    module = models[0].module
    check_data_fits(module, data)
    params = (
        _aligned(models, seed, progress) if align == "weight" else [dict(m.params) for m in models]
    )
    fix = resolve_fix(module, settings.fix)
    hook = path_prepare(
        MERGE_METHOD_OF_FIX[fix], module, params[0], params[1], train_inputs(data, settings)
    )

    def prepare(p: Params) -> Params:
        return p if hook is None else hook(p, 0.5)

    size = settings.batch_for(data)
    x, y = data.split(settings.split)

    def measure(p: Params) -> Metrics:
        return evaluate(module, p, batches(x, y, size))

    chosen_on = "val" if data.has_val else "train"
    if greedy:
        xs, ys = data.split(chosen_on)
        made = greedy_soup(module, params, lambda: batches(xs, ys, size), prepare=prepare)
        soup, members = made.params, made.members
    else:
        soup, members = prepare(uniform_soup(params)), list(range(len(params)))
    meta = {"greedy": greedy, "align": align, "fix": fix, "split": settings.split}
    if greedy:
        meta["chosen_on"] = chosen_on
    return SoupResult(soup, members, [measure(p) for p in params], measure(soup), meta)
