"""The model card (``README.md``) of a Hugging Face folder lmckit writes.

It says what the folder is: which model's weights, moved how (method, symmetry, form),
aligned to which model, the alignment's objective and, when measured, the barrier. A
card the source folder had is kept below it (its YAML front matter, which the Hub reads
from the top of the file, stays on top).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["model_card"]


def _objective(meta: Mapping[str, Any]) -> str | None:
    spaces = meta.get("spaces")
    if not isinstance(spaces, dict) or not spaces:
        return None
    try:
        before = sum(float(d["objective_before"]) for d in spaces.values())
        after = sum(float(d["objective_after"]) for d in spaces.values())
    except (KeyError, TypeError, ValueError):
        return None
    return f"{before:.6g} -> {after:.6g} over {len(spaces)} spaces"


def _rows(meta: Mapping[str, Any], dtype: str | None) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, label in (
        ("command", "command"),
        ("source", "weights of"),
        ("aligned_to", "aligned to"),
        ("a", "model A (t = 0)"),
        ("b", "model B (t = 1)"),
        ("t", "interpolation weight t"),
        ("method", "method"),
        ("symmetry", "symmetry"),
        ("form", "form"),
        ("fix", "fix"),
        ("data", "data"),
    ):
        value = meta.get(key)
        if value not in (None, "", [], {}):
            rows.append((label, str(value)))
    objective = _objective(meta)
    if objective:
        rows.append(("objective (weight inner product)", objective))
    for key in ("barrier_loss", "barrier"):
        if isinstance(meta.get(key), int | float):
            rows.append(("loss barrier", f"{meta[key]:.4g}"))
    if dtype:
        rows.append(("stored as", dtype))
    return rows


def model_card(
    name: str, meta: Mapping[str, Any], *, version: str, dtype: str | None, source_card: str = ""
) -> str:
    """The text of ``README.md`` for the folder ``name``.

    Args:
        name: the output folder's name (the card's title).
        meta: what lmckit did (the metadata it stores in ``lmckit.json``).
        version: lmckit's version.
        dtype: the floating dtype the weights are stored in.
        source_card: the source folder's ``README.md``, kept below.
    """
    front, body = "", source_card
    if source_card.startswith("---\n"):
        end = source_card.find("\n---", 4)
        if end != -1:
            front = source_card[: end + 4].rstrip("\n") + "\n\n"
            body = source_card[end + 4 :].lstrip("\n")
    lines = [f"# {name}", "", f"Written by lmckit {version}.", ""]
    rows = _rows(meta, dtype)
    if rows:
        lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines.append(
        "The weights are the source's moved by a symmetry of its architecture (the same "
        "function) or interpolated between two such models; `lmckit.json` holds the full "
        "record."
    )
    if body.strip():
        lines += ["", "## The source's model card", "", body.rstrip("\n")]
    return front + "\n".join(lines) + "\n"
