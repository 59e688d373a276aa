"""Language-modelling data: a text file, tokenized with a local BPE tokenizer, in blocks.

The token stream is split contiguously into train / validation / test (90 / 5 / 5 % of
the tokens by default), and each split is cut into non-overlapping blocks of ``block``
tokens: input ``x = ids[i : i + block]``, target ``y = ids[i + 1 : i + block + 1]``
(the next token at every position). Nothing is downloaded: the text and the tokenizer
(a Hugging Face ``tokenizer.json``, read with the optional ``tokenizers`` package) come
from paths the user gives.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmckit.data._dataset import Dataset
from lmckit.formats._bounded import read_text, regular_file

__all__ = ["load_text", "make_blocks", "split_tokens", "tokenize_file"]

DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)


#: Largest text file read (bytes of UTF-8).
MAX_TEXT_BYTES = 512 << 20
#: Largest tokenizer.json read (large vocabularies take tens of MB).
MAX_TOKENIZER_BYTES = 256 << 20
#: The largest share of a text's tokens that may be the tokenizer's unknown token.
MAX_UNKNOWN_SHARE = 0.5


def _tokenizer_file(tokenizer: str | Path) -> Path:
    path = Path(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no tokenizer at {path}: give a tokenizer.json file or a directory holding one"
        )
    return regular_file(path, what="tokenizer")


def tokenize_file(text_path: str | Path, tokenizer: str | Path) -> tuple[Tensor, int]:
    """Token ids of a UTF-8 text file.

    Args:
        text_path: the text, e.g. ``tinyshakespeare/input.txt``.
        tokenizer: a ``tokenizer.json`` or a directory holding one (e.g. ``gpt2_tokenizer/``).

    Returns:
        ``(ids, vocab_size)``: int64 ids ``(n_tokens,)`` and the tokenizer's vocabulary size.
        ``ids`` is a fresh tensor on every call (callers may modify it).
    """
    text = Path(text_path)
    if not text.exists():
        raise FileNotFoundError(f"no text file at {text}")
    regular_file(text, what="text file")
    tok = _tokenizer_file(tokenizer)
    # Keyed on modification times so an edited file is tokenized again.
    ids, vocab = _tokenize_cached(
        str(text.resolve()), text.stat().st_mtime_ns, str(tok.resolve()), tok.stat().st_mtime_ns
    )
    return ids.clone(), vocab


@functools.lru_cache(maxsize=4)
def _tokenize_cached(
    text_path: str, text_mtime: int, tokenizer_path: str, tokenizer_mtime: int
) -> tuple[Tensor, int]:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValueError(
            "text data needs the 'tokenizers' package: pip install tokenizers"
        ) from None
    spec = read_text(tokenizer_path, max_bytes=MAX_TOKENIZER_BYTES, what="tokenizer")
    try:
        tokenizer = Tokenizer.from_str(spec)
    except Exception as err:  # the Rust library raises a bare Exception
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{tokenizer_path} is not a valid tokenizer.json: {reason}") from None
    content = read_text(text_path, max_bytes=MAX_TEXT_BYTES, what="text file")
    ids = torch.tensor(tokenizer.encode(content).ids, dtype=torch.int64)
    _check_known(ids, tokenizer, text_path, tokenizer_path)
    # with_added_tokens: ids of added special tokens lie past the base vocabulary
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if ids.numel() and int(ids.max()) >= vocab:
        raise ValueError(
            f"{tokenizer_path} produced token id {int(ids.max())} outside its vocabulary of {vocab}"
        )
    return ids, vocab


def _check_known(ids: Tensor, tokenizer: Any, text_path: str, tokenizer_path: str) -> None:
    """Refuse a text that is mostly the tokenizer's unknown token (another language or
    alphabet than the tokenizer's): every score on it would measure nothing."""
    unk = getattr(tokenizer.model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    if unk_id is None or not ids.numel():
        return
    unknown = int((ids == unk_id).sum())
    if unknown > MAX_UNKNOWN_SHARE * ids.numel():
        raise ValueError(
            f"{text_path}: {unknown:,} of its {ids.numel():,} tokens "
            f"({100 * unknown / ids.numel():.0f}%) are unknown to {tokenizer_path} "
            f"({unk}), at most {100 * MAX_UNKNOWN_SHARE:.0f}% may be (a tokenizer made "
            "for another text)"
        )


def split_tokens(
    ids: Tensor, fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
) -> tuple[Tensor, Tensor, Tensor]:
    """Contiguous train / validation / test pieces of a token stream.

    Piece sizes are ``floor(f_train * n)`` and ``floor(f_val * n)``; the test piece takes
    the rest. The pieces are copies, in stream order.

    Args:
        ids: token ids ``(n,)``.
        fractions: ``(train, val, test)``, non-negative, summing to 1.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if len(fractions) != 3 or min(fractions) < 0 or not math.isclose(sum(fractions), 1.0):
        raise ValueError(f"fractions must be 3 non-negative numbers summing to 1, got {fractions}")
    n = ids.numel()
    n_train = int(fractions[0] * n)
    n_val = int(fractions[1] * n)
    return (
        ids[:n_train].clone(),
        ids[n_train : n_train + n_val].clone(),
        ids[n_train + n_val :].clone(),
    )


def make_blocks(ids: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """Non-overlapping next-token blocks of a token stream.

    Block ``i`` is ``x = ids[i*block : (i+1)*block]``, ``y = ids[i*block+1 : (i+1)*block+1]``;
    there are ``(n - 1) // block`` of them (the tail that does not fill a block is dropped).

    Returns:
        ``(x, y)``, int64 ``(n_blocks, block)`` each.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    n_blocks = max(0, ids.numel() - 1) // block
    span = n_blocks * block
    x = ids[:span].reshape(n_blocks, block).clone()
    y = ids[1 : span + 1].reshape(n_blocks, block).clone()
    return x, y


def load_text(
    text_path: str | Path,
    tokenizer: str | Path,
    *,
    block: int = 256,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    name: str = "text",
) -> Dataset:
    """A language-modelling :class:`Dataset` from a text file and a local tokenizer.

    Args:
        text_path: UTF-8 text, e.g. ``../shared/data/tinyshakespeare/input.txt``.
        tokenizer: ``tokenizer.json`` or its directory, e.g. ``../shared/data/gpt2_tokenizer``.
        block: tokens per example (the context length trained on).
        fractions: contiguous ``(train, val, test)`` fractions of the token stream.
        name: the dataset's name.

    Returns:
        A dataset with int64 inputs and targets ``(N, block)`` in every split (train, val,
        test) and ``num_classes`` equal to the vocabulary size.
    """
    ids, vocab = tokenize_file(text_path, tokenizer)
    pieces = split_tokens(ids, fractions)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (make_blocks(p, block) for p in pieces)
    for split, x in (("train", x_train), ("val", x_val), ("test", x_test)):
        if x.shape[0] == 0:
            raise ValueError(
                f"{text_path}: the {split} split has fewer than {block} + 1 tokens; "
                "use a smaller block or a longer text"
            )
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=vocab,
        x_val=x_val,
        y_val=y_val,
    )
