"""The command line, end to end on digits with tiny settings: artifacts, numbers, bad input."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import lmckit
from lmckit.cli import main
from lmckit.data import batches, load_digits
from lmckit.formats._checkpoint import load_metadata
from lmckit.measure._evaluate import evaluate

TINY = ["--data", "digits", "--epochs", "2", "--lr", "0.01", "--batch-size", "64", "--quiet"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _ok(*args: str | Path) -> Result:
    result = _invoke(*args)
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    return result


def _train(out: Path, seed: int, *extra: str) -> Path:
    _ok("train", "--model", "mlp", "--width", "32", "--depth", "1", "--seed", seed, "--out", out,
        *TINY, *extra)  # fmt: skip
    return out


def _barrier(a: Path, b: Path, json_path: Path, *extra: str) -> dict:
    _ok("barrier", a, b, "--data", "digits", "--points", "5", "--json", json_path, "--quiet",
        *extra)  # fmt: skip
    return json.loads(json_path.read_text())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> Path:
    """Two plain MLP checkpoints ``a``, ``b`` and two BatchNorm ones ``bn_a``, ``bn_b``."""
    root = tmp_path_factory.mktemp("ckpts")
    _train(root / "a", 0)
    _train(root / "b", 1)
    _train(root / "bn_a", 0, "--norm", "batch")
    _train(root / "bn_b", 1, "--norm", "batch")
    return root


@pytest.fixture
def ckpt_copy(ckpts, tmp_path) -> Path:
    """A private copy of checkpoint ``a`` to break."""
    return Path(shutil.copytree(ckpts / "a", tmp_path / "copy"))


def test_train_writes_a_loadable_checkpoint(ckpts) -> None:
    ckpt = lmckit.load(ckpts / "a")
    assert ckpt.config.name == "mlp"
    assert ckpt.config.kwargs["hidden"] == [32]
    assert ckpt.params["layers.0.weight"].shape == (32, 64)
    meta = load_metadata(ckpts / "a")
    assert meta["seed"] == 0 and meta["data"] == "digits"
    data = load_digits(seed=0)
    m = evaluate(ckpt.module, ckpt.params, batches(data.x_test, data.y_test, 500))
    assert m.acc == pytest.approx(meta["test_acc"])
    assert m.acc > 0.8  # it learned something in two epochs


def test_train_is_reproducible(ckpts, tmp_path) -> None:
    again = lmckit.load(_train(tmp_path / "again", 0))
    first = lmckit.load(ckpts / "a")
    for k, v in first.params.items():
        assert (again.params[k] == v).all(), k


@pytest.mark.parametrize("method", ["weight", "activation"])
def test_align_lowers_the_barrier(ckpts, tmp_path, method: str) -> None:
    out = tmp_path / "b_aligned"
    result = _ok("align", ckpts / "a", ckpts / "b", "--method", method, "--data", "digits",
                 "--out", out, "--quiet")  # fmt: skip
    assert "objective" in result.output
    meta = load_metadata(out)
    assert meta["method"] == f"{method}_matching"
    naive = _barrier(ckpts / "a", ckpts / "b", tmp_path / "naive.json")
    aligned = _barrier(ckpts / "a", out, tmp_path / "aligned.json")
    assert aligned["barrier_loss"] < naive["barrier_loss"]
    # same model B, only reparametrised: the endpoint loss is unchanged
    assert aligned["loss"][-1] == pytest.approx(naive["loss"][-1], rel=1e-5)


@pytest.mark.parametrize("start", ["anchored", "identity"])
def test_align_start_is_weight_matchings(ckpts, tmp_path, start: str) -> None:
    from lmckit.aligners import WeightMatchingConfig, weight_matching

    out = tmp_path / "b_aligned"
    _ok("align", ckpts / "a", ckpts / "b", "--start", start, "--out", out, "--quiet")
    a, b = lmckit.load(ckpts / "a"), lmckit.load(ckpts / "b")
    spec = a.module.symmetry_spec()
    want = weight_matching(spec, a.params, b.params, WeightMatchingConfig(start=start))
    got = lmckit.load(out).params
    for k, v in want.apply(b.params).items():
        assert torch.equal(got[k], v), k
    # the output records the config as run and the result as the method reports it
    recorded = load_metadata(out)
    assert recorded["config"]["start"] == start
    assert recorded["sweeps"] == want.iterations and recorded["history"] == want.history
    assert recorded["spaces"].keys() == want.spaces.keys()


def test_align_start_best_keeps_the_start_chosen_on_training_data(ckpts, tmp_path) -> None:
    from lmckit.aligners import WeightMatchingConfig, weight_matching

    refused = _invoke("align", ckpts / "a", ckpts / "b", "--start", "best", "--out", tmp_path / "x")
    assert refused.exit_code == 1
    assert refused.output.strip() == (
        "Error: --start best compares the starts on training data: give --data"
    )
    assert not (tmp_path / "x").exists()
    out = tmp_path / "b_aligned"
    _ok("align", ckpts / "a", ckpts / "b", "--start", "best", "--data", "digits", "--out", out,
        "--quiet")  # fmt: skip
    a, b = lmckit.load(ckpts / "a"), lmckit.load(ckpts / "b")
    config = WeightMatchingConfig(start="best")
    want = weight_matching(
        a.module.symmetry_spec(),
        a.params,
        b.params,
        config,
        model=a.module,
        data=load_digits(seed=0),
    )
    for k, v in want.apply(b.params).items():
        assert torch.equal(lmckit.load(out).params[k], v), k
    recorded = load_metadata(out)["start"]
    assert recorded["chosen"] == want.start
    assert recorded["midpoint_losses"] == pytest.approx(want.midpoint_losses)


def test_progress_bars_only_when_stderr_is_a_terminal(ckpts, tmp_path, monkeypatch) -> None:
    import subprocess
    import sys

    from lmckit.cli._common import _no_bars_off_a_terminal

    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    cases = [(True, None, False), (True, True, True), (False, None, True), (False, False, False)]
    for tty, quiet, want in cases:
        monkeypatch.setattr(sys, "stderr", Stream(tty))
        assert _no_bars_off_a_terminal(None, None, quiet) is want  # type: ignore[arg-type]
    monkeypatch.undo()
    # a pipe gets the result and no carriage-return frames of a bar
    entry = "from lmckit.cli import main; main()"
    cmd = [sys.executable, "-c", entry, "align", str(ckpts / "a"), str(ckpts / "b"),
           "--out", str(tmp_path / "piped")]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "\r" not in run.stderr and "sweep" not in run.stderr, run.stderr
    assert run.stdout.splitlines()[-1] == f"wrote {tmp_path / 'piped'}"
    # --progress asks for them anyway (e.g. for a log followed with tail -f)
    run = subprocess.run([*cmd, "--progress", "--force"], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert "weight matching:" in run.stderr


def test_symmetries_reports_the_hidden_space_and_refuses_rotations(ckpts, tmp_path) -> None:
    out = _ok("symmetries", ckpts / "bn_a", "--json", tmp_path / "r.json").output
    report = json.loads((tmp_path / "r.json").read_text())
    # one hidden layer of 32 units: its permutation moves the two linear layers and the
    # BatchNorm around it; only the output bias and the BatchNorm step counter stay
    assert [(s["name"], s["group"], s["n"]) for s in report["spaces"]] == [
        ("hidden.0", "Permutation", 32)
    ]
    assert set(report["fixed"]) == {"head.bias", "norms.0.num_batches_tracked"}
    assert report["elements"] - report["moved_elements"] == 10 + 1
    assert out.startswith("mlp: 1 space under the architecture's own groups\n")
    refused = _invoke("symmetries", ckpts / "bn_a", "--symmetry", "orthogonal")
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines() == [
        "Error: MLP has no space that admits orthogonal maps (every space passes through ops "
        "that act unit by unit): its spaces hidden.0 allow permutations only"
    ]


def test_barrier_writes_json_and_png(ckpts, tmp_path) -> None:
    png = tmp_path / "path.png"
    data = _barrier(ckpts / "a", ckpts / "b", tmp_path / "path.json", "--plot", str(png))
    assert {"t", "loss", "acc", "barrier_loss", "barrier_acc"} <= set(data)
    assert data["t"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len(data["loss"]) == len(data["acc"]) == 5
    # every point against a direct evaluation of the interpolated weights (plain torch,
    # not lmckit's path code), and the barriers against those losses
    a, b = lmckit.load(ckpts / "a"), lmckit.load(ckpts / "b")
    digits = load_digits(seed=0)
    losses, accs = [], []
    for t in data["t"]:
        mixed = {k: (1 - t) * a.params[k] + t * b.params[k] for k in a.params}
        with torch.no_grad():
            logits = torch.func.functional_call(a.module.eval(), mixed, (digits.x_test,))
        losses.append(float(torch.nn.functional.cross_entropy(logits, digits.y_test)))
        accs.append(float((logits.argmax(1) == digits.y_test).double().mean()))
    assert data["loss"] == pytest.approx(losses, rel=1e-5)
    assert data["acc"] == pytest.approx(accs, abs=1e-9)
    ts = data["t"]
    assert data["barrier_loss"] == pytest.approx(
        max(v - ((1 - t) * losses[0] + t * losses[-1]) for t, v in zip(ts, losses, strict=True)),
        rel=1e-4,
    )
    assert data["barrier_acc"] == pytest.approx(
        max(((1 - t) * accs[0] + t * accs[-1]) - v for t, v in zip(ts, accs, strict=True)),
        abs=1e-9,
    )
    assert data["barrier_loss"] > 0.01  # two seeds, unaligned: a barrier the check can see
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_merge_with_repair_beats_plain_merge(ckpts, tmp_path) -> None:
    aligned = tmp_path / "b_aligned"
    _ok("align", ckpts / "a", ckpts / "b", "--out", aligned, "--quiet")
    common = [ckpts / "a", aligned, "--data", "digits"]
    _ok("merge", *common, "--out", tmp_path / "plain")
    _ok("merge", *common, "--repair", "--out", tmp_path / "repaired")
    plain = load_metadata(tmp_path / "plain")
    repaired = load_metadata(tmp_path / "repaired")
    assert repaired["repair"] and not plain["repair"]
    assert repaired["test_loss"] < plain["test_loss"]
    merged = lmckit.load(tmp_path / "plain")
    a, b = lmckit.load(ckpts / "a"), lmckit.load(aligned)
    w = merged.params["head.weight"]
    assert ((w - 0.5 * (a.params["head.weight"] + b.params["head.weight"])).abs() < 1e-6).all()


def test_merge_reset_bn(ckpts, tmp_path) -> None:
    common = [ckpts / "bn_a", ckpts / "bn_b", "--data", "digits", "--t", "0.5"]
    _ok("merge", *common, "--out", tmp_path / "plain")
    _ok("merge", *common, "--reset-bn", "--out", tmp_path / "reset")
    plain, reset = lmckit.load(tmp_path / "plain"), lmckit.load(tmp_path / "reset")
    # interpolated running statistics are replaced by ones measured on the data
    assert not (plain.params["norms.0.running_var"] == reset.params["norms.0.running_var"]).all()
    assert (
        load_metadata(tmp_path / "reset")["test_loss"]
        < load_metadata(tmp_path / "plain")["test_loss"]
    )


def test_merge_option_errors(ckpts, tmp_path) -> None:
    both = _invoke("merge", ckpts / "bn_a", ckpts / "bn_b", "--data", "digits", "--reset-bn",
                   "--repair", "--out", tmp_path / "m")  # fmt: skip
    assert both.exit_code != 0 and "choose one of --reset-bn and --repair" in both.output
    no_bn = _invoke("merge", ckpts / "a", ckpts / "b", "--data", "digits", "--reset-bn",
                    "--out", tmp_path / "m")  # fmt: skip
    assert no_bn.exit_code != 0 and "no BatchNorm" in no_bn.output
    bad_t = _invoke("merge", ckpts / "a", ckpts / "b", "--t", "1.5", "--out", tmp_path / "m")
    assert bad_t.exit_code != 0 and "[0, 1]" in bad_t.output
    assert not (tmp_path / "m").exists()


def test_demo_weight_matching_removes_most_of_the_barrier(tmp_path) -> None:
    json_path, png = tmp_path / "demo.json", tmp_path / "demo.png"
    result = _ok("demo", "--json", json_path, "--plot", png, "--quiet")
    assert "weight_matching" in result.output
    data = json.loads(json_path.read_text())
    assert set(data) == {"naive", "weight_matching", "activation_matching"}
    assert data["weight_matching"]["barrier_loss"] < data["naive"]["barrier_loss"] / 3
    assert png.read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------- bad input


def test_different_widths_name_the_first_mismatched_parameter(ckpts, tmp_path) -> None:
    narrow = tmp_path / "narrow"
    _ok("train", "--model", "mlp", "--width", "16", "--depth", "1", "--out", narrow,
        "--data", "digits", "--epochs", "1", "--quiet")  # fmt: skip
    align = _invoke("align", ckpts / "a", narrow, "--out", tmp_path / "x", "--quiet")
    barrier = _invoke("barrier", ckpts / "a", narrow, "--data", "digits", "--quiet")
    for result in (align, barrier):
        assert result.exit_code != 0
        assert "different architectures" in result.output
        assert "'layers.0.weight' has shape (32, 64)" in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_different_architectures_are_refused(ckpts, tmp_path) -> None:
    result = _invoke("align", ckpts / "a", ckpts / "bn_a", "--out", tmp_path / "x", "--quiet")
    assert result.exit_code != 0
    assert "different architectures" in result.output
    assert "'norms.0.weight' is in the second model only" in result.output


class _Payload:
    """Pickles to a call of ``os.system``: loading it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_executable_pickle_is_refused_and_not_run(ckpts, tmp_path) -> None:
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(ckpts / "a" / "config.json", evil / "config.json")
    marker = tmp_path / "payload-ran"
    with open(evil / "model.pt", "wb") as fh:
        pickle.dump({"layers.0.weight": _Payload(marker)}, fh)
    result = _invoke("barrier", ckpts / "a", evil, "--data", "digits", "--quiet")
    assert result.exit_code != 0
    assert "refusing to load" in result.output and "model.pt" in result.output
    assert not marker.exists()


