"""Language-modelling data: token blocks, contiguous splits, text specs, token datasets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmckit.data import Dataset, load_data
from lmckit.data._text import load_text, make_blocks, split_tokens, tokenize_file

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SHAKESPEARE = SHARED / "tinyshakespeare" / "input.txt"
GPT2_TOKENIZER = SHARED / "gpt2_tokenizer"

WORDS = ["<unk>", "the", "cat", "sat", "on", "mat", "and", "dog", "ran"]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer.json whose ids are the positions in WORDS."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path.parent


def _text(tmp_path: Path, n_words: int = 400) -> tuple[Path, torch.Tensor]:
    """A text of ``n_words`` known words, and its expected token ids."""
    ids = torch.tensor([1 + (i * 7 + i // 5) % (len(WORDS) - 1) for i in range(n_words)])
    path = tmp_path / "corpus,v1.txt"  # a comma in the name: specs must keep it in the path
    path.write_text(" ".join(WORDS[int(i)] for i in ids), encoding="utf-8")
    return path, ids


def test_make_blocks_shift_by_one() -> None:
    ids = torch.arange(23)
    x, y = make_blocks(ids, 5)
    assert x.shape == y.shape == (4, 5)  # (23 - 1) // 5 blocks
    assert torch.equal(x.flatten(), ids[:20]) and torch.equal(y, x + 1)
    # The blocks are copies: editing them leaves the stream alone.
    x[0, 0] = 99
    assert ids[0] == 0
    assert make_blocks(torch.arange(5), 5)[0].shape == (0, 5)
    with pytest.raises(ValueError, match="block"):
        make_blocks(ids, 0)


def test_split_tokens_contiguous() -> None:
    ids = torch.arange(1000)
    train, val, test = split_tokens(ids)
    assert (train.numel(), val.numel(), test.numel()) == (900, 50, 50)
    assert torch.equal(torch.cat([train, val, test]), ids)
    assert split_tokens(ids, (0.5, 0.25, 0.25))[1][0] == 500
    for bad in [(0.9, 0.1, 0.1), (1.1, -0.1, 0.0), (0.5, 0.5)]:
        with pytest.raises(ValueError, match="fractions"):
            split_tokens(ids, bad)  # type: ignore[arg-type]


def test_load_text_blocks_and_splits(tmp_path: Path, word_tokenizer: Path) -> None:
    path, ids = _text(tmp_path)
    got, vocab = tokenize_file(path, word_tokenizer / "tokenizer.json")
    assert vocab == len(WORDS) and torch.equal(got, ids)

    ds = load_text(path, word_tokenizer, block=8, fractions=(0.8, 0.1, 0.1), name="toy")
    assert ds.is_language and ds.has_val and ds.splits == ("train", "val", "test")
    assert ds.num_classes == len(WORDS) and ds.input_shape == (8,)
    # 320 / 40 / 40 tokens -> 39 / 4 / 4 blocks of 8 (one token is kept for the last target).
    assert [ds.split(s)[0].shape[0] for s in ds.splits] == [39, 4, 4]
    assert torch.equal(ds.x_train.flatten(), ids[:312])
    assert torch.equal(ds.y_train.flatten(), ids[1:313])
    assert torch.equal(ds.x_val[0], ids[320:328]) and torch.equal(ds.x_test[0], ids[360:368])
    assert "n_val=4" in repr(ds)
    with pytest.raises(ValueError, match="fewer than 64"):
        load_text(path, word_tokenizer, block=64)


def test_text_spec(tmp_path: Path, word_tokenizer: Path) -> None:
    path, ids = _text(tmp_path)
    ds = load_data(f"shakespeare:{path},tokenizer={word_tokenizer},block=4,split=50/25/25")
    assert ds.name == "shakespeare" and ds.input_shape == (4,)
    assert torch.equal(ds.x_val[0], ids[200:204])
    long_path, _ = _text(tmp_path, n_words=6000)
    default = load_data(f"text: {long_path} , tokenizer = {word_tokenizer}")
    assert default.name == "text" and default.input_shape == (256,)
    assert default.x_train.shape[0] == (5400 - 1) // 256


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        ("", "needs a tokenizer"),
        (",tokenizer=TOK,block=x", "not an integer"),
        (",tokenizer=TOK,split=90/10", "TRAIN/VAL/TEST"),
        (",tokenizer=TOK,block=4,block=8", "given twice"),
        (",tokenizer=TOK,block=0", "block must be >= 1"),
    ],
)
def test_text_spec_errors(tmp_path: Path, word_tokenizer: Path, suffix: str, message: str) -> None:
    path, _ = _text(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_data(f"text:{path}{suffix.replace('TOK', str(word_tokenizer))}")
    with pytest.raises(ValueError, match="needs a text file"):
        load_data(f"text:,tokenizer={word_tokenizer}")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_data(f"text:{path},tokenizer={tmp_path}")


def _tokens(n: int, t: int = 4) -> torch.Tensor:
    return torch.arange(n * t).reshape(n, t) % 5


def test_dataset_token_inputs_and_val_split() -> None:
    ds = Dataset(
        "lm", _tokens(6), _tokens(6), _tokens(2), _tokens(2), 5, x_val=_tokens(3), y_val=_tokens(3)
    )
    assert ds.split("val")[0].shape == (3, 4)
    plain = Dataset("lm", _tokens(6), _tokens(6), _tokens(2), _tokens(2), 5)
    assert not plain.has_val
    with pytest.raises(ValueError, match="no validation split"):
        plain.split("val")
    bad = [
        ({"y_train": _tokens(6)[:, :3]}, "like the tokens"),
        ({"x_val": _tokens(3)}, "both x_val and y_val"),
        ({"x_val": _tokens(3, 5), "y_val": _tokens(3, 5)}, "differ in shape"),
        ({"x_test": _tokens(2) + 5}, "token ids outside"),
        ({"x_train": _tokens(6).int()}, "float32 .* or int64"),
    ]
    for overrides, message in bad:
        fields = dict(
            name="lm",
            x_train=_tokens(6),
            y_train=_tokens(6),
            x_test=_tokens(2),
            y_test=_tokens(2),
            num_classes=5,
        )
        fields.update(overrides)
        with pytest.raises(ValueError, match=message):
            Dataset(**fields)  # type: ignore[arg-type]


@pytest.mark.skipif(
    not (SHAKESPEARE.is_file() and GPT2_TOKENIZER.is_dir()), reason="shared data absent"
)
def test_tiny_shakespeare_gpt2_tokens() -> None:
    pytest.importorskip("tokenizers")
    ds = load_data(f"shakespeare:{SHAKESPEARE},tokenizer={GPT2_TOKENIZER}")
    # 338,025 GPT-2 tokens: 304,222 / 16,901 / 16,902 -> 1,188 / 66 / 66 blocks of 256.
    assert ds.num_classes == 50257 and ds.input_shape == (256,)
    assert [ds.split(s)[0].shape[0] for s in ds.splits] == [1188, 66, 66]
    assert ds.x_train[0, :3].tolist() == [5962, 22307, 25]  # "First Citizen:"
