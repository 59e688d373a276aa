"""Fixtures over every group of lmckit.groups (cases in ``group_cases``)."""

from __future__ import annotations

import pytest
from group_cases import CASES, Case


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


@pytest.fixture(params=[k for k, c in CASES.items() if c.m == c.n], ids=lambda k: k)
def square(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]
