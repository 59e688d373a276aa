"""``lmckit.align``: the README's example run as written, and the one call giving exactly
what the explicit steps give (zoo models, Hugging Face folders and modules), written
back in the input's format."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.tiny_models import TINY, auto_load
from torch import nn

import lmckit
from lmckit.aligners import weight_matching
from lmckit.data import Dataset
from lmckit.measure._evaluate import evaluate_path
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.training._train import TrainConfig, fit

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The first Python block of README's "Python" section, as written there."""
    section = README.read_text(encoding="utf-8").split("\n## Python\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "README's Python section has no python block"
    return match.group(1)


def _net() -> nn.Module:
    # a user's own module: not one of lmckit's models
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 10)
    )


@pytest.fixture(scope="module")
def trained_modules(digits: Dataset) -> tuple[nn.Module, nn.Module]:
    """Two of the user's own modules trained on digits from different seeds."""
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module = _net().eval()
        config = TrainConfig(epochs=6, batch_size=64, lr=3e-3)
        params = fit(module, lmckit.module_params(module), digits, config, seed=seed,
                       progress=False).params  # fmt: skip
        module.load_state_dict(params)
        out.append(module)
    return out[0], out[1]


def _tokens(vocab: int, n: int = 24, length: int = 9) -> Dataset:
    x = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))
    half = n // 2
    return Dataset("tokens", x[:half, :-1], x[:half, 1:], x[half:, :-1], x[half:, 1:],
                   num_classes=vocab)  # fmt: skip


