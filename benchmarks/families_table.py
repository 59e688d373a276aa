"""The tables of docs/families.md, from the measurements of ``benchmarks/families.py``.

The numbers come from the report; what a measurement cannot say (why a stream admits no
rotation, what a family's quirk is) is data here: :data:`NOTES` and :data:`NO_ROTATION`,
written by hand, one line per family.
"""

from __future__ import annotations

import re
from typing import Any

#: the page's sections and their families, in the order of the page
SECTIONS: dict[str, tuple[str, ...]] = {
    "Llama-like decoders": ("llama", "mistral", "qwen2", "gemma", "phi3", "granite", "smollm3",
                            "stablelm", "starcoder2", "nemotron", "gemma2", "qwen3", "gemma3",
                            "olmo2", "cohere"),
    "GPT-style decoders": ("gpt2", "gptj", "gpt_neox", "phi", "opt", "falcon", "bloom", "mpt"),
    "Mixtures of experts": ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3"),
    "Encoders": ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta-v2",
                 "albert", "modernbert", "clip"),
    "Encoder-decoders": ("t5", "bart", "whisper"),
    "Vision": ("vit", "deit", "beit", "dinov2", "siglip", "swin", "convnext", "resnet"),
}  # fmt: skip

#: the family's name as people write it
TITLES: dict[str, str] = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gemma": "Gemma",
    "phi3": "Phi-3", "granite": "Granite", "smollm3": "SmolLM3", "stablelm": "StableLM",
    "starcoder2": "Starcoder2", "nemotron": "Nemotron", "gemma2": "Gemma2", "qwen3": "Qwen3",
    "gemma3": "Gemma3 (text)", "olmo2": "OLMo2", "cohere": "Cohere", "gpt2": "GPT-2",
    "gptj": "GPT-J", "gpt_neox": "GPT-NeoX", "phi": "Phi", "opt": "OPT", "falcon": "Falcon",
    "bloom": "BLOOM", "mpt": "MPT", "mixtral": "Mixtral", "qwen2_moe": "Qwen2-MoE",
    "qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE", "deepseek_v3": "DeepSeek-V3", "bert": "BERT",
    "roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa", "distilbert": "DistilBERT",
    "electra": "ELECTRA", "deberta-v2": "DeBERTa-v2", "albert": "ALBERT",
    "modernbert": "ModernBERT", "clip": "CLIP (text)", "t5": "T5", "bart": "BART",
    "whisper": "Whisper", "vit": "ViT", "deit": "DeiT", "beit": "BEiT", "dinov2": "DINOv2",
    "siglip": "SigLIP (vision, classifier)", "swin": "Swin", "convnext": "ConvNeXt",
    "resnet": "HF ResNet",
}  # fmt: skip

#: what the family's architecture adds to the components found, by hand
NOTES: dict[str, str] = {
    "qwen2": "biases on q, k, v",
    "gemma": "its RMSNorm's `1 + w` is read as a scale",
    "phi3": "the fused `qkv_proj` is cut into query, key and value blocks",
    "granite": "its scalar multipliers change nothing",
    "smollm3": "layer 1 has no rotary positions (NoPE): its qk is Orthogonal",
    "stablelm": "rotary on a quarter of each head: the rest is a pass-through block",
    "nemotron": "relu² is `aten.square`",
    "gemma2": "a norm after each block as well as before",
    "qwen3": "qk-norm per head: only plane sign flips commute with it (PlaneSigns)",
    "gemma3": "qk-norm per head, as Qwen3",
    "olmo2": "qk-norm over the whole projection: its scales move with the heads",
    "cohere": "interleaved rotary over the whole head",
    "gptj": "interleaved rotary on half of each head, the rest passed through",
    "gpt_neox": "rotary on a quarter of each head, `query_key_value` split inside each head",
    "phi": "rotary on half of each head",
    "opt": "learned positions from a `cumsum` of the mask",
    "falcon": "one key/value head shared by every query head: its bases are spaces of "
    "their own beside the heads",
    "bloom": "ALiBi: per-head slopes fix the head order; each head's bases survive",
    "mpt": "ALiBi, as BLOOM; fused `Wqkv`",
    "mixtral": "experts and the units inside each expert",
    "qwen2_moe": "a shared expert besides the routed ones",
    "qwen3_moe": "qk-norm per head, as Qwen3",
    "olmoe": "qk-norm over the whole projection, as OLMo2",
    "deepseek_v3": "multi-head latent attention, a shared and routed experts",
    "roberta": "positions from the ids (`cumsum`, `gather`)",
    "xlm-roberta": "as RoBERTa",
    "deberta-v2": "its attention written out with `bmm`, read as attention",
    "albert": "embeddings of width 16 into a hidden stream; one layer run twice",
    "modernbert": "`unbind` of a fused `Wqkv`; windowed attention",
    "clip": "the model's output is the stream itself",
    "t5": "a relative position bias shared by every layer's self-attention heads",
    "whisper": "log-mel features through two convolutions",
    "beit": "relative position tables per layer; layer scales",
    "dinov2": "layer scales; the classifier concatenates the class token and the mean",
    "siglip": "traced at its `vision_config`'s image size",
    "swin": "windowed attention (`pad`, window indexing), patch merging",
    "convnext": "channels-last LayerNorm under a permute",
    "resnet": "BatchNorm",
}

