"""Params: compatibility and finiteness checks, weighted averages as pure functions."""

from __future__ import annotations

import pytest
import torch

from lmckit.symmetry._average import interpolate, weighted_average
from lmckit.symmetry._params import (
    Float32View,
    IncompatibleModelsError,
    check_compatible,
    check_finite,
)


def _params(width: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(width, 2, generator=gen),
        "b": torch.randn(width, generator=gen),
        "steps": torch.tensor(seed),
    }


def test_check_compatible_names_the_first_mismatch() -> None:
    check_compatible(_params(), _params(seed=1))
    with pytest.raises(IncompatibleModelsError, match=r"'w' has shape \(3, 2\) .* \(4, 2\)"):
        check_compatible(_params(3), _params(4))
    extra = {**_params(), "z": torch.zeros(1)}
    with pytest.raises(IncompatibleModelsError, match="'z' is in the first model only"):
        check_compatible(extra, _params())
    with pytest.raises(IncompatibleModelsError, match="'z' is in the second model only"):
        check_compatible(_params(), extra)
    assert issubclass(IncompatibleModelsError, ValueError)


def test_check_finite() -> None:
    check_finite(_params())
    for bad in (float("nan"), float("inf"), -float("inf")):
        p = _params()
        p["b"] = p["b"].clone()
        p["b"][1] = bad
        with pytest.raises(ValueError, match="model A: 'b' contains NaN or infinite"):
            check_finite(p, what="model A")


def test_weighted_average_is_the_weighted_sum() -> None:
    models = [_params(seed=s) for s in range(3)]
    weights = [0.2, 0.3, 0.5]
    out = weighted_average(models, weights)
    expected = sum(w * m["w"] for w, m in zip(weights, models, strict=True))
    torch.testing.assert_close(out["w"], expected)
    # integer tensors come from the first model, as copies
    assert int(out["steps"]) == 0 and out["steps"] is not models[0]["steps"]


def test_bfloat16_averages_are_rounded_once() -> None:
    a, b = (
        {k: v.to(torch.bfloat16) for k, v in _params(seed=s).items() if v.is_floating_point()}
        for s in (0, 1)
    )
    out = weighted_average([a, b], [0.3, 0.7])
    for name in a:
        exact = 0.3 * a[name].double() + 0.7 * b[name].double()
        assert out[name].dtype == torch.bfloat16
        # summed in float32 and rounded once: the float64 sum rounded to bfloat16
        assert torch.equal(out[name], exact.to(torch.bfloat16))


def test_float32_view_reads_without_copying_the_source() -> None:
    source = {"w": torch.randn(4, 3).to(torch.bfloat16), "x": torch.randn(2), "n": torch.tensor(3)}
    view = Float32View(source)
    assert list(view) == ["w", "x"] and len(view) == 2 and "n" not in view
    assert view["w"].dtype == torch.float32 and torch.equal(view["w"], source["w"].float())
    assert view["x"].data_ptr() == source["x"].data_ptr()  # float32 already: no copy
    view["w"] = torch.zeros(4, 3)
    view["extra"] = torch.ones(1)
    assert torch.equal(view["w"], torch.zeros(4, 3)) and list(view) == ["w", "x", "extra"]
    assert source["w"].dtype == torch.bfloat16 and bool(source["w"].ne(0).any())
    del view["x"]
    assert "x" not in view and "x" in source
    with pytest.raises(KeyError):
        view["missing"]


def test_weighted_average_is_pure() -> None:
    a, b = _params(seed=0), _params(seed=1)
    copies = [{k: v.clone() for k, v in m.items()} for m in (a, b)]
    out = interpolate(a, b, 0.3)
    for m, c in zip((a, b), copies, strict=True):
        for k in m:
            assert torch.equal(m[k], c[k])
    out["w"].add_(1.0)  # the result owns its tensors
    assert torch.equal(a["w"], copies[0]["w"])


def test_interpolate_is_affine_in_t() -> None:
    a, b = _params(seed=0), _params(seed=1)
    for t in (0.0, 0.25, 1.0, 1.5, -0.5):
        torch.testing.assert_close(interpolate(a, b, t)["b"], (1 - t) * a["b"] + t * b["b"])


def test_weighted_average_errors() -> None:
    with pytest.raises(ValueError, match="one weight per model"):
        weighted_average([_params()], [0.5, 0.5])
    with pytest.raises(ValueError, match="one weight per model"):
        weighted_average([], [])
    with pytest.raises(IncompatibleModelsError, match="'w'"):
        weighted_average([_params(3), _params(4)], [0.5, 0.5])


def test_public_names_are_lazy_and_complete() -> None:
    import subprocess
    import sys

    import lmckit

    assert lmckit.__all__ == sorted(set(lmckit.__all__))
    assert all(getattr(lmckit, name) is not None for name in lmckit.__all__)
    code = "import sys, lmckit, lmckit.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # the command line starts without PyTorch


def test_a_point_of_bfloat16_models_is_built_in_the_dtype_asked() -> None:
    gen = torch.Generator().manual_seed(0)
    a = {"w": torch.randn(5, 3, generator=gen).bfloat16(), "n": torch.tensor(3)}
    b = {"w": torch.randn(5, 3, generator=gen).bfloat16(), "n": torch.tensor(3)}
    point = interpolate(a, b, 0.3, dtype=torch.float32)
    assert point["w"].dtype == torch.float32 and point["n"].dtype == torch.int64
    # exactly the point of float32 copies: nothing rounded to bfloat16 on the way
    wide = interpolate({"w": a["w"].float()}, {"w": b["w"].float()}, 0.3)
    assert torch.equal(point["w"], wide["w"])
    assert interpolate(a, b, 0.3)["w"].dtype == torch.bfloat16  # default: as stored


def test_a_large_rounded_average_is_summed_in_blocks_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lmckit.symmetry._average as params

    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(301, 70, generator=gen).to(torch.bfloat16) for _ in range(3))
    weights = [0.3, 0.5, 0.2]
    monkeypatch.setattr(params, "WIDE_CHUNK_BYTES", 2**40)
    whole = params.weighted_average([{"w": a}, {"w": b}, {"w": c}], weights)["w"]
    monkeypatch.setattr(params, "WIDE_CHUNK_BYTES", 1000)  # a few rows at a time
    blocks = params.weighted_average([{"w": a}, {"w": b}, {"w": c}], weights)["w"]
    assert blocks.dtype == torch.bfloat16 and torch.equal(blocks, whole)
