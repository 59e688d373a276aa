"""What lmckit misses today in the families of ``tests/tiny_models.py``: the one list.

Each entry marks test cases ``xfail(strict=True)`` with its reason, so that a fix shows
up as an unexpected pass and its entry is then removed. Keys:

- ``family``: the independent plant (``tests/hf/test_families_oracle.py``: permutations
  and head bases drawn from the architecture's math) is not recovered, or the command
  refuses the model;
- ``family/orthogonal``: the same with the residual stream rotated (norms folded);
- ``family/found``: inference finds less than ``EXPECTED`` in
  ``tests/hf/test_families.py`` (the components the architecture has);
- ``family/inferred``: the plant of lmckit's own inferred group is not undone (or the
  command refuses the model).

"Left" is the share of the planted distance left after alignment (after / before),
measured on the tiny models with the seeds of the tests.
"""

from __future__ import annotations

import pytest

KNOWN_MISSES: dict[str, str] = {
    # --- the independent plant (permutations, value and query/key bases)
    # --- what inference finds, against what the architecture has (EXPECTED)
    # --- the plant of lmckit's own inferred group
}


def known(key: str) -> list[pytest.MarkDecorator]:
    """``xfail(strict=True)`` with the reason if ``key`` is a known miss, else nothing."""
    reason = KNOWN_MISSES.get(key)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
