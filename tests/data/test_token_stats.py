"""Token statistics on hand-made token data, and a text prefix with a compacted vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmckit.data import Dataset
from lmckit.data._text import tokenize_file
from lmckit.data._token_stats import (
    seen_token_masks,
    seen_tokens,
    text_prefix,
    token_counts,
    token_row_weights,
)

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"
TEXT = DATA_ROOT / "tinyshakespeare" / "input.txt"
TOKENIZER = DATA_ROOT / "gpt2_tokenizer"


def _tokens() -> Dataset:
    # vocabulary 6: id 5 never occurs in train; id 4 only as a target; id 0 only read
    x = torch.tensor([[0, 1, 1], [2, 1, 3]])
    y = torch.tensor([[1, 1, 2], [1, 3, 4]])
    test = torch.tensor([[5, 5, 5]])
    return Dataset("toy", x, y, test, test, num_classes=6)


def test_counts_and_seen_tokens() -> None:
    read, predicted = token_counts(_tokens())
    assert read.tolist() == [1, 3, 1, 1, 0, 0]
    assert predicted.tolist() == [0, 3, 1, 1, 1, 0]
    assert seen_tokens(_tokens()).tolist() == [True, True, True, True, True, False]
    masks = seen_token_masks(_tokens(), embedding="emb", head="head")
    assert set(masks) == {"emb", "head"} and not masks["emb"][5]


def test_row_weights_are_frequencies_with_mean_one_over_present_tokens() -> None:
    weights = token_row_weights(_tokens())
    # read counts 1, 3, 1, 1 over four present tokens: mean 1.5
    torch.testing.assert_close(
        weights["transformer.wte.weight"], torch.tensor([2, 6, 2, 2, 0, 0]) / 3
    )
    # predicted counts 3, 1, 1, 1 over ids 1..4: mean 1.5
    torch.testing.assert_close(weights["lm_head.weight"], torch.tensor([0, 6, 2, 2, 2, 0]) / 3)


@pytest.mark.skipif(not (TEXT.exists() and TOKENIZER.exists()), reason="needs Tiny Shakespeare")
def test_text_prefix_renumbers_without_changing_the_stream() -> None:
    data = text_prefix(TEXT, TOKENIZER, block=16, tokens=2000, name="tinyshakespeare")
    ids, _ = tokenize_file(TEXT, TOKENIZER)
    vocab = torch.unique(ids[:2000])
    assert data.num_classes == len(vocab) and data.name == "tinyshakespeare"
    # block 0 of train is the first 16 tokens; targets are the inputs shifted by one
    assert torch.equal(vocab[data.x_train[0]], ids[:16])
    assert torch.equal(data.x_train[0, 1:], data.y_train[0, :-1])
    assert len(data.split("val")[0]) > 0 and len(data.x_test) > 0
    with pytest.raises(ValueError, match="tokens must be"):
        text_prefix(TEXT, TOKENIZER, block=16, tokens=0)
    with pytest.raises(ValueError, match="in every split"):
        text_prefix(TEXT, TOKENIZER, block=16, tokens=100)


def test_token_row_masks_find_the_token_tables_by_structure() -> None:
    from lmckit.data._token_stats import token_row_masks
    from lmckit.models import create_model

    data = _tokens()  # id 5 never occurs in training
    tied, tp = create_model("gpt2", vocab_size=6, n_layer=1, n_head=1, n_embd=4, context=3)
    masks = token_row_masks(tied, tp, data)
    assert set(masks) == {"transformer.wte.weight"}  # the tied head is the embedding
    assert masks["transformer.wte.weight"].tolist() == [True] * 5 + [False]
    untied, up = create_model(
        "gpt2", vocab_size=8, n_layer=1, n_head=1, n_embd=4, context=3, tie_embeddings=False
    )
    masks = token_row_masks(untied, up, data)
    # rows past the tokenizer's 6 never occur either
    want = [True] * 5 + [False] * 3
    assert {k: m.tolist() for k, m in masks.items()} == {
        "transformer.wte.weight": want,
        "lm_head.weight": want,
    }
    # the position embedding (3 rows) and every other layer are not token tables
    labels = Dataset("cls", torch.randn(4, 3), torch.tensor([0, 1, 0, 1]),
                     torch.randn(2, 3), torch.tensor([0, 1]), num_classes=2)  # fmt: skip
    assert token_row_masks(untied, up, labels) == {}


def test_token_row_masks_without_token_tables_use_the_vocabulary_size() -> None:
    from torch import nn

    from lmckit.data._token_stats import token_row_masks

    module = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 5), nn.Linear(5, 6))
    params = {k: v.detach() for k, v in module.state_dict().items()}
    masks = token_row_masks(module, params, _tokens())
    assert set(masks) == {"0.weight", "2.weight"}
    all_seen = Dataset("all", torch.arange(6)[None], torch.arange(6)[None],
                       torch.arange(6)[None], torch.arange(6)[None], num_classes=6)  # fmt: skip
    assert token_row_masks(module, params, all_seen) == {}
