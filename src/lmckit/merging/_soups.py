"""Model soups (Wortsman et al. 2022): averages of several checkpoints of one architecture.

- Uniform soup: ``theta = (1/K) sum_k theta_k``.
- Greedy soup: sort the ingredients by held-out accuracy, best first; starting from the
  best, add each next one to the average if the soup's held-out accuracy does not drop.
  Any task's metric works the same way (:mod:`lmckit.training._task`; "drop" follows its direction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from lmckit.measure._evaluate import Metrics, evaluate
from lmckit.symmetry._average import weighted_average
from lmckit.symmetry._params import Params
from lmckit.training._task import CLASSIFICATION, Task

__all__ = ["GreedySoup", "greedy_soup", "uniform_soup"]

Batches = Iterable[tuple[Tensor, Tensor]]


def uniform_soup(models: Sequence[Params]) -> Params:
    """``(1/K) sum_k theta_k`` (non-float tensors from the first model)."""
    if not models:
        raise ValueError("a soup needs at least one model")
    return weighted_average(list(models), [1.0 / len(models)] * len(models))


@dataclass(frozen=True)
class GreedySoup:
    """Result of :func:`greedy_soup`.

    Attributes:
        params: the soup, the uniform average of the chosen ingredients.
        members: indices (into the input sequence) of the chosen ingredients, in the order
            they were added.
        metrics: held-out metrics of the soup (``acc``: the task's metric).
        ingredient_metrics: held-out metrics of each input model, by index.
    """

    params: Params
    members: list[int]
    metrics: Metrics
    ingredient_metrics: list[Metrics]


def greedy_soup(
    model: nn.Module,
    models: Sequence[Params],
    held_out: Callable[[], Batches],
    *,
    prepare: Callable[[Params], Params] | None = None,
    task: Task = CLASSIFICATION,
) -> GreedySoup:
    """Greedy soup selected on the held-out metric (ties keep the ingredient).

    Args:
        model: module of the architecture.
        models: candidate parameter sets.
        held_out: callable returning fresh held-out ``(x, y)`` batches.
        prepare: optional fix applied to every averaged candidate before evaluation,
            e.g. a BatchNorm reset.
        task: whose metric selects (default accuracy, higher is better).
    """
    if not models:
        raise ValueError("a soup needs at least one model")
    fix = prepare or (lambda p: p)
    # a score that is higher for better models, whatever the metric's direction
    sign = 1.0 if task.higher_is_better else -1.0
    scores = [evaluate(model, m, held_out(), task=task) for m in models]
    order = sorted(range(len(models)), key=lambda i: -sign * scores[i].acc)
    members = [order[0]]
    soup = {k: v.clone() for k, v in models[order[0]].items()}
    best = scores[order[0]]
    for i in order[1:]:
        candidate = fix(uniform_soup([models[j] for j in [*members, i]]))
        metrics = evaluate(model, candidate, held_out(), task=task)
        if sign * metrics.acc >= sign * best.acc:
            members.append(i)
            soup, best = candidate, metrics
    return GreedySoup(soup, members, best, scores)
