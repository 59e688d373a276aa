"""`lmckit align` then `lmckit barrier` on Hugging Face GPT-2 folders gives the library's
result: the same form (``PREFERRED_FORMS``), the same unseen-token masks, the same start,
the same path, point for point, for permutations, orthogonal maps and learned matching.

The library side is written out step by step, as ``benchmarks/reference_comparison.py``
does it: the folders converted to lmckit's GPT-2, :func:`lmckit.forms.aligned_form`,
the aligner with ``row_masks`` of the tokens never seen, the path measured in that form.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from lmckit.aligners import (
    LearnedMatchingConfig,
    WeightMatchingConfig,
    learned_matching,
    weight_matching,
)
from lmckit.cli import main
from lmckit.data import load_data
from lmckit.data._token_stats import seen_token_masks
from lmckit.forms._choice import FORMS, PREFERRED_FORMS
from lmckit.forms._recipe import aligned_form
from lmckit.hf import load_hf, zoo_from_hf
from lmckit.measure._measure import EvalSettings, measure_path
from lmckit.symmetry._transform import apply
from lmckit.workflow._pair import recorded_metadata

WORDS = "the quick brown fox jumps over a lazy dog and a cat sat on the mat".split()
UNSEEN = 61 - len(set(WORDS))  # the tiny folders' vocabulary less the words of the text


def _invoke(*args: object):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_hf_folder):
    """Two tiny GPT-2 folders and a text whose word tokenizer fills their 61 ids, of
    which only the text's 14 words occur: 47 rows to mask."""
    root = tmp_path_factory.mktemp("best")
    a = make_hf_folder("gpt2", root / "a", seed=0)
    b = make_hf_folder("gpt2", root / "b", seed=1)
    gen = torch.Generator().manual_seed(0)
    text = root / "text.txt"
    picks = torch.randint(0, len(WORDS), (3000,), generator=gen).tolist()
    text.write_text(" ".join(WORDS[i] for i in picks))
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(WORDS))
    vocab = ["[UNK]", *words, *(f"unused{i}" for i in range(60 - len(words)))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    spec = f"text:{text},tokenizer={root / 'tokenizer.json'},block=8"
    return a, b, spec


def _library(a: Path, b: Path, spec: str, method: str, symmetry: str, name: str) -> list[float]:
    """The library's aligned-and-measured path in the form ``name``, step by step (module
    docstring)."""
    circuits, path_circuits, rms = FORMS[name].circuits, FORMS[name].path_circuits, FORMS[name].rms
    data = load_data(spec)
    if path_circuits or rms or symmetry == "orthogonal":  # forms of lmckit's own GPT-2
        (module, pa), (_, pb) = zoo_from_hf(a), zoo_from_hf(b)
    else:
        la, lb = load_hf(a), load_hf(b)
        module, pa, pb = la.module, la.params, lb.params
    form = aligned_form(module, pa, pb, symmetry=symmetry, circuits=circuits, rms=rms)
    masks = {k: m for k, m in seen_token_masks(data).items() if k in form.a}
    assert masks and all(int((~m).sum()) == UNSEEN for m in masks.values())
    if method == "weight":
        result = weight_matching(form.spec, form.a, form.b, WeightMatchingConfig(start="best"),
                                 model=form.module, data=data, row_masks=masks)  # fmt: skip
    else:
        config = LearnedMatchingConfig(steps=30, batch_size=8)  # one validation, at step 25
        result = learned_matching(form.spec, form.a, form.b, config, model=form.module,
                                  data=data, row_masks=masks)  # fmt: skip
    aligned = apply(form.spec, form.b, result.transform)
    module, pa = form.module, form.a
    if path_circuits and not circuits:  # aligned as projections, interpolated as circuits
        on_path = aligned_form(module, pa, aligned, circuits=True)
        module, pa, aligned = on_path.module, on_path.a, on_path.b
    path = measure_path(module, pa, aligned, data, EvalSettings(points=5))
    return path.loss


@pytest.mark.parametrize(
    "method, symmetry",
    [("weight", "permutation"), ("weight", "orthogonal"), ("learned", "orthogonal")],
)
def test_command_line_barrier_equals_the_library_call(pair, tmp_path, method, symmetry) -> None:
    a, b, spec = pair
    out = tmp_path / "out"
    extra = ["--steps", 30, "--batch-size", 8] if method == "learned" else []
    cmd = ["align", a, b, "--method", method, "--symmetry", symmetry, "--data", spec,
           "--out", out, "--quiet", *extra]  # fmt: skip
    aligned = _invoke(*cmd)
    # weight matching with data chooses among the forms by midpoint training loss (and
    # says so); learned matching takes the first preferred form
    # a Hugging Face folder in is a folder out (B in its class), the form recorded
    meta = recorded_metadata(out)
    assert meta["stored_form"] == "class" and (out / "lmckit.json").is_file()
    name = meta["form_choice"]["name"]
    label = FORMS[name].label
    assert any(line.startswith(f"form: {label} (") for line in aligned.output.splitlines())
    if method == "weight":
        losses = meta["form_midpoint_losses"]
        # circuits and heads aligned as projections, interpolated as circuits; for
        # permutations also the RMSNorm form's stream
        assert len(losses) == (3 if symmetry == "permutation" else 2)
        assert name == min(losses, key=losses.get)
    else:
        assert name == PREFERRED_FORMS[(method, symmetry)][0]
    assert f"masked {UNSEEN} token rows" in aligned.output
    # measured against the original folder A: the recorded form puts A in it
    _invoke("barrier", a, out, "--data", spec, "--points", 5, "--json", tmp_path / "p.json",
            "--quiet")  # fmt: skip
    cli = json.loads((tmp_path / "p.json").read_text())["loss"]
    lib = _library(a, b, spec, method, symmetry, name)
    assert cli == pytest.approx(lib, abs=1e-5)
    assert max(lib) - min(lib) > 1e-3  # a path that is not flat: the comparison means something


def test_merge_reads_the_recorded_form(pair, tmp_path) -> None:
    """`lmckit merge A X` on what `align` wrote interpolates in the recorded form: the merged
    model is the path's midpoint that `barrier` measures."""
    a, b, spec = pair
    out, merged = tmp_path / "out", tmp_path / "merged"
    _invoke("align", a, b, "--symmetry", "orthogonal", "--data", spec, "--out", out, "--quiet")
    _invoke("barrier", a, out, "--data", spec, "--points", 3, "--json", tmp_path / "p.json",
            "--quiet")  # fmt: skip
    midpoint = json.loads((tmp_path / "p.json").read_text())["loss"][1]
    result = _invoke("merge", a, out, "--data", spec, "--out", merged)
    assert "form (as `lmckit align` recorded)" in result.output
    # a point between two circuit forms: no GPT-2 holds it, said in one line
    assert "wrote an lmckit checkpoint instead" in result.output
    meta = json.loads((merged / "config.json").read_text())["metadata"]
    assert meta["form_choice"] == recorded_metadata(out)["form_choice"]
    assert meta["test_loss"] == pytest.approx(midpoint, abs=1e-6)