def test_truncated_safetensors_is_a_clear_error(ckpt_copy, ckpts) -> None:
    weights = ckpt_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = _invoke("barrier", ckpts / "a", ckpt_copy, "--data", "digits", "--quiet")
    assert result.exit_code != 0
    assert "corrupt or truncated" in result.output and "model.safetensors" in result.output
    assert "Traceback" not in result.output


def test_interrupted_write_leaves_no_partial_output(ckpts, tmp_path, monkeypatch) -> None:
    import lmckit.formats._checkpoint

    def half_write(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(lmckit.formats._checkpoint, "save_file", half_write)
    out_root = tmp_path / "outputs"
    out_root.mkdir()
    result = _invoke("align", ckpts / "a", ckpts / "b", "--out", out_root / "b_al", "--quiet")
    assert result.exit_code == 1
    assert "could not write output" in result.output and "disk full" in result.output
    assert list(out_root.iterdir()) == []  # neither the output nor a temporary directory


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_reproduce_hands_device_to_the_experiment(tmp_path, monkeypatch, device: str) -> None:
    import lmckit.experiments as experiments
    from lmckit.experiments import ExperimentResult

    seen = {}

    def record(name, ctx):
        seen[name] = ctx.device
        return ExperimentResult(table="", rows=[])

    monkeypatch.setattr(experiments, "run_experiment", record)
    _ok("reproduce", "coherence", "--quick", "--device", device, "--out", tmp_path / "run",
        "--quiet")  # fmt: skip
    assert seen == {"coherence": device}


def test_reproduce_device_is_checked_before_any_work(tmp_path) -> None:
    result = _invoke("reproduce", "coherence", "--device", "gpu", "--out", tmp_path / "r")
    assert result.exit_code == 2 and "'gpu' is not one of 'auto', 'cpu', 'cuda'" in result.output
    if not torch.cuda.is_available():
        result = _invoke("reproduce", "coherence", "--device", "cuda", "--out", tmp_path / "r")
        assert result.exit_code == 1
        assert "Error: --device cuda: no CUDA device is available" in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lr", "0.1"], "--lr is an option of --method learned; --method weight does not use it"),
        (
            ["--method", "learned", "--data", "digits", "--start", "identity"],
            "--start is an option of --method weight; --method learned does not use it",
        ),
        (
            ["--method", "activation", "--data", "digits", "--max-sweeps", "3"],
            "--max-sweeps is an option of --method weight; --method activation does not use it",
        ),
    ],
)
def test_align_refuses_an_option_its_method_does_not_use(ckpts, tmp_path, args, message) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["align", str(ckpts / "a"), str(ckpts / "b"), *args,
                                       "--out", str(out)])  # fmt: skip
    assert result.exit_code == 1 and message in result.output, result.output
    assert not out.exists()
