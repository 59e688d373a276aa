"""Where a head space's projections live: the rows ``CircuitPart.index`` names."""

from __future__ import annotations

import pytest
import torch

from lmckit.symmetry._head_circuits import CircuitPart


def test_blocks_of_the_whole_axis_and_rows_by_offsets() -> None:
    x = torch.arange(12)
    assert x[CircuitPart("w", 1, 3).index(12, heads=2)].tolist() == [4, 5, 6, 7]
    assert x[CircuitPart("w", rows=3, start=8).index(12, heads=1)].tolist() == [8, 9, 10]


def test_blocks_inside_each_head_are_read_and_written_head_by_head() -> None:
    # 2 heads x (query, key, value) x head_dim 2, laid out head by head (GPT-NeoX)
    heads, blocks, dim = 2, 3, 2
    x = torch.arange(heads * blocks * dim).float()
    layout = x.reshape(heads, blocks, dim)
    for block in range(blocks):
        rows = CircuitPart("w", block, blocks, per_head=True).index(x.numel(), heads)
        assert torch.equal(x[rows], layout[:, block].reshape(-1))
    values = CircuitPart("w", 2, blocks, per_head=True).index(x.numel(), heads)
    y = x.clone()
    y[values] = -1.0  # writing the values touches only each head's value rows
    assert torch.equal(y.reshape(heads, blocks, dim)[:, :2], layout[:, :2])
    assert bool((y.reshape(heads, blocks, dim)[:, 2] == -1).all())


def test_offsets_and_blocks_inside_heads_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        CircuitPart("w", 0, 3, rows=4, per_head=True)


def test_rows_by_offsets_inside_each_head() -> None:
    # 3 heads of 5 rows each: [3 position-free rows | 2 rotary rows] (latent attention)
    x = torch.arange(15)
    nope = CircuitPart("w", rows=3, per_head=True).index(15, heads=3)
    rope = CircuitPart("w", start=3, rows=2, per_head=True).index(15, heads=3)
    assert x[nope].tolist() == [0, 1, 2, 5, 6, 7, 10, 11, 12]
    assert x[rope].tolist() == [3, 4, 8, 9, 13, 14]
