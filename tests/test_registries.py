"""The registry behind models, aligners, merge methods and experiments."""

from __future__ import annotations

import pytest

from lmckit._registry import Registry, summary
from lmckit.experiments import get_experiment
from lmckit.models import get_model_class


def test_a_name_is_taken_once_and_keeps_its_first_entry() -> None:
    registry: Registry[int] = Registry("widget")
    registry.add("b", 2)
    registry.add("a", 1)
    with pytest.raises(ValueError, match="^widget 'a' is already registered$"):
        registry.add("a", 3)
    assert registry.get("a") == 1
    assert registry.names() == ["a", "b"]


def test_an_unknown_name_lists_the_valid_ones_sorted() -> None:
    registry: Registry[int] = Registry("widget")
    for name in ("zeta", "alpha"):
        registry.add(name, 0)
    with pytest.raises(KeyError, match="unknown widget 'alfa'; known widgets: alpha, zeta"):
        registry.get("alfa")


def test_load_runs_before_every_lookup() -> None:
    calls: list[str] = []
    registry: Registry[str] = Registry("widget", load=lambda: calls.append("load"))
    registry.add("a", "x")
    assert registry.names() == ["a"]
    assert registry.get("a") == "x"
    with pytest.raises(KeyError):
        registry.get("b")
    assert calls == ["load"] * 3


def test_the_zoo_and_experiment_registries_name_their_kind() -> None:
    with pytest.raises(KeyError, match="unknown model 'mpl'; known models: .*mlp"):
        get_model_class("mpl")
    with pytest.raises(KeyError, match="unknown experiment 'nope'; known experiments: "):
        get_experiment("nope")


def test_summary_is_the_first_docstring_line() -> None:
    def documented() -> None:
        """First line.

        More.
        """

    def bare() -> None:
        pass

    assert summary(documented) == "First line."
    assert summary(bare) == ""
