"""The library against hostile input: the cases that are not about the command line.

Each table case calls one public function with bad input and asserts the exception
type and message, and that the inputs it was handed are unchanged. The tests after
the table cover what a table cannot: leftovers of killed writers, file permissions,
and a real Ctrl-C sent to a running ``lmckit`` process.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import lmckit
from lmckit.data import load_data, load_digits
from lmckit.data._fit import DataMismatchError, check_data_fits
from lmckit.data._mnist import read_idx
from lmckit.formats._bounded import FileLimitError, read_bytes
from lmckit.formats._checkpoint import CheckpointError
from lmckit.inference import SpecCheckError
from lmckit.measure._evaluate import PathResult
from lmckit.measure._measure import EvalSettings, eval_batch_size, resolve_fix
from lmckit.models import create_model
from lmckit.models._sizing import ModelOptions, check_fits_in_memory, sized_config
from lmckit.outputs._atomic import remove_stale
from lmckit.paths._simplex import SimplexResult, simplex_grid
from lmckit.symmetry._transform import Transform
from lmckit.training._train import TrainConfig

MLP, PARAMS = create_model("mlp", seed=0, in_features=64, hidden=[6], out_features=10)
SPEC = MLP.symmetry_spec()
RMS_GPT, RMS_PARAMS = create_model(
    "gpt2", seed=0, vocab_size=7, n_layer=1, n_head=2, n_embd=4, context=4, norm="rms"
)
DIGITS = load_digits(seed=0)


class _DropsOut(torch.nn.Module):
    """Dropout that stays on in eval mode (the functional form with training=True)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.dropout(torch.relu(self.a(x)), 0.5, training=True)
        return self.b(h)


def _result_on(grid: list[tuple[float, ...]]) -> SimplexResult:
    return SimplexResult(grid, [float(i) for i in range(len(grid))], [0.5] * len(grid))


def _wrong_width() -> None:
    narrow, _ = create_model("mlp", in_features=64, hidden=[3], out_features=10)
    t = lmckit.random_transform(narrow.symmetry_spec(), 0)
    lmckit.apply(SPEC, PARAMS, Transform(SPEC, dict(t.elements)))


def _not_orthogonal() -> None:
    spec = RMS_GPT.symmetry_spec()
    lmckit.apply(spec, RMS_PARAMS, Transform(spec, {"residual": torch.full((4, 4), 0.5)}))


TABLE: list[tuple[str, Callable[[], object], type[BaseException], str]] = [
    ("apply-wrong-width", _wrong_width, ValueError, "permutes 3 units, the space has 6"),
    ("apply-not-a-permutation",
     lambda: lmckit.apply(SPEC, PARAMS, Transform(SPEC, {"hidden.0": torch.zeros(6).long()})),
     ValueError, "not a permutation"),
    ("apply-not-orthogonal", _not_orthogonal, ValueError, "orthogonal"),
    ("trainconfig-epochs", lambda: TrainConfig(epochs=0), ValueError, "epochs must be >= 1"),
    ("trainconfig-batch", lambda: TrainConfig(batch_size=-2), ValueError, "batch_size must be"),
    ("trainconfig-lr-nan", lambda: TrainConfig(lr=float("nan")), ValueError, "lr must be"),
    ("trainconfig-wd", lambda: TrainConfig(weight_decay=-1), ValueError, "weight_decay must be"),
    ("trainconfig-clip-nan", lambda: TrainConfig(grad_clip=float("nan")), ValueError,
     "grad_clip must be"),
    ("model-options-width", lambda: ModelOptions(width=0), ValueError,
     "width must be a positive integer"),
    ("model-options-dropout", lambda: ModelOptions(dropout=1.0), ValueError, "dropout"),
    ("zoo-mlp-float-width",
     lambda: create_model("mlp", in_features=4, hidden=[2.5], out_features=2), ValueError,
     "hidden[0] must be a positive integer"),
    ("zoo-vgg-zero-classes",
     lambda: create_model("vgg", in_channels=1, num_classes=0, image_size=8), ValueError,
     "num_classes must be a positive integer"),
    ("sized-config-vit-on-features",
     lambda: sized_config("vit", input_shape=(32,), num_classes=3, tokens=False), ValueError,
     "vit needs square images"),
    ("memory-budget",
     lambda: check_fits_in_memory(sized_config("mlp", input_shape=(64,), num_classes=10,
                                               tokens=False), limit_bytes=1000),
     ValueError, "more than the 0.0 GiB available"),
    ("simplex-grid-huge", lambda: simplex_grid(3, 10**9), ValueError, "grid points"),
    ("eval-settings-2-points", lambda: EvalSettings(points=2), ValueError, "with 2 the barrier"),
    ("eval-batch-size-0", lambda: eval_batch_size(DIGITS, 0), ValueError, ">= 1"),
    ("fix-reset-bn-without-bn", lambda: resolve_fix(MLP, "reset_bn"), ValueError, "BatchNorm"),
    ("align-orthogonal-mlp", lambda: lmckit.align(MLP, MLP, symmetry="orthogonal"), ValueError,
     "allow permutations only"),
    ("align-circuits-mlp", lambda: lmckit.align(MLP, MLP, circuits=True), ValueError,
     "no attention heads"),
    ("data-fit-token-model-on-images", lambda: check_data_fits(RMS_GPT, DIGITS),
     DataMismatchError, "reads token ids"),
    ("data-spec-unknown-text-option",
     lambda: load_data("text:nowhere.txt,tokenizer=tok,stride=2"), ValueError,
     "unknown text option 'stride'"),
    ("read-dev-zero", lambda: read_bytes("/dev/zero", max_bytes=10), FileLimitError,
     "is a device"),
    # second pass
    ("config-quoted-list",
     lambda: create_model("mlp", in_features=4, hidden="32", out_features=2), ValueError,
     "hidden must be a list of positive integers, got '32' (a string: write a list"),
    ("config-quoted-number",
     lambda: create_model("mlp", in_features="64", hidden=[3], out_features=2), ValueError,
     "in_features must be a positive integer, got '64' (a string: write the number"),
    ("sized-config-mlp-dropout",
     lambda: sized_config("mlp", input_shape=(4,), num_classes=2, tokens=False,
                          options=ModelOptions(dropout=0.1)), ValueError,
     "dropout is for gpt2 only; mlp has no dropout"),
    ("interpolate-nan", lambda: lmckit.interpolate(PARAMS, PARAMS, float("nan")), ValueError,
     "t must be a finite real number, got nan"),
    ("eval-settings-even-points", lambda: EvalSettings(points=4), ValueError,
     "points must be odd, so that t = 0.5 is a point of the path"),
    ("simplex-grid-resolution-1", lambda: simplex_grid(3, 1), ValueError,
     "resolution must be >= 2"),
    ("simplex-centroid-off-grid", lambda: _result_on(simplex_grid(3, 2)).centroid_loss,
     ValueError, "the centroid of 3 models is not a point of this grid"),
    ("path-midpoint-off-grid",
     lambda: PathResult([0.0, 1 / 3, 2 / 3, 1.0], [1.0] * 4, [0.5] * 4).midpoint_loss,
     ValueError, "this path has no point at t = 0.5"),
    ("infer-spec-active-dropout", lambda: lmckit.infer_spec(_DropsOut(), torch.randn(4, 4)),
     SpecCheckError, "_DropsOut's outputs are not deterministic"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "error", "fragment"), TABLE, ids=[t[0] for t in TABLE])
