"""Parameters that one space alone touches, folded into exact small surrogates.

A large matrix used by one space (a token embedding) enters weight matching only
through one product of the two models' copies: computed once, a block of rows at a
time, it replaces both, so no step reads the large matrix again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping

import torch
from torch import Tensor

from lmckit.symmetry._params import meta_of, rows_of
from lmckit.symmetry._transform import SymmetrySpec

__all__ = ["FOLD_BLOCK_BYTES", "fold_single_use_params"]

#: :func:`fold_single_use_params` reads a large matrix this many bytes of float32 rows at
#: a time
FOLD_BLOCK_BYTES = 2**25


def fold_single_use_params(
    spec: SymmetrySpec,
    ref: MutableMapping[str, Tensor],
    other: MutableMapping[str, Tensor],
    *,
    owns: Callable[[str], bool] | None = None,
) -> None:
    """Replace large parameters that only one space touches by an exact small surrogate.

    A matrix ``X`` (``(rows, n)`` with its space on axis 1, e.g. a token embedding)
    enters every similarity and the objective only through ``A^T B``, linearly in B's
    space axis. ``A' = I_m`` and ``B' = A^T B`` (both ``m`` rows) give the same terms,
    so the ``rows``-sized product is computed once instead of at every step, a block of
    rows at a time (:data:`FOLD_BLOCK_BYTES`). Skipped
    for least-squares spaces, whose Gram needs ``B^T B``, and for groups that compare
    units by their norms, which the surrogate does not keep. Edits the dicts in place
    (the caller's private float32 views, :class:`lmckit.symmetry._params.Float32View`). With
    ``owns``, only the parameters it names (this process's share).
    """
    for name in list(ref):
        if owns is not None and not owns(name):
            continue
        uses = spec.uses_of(name)
        if len(uses) != 1 or name not in other or uses[0][1].parts:
            continue
        space, use = uses[0]
        a, b = meta_of(ref, name), meta_of(other, name)
        if a.ndim != 2 or use.axis % 2 != 1 or use.outer != 1 or use.inner != 1:
            continue
        if space.group.least_squares or space.group.needs_norms or a.shape[0] <= a.shape[1]:
            continue
        other[name] = _gram_by_rows(ref, other, name, a.shape[0], a.shape[1], b.shape[1])
        ref[name] = torch.eye(a.shape[1], dtype=torch.float32, device=other[name].device)


def _gram_by_rows(
    ref: Mapping[str, Tensor], other: Mapping[str, Tensor], name: str, rows: int, m: int, n: int
) -> Tensor:
    """``ref[name].T @ other[name]`` (``(m, n)``, float32 like every similarity term),
    summed over blocks of rows: a vocabulary-sized matrix is never read whole in float32."""
    step = max(1, FOLD_BLOCK_BYTES // (4 * max(m, n)))
    total: Tensor | None = None
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        block = rows_of(ref, name, start, stop).T @ rows_of(other, name, start, stop)
        total = block if total is None else total.add_(block)
    assert total is not None  # rows > m >= 0
    return total
