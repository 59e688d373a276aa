"""`lmckit align` recovers symmetries planted from each family's own math.

The planter (:mod:`tests.hf.oracle`) knows each family's weight layout, written by hand
from its ``modeling_*.py``, and nothing of lmckit's inferred spec: it permutes the
residual stream (or rotates it, with norm scales folded first), MLP units, experts,
key/value groups with their query heads, query heads within each group, and maps each
key/value head's value features and query/key features (a rotation per rotary plane,
any orthogonal map on pass-through dims or under absolute positions). A symmetry that
inference misses is then still planted, and its recovery fails: such cases are listed in
``tests/hf/known_misses.py`` with the reason, and expected to fail until inference finds it.

Each plant is first checked to keep the family's outputs (the oracle checks itself).
Then ``lmckit align A B --method weight`` must write A's weights back (distance after /
before < 1e-4) in a folder that ``from_pretrained`` loads and that computes B's outputs.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from click.testing import CliRunner
from tests.hf.known_misses import known
from tests.hf.oracle import LAYOUTS, Layout, fold, plant
from tests.tiny_models import ALL_FAMILIES, auto_load

from lmckit.cli import main


def _config(name: str) -> Any:
    family = ALL_FAMILIES[name]
    return getattr(transformers, family.config)(**family.kwargs)


#: rotated streams checked in the default run (one per kind of norm, fold and head);
#: the other families' rotations that lmckit recovers run with ``-m slow``
ROTATED_BY_DEFAULT = ("llama", "gemma", "mixtral", "phi", "falcon", "gpt2", "vit")


def _cases() -> list[Any]:
    """Every family with a layout; again with a rotated stream where its layout folds
    every norm on the stream (the stream then admits rotations)."""
    cases = []
    for name in sorted(LAYOUTS):
        cases.append(pytest.param(name, None, id=name, marks=known(name)))
        if LAYOUTS[name](_config(name)).rotates:
            key = f"{name}/orthogonal"
            marks = known(key)
            if not marks and name not in ROTATED_BY_DEFAULT:
                marks = [pytest.mark.slow]
            cases.append(pytest.param(name, "orthogonal", id=key, marks=marks))
    return cases


def family_inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Inputs of the family's main kind, from its config: 12 tokens (an encoder-decoder's
    decoder given 7), or images of the configured size."""
    config, gen = model.config, torch.Generator().manual_seed(0)
    kind = model.main_input_name
    if kind == "input_ids":
        vocab = config.get_text_config().vocab_size
        x = {"input_ids": torch.randint(0, vocab, (2, 12), generator=gen)}
        if getattr(config, "is_encoder_decoder", False):
            x["decoder_input_ids"] = torch.randint(0, vocab, (2, 7), generator=gen)
        return x
    if kind == "input_features":  # log-mel frames: twice the encoder's positions
        frames = 2 * config.max_source_positions
        mel = torch.randn(2, config.num_mel_bins, frames, generator=gen)
        ids = torch.randint(0, config.vocab_size, (2, 7), generator=gen)
        return {"input_features": mel, "decoder_input_ids": ids}
    if kind == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        shape = (2, vision.num_channels, vision.image_size, vision.image_size)
        return {"pixel_values": torch.randn(*shape, generator=gen)}
    raise AssertionError(f"no inputs for {kind}")


def _outputs(model: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**x)[0]


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp(min=1.0))


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a).sqrt())


def _folded(a: torch.nn.Module, layout: Layout, out: Path) -> torch.nn.Module:
    """``a`` with its norm scales folded into the layers reading them (by the layout, not
    by lmckit), its head untied (the head takes the final norm's scale), written to
    ``out``: the form in which a rotated stream is a symmetry."""
    config = copy.deepcopy(a.config)
    if getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
    folded = type(a)(config).eval()
    folded.load_state_dict(fold(a.state_dict(), layout))
    folded.save_pretrained(out)
    return folded


@pytest.mark.parametrize(("name", "symmetry"), _cases())
def test_align_recovers_an_element_planted_from_the_architecture(
    name: str, symmetry: str | None, hf_folder, tmp_path: Path
) -> None:
    a_path = hf_folder(name)
    a = auto_load(name, a_path)
    layout = LAYOUTS[name](a.config)
    x = family_inputs(a)
    rotate = symmetry == "orthogonal"
    if rotate:
        want = _outputs(a, x)
        a_path = tmp_path / "a"
        a = _folded(a, layout, a_path)
        assert _relative(_outputs(a, x), want) <= 1e-4  # folding keeps the function
    state = {k: v.clone() for k, v in a.state_dict().items()}
    moved = plant(state, layout, seed=7, rotate=rotate)
    b = copy.deepcopy(a)
    b.load_state_dict(moved)
    want = _outputs(b, x)
    assert _relative(want, _outputs(a, x)) <= 1e-4  # the plant keeps the function
    b.save_pretrained(tmp_path / "b")

    out = tmp_path / "out"
    extra = ["--symmetry", symmetry] if symmetry else []
    result = CliRunner().invoke(
        main,
        ["align", str(a_path), str(tmp_path / "b"), "--method", "weight", *extra,
         "--no-circuits", "--out", str(out), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    aligned = auto_load(name, out)
    # a form that moved A too (a LayerNorm's shift into its readers' biases) is written
    # beside as A's reference: B aligned is compared with A in that form
    reference = out / "reference"
    target = auto_load(name, reference).state_dict() if reference.is_dir() else state
    before = _distance(moved, state)
    after = _distance(aligned.state_dict(), target)
    assert before > 0.5 and after / before < 1e-4, (before, after / before)
    assert _relative(_outputs(aligned, x), want) < 1e-4


def _not_a_symmetry(name: str, layout: Layout) -> Layout:
    """``layout`` changed into a plausible layout that is wrong for the family."""
    atts = layout.attention
    if name == "gptj":  # half-split planes where GPT-J pairs dims 2i, 2i + 1
        atts = tuple(replace(a, qk=replace(a.qk, kind="half")) for a in atts)
    elif name == "qwen3":  # whole plane rotations under a per-head query/key norm
        atts = tuple(replace(a, qk=replace(a.qk, kind="half")) for a in atts)
    elif name == "bloom":  # ALiBi heads reordered
        atts = tuple(replace(a, heads_move=True) for a in atts)
    elif name == "llama":  # any orthogonal map of the query/key features under rotary
        atts = tuple(replace(a, qk=replace(a.qk, kind="full")) for a in atts)
    return replace(layout, attention=atts)


@pytest.mark.parametrize("name", ["gptj", "qwen3", "bloom", "llama", "llama/unfolded"])
def test_the_oracle_tells_a_symmetry_from_a_map_that_is_not_one(name: str, hf_folder) -> None:
    # the check every plant above passes first (outputs kept to 1e-4) fails for maps
    # that are not symmetries: the wrong rotary layout, rotations a query/key norm does
    # not commute with, heads that ALiBi pins, a rotated stream with its norms unfolded
    family, _, unfolded = name.partition("/")
    a = auto_load(family, hf_folder(family))
    layout = LAYOUTS[family](a.config)
    wrong = layout if unfolded else _not_a_symmetry(family, layout)
    b = copy.deepcopy(a)
    b.load_state_dict(plant(a.state_dict(), wrong, seed=7, rotate=bool(unfolded)))
    x = family_inputs(a)
    assert _relative(_outputs(b, x), _outputs(a, x)) > 1e-2