def test_library_case(name: str, call, error: type[BaseException], fragment: str) -> None:
    frozen = {k: v.clone() for k, v in {**PARAMS, **RMS_PARAMS}.items()}
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    for k, v in {**PARAMS, **RMS_PARAMS}.items():
        assert torch.equal(v, frozen[k]), f"{name} modified {k}"


def test_gzip_expansion_stops_at_the_limit(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "bomb.gz"
    header = bytes([0, 0, 0x08, 1]) + (8 << 20).to_bytes(4, "big")
    path.write_bytes(gzip.compress(header + bytes(8 << 20), compresslevel=1))
    with pytest.raises(ValueError, match="more than the 1,000,000 allowed"):
        read_idx(path, max_bytes=1_000_000)
    assert read_idx(path).shape == (8 << 20,)  # within the default limit: read whole


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FileLimitError, match="is a FIFO"):
        read_bytes(fifo, max_bytes=10)


def test_float_checkpoints_compute_in_float32_and_int_weights_are_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    lmckit.save(tmp_path / "a", MLP, PARAMS)
    save_file({k: v.half() for k, v in PARAMS.items()}, str(tmp_path / "a" / "model.safetensors"))
    loaded = lmckit.load(tmp_path / "a")
    for k, v in loaded.params.items():
        assert v.dtype == torch.float32
        assert torch.equal(v, PARAMS[k].half().float()), k
    assert lmckit.load(tmp_path / "a", dtype=None).params["head.weight"].dtype == torch.float16
    save_file({**PARAMS, "head.weight": PARAMS["head.weight"].long()},
              str(tmp_path / "a" / "model.safetensors"))  # fmt: skip
    with pytest.raises(CheckpointError, match="'head.weight' is stored as I64, not floating"):
        lmckit.load(tmp_path / "a")


def test_weights_get_the_config_permissions(tmp_path: Path) -> None:
    lmckit.save(tmp_path / "c", MLP, PARAMS)
    weights = (tmp_path / "c" / "model.safetensors").stat().st_mode & 0o777
    config = (tmp_path / "c" / "config.json").stat().st_mode & 0o777
    assert weights == config and weights & 0o044 == 0o044 ^ (0o044 & _umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_leftovers_of_dead_writers_are_cleaned_by_the_next_write(tmp_path: Path) -> None:
    dead, alive = _dead_pid(), os.getpid()
    stale_tmp = tmp_path / f".c.{dead}.0123456789ab.tmp"
    stale_old = tmp_path / f".c.{dead}.0123456789ab.old"
    live_tmp = tmp_path / f".c.{alive}.ba9876543210.tmp"
    other = tmp_path / f".d.{dead}.0123456789ab.tmp"  # another output's leftover
    for folder in (stale_tmp, stale_old, live_tmp, other):
        folder.mkdir()
        (folder / "x").write_text("half")
    lmckit.save(tmp_path / "c", MLP, PARAMS)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["c", live_tmp.name, other.name])