#: why the stream admits no rotation, where lmckit refuses or finds none, by hand
NO_ROTATION: dict[str, str] = {
    "bert": "post-LayerNorm: a norm's output is summed into the stream",
    "gemma2": "a norm after each block is summed into the stream",
    "bloom": "the embedding LayerNorm's output is the stream itself",
    "clip": "the model's output is the stream itself",
    "t5": "its output head is tied to the embedding and reads the final norm",
    "resnet": "BatchNorm scales each channel",
    "convnext": "channels-last LayerNorm under a permute",
    "beit": "the layer scales `lambda_1`, `lambda_2` are summed into the stream",
    "gemma3": "a norm after each block is summed into the stream",
    "olmo2": "a norm after each block (`x + norm(attn(x))`) is summed into the stream",
    "modernbert": "the embedding norm's output is summed into the stream",
    "dinov2": "layer scales summed into the stream, and the classifier's `cat`",
    "swin": "norms read by the windows' `pad` and by patch merging",
}
for _name in ("roberta", "xlm-roberta", "distilbert", "electra", "deberta-v2", "bart"):
    NO_ROTATION[_name] = NO_ROTATION["bert"]

_SHORT = {"residual": "R", "residual rotation": "R⊥", "units": "U", "experts": "E",
          "heads": "H", "query": "Q", "value": "V"}  # fmt: skip
_QK = {"half": "half", "interleaved": "interleaved", "full": "full", "plane_signs": "±"}
_ORDER = ("residual", "heads", "query", "value", "qk", "units", "scale", "experts")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _components(row: dict[str, Any]) -> str:
    found = row["inference"]
    if "error" in found:
        return f"**refused**: `{_cell(found['error'])}`"
    groups = found["groups"]
    names = sorted(groups, key=lambda c: (_ORDER.index(c) if c in _ORDER else len(_ORDER), c))
    parts = []
    for name in names:
        kinds = [g for g in groups[name] if g != "Permutation"]
        parts.append(f"{name} ({', '.join(kinds)})" if kinds else name)
    note = NOTES.get(row["family"])
    return ", ".join(parts) + (f"; {note}" if note else "")


def _refusal(reason: str) -> str:
    """A refusal shortened to its causes (the ops that consume a norm's scale), or ""."""
    ops = re.findall(r"\((\w+)\) consumes the value", reason)
    return "norm scales read by " + ", ".join(f"`{op}`" for op in dict.fromkeys(ops)) if ops else ""


def _orthogonal(row: dict[str, Any]) -> str:
    found, why = row["orthogonal"], NO_ROTATION.get(row["family"])
    if "error" in found:
        return f"**error**: `{_cell(found['error'][:140])}`"
    if "reason" in found:
        causes = _refusal(found["reason"])
        if why:
            return f"no: {why}" + (f" ({causes})" if causes else "")
        return f"no: {causes or _cell(found['reason'][:140])}"
    if not found["admits"]:
        return f"no rotation found: the stream stays {', '.join(found['groups'])}"
    form = f" ({found['form']})" if found["form"] else ""
    return f"yes: {', '.join(found['groups'])}{form}"


