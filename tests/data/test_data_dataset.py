"""`Dataset` validation and `batches`."""

from __future__ import annotations

import pytest
import torch

from lmckit.data import Dataset, batches


def _dataset(**overrides: object) -> Dataset:
    fields: dict[str, object] = dict(
        name="toy",
        x_train=torch.zeros(6, 3, 2, 2),
        y_train=torch.tensor([0, 1, 2, 0, 1, 2]),
        x_test=torch.zeros(3, 3, 2, 2),
        y_test=torch.tensor([2, 1, 0]),
        num_classes=3,
    )
    fields.update(overrides)
    return Dataset(**fields)  # type: ignore[arg-type]


def test_input_shape_and_split() -> None:
    ds = _dataset()
    assert ds.input_shape == (3, 2, 2)
    assert ds.split("train")[0] is ds.x_train
    assert ds.split("test")[1] is ds.y_test
    with pytest.raises(ValueError, match="unknown split 'val'.*train, test"):
        ds.split("val")
    assert "n_train=6" in repr(ds)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"x_train": torch.zeros(6, 3, 2, 2, dtype=torch.float64)}, "float32"),
        ({"y_train": torch.zeros(6, dtype=torch.int32)}, "int64"),
        ({"y_test": torch.tensor([0, 1])}, "same number of samples"),
        ({"y_test": torch.tensor([0, 1, 3])}, r"outside \[0, 3\)"),
        ({"x_test": torch.zeros(3, 3, 2, 3)}, "differ in shape"),
        ({"num_classes": 0}, "num_classes"),
    ],
)
def test_validation(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _dataset(**overrides)


def test_frozen() -> None:
    ds = _dataset()
    with pytest.raises(AttributeError):
        ds.name = "other"  # type: ignore[misc]


def test_batches_in_order_with_remainder() -> None:
    x = torch.arange(10.0).unsqueeze(1)
    y = torch.arange(10)
    got = list(batches(x, y, 4))
    assert [len(b[1]) for b in got] == [4, 4, 2]
    assert torch.equal(torch.cat([b[1] for b in got]), y)
    assert all(torch.equal(bx.squeeze(1).long(), by) for bx, by in got)


def test_batches_limit() -> None:
    x, y = torch.zeros(10, 2), torch.zeros(10, dtype=torch.int64)
    assert len(list(batches(x, y, 3, limit=2))) == 2
    assert len(list(batches(x, y, 3, limit=100))) == 4
    assert list(batches(x, y, 3, limit=0)) == []


def test_batches_shuffle_is_seeded_and_a_permutation() -> None:
    x = torch.arange(20.0).unsqueeze(1)
    y = torch.arange(20)

    def order(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        got = list(batches(x, y, 6, shuffle=True, generator=gen))
        assert all(torch.equal(bx.squeeze(1).long(), by) for bx, by in got)
        return torch.cat([by for _, by in got])

    assert torch.equal(order(1), order(1))
    assert not torch.equal(order(1), order(2))
    assert torch.equal(order(1).sort().values, y)


def test_batches_errors_are_eager() -> None:
    x, y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="torch.Generator"):
        batches(x, y, 2, shuffle=True)
    with pytest.raises(ValueError, match="batch_size"):
        batches(x, y, 0)
    with pytest.raises(ValueError, match="limit"):
        batches(x, y, 2, limit=-1)
    with pytest.raises(ValueError, match="4 samples but y has 3"):
        batches(x, y[:3], 2)


def test_global_rng_untouched() -> None:
    state = torch.get_rng_state()
    x, y = torch.zeros(8, 2), torch.zeros(8, dtype=torch.int64)
    list(batches(x, y, 3, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(torch.get_rng_state(), state)