def _run_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **names: Any) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)  # the example writes barrier.png where it runs
    namespace: dict[str, Any] = dict(names)
    exec(compile(readme_example(), str(README), "exec"), namespace)
    assert (tmp_path / "barrier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return namespace


def test_readme_example_on_two_modules(
    trained_modules: tuple[nn.Module, nn.Module],
    digits: Dataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = trained_modules
    before = {k: v.clone() for k, v in b.state_dict().items()}
    x = digits.x_test[:8]
    ns = _run_readme(tmp_path, monkeypatch, model_a=a, model_b=b, x=x, data=digits)
    aligned, path = ns["aligned"], ns["path"]
    # B moved, not changed: same function, and the caller's module untouched
    torch.testing.assert_close(aligned.module(x), b(x), rtol=0, atol=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in b.state_dict().items())
    # the aligned path is flatter than the path between the models as trained
    naive = evaluate_path(a, lmckit.module_params(a), lmckit.module_params(b),
                          [(digits.x_test, digits.y_test)])  # fmt: skip
    assert path.barrier_loss < 0.5 * naive.barrier_loss, (path.barrier_loss, naive.barrier_loss)
    assert path.loss[0] == pytest.approx(naive.loss[0], abs=1e-5)
    assert path.loss[-1] == pytest.approx(naive.loss[-1], abs=1e-5)


def test_readme_example_on_two_hugging_face_folders(
    hf_folder_pair: Callable[[str], tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder_a, folder_b = hf_folder_pair("llama")
    data = _tokens(61)
    ns = _run_readme(tmp_path, monkeypatch, model_a=str(folder_a), model_b=str(folder_b),
                     x=None, data=data)  # fmt: skip
    aligned, path = ns["aligned"], ns["path"]
    b = lmckit.load(folder_b).module
    ids = data.x_test[:2]
    with torch.no_grad():
        torch.testing.assert_close(aligned.module(ids).logits, b(ids).logits, rtol=0, atol=1e-4)
    # the path's ends are A and B as given
    a = lmckit.load_model(folder_a)
    end_a = lmckit.evaluate(a.module, a.params, [(data.x_test, data.y_test)])
    assert path.loss[0] == pytest.approx(end_a.loss, abs=1e-5)


# ------------------------------------------------------------------ one call = explicit steps


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


@pytest.mark.parametrize("name", sorted(TINY))
def test_one_call_equals_the_explicit_steps_on_zoo_models(name: str) -> None:
    ma, pa = create_model(name, seed=0, **TINY[name])
    mb, pb = create_model(name, seed=1, **TINY[name])
    aligned = lmckit.align(ma, mb)
    # transformers are aligned with their heads as QK/OV circuits by default (the form
    # measured best), said in the form's name; other models as they are
    circuits = name in ("gpt2", "vit")
    assert aligned.metadata["form_choice"]["name"] == ("circuits" if circuits else "projected")
    form = lmckit.aligned_form(ma, pa, pb, circuits=circuits)
    want = lmckit.apply(form.spec, form.b, weight_matching(form.spec, form.a, form.b).transform)
    _same(aligned.params, want)
    assert aligned.reference is not None and _same(aligned.reference, form.a) is None
    assert aligned.transform.spec == form.spec and aligned.form == form.form
    if circuits:
        return  # the circuit form is lmckit's own architecture, not B's class
    # the aligned module is B's class and computes B's function
    x = ma.example_inputs()
    assert type(aligned.module) is type(mb) and not aligned.module.training
    mb.eval()
    with torch.no_grad():
        torch.testing.assert_close(aligned.module(*x), mb(*x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("symmetry", [None, "orthogonal"])
def test_one_call_equals_the_explicit_steps_on_hugging_face_models(
    family: str, symmetry: str | None, hf_folder_pair: Callable[[str], tuple[Path, Path]]
) -> None:
    folder_a, folder_b = hf_folder_pair(family)
    a, b = lmckit.load_model(folder_a), lmckit.load_model(folder_b)
    # a GPT-2 folder is converted to lmckit's GPT-2 and aligned in the circuit form by
    # default; a Llama has no circuit form and is aligned as it is
    circuits = family == "gpt2"
    if circuits:
        from lmckit.hf import zoo_from_hf

        (module, pa), (_, pb) = zoo_from_hf(folder_a), zoo_from_hf(folder_b)
        form = lmckit.aligned_form(module, pa, pb, symmetry=symmetry, circuits=True)
    else:
        form = lmckit.aligned_form(a.module, a.params, b.params, symmetry=symmetry)
    want = lmckit.apply(form.spec, form.b, weight_matching(form.spec, form.a, form.b).transform)
    from_folders = lmckit.align(folder_a, folder_b, symmetry=symmetry)
    assert from_folders.metadata["form_choice"]["circuits"] is circuits
    _same(from_folders.params, want)
    _same(from_folders.reference, form.a)
    assert from_folders.form == form.form
    if family == "gpt2":
        # the same call with the projected form asked for, from the folders and from the
        # modules (a module in memory has no folder to convert: always projected)
        if symmetry == "orthogonal":
            return  # a LayerNorm stream takes rotations only in lmckit's RMSNorm form
        form = lmckit.aligned_form(a.module, a.params, b.params, symmetry=symmetry)
        want = lmckit.apply(form.spec, form.b, weight_matching(form.spec, form.a, form.b).transform)
        _same(lmckit.align(folder_a, folder_b, symmetry=symmetry, circuits=False).params, want)
    from_modules = lmckit.align(a.module, b.module, symmetry=symmetry)
    _same(from_modules.params, want)


# ------------------------------------------------------------------ written in the input's format


def test_save_writes_a_hugging_face_folder_that_transformers_loads(
    hf_folder_pair: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    folder_a, folder_b = hf_folder_pair("llama")
    aligned = lmckit.align(folder_a, folder_b, symmetry="orthogonal")
    out = aligned.save(tmp_path / "b-aligned")
    ids = _tokens(61).x_test[:2]
    with torch.no_grad():
        got = auto_load("llama", out)(ids).logits
        want = auto_load("llama", folder_b)(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # the norm scales were folded into both models: A in that form is the reference
    reference = lmckit.load_model(out / "reference")
    _same(reference.params, aligned.reference)
    record = __import__("json").loads((out / "lmckit.json").read_text())
    assert record["metadata"]["aligned_to"] == str(folder_a)
    assert record["metadata"]["method"] == "weight_matching"
    with pytest.raises(lmckit.outputs.OutputError, match="input"):  # type: ignore[attr-defined]
        aligned.save(folder_b / "inside")


def test_the_command_line_writes_what_the_one_call_saves(
    hf_folder_pair: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from lmckit.cli import main

    folder_a, folder_b = hf_folder_pair("llama")
    args = ["align", folder_a, folder_b, "--symmetry", "orthogonal", "--out", tmp_path / "cli"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    lmckit.align(folder_a, folder_b, symmetry="orthogonal").save(tmp_path / "call")
    for inside in ("", "reference"):
        cli = lmckit.load_model(tmp_path / "cli" / inside)
        call = lmckit.load_model(tmp_path / "call" / inside)
        _same(call.params, cli.params)


def test_save_and_merge_of_a_users_module(
    trained_modules: tuple[nn.Module, nn.Module], digits: Dataset, tmp_path: Path
) -> None:
    a, b = trained_modules
    aligned = lmckit.align(a, b, example_inputs=digits.x_test[:4])
    with pytest.raises(lmckit.outputs.OutputError, match="unknown file type"):  # type: ignore[attr-defined]
        aligned.save(tmp_path / "b-aligned")
    file = aligned.save(tmp_path / "b-aligned.safetensors")
    restored = _net()
    restored.load_state_dict(load_file(file))
    _same(lmckit.module_params(restored), aligned.params)
    merged = aligned.merge(0.25)
    _same(merged.params, interpolate(lmckit.module_params(a), aligned.params, 0.25))
    _same(lmckit.module_params(merged.module), merged.params)
    back = merged.save(tmp_path / "merged.safetensors")
    _same(load_file(back), merged.params)


def test_zoo_module_is_saved_as_a_checkpoint_and_merged_with_batchnorm_reset(
    bn_mlp_pair: Any, tmp_path: Path
) -> None:
    pair = bn_mlp_pair
    ma, mb = (create_model("mlp", **pair.model.config.kwargs)[0] for _ in range(2))
    ma.load_state_dict(pair.a)
    mb.load_state_dict(pair.b)
    aligned = lmckit.align(ma, mb)
    checkpoint = lmckit.load(aligned.save(tmp_path / "b-aligned"))
    _same(checkpoint.params, aligned.params)
    merged = aligned.merge(0.5, fix="reset_bn", data=pair.data)
    plain = aligned.merge(0.5)
    key = next(k for k in merged.params if k.endswith("running_var"))
    assert not torch.equal(merged.params[key], plain.params[key])
    path = aligned.barrier(pair.data, points=3)
    assert path.meta["fix"] == "reset_bn"


# ------------------------------------------------------------------ mistakes


def test_mistakes_are_named_before_any_work(
    trained_modules: tuple[nn.Module, nn.Module], digits: Dataset
) -> None:
    a, b = trained_modules
    with pytest.raises(ValueError, match="cannot make example inputs for a Sequential"):
        lmckit.align(a, b)
    with pytest.raises(ValueError, match="method='activation' needs training data: give data"):
        lmckit.align(a, b, method="activation", example_inputs=digits.x_test[:4])
    other, _ = create_model("mlp", in_features=64, hidden=[48, 48], out_features=10)
    with pytest.raises(lmckit.symmetry.IncompatibleModelsError, match="different architectures"):  # type: ignore[attr-defined]
        lmckit.align(a, other)
    aligned = lmckit.align(a, b, example_inputs=digits.x_test[:4])
    batches = [(digits.x_test, digits.y_test)]
    with pytest.raises(ValueError, match="split= is for datasets"):
        aligned.barrier(batches, split="train")
    with pytest.raises(ValueError, match="task= is for batches"):
        aligned.barrier(digits, task=lmckit.mse())
    # batches measure the same path as the dataset's test split
    from_batches = aligned.barrier(batches)
    from_dataset = aligned.barrier(digits, batch_size=len(digits.x_test))
    assert from_batches.loss == pytest.approx(from_dataset.loss, abs=1e-6)
