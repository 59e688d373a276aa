"""The model card (``README.md``) of a Hugging Face folder lmckit writes.

It says what the folder is: which model's weights, moved how (method, symmetry, form),
aligned to which model, the alignment's objective and, when measured, the barrier. A
card the source folder had is kept below it (its YAML front matter, which the Hub reads
from the top of the file, stays on top). Weights that derive from several models (a
merge) carry every model's license: in the front matter and in a section naming each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def _split(card: str) -> tuple[str, str]:
    """``(front matter with its --- lines, or "", the rest)`` of a model card."""
    if card.startswith("---\n"):
        end = card.find("\n---", 4)
        if end != -1:
            return card[: end + 4].rstrip("\n") + "\n", card[end + 4 :].lstrip("\n")
    return "", card


def _license(front: str) -> str | None:
    """The ``license:`` of a card's front matter (a one-line value), if it has one."""
    for line in front.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip().strip("'\"")
    return None


def _with_licenses(front: str, licenses: list[str]) -> str:
    """``front`` whose ``license`` says every license of the weights: one shared license
    as it is, several as ``other`` with ``license_name`` naming them all."""
    if len(set(licenses)) <= 1 and (not licenses or _license(front) == licenses[0]):
        return front
    if len(set(licenses)) == 1:
        entries = [f"license: {licenses[0]}"]
    else:
        entries = ["license: other", f"license_name: {' AND '.join(dict.fromkeys(licenses))}"]
    kept = [
        line
        for line in front.splitlines()[1:-1]
        if line.partition(":")[0].strip() not in ("license", "license_name")
    ]
    return "\n".join(["---", *entries, *kept, "---"]) + "\n"


def _licenses_section(cards: list[tuple[str, str]]) -> list[str]:
    """Lines saying which license each model the weights derive from has."""
    lines = ["", "## Licenses", "", "The weights derive from each of these models; each one's "
             "license applies:", ""]  # fmt: skip
    for label, card in cards:
        found = _license(_split(card)[0])
        lines.append(f"- {label}: {found or 'no license stated in its model card'}")
    return lines


def model_card(
    name: str,
    meta: Mapping[str, Any],
    *,
    version: str,
    dtype: str | None,
    source_card: str = "",
    other_cards: Sequence[tuple[str, str]] = (),
    source_name: str = "the source",
) -> str:
    """The text of ``README.md`` for the folder ``name``.

    Args:
        name: the output folder's name (the card's title).
        meta: what lmckit did (the metadata it stores in ``lmckit.json``).
        version: lmckit's version.
        dtype: the floating dtype the weights are stored in.
        source_card: the source folder's ``README.md``, kept below.
        source_name: how the licenses section names the source.
        other_cards: ``(label, README.md text)`` of the other models the weights derive
            from (a merge's other end): their licenses join the source's in the front
            matter (``license: other`` and ``license_name`` when they differ) and in a
            section naming each model's.
    """
    front, body = _split(source_card)
    if other_cards:
        cards = [(source_name, source_card), *other_cards]
        found = [lic for _, card in cards if (lic := _license(_split(card)[0]))]
        base = front or ("---\n---\n" if found else "")
        front = _with_licenses(base, found) if found else front
    front = front + "\n" if front else ""
    lines = [f"# {name}", "", f"Written by lmckit {version}.", ""]
    rows = _rows(meta, dtype)
    if rows:
        lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines.append(
        "The weights are the source's moved by a symmetry of its architecture (the same "
        "function) or interpolated between two such models; `lmckit.json` holds the full "
        "record."
    )
    if other_cards:
        lines += _licenses_section([(source_name, source_card), *other_cards])
    if body.strip():
        lines += ["", "## The source's model card", "", body.rstrip("\n")]
    return front + "\n".join(lines) + "\n"
