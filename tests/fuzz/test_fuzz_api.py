"""Every function of ``lmckit.__all__`` against the natural mistakes of a new user.

One test per public function (and ``weight_matching``, the aligner the README starts
with): the mistake a user makes first (a checkpoint where its params belong, a tensor
where a tuple was expected, a seed or ``t`` out of range) gets a one-line error naming
what is expected, or, where the meaning is clear (a bare tensor as example inputs, a
dict of group elements as a transform, a list of batches), the right result. Each also
checks that its inputs were not modified. A last test checks that the table covers
every public function.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import lmckit
from lmckit.aligners import weight_matching
from lmckit.models import create_model

MLP, PARAMS = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
OTHER = create_model("mlp", seed=1, in_features=4, hidden=[6], out_features=3)[1]
SPEC = MLP.symmetry_spec()
X = torch.randn(5, 4)
Y = torch.randint(0, 3, (5,))
FROZEN = {k: v.clone() for k, v in {**PARAMS, **{f"o.{k}": v for k, v in OTHER.items()}}.items()}


@pytest.fixture(autouse=True)
def _inputs_unchanged():
    yield
    now = {**PARAMS, **{f"o.{k}": v for k, v in OTHER.items()}}
    for key, value in now.items():
        assert torch.equal(value, FROZEN[key]), f"{key} was modified"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> lmckit.LoadedModel:
    return lmckit.load(lmckit.save(tmp_path_factory.mktemp("api") / "a", MLP, PARAMS))


def _one_line(info: pytest.ExceptionInfo[BaseException], *fragments: str) -> None:
    text = str(info.value)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text


def test_weight_matching(ckpt) -> None:
    with pytest.raises(TypeError) as info:
        weight_matching(SPEC, ckpt, ckpt)
    _one_line(info, "params_a must be a dict of tensors", "got a LoadedModel: pass its .params")
    with pytest.raises(TypeError) as info:
        weight_matching(ckpt.module, PARAMS, OTHER)
    _one_line(info, "spec must be a SymmetrySpec", "got MLP")
    # the right call recovers a planted permutation
    planted = lmckit.random_transform(SPEC, 3)
    moved = lmckit.apply(SPEC, PARAMS, planted)
    back = lmckit.apply(SPEC, moved, weight_matching(SPEC, PARAMS, moved).transform)
    assert all(torch.allclose(back[k], PARAMS[k]) for k in PARAMS)


def test_align(ckpt, tmp_path: Path) -> None:
    from types import SimpleNamespace

    held = SimpleNamespace(module=ckpt.module)  # something that holds a model, not one
    with pytest.raises(TypeError) as info:
        lmckit.align(held, held)
    _one_line(info, "a must be an nn.Module, a path to a saved model", "pass its .module")
    with pytest.raises(TypeError) as info:
        lmckit.align(MLP, MLP, example_inputs=3)  # type: ignore[arg-type]
    _one_line(info, "example inputs must be a tensor")
    with pytest.raises(ValueError) as info:
        lmckit.align(MLP, MLP, method="weight_matching")
    _one_line(info, "unknown method 'weight_matching'; choose from weight, activation, learned")
    with pytest.raises(FileNotFoundError) as info:
        lmckit.align(tmp_path / "nowhere", MLP)
    _one_line(info, "nowhere does not exist")
    with pytest.raises(ValueError) as info:
        lmckit.align(MLP, MLP, symmetry="rotation")
    _one_line(info, "symmetry must be one of permutation, orthogonal or None")
    # the right call recovers a planted permutation, from a module or from its path
    moved, _ = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    moved.load_state_dict(lmckit.apply(SPEC, PARAMS, lmckit.random_transform(SPEC, 3)))
    for a in (MLP, ckpt.module, lmckit.save(tmp_path / "a", MLP, PARAMS)):
        back = lmckit.align(a, moved).params
        assert all(torch.allclose(back[k], PARAMS[k]) for k in PARAMS)


def test_apply(ckpt) -> None:
    perm = torch.tensor([2, 0, 1, 5, 4, 3])
    by_dict = lmckit.apply(SPEC, PARAMS, {"hidden.0": perm})
    by_transform = lmckit.apply(SPEC, PARAMS, lmckit.Transform(SPEC, {"hidden.0": perm}))
    assert all(torch.equal(by_dict[k], by_transform[k]) for k in PARAMS)
    assert torch.equal(by_dict["layers.0.weight"], PARAMS["layers.0.weight"][perm])
    with pytest.raises(TypeError) as info:
        lmckit.apply(SPEC, ckpt, {"hidden.0": perm})
    _one_line(info, "params must be a dict of tensors", "pass its .params")
    with pytest.raises(TypeError) as info:
        lmckit.apply(SPEC, PARAMS, weight_matching(SPEC, PARAMS, OTHER))
    _one_line(info, "transform must be a Transform or a dict", "pass its .transform")
    with pytest.raises(KeyError, match="unknown spaces"):
        lmckit.apply(SPEC, PARAMS, {"hidden.9": perm})


def test_random_transform() -> None:
    for seed, error, fragment in (
        (2**70, ValueError, "seed must be between 0 and 2**64 - 1, got 1180591620717411303424"),
        (-1, ValueError, "got -1"),
        (1.5, TypeError, "seed must be an integer, got 1.5"),
        (True, TypeError, "seed must be an integer"),
    ):
        with pytest.raises(error) as info:
            lmckit.random_transform(SPEC, seed)  # type: ignore[arg-type]
        _one_line(info, fragment)
    top = lmckit.random_transform(SPEC, 2**64 - 1)
    assert torch.equal(torch.sort(top["hidden.0"]).values, torch.arange(6))
    with pytest.raises(TypeError) as info:
        lmckit.random_transform(MLP, 0)  # type: ignore[arg-type]
    _one_line(info, "spec must be a SymmetrySpec")


def test_interpolate(ckpt) -> None:
    for t in (float("nan"), float("inf")):
        with pytest.raises(ValueError) as info:
            lmckit.interpolate(PARAMS, OTHER, t)
        _one_line(info, "t must be a finite real number")
    with pytest.raises(TypeError) as info:
        lmckit.interpolate(PARAMS, OTHER, "0.5")  # type: ignore[arg-type]
    _one_line(info, "t must be a finite real number, got '0.5'")
    with pytest.raises(TypeError) as info:
        lmckit.interpolate(ckpt, OTHER, 0.5)
    _one_line(info, "got a LoadedModel: pass its .params")
    mid = lmckit.interpolate(PARAMS, OTHER, 0.25)
    assert torch.allclose(mid["head.bias"], 0.75 * PARAMS["head.bias"] + 0.25 * OTHER["head.bias"])


def test_weighted_average() -> None:
    with pytest.raises(ValueError) as info:
        lmckit.weighted_average([PARAMS, OTHER], [float("inf"), 0.0])
    _one_line(info, "each weight must be a finite real number, got inf")
    with pytest.raises(ValueError, match="one weight per model"):
        lmckit.weighted_average([PARAMS, OTHER], [1.0])


def test_check_compatible(ckpt) -> None:
    with pytest.raises(TypeError) as info:
        lmckit.check_compatible(ckpt, OTHER)
    _one_line(info, "the first model's params must be a dict of tensors", "pass its .params")
    narrow = create_model("mlp", in_features=4, hidden=[5], out_features=3)[1]
    with pytest.raises(lmckit.symmetry.IncompatibleModelsError, match="has shape"):
        lmckit.check_compatible(PARAMS, narrow)


def test_module_params(ckpt) -> None:
    with pytest.raises(TypeError) as info:
        lmckit.module_params(ckpt)
    _one_line(info, "module must be an nn.Module, got a LoadedModel: pass its .module")
    assert lmckit.module_params(MLP).keys() == PARAMS.keys()


def test_evaluate(ckpt) -> None:
    with pytest.raises(TypeError) as info:
        lmckit.evaluate(MLP, PARAMS, (X, Y))
    _one_line(info, "got one pair of tensors: pass [(x, y)]")
    with pytest.raises(TypeError) as info:
        lmckit.evaluate(MLP, ckpt, [(X, Y)])
    _one_line(info, "pass its .params")
    logits = torch.func.functional_call(MLP, PARAMS, (X,))
    loss = torch.nn.functional.cross_entropy(logits, Y)
    assert lmckit.evaluate(MLP, PARAMS, [(X, Y)]).loss == pytest.approx(float(loss), rel=1e-5)


def test_evaluate_path(ckpt) -> None:
    by_list = lmckit.evaluate_path(MLP, PARAMS, OTHER, [(X, Y)], points=3)
    by_callable = lmckit.evaluate_path(MLP, PARAMS, OTHER, lambda: [(X, Y)], points=3)
    assert by_list.loss == by_callable.loss
    mid = lmckit.evaluate(MLP, lmckit.interpolate(PARAMS, OTHER, 0.5), [(X, Y)])
    assert by_list.midpoint_loss == pytest.approx(mid.loss, rel=1e-5)
    with pytest.raises(TypeError) as info:
        lmckit.evaluate_path(MLP, PARAMS, OTHER, iter([(X, Y)]))
    _one_line(info, "which each point would use up")
    with pytest.raises(TypeError) as info:
        lmckit.evaluate_path(ckpt, PARAMS, OTHER, [(X, Y)])
    _one_line(info, "model must be an nn.Module, got a LoadedModel: pass its .module")
    even = lmckit.evaluate_path(MLP, PARAMS, OTHER, [(X, Y)], points=4)
    assert not even.has_midpoint and even.to_dict()["midpoint_loss"] is None


def _uses(spec: lmckit.SymmetrySpec) -> list[list[tuple[str, int]]]:
    return sorted(sorted((u.param, u.axis) for u in s.uses) for s in spec)


def test_infer_spec() -> None:
    assert _uses(lmckit.infer_spec(MLP, X)) == _uses(SPEC)  # a bare tensor
    assert _uses(lmckit.infer_spec(MLP, [X])) == _uses(SPEC)
    assert _uses(lmckit.infer_spec(MLP, {"x": X})) == _uses(SPEC)  # keyword inputs
    for bad in ("x", 3, None):
        with pytest.raises(TypeError) as info:
            lmckit.infer_spec(MLP, bad)  # type: ignore[arg-type]
        _one_line(info, "example inputs must be a tensor (the one input), a tuple")
    with pytest.raises(TypeError) as info:
        lmckit.infer_spec(MLP, (X, X))
    _one_line(info, "do not fit MLP.forward(x): too many positional arguments")


def test_analyze_symmetries() -> None:
    assert _uses(lmckit.analyze_symmetries(MLP, X).spec) == _uses(SPEC)
    with pytest.raises(TypeError) as info:
        lmckit.analyze_symmetries(MLP, 1.0)  # type: ignore[arg-type]
    _one_line(info, "got a float")


def test_check_spec() -> None:
    assert lmckit.check_spec(MLP, SPEC, X)["all"] < 1e-9
    with pytest.raises(TypeError) as info:
        lmckit.check_spec(MLP, {"hidden.0": 6}, X)  # type: ignore[arg-type]
    _one_line(info, "spec must be a SymmetrySpec")


def test_aligned_form(ckpt) -> None:
    form = lmckit.aligned_form(MLP, PARAMS, OTHER, example_inputs=X)
    assert _uses(form.spec) == _uses(SPEC)
    with pytest.raises(TypeError) as info:
        lmckit.aligned_form(MLP, ckpt, ckpt)
    _one_line(info, "params_a must be a dict of tensors", "pass its .params")
    with pytest.raises(TypeError) as info:
        lmckit.aligned_form(MLP, PARAMS, OTHER, example_inputs="x")
    _one_line(info, "example inputs must be")


def test_save(tmp_path: Path, ckpt) -> None:
    with pytest.raises(TypeError) as info:
        lmckit.save(tmp_path / "c", MLP, ckpt)
    _one_line(info, "params must be a dict of tensors", "pass its .params")
    assert not (tmp_path / "c").exists()


def test_save_model(tmp_path: Path, ckpt) -> None:
    with pytest.raises(TypeError) as info:
        lmckit.save_model(tmp_path / "c", ckpt.module, PARAMS)  # type: ignore[arg-type]
    _one_line(info, "like must be the LoadedModel", "got MLP")


def test_load(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="os.PathLike"):
        lmckit.load(3)  # type: ignore[arg-type]
    with pytest.raises(lmckit.CheckpointError, match="does not exist"):
        lmckit.load(tmp_path / "nowhere")


def test_load_model(ckpt, tmp_path: Path) -> None:
    folder = lmckit.save(tmp_path / "a", MLP, PARAMS)
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype or None"):
        lmckit.load_model(folder, dtype=torch.int64)
    assert lmckit.load_model(folder, dtype=torch.float64).params["head.bias"].dtype == (
        torch.float64
    )


def test_load_hf_refuses_a_checkpoint(tmp_path: Path) -> None:
    from lmckit.hf import load_hf

    folder = lmckit.save(tmp_path / "a", MLP, PARAMS)
    with pytest.raises(lmckit.CheckpointError, match="is not a Hugging Face config"):
        load_hf(folder)


def test_classification_and_mse() -> None:
    with pytest.raises(TypeError, match="positional"):
        lmckit.classification(3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        lmckit.mse("a")  # type: ignore[call-arg]
    assert lmckit.classification().metric_name == "acc" and lmckit.mse().metric_name == "mae"


def test_transform() -> None:
    with pytest.raises(TypeError) as info:
        lmckit.Transform({}, {})  # type: ignore[arg-type]
    _one_line(info, "spec must be a SymmetrySpec")
    with pytest.raises(TypeError) as info:
        lmckit.Transform(SPEC, [torch.arange(6)])  # type: ignore[arg-type]
    _one_line(info, "elements must be a dict of group elements by space name")


FUNCTIONS = {name for name in lmckit.__all__ if inspect.isfunction(getattr(lmckit, name))}


def test_every_public_function_has_a_test() -> None:
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    covered = set()
    for name in FUNCTIONS:
        if name in tested or any(name in t.split("_and_") for t in tested):
            covered.add(name)
    assert FUNCTIONS - covered == set()