def test_a_swap_killed_between_renames_gets_the_old_version_back(tmp_path: Path) -> None:
    dead = _dead_pid()
    old = tmp_path / f".c.{dead}.0123456789ab.old"
    lmckit.save(old, MLP, PARAMS)  # the previous checkpoint, moved aside, never moved back
    assert remove_stale(tmp_path / "c") == [old]
    assert torch.equal(lmckit.load(tmp_path / "c").params["head.weight"], PARAMS["head.weight"])


def test_ctrl_c_in_a_running_command_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "model"
    args = ["train", "--model", "mlp", "--data", "digits", "--width", "64", "--depth", "2",
            "--epochs", "100000", "--batch-size", "8", "--threads", "1", "--progress",
            "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmckit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    # a training step's loss on the progress bar: start-up is over and training runs
    deadline = time.monotonic() + 120
    seen = b""
    while b"loss=" not in seen and time.monotonic() < deadline:
        # wait for output at most until the deadline (a silent process must not hang us)
        if not select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(proc.stderr.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    text = (seen + err).decode(errors="replace")
    assert proc.returncode == 130, text
    assert "Traceback" not in text and text.rstrip().endswith("interrupted"), text
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_interrupt_swallowed_on_its_way_up_is_raised_again(monkeypatch) -> None:
    import lmckit.cli as cli

    monkeypatch.setattr(cli, "INTERRUPT_RETRY_S", 0.05)
    handler = cli._interrupt_handler()
    before = signal.getsignal(signal.SIGALRM)
    try:
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        # as if a __del__ had swallowed it: the run goes on, and is interrupted again
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_the_centroid_and_midpoint_are_the_points_themselves() -> None:
    grid = simplex_grid(3, 3)
    result = _result_on(grid)
    assert result.centroid_loss == grid.index((1 / 3, 1 / 3, 1 / 3))
    assert result.to_dict()["centroid_loss"] == result.centroid_loss
    assert _result_on(simplex_grid(3, 2)).to_dict()["centroid_loss"] is None
    path = PathResult([0.0, 0.25, 0.5, 0.75, 1.0], [0.0, 1.0, 2.0, 3.0, 4.0], [0.5] * 5)
    assert path.midpoint_loss == 2.0


class _ArgmaxOfHidden(torch.nn.Module):
    """The index of the largest unit of a hidden layer feeds the output."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(4, 6), torch.nn.Linear(6, 5),
                                  torch.nn.Linear(5, 3))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = torch.relu(self.b(torch.relu(self.a(x))))
        return self.c(g) + g.argmax(-1, keepdim=True).float()


def test_argmax_over_a_hidden_axis_leaves_that_axis_out() -> None:
    torch.manual_seed(0)
    model = _ArgmaxOfHidden()
    analysis = lmckit.analyze_symmetries(model, torch.randn(8, 4))
    assert analysis.spec.names == ("a",)  # b's units are read by position; a's are free
    assert any("returns a position" in line for line in analysis.left_out)


def test_overflow_on_load_names_the_parameter(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    lmckit.save(tmp_path / "a", MLP, PARAMS)
    big = {k: v.double() for k, v in PARAMS.items()}
    big["head.bias"][0] = 1e300
    save_file(big, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="parameter 'head.bias' overflows torch.float32"):
        lmckit.load(tmp_path / "a")
    assert lmckit.load(tmp_path / "a", dtype=None).params["head.bias"][0] == 1e300


def _idx_file(path: Path, shape: tuple[int, ...], payload: bytes, *, gz: bool) -> None:
    import gzip
    import struct

    data = bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape)
    path.write_bytes(gzip.compress(data + payload) if gz else data + payload)


def test_mnist_raw_and_gz_side_by_side_read_a_consistent_pair(tmp_path: Path) -> None:
    from lmckit.data._mnist import load_mnist

    # the download (gzipped pair) and, beside it, a decompressed copy of other images
    n = 2010
    images, labels = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
    _idx_file(tmp_path / f"{images}.gz", (n, 28, 28), bytes([200]) * (n * 784), gz=True)
    _idx_file(tmp_path / f"{labels}.gz", (n,), bytes([7]) * n, gz=True)
    _idx_file(tmp_path / images, (n, 28, 28), bytes([10]) * (n * 784), gz=False)
    data = load_mnist(tmp_path, train_size=10)
    # images and labels both from the gzipped pair: the only complete one
    expected = (200 / 255 - 0.1307) / 0.3081
    assert torch.allclose(data.x_test, torch.full_like(data.x_test, expected))
    assert bool((data.y_test == 7).all())
    _idx_file(tmp_path / labels, (n,), bytes([3]) * n, gz=False)
    plain = load_mnist(tmp_path, train_size=10)  # both plain now: the plain pair
    assert bool((plain.y_test == 3).all()) and float(plain.x_test.max()) < 0