def _left_out(row: dict[str, Any]) -> str:
    """The left-out lines, those that differ only in numbers (layers, nodes) once, cut."""
    counts: dict[str, list[str]] = {}
    for line in row["inference"].get("left_out", []):
        counts.setdefault(re.sub(r"'[^']*'|\d+(\.\d+)?", "N", line), []).append(line)
    shown = []
    for same in counts.values():
        line = re.sub(r"\.\d+(?=[.:' ])", ".N", same[0])
        line = line if len(line) <= 150 else line[:147] + "..."
        shown.append(f"{_cell(line)}" + (f" (x{len(same)})" if len(same) > 1 else ""))
    return "; ".join(shown) or "-"


def _planted(row: dict[str, Any]) -> str:
    maps = list(row.get("planted", {}).get("maps", []))
    if "rotated" in row:
        maps.insert(1, "residual rotation")
    short = [_SHORT.get(m) or "QK-" + _QK.get(m[4:-1], m[4:-1]) for m in maps]
    return " ".join(short) or "-"


def _left(plant: dict[str, Any]) -> str:
    if "error" in plant:
        return f"error: {plant['error'][:100]}"
    if "refused" in plant:
        return f"refused (`{_cell(plant['refused'][:100])}`)"
    left = plant["left"]
    if left == 0:
        return "0"
    return re.sub(r"e-0*", "e-", f"{left:.0e}") if left < 1e-4 else f"{left:.2f}"


def _recovered(row: dict[str, Any]) -> str:
    plants = [row[k] for k in ("planted", "rotated") if k in row]
    if not plants:
        return "-"
    ok = all(p.get("left", 1.0) < 1e-4 for p in plants)
    return ("yes: " if ok else "**no**: ") + "; ".join(_left(p) for p in plants)


def _time(row: dict[str, Any]) -> str:
    seconds = row["inference"].get("time_s")
    return "-" if seconds is None else f"{seconds:.1f} s"


def _row(row: dict[str, Any]) -> str:
    moved = row["inference"].get("moved")
    cells = [TITLES.get(row["family"], row["family"]), _components(row),
             "-" if moved is None else f"{100 * moved:.1f} %", _orthogonal(row),
             _left_out(row), _planted(row), _recovered(row), _time(row)]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


_HEADER = (
    "| family | components (groups) | moved | orthogonal stream | left out | planted "
    "| recovered: left | time |\n|---|---|---|---|---|---|---|---|"
)


def markdown(report: dict[str, Any]) -> str:
    """The tables of docs/families.md, one section per kind of family."""
    rows = {row["family"]: row for row in report["families"]}
    placed = {name for names in SECTIONS.values() for name in names}
    sections = dict(SECTIONS)
    if rest := tuple(sorted(set(rows) - placed)):
        sections["Other"] = rest
    wall, threads = report["wall_s"], report["threads"]
    out = [f"Made by `{report['command']}` on {report['date']} "
           f"({len(rows)} families, {wall:.0f} s wall, {threads} threads)."]  # fmt: skip
    for note in report.get("updates", []):
        out[0] += (f" Measured again by `{note['command']}` on {note['date']}: "
                   f"{', '.join(note['families'])}.")  # fmt: skip
    for title, names in sections.items():
        present = [rows[n] for n in names if n in rows]
        if present:
            out += ["", f"### {title}", "", _HEADER, *(_row(r) for r in present)]
    return "\n".join(out) + "\n"


BEGIN = "<!-- tables: benchmarks/families.py --markdown docs/families.md -->"
END = "<!-- end of the tables -->"


def splice(page: str, report: dict[str, Any]) -> str:
    """``page`` with the tables between :data:`BEGIN` and :data:`END` replaced by those of
    ``report``; the tables alone, between the markers, when ``page`` has none."""
    tables = f"{BEGIN}\n\n{markdown(report)}\n{END}"
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        return tables + "\n"
    return page[:start] + tables + page[end + len(END) :]
