"""Token statistics of language-modelling data, and a text prefix with a compacted vocabulary.

* :func:`text_prefix`: the first ``tokens`` BPE ids of a text, renumbered to the ids that
  occur in them, so a small model needs no 50,257-row embedding.
* :func:`seen_tokens`, :func:`token_counts`: which tokens the training split reads or
  predicts, and how often.
* :func:`seen_token_masks`, :func:`token_row_weights`: the same as ``row_masks`` /
  ``row_weights`` of weight matching, keyed by the embedding and LM-head parameters
  (GPT-2's names by default): rows of tokens that never occur carry no signal, and the
  rest count by frequency (as the reference code of Generalized LMC for Transformers
  computes token frequencies).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from lmckit.data._dataset import Dataset
from lmckit.data._text import load_text, make_blocks, split_tokens, tokenize_file

__all__ = [
    "EMBEDDING",
    "LM_HEAD",
    "seen_token_masks",
    "seen_tokens",
    "text_prefix",
    "token_counts",
    "token_row_masks",
    "token_row_weights",
]

#: GPT-2's token embedding and LM-head weights (rows indexed by token id).
EMBEDDING = "transformer.wte.weight"
LM_HEAD = "lm_head.weight"


def text_prefix(
    text: str | Path,
    tokenizer: str | Path,
    *,
    block: int,
    tokens: int | None = None,
    name: str = "text",
) -> Dataset:
    """A text in BPE blocks, contiguous 90/5/5 train/val/test split.

    Args:
        text, tokenizer: a UTF-8 text file and a ``tokenizer.json`` (or its folder).
        block: tokens per block (the context).
        tokens: keep only the first ``tokens`` ids and renumber the ids that occur in
            them ``0..V'-1`` (in id order); ``None``: the whole text with the tokenizer's
            vocabulary (:func:`lmckit.data._text.load_text`).
        name: the dataset's name.

    Raises:
        ValueError: ``tokens < 1``, or too few tokens for a block in every split.
    """
    if tokens is None:
        return load_text(text, tokenizer, block=block, name=name)
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1 or None, got {tokens}")
    ids, _ = tokenize_file(text, tokenizer)
    ids = ids[:tokens]
    vocab, compact = torch.unique(ids, return_inverse=True)
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = (
        make_blocks(part, block) for part in split_tokens(compact)
    )
    if min(len(x_tr), len(x_va), len(x_te)) == 0:
        raise ValueError(f"{tokens} tokens do not make a block of {block} in every split")
    return Dataset(name, x_tr, y_tr, x_te, y_te, num_classes=len(vocab), x_val=x_va, y_val=y_va)


def token_counts(data: Dataset) -> tuple[Tensor, Tensor]:
    """How often each token id is read (``x_train``) and predicted (``y_train``).

    Returns:
        two int64 tensors ``(num_classes,)``.
    """
    return tuple(  # type: ignore[return-value]
        torch.bincount(ids.flatten(), minlength=data.num_classes)
        for ids in (data.x_train, data.y_train)
    )


def seen_tokens(data: Dataset) -> Tensor:
    """Bool ``(num_classes,)``: whether each id occurs in the training split (read or predicted)."""
    read, predicted = token_counts(data)
    return (read + predicted) > 0


def seen_token_masks(
    data: Dataset, *, embedding: str = EMBEDDING, head: str = LM_HEAD
) -> dict[str, Tensor]:
    """``row_masks``: embedding and LM-head rows of the tokens in the training split."""
    seen = seen_tokens(data)
    return {embedding: seen, head: seen}


def token_row_masks(
    module: torch.nn.Module, params: Mapping[str, Tensor], data: Dataset
) -> dict[str, Tensor]:
    """``row_masks`` of a language model: the rows of its token embedding and of its
    output layer for the tokens that occur in ``data``'s training split.

    The tables are the module's ``get_input_embeddings()`` and ``get_output_embeddings()``
    (``transformers``' API, which lmckit's GPT-2 has too); a module without them: every
    ``nn.Embedding`` and ``nn.Linear`` with one row per token of ``data``. Rows past the
    tokenizer's (a vocabulary padded beyond it) never occur. Only parameters in
    ``params`` count (a tied head is its embedding). Empty when ``data`` is not token
    data or every row's token occurs: nothing to mask.
    """
    if not data.is_language:
        return {}
    seen = seen_tokens(data)
    tables: list[torch.nn.Module] = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        table = getattr(module, getter, None)
        found = table() if callable(table) else None
        if isinstance(found, torch.nn.Module):
            tables.append(found)
    if not tables:
        tables = [
            m
            for m in module.modules()
            if (isinstance(m, torch.nn.Embedding) and m.num_embeddings == data.num_classes)
            or (isinstance(m, torch.nn.Linear) and m.out_features == data.num_classes)
        ]
    names = {id(m): name for name, m in module.named_modules()}
    out = {}
    for table in tables:
        prefix = names.get(id(table))
        key = f"{prefix}.weight" if prefix else "weight"
        if prefix is None or key not in params:
            continue
        rows = params[key].shape[0]
        if rows < data.num_classes:
            continue  # not a table of these tokens
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[: data.num_classes] = seen
        if not bool(mask.all()):
            out[key] = mask
    return out


def token_row_weights(
    data: Dataset, *, embedding: str = EMBEDDING, head: str = LM_HEAD
) -> dict[str, Tensor]:
    """``row_weights``: embedding rows weighted by how often their token is read, LM-head
    rows by how often it is predicted, in the training split.

    Each is normalised to mean 1 over the tokens that occur, so they weigh as much in
    total as under a mask of those tokens; absent tokens get 0.
    """
    out = {}
    for key, counts in zip((embedding, head), token_counts(data), strict=True):
        counts = counts.double()
        out[key] = (counts / counts[counts > 0].mean()).float()
    return out
