"""Barrier formulas on hand-made values, JSON round trips, and paths through real modules."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmckit.measure._evaluate import (
    Batching,
    Metrics,
    PathResult,
    evaluate,
    evaluate_path,
    linear_grid,
)
from lmckit.models import create_model
from lmckit.symmetry._average import interpolate
from lmckit.symmetry._params import IncompatibleModelsError


def test_loss_barrier_of_a_bump() -> None:
    path = PathResult([0.0, 0.5, 1.0], [1.0, 3.0, 1.0], [0.9, 0.5, 0.9])
    assert path.barrier_loss == pytest.approx(2.0)
    assert path.barrier_acc == pytest.approx(0.4)
    assert path.midpoint_loss == 3.0
    assert path.midpoint_acc == 0.5


def test_barriers_measure_from_the_chord_between_unequal_ends() -> None:
    # chord at t: loss 1 + 2t, acc 0.9 - 0.4t
    t = [0.0, 0.25, 0.5, 0.75, 1.0]
    loss = [1.0, 2.0, 2.5, 2.5, 3.0]  # minus chord: 0, 0.5, 0.5, 0, 0
    acc = [0.9, 0.6, 0.7, 0.3, 0.5]  # chord minus acc: 0, 0.2, 0, 0.3, 0
    path = PathResult(t, loss, acc)
    assert path.barrier_loss == pytest.approx(0.5)
    assert path.barrier_acc == pytest.approx(0.3)


def test_convex_path_has_zero_barrier_not_negative() -> None:
    # the ends are on the chord, so the max is never below 0
    path = PathResult([0.0, 0.5, 1.0], [1.0, 0.2, 1.0], [0.5, 0.9, 0.5])
    assert path.barrier_loss == 0.0
    assert path.barrier_acc == 0.0


def test_midpoint_is_t_half_and_only_when_measured() -> None:
    path = PathResult([0.0, 0.25, 0.5, 1.0], [0.0, 1.0, 2.0, 3.0], [1.0, 0.8, 0.6, 0.4])
    assert path.midpoint_loss == 2.0 and path.midpoint_acc == 0.6
    # the nearest point (0.4) is not the midpoint: nothing is reported for it
    off = PathResult([0.0, 0.4, 0.7, 1.0], [0.0, 1.0, 2.0, 3.0], [1.0, 0.8, 0.6, 0.4])
    assert not off.has_midpoint
    with pytest.raises(ValueError, match="no point at t = 0.5"):
        _ = off.midpoint_loss
    assert off.to_dict()["midpoint_loss"] is None and off.to_dict()["midpoint_acc"] is None


def test_json_round_trip(tmp_path) -> None:
    path = PathResult(
        linear_grid(5), [1.0, 1.5, 2.0, 1.2, 0.9], [0.9, 0.8, 0.7, 0.85, 0.95], {"method": "x"}
    )
    data = json.loads(path.to_json())
    # chords 1 - 0.1 t and 0.9 + 0.05 t: the worst points are both at t = 0.5
    assert data["barrier_loss"] == pytest.approx(1.05)
    assert data["barrier_acc"] == pytest.approx(0.225)
    assert (data["midpoint_loss"], data["midpoint_acc"]) == (2.0, 0.7)
    back = PathResult.from_dict(data)
    assert back == path
    file = tmp_path / "path.json"
    file.write_text(path.to_json())
    assert PathResult.load(file) == path


def test_path_result_errors() -> None:
    with pytest.raises(ValueError, match="both ends"):
        PathResult([0.0, 0.5], [1.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="both ends"):
        PathResult([0.1, 1.0], [1.0, 2.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="same length"):
        PathResult([0.0, 0.5, 1.0], [1.0, 2.0], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="same length"):
        PathResult([0.0], [1.0], [0.5])
    with pytest.raises(ValueError, match="missing 'acc'"):
        PathResult.from_dict({"t": [0.0, 1.0], "loss": [1.0, 1.0]})
    with pytest.raises(ValueError, match="malformed"):
        PathResult.from_dict({"t": None, "loss": [1.0, 1.0], "acc": [1.0, 1.0]})
    with pytest.raises(ValueError, match="at least 2"):
        linear_grid(1)


def test_linear_grid() -> None:
    assert linear_grid(3) == [0.0, 0.5, 1.0]
    grid = linear_grid(11)
    assert len(grid) == 11 and grid[0] == 0.0 and grid[-1] == 1.0
    assert grid[3] == pytest.approx(0.3)


def test_interpolate_hits_the_endpoints_exactly() -> None:
    _, a = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=2, norm="batch")
    _, b = create_model("mlp", seed=1, in_features=4, hidden=[6], out_features=2, norm="batch")
    b["norms.0.num_batches_tracked"] = torch.tensor(9)
    for k in a:
        assert torch.equal(interpolate(a, b, 0.0)[k], a[k])
    for k in a:
        if a[k].is_floating_point():
            assert torch.equal(interpolate(a, b, 1.0)[k], b[k])
    mid = interpolate(a, b, 0.25)
    torch.testing.assert_close(
        mid["head.weight"], 0.75 * a["head.weight"] + 0.25 * b["head.weight"]
    )
    # integer buffers come from the first model
    assert int(mid["norms.0.num_batches_tracked"]) == 0
    assert mid["norms.0.num_batches_tracked"] is not a["norms.0.num_batches_tracked"]


def test_evaluate_matches_direct_cross_entropy() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, generator=gen)
    y = torch.randint(0, 3, (30,), generator=gen)
    logits = module(x).detach()
    m = evaluate(module, params, [(x[:13], y[:13]), (x[13:], y[13:])])
    assert m.loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert m.acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    with pytest.raises(ValueError, match="no data"):
        evaluate(module, params, [])


def test_evaluate_restores_training_mode() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    module.train()
    evaluate(module, params, [(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))])
    assert module.training


def test_evaluate_path_of_identical_endpoints_is_flat() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(20, 4, generator=gen), torch.randint(0, 3, (20,), generator=gen))]
    path = evaluate_path(module, params, params, lambda: data, points=5, meta={"k": 1})
    assert path.t == linear_grid(5)
    assert path.barrier_loss == pytest.approx(0.0, abs=1e-7)
    assert path.barrier_acc == pytest.approx(0.0, abs=1e-9)
    assert path.meta == {"k": 1}
    m = evaluate(module, params, data)
    assert path.loss[0] == pytest.approx(m.loss) and path.acc[-1] == pytest.approx(m.acc)


def test_evaluate_path_endpoints_are_the_models(mlp_pair) -> None:
    from lmckit.data import batches

    x, y = mlp_pair.data.x_test, mlp_pair.data.y_test
    path = evaluate_path(
        mlp_pair.model, mlp_pair.a, mlp_pair.b, lambda: batches(x, y, 100), ts=[0.0, 0.5, 1.0]
    )
    end_a = evaluate(mlp_pair.model, mlp_pair.a, batches(x, y, 100))
    end_b = evaluate(mlp_pair.model, mlp_pair.b, batches(x, y, 100))
    assert Metrics(path.loss[0], path.acc[0]) == end_a
    assert Metrics(path.loss[-1], path.acc[-1]) == end_b


def test_evaluate_path_prepare_and_errors() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    data = [(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))]
    seen: list[float] = []

    def prepare(theta, t):
        seen.append(t)
        return theta

    evaluate_path(module, params, params, lambda: data, ts=[0.0, 0.3, 1.0], prepare=prepare)
    assert seen == [0.0, 0.3, 1.0]
    for bad in ([0.0, 0.5], [0.2, 1.0], [0.0, 0.6, 0.4, 1.0]):
        with pytest.raises(ValueError, match="increase from 0 to 1"):
            evaluate_path(module, params, params, lambda: data, ts=bad)
    _, other = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=3)
    with pytest.raises(IncompatibleModelsError):
        evaluate_path(module, params, other, lambda: data)
    broken = dict(params)
    broken["head.bias"] = torch.full((3,), float("inf"))
    with pytest.raises(FloatingPointError, match="not finite"):
        evaluate_path(module, params, broken, lambda: data, ts=[0.0, 1.0])


def test_language_model_logits_are_flattened() -> None:
    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 5)

        def forward(self, x):
            return self.emb(x)  # (batch, time, vocab)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lm = TinyLM()
    params = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    x = torch.tensor([[0, 1, 2], [3, 4, 0]])
    y = torch.tensor([[1, 2, 3], [4, 0, 1]])
    m = evaluate(lm, params, [(x, y)])
    expected = F.cross_entropy(params["emb.weight"][x].reshape(-1, 5), y.reshape(-1))
    assert m.loss == pytest.approx(float(expected), rel=1e-5)


# --------------------------------------------------------------------------- batched


def _zoo_pair(name: str, **kw):
    model, a = create_model(name, seed=0, **kw)
    _, b = create_model(name, seed=1, **kw)
    return model, a, b


def _hf_gpt2_pair():
    transformers = pytest.importorskip("transformers")
    from transformers.utils import logging as hf_logging

    from lmckit.symmetry._params import module_params

    config = transformers.GPT2Config(
        vocab_size=40, n_positions=8, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.GPT2LMHeadModel(config)
            a = module_params(model)
            torch.manual_seed(1)
            b = module_params(transformers.GPT2LMHeadModel(config))
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, a, b


def _images(channels: int, size: int, classes: int = 10):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(45, channels, size, size, generator=gen)
    y = torch.randint(0, classes, (45,), generator=gen)
    return [(x[:20], y[:20]), (x[20:40], y[20:40]), (x[40:], y[40:])]


def _tokens(vocab: int, context: int):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (7, context), generator=gen)
    y = torch.randint(0, vocab, (7, context), generator=gen)
    return [(x[:4], y[:4]), (x[4:], y[4:])]


# (model, params a, params b, batches): one case per family the zoo and transformers give
BATCHED_CASES = {
    "mlp": lambda: (
        *_zoo_pair("mlp", in_features=64, hidden=[16, 16], out_features=10),
        _images(1, 8),
    ),
    "mlp-batchnorm": lambda: (
        *_zoo_pair("mlp", in_features=64, hidden=[16, 16], out_features=10, norm="batch"),
        _images(1, 8),
    ),
    "resnet20": lambda: (
        *_zoo_pair("resnet20", in_channels=1, num_classes=10, width_mult=1),
        _images(1, 8),
    ),
    "vit": lambda: (
        *_zoo_pair(
            "vit",
            image_size=8,
            patch_size=4,
            in_channels=1,
            num_classes=10,
            width=16,
            depth=2,
            heads=2,
        ),
        _images(1, 8),
    ),
    "gpt2": lambda: (
        *_zoo_pair("gpt2", vocab_size=40, n_layer=2, n_head=2, n_embd=16, context=8),
        _tokens(40, 8),
    ),
    "hf-gpt2": lambda: (*_hf_gpt2_pair(), _tokens(40, 8)),
}


@pytest.mark.parametrize("case", list(BATCHED_CASES))
def test_batched_path_equals_the_point_loop(case: str, caplog) -> None:
    model, a, b, data = BATCHED_CASES[case]()
    loop = evaluate_path(model, a, b, lambda: data, points=5, batching=Batching(mode="loop"))
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        batched = evaluate_path(
            model, a, b, lambda: data, points=5, batching=Batching(mode="batched")
        )
    assert "evaluated 5 points batched, 5 per call" in caplog.text  # no silent fallback
    assert batched.loss == pytest.approx(loop.loss, rel=1e-5, abs=1e-5)
    assert batched.acc == pytest.approx(loop.acc, abs=1e-5)
    assert len(set(loop.loss)) > 1  # the points differ: each was run with its own weights


def test_batched_in_chunks_and_under_a_memory_budget(caplog) -> None:
    model, a, b, data = BATCHED_CASES["resnet20"]()
    loop = evaluate_path(model, a, b, lambda: data, points=5, batching=Batching(mode="loop"))
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        chunks = evaluate_path(
            model, a, b, lambda: data, points=5, batching=Batching("batched", points_per_call=2)
        )
    assert "5 points batched, 2 per call" in caplog.text
    assert chunks.loss == pytest.approx(loop.loss, rel=1e-5, abs=1e-5)
    caplog.clear()
    # room for the stacked parameters and two points' activations, not five
    params = sum(v.numel() * v.element_size() for v in a.values())
    budget = 2 * 5 * params + 2 * 4 * 20 * 16 * 8 * 8 * 4
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        fitted = evaluate_path(
            model, a, b, lambda: data, points=5, batching=Batching("batched", memory_bytes=budget)
        )
    assert "5 points batched, 2 per call" in caplog.text
    assert fitted.loss == pytest.approx(loop.loss, rel=1e-5, abs=1e-5)
    with caplog.at_level(logging.INFO, logger="lmckit.measure._batched"):
        tiny = evaluate_path(
            model, a, b, lambda: data, points=5, batching=Batching("batched", memory_bytes=1000)
        )
    assert "point by point" in caplog.text and "do not fit" in caplog.text
    assert tiny.loss == loop.loss


class _ItemBranch(nn.Module):
    """Data-dependent control flow on activations (``.item()``): vmap cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        return h if h.sum().item() > -1e9 else -h


class _CountingBuffer(nn.Module):
    """Adds each batch's mean activation to a buffer in place: vmap cannot batch it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("seen", torch.zeros(()), persistent=False)

    def forward(self, x):
        h = self.fc(x)
        self.seen.add_(h.mean())
        return h


@pytest.mark.parametrize("cls", [_ItemBranch, _CountingBuffer])
def test_modules_vmap_cannot_run_fall_back_to_the_loop(cls, caplog) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, other = cls(), cls()
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = {k: v.detach().clone() for k, v in other.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(10, 4, generator=gen), torch.randint(0, 3, (10,), generator=gen))]
    loop = evaluate_path(model, a, b, lambda: data, points=4, batching=Batching(mode="loop"))
    with caplog.at_level(logging.WARNING, logger="lmckit.measure._batched"):
        batched = evaluate_path(
            model, a, b, lambda: data, points=4, batching=Batching(mode="batched")
        )
    assert "evaluating point by point: vmap cannot run the module" in caplog.text
    assert batched.loss == pytest.approx(loop.loss, rel=1e-6)


def test_batched_with_a_batchnorm_reset_at_each_point(caplog) -> None:
    from lmckit.merging._merge import reset_prepare

    model, a, b, data = BATCHED_CASES["resnet20"]()
    inputs = lambda: [x for x, _ in data]  # noqa: E731
    seen: list[float] = []

    def prepare(theta, t):
        seen.append(t)
        return reset_prepare(model, inputs)(theta, t)

    loop = evaluate_path(
        model, a, b, lambda: data, points=3, prepare=prepare, batching=Batching(mode="loop")
    )
    assert seen == [0.0, 0.5, 1.0]
    seen.clear()
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        batched = evaluate_path(
            model, a, b, lambda: data, points=3, prepare=prepare, batching=Batching("batched")
        )
    assert "evaluated 3 points batched" in caplog.text
    assert seen == [0.0, 0.5, 1.0]  # each point prepared once, in order
    assert batched.loss == pytest.approx(loop.loss, rel=1e-5, abs=1e-5)


def test_mixed_precision_runs_the_forward_in_bfloat16(caplog) -> None:
    class Recording(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)
            self.dtypes: set[torch.dtype] = set()

        def forward(self, x):
            h = self.fc(x.flatten(1))
            self.dtypes.add(h.dtype)
            return h

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, other = Recording(), Recording()
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = {k: v.detach().clone() for k, v in other.state_dict().items()}
    data = _images(1, 8)
    full = evaluate_path(model, a, b, lambda: data, points=3, batching=Batching("batched"))
    assert model.dtypes == {torch.float32}
    model.dtypes.clear()
    with caplog.at_level(logging.WARNING, logger="lmckit.measure._batched"):
        half = evaluate_path(
            model, a, b, lambda: data, points=3, batching=Batching("batched", precision="bfloat16")
        )
    # CPU autocast skips vmap's batched products: the points run one by one, in bfloat16
    assert "autocast does not reach" in caplog.text
    assert model.dtypes == {torch.bfloat16}
    # bfloat16 keeps ~3 significant digits: close to the float32 figures, not equal
    assert half.loss == pytest.approx(full.loss, rel=2e-2)
    assert half.loss != full.loss


def test_batched_non_finite_point_and_settings_errors(caplog) -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[6], out_features=3)
    data = [(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))]
    broken = dict(params)
    broken["head.bias"] = torch.full((3,), float("inf"))  # 0 * inf: NaN already at t = 0
    with caplog.at_level(logging.WARNING, logger="lmckit.measure._batched"):
        with pytest.raises(FloatingPointError, match="not finite at t=0.0"):
            evaluate_path(
                module, params, broken, lambda: data, points=3, batching=Batching("batched")
            )
    assert not caplog.text  # NaN both ways is no reason to fall back
    with pytest.raises(ValueError, match="no data"):
        evaluate_path(module, params, params, lambda: [], batching=Batching("batched"))
    with pytest.raises(ValueError, match="mode must be"):
        Batching(mode="vmap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="points_per_call"):
        Batching(points_per_call=0)
    with pytest.raises(ValueError, match="precision"):
        Batching(precision="int8")  # type: ignore[arg-type]


def test_auto_runs_point_by_point_on_the_cpu(caplog) -> None:
    model, a, b, data = BATCHED_CASES["mlp"]()
    with caplog.at_level(logging.DEBUG, logger="lmckit.measure._batched"):
        auto = evaluate_path(model, a, b, lambda: data, points=3)
    assert "batched" not in caplog.text
    loop = evaluate_path(model, a, b, lambda: data, points=3, batching=Batching(mode="loop"))
    assert auto.loss == loop.loss  # the same computation, to the bit
