"""Writers that respect every kind of file (issue 43: items 8 to 11, 14's ``--json -``, 15).

Each test is one case of the issue, run as the hostile test ran it (the command line or
the library), and checks the files around it byte for byte. A device is never written
to: FIFOs and sockets made in a temporary folder stand in for it, and the one test that
names ``/dev/null`` makes every rename onto it fail first, so that even a writer that
ignored the policy could not replace it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import load_file, save_file
from torch import nn

import lmckit
from lmckit.cli import main
from lmckit.data import load_data
from lmckit.data._source import check_data_spec, data_spec_paths
from lmckit.formats._checkpoint import CheckpointError
from lmckit.hf import HFError
from lmckit.measure._evaluate import PathResult
from lmckit.models import create_model
from lmckit.outputs import OutputError, check_output_file
from lmckit.outputs._atomic import atomic_dir, atomic_path, write_json
from lmckit.outputs._folders import RUN_MARKER
from lmckit.plan._aligned import Aligned

DIGITS = ["--data", "digits", "--points", "3", "--quiet"]


def _cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _refused(result: Result, fragment: str) -> None:
    """Exit 1, one ``Error:`` line naming the problem, no traceback."""
    text = result.output
    assert result.exit_code == 1, text
    assert "Traceback" not in text, text
    assert text.strip().splitlines()[-1].startswith("Error: "), text
    assert fragment in text, text


def _mlp(path: Path, seed: int, inputs: int = 64) -> Path:
    model, params = create_model("mlp", seed=seed, in_features=inputs, hidden=[8], out_features=10)
    return lmckit.save(path, model, params)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints ``a``, ``b`` (the pair), ``c`` (a model that is not an input)."""
    root = tmp_path_factory.mktemp("writers")
    for seed, name in enumerate("abc"):
        _mlp(root / name, seed)
    return root


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a socket's path is limited to about 100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="lmw", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def _special(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return "fifo" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "other"


# --------------------------------------------------------------- 8: only regular files replaced


def test_atomic_writes_never_replace_a_fifo_or_a_socket(short_dir: Path) -> None:
    os.mkfifo(short_dir / "fifo.json")
    sock = _socket(short_dir / "sock.json")
    try:
        for name, kind in (("fifo.json", "a FIFO"), ("sock.json", "a socket")):
            target = short_dir / name
            with pytest.raises(OutputError, match=f"it is {kind}, not a regular file"):
                write_json(target, {"x": 1})
            with pytest.raises(OutputError, match=f"it is {kind}, not a folder"):
                with atomic_dir(target) as tmp:
                    (tmp / "f").write_text("x")
        assert _special(short_dir / "fifo.json") == "fifo"
        assert _special(short_dir / "sock.json") == "socket"
        assert sorted(p.name for p in short_dir.iterdir()) == ["fifo.json", "sock.json"]
    finally:
        sock.close()


def test_a_fifo_made_during_the_write_is_not_replaced(tmp_path: Path) -> None:
    # the check is made again right before the rename, not only before the work
    target = tmp_path / "out.json"
    with pytest.raises(OutputError, match="it is a FIFO"):
        with atomic_path(target) as tmp:
            tmp.write_text("{}")
            os.mkfifo(target)
    assert _special(target) == "fifo"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_json_and_plot_onto_a_fifo_or_socket_are_refused_before_work(
    ckpts: Path, short_dir: Path
) -> None:
    os.mkfifo(short_dir / "r.json")
    sock = _socket(short_dir / "p.png")
    try:
        for option, name, kind in (("--json", "r.json", "a FIFO"), ("--plot", "p.png", "a socket")):
            result = _cli("barrier", ckpts / "a", ckpts / "b", *DIGITS, option, short_dir / name)
            _refused(result, f"it is {kind}, not a regular file")
            assert "linear" not in result.output  # refused before the path was measured
        assert _special(short_dir / "r.json") == "fifo"
        assert _special(short_dir / "p.png") == "socket"
    finally:
        sock.close()


def test_dev_null_is_refused_without_a_write(
    ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    null = Path("/dev/null")
    if not (null.exists() and stat.S_ISCHR(os.stat(null).st_mode)):
        pytest.skip("no /dev/null character device on this machine")
    real_replace, real_rename = os.replace, os.rename

    def never_onto_dev_null(real):
        def move(src, dst, *args, **kwargs):
            # a safety net: if the policy let a write through, fail instead of replacing it
            assert os.path.realpath(dst) != "/dev/null", "a writer renamed onto /dev/null"
            return real(src, dst, *args, **kwargs)

        return move

    monkeypatch.setattr(os, "replace", never_onto_dev_null(real_replace))
    monkeypatch.setattr(os, "rename", never_onto_dev_null(real_rename))
    monkeypatch.chdir(tmp_path)
    result = _cli("barrier", ckpts / "a", ckpts / "b", *DIGITS, "--json", null)
    _refused(result, "/dev/null: it is a character device, not a regular file")
    with pytest.raises(OutputError, match="character device"):
        check_output_file(null, force=True)
    with pytest.raises(OutputError, match="character device"):
        write_json(null, {"x": 1})
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- 9: '~' resolved once


def _idx(path: Path, shape: tuple[int, ...], payload: bytes) -> None:
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)
    path.write_bytes(header + payload)


@pytest.fixture
def home_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$HOME`` in a temporary folder, holding a small but valid MNIST at ``~/mnist``."""
    home = tmp_path / "home"
    mnist = home / "mnist"
    mnist.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 40), ("t10k", 20)):
        pixels = torch.randint(0, 256, (n * 784,), generator=g, dtype=torch.uint8)
        _idx(mnist / f"{split}-images-idx3-ubyte", (n, 28, 28), bytes(pixels.tolist()))
        _idx(mnist / f"{split}-labels-idx1-ubyte", (n,), bytes(i % 10 for i in range(n)))
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return mnist


def test_data_spec_paths_resolve_home_as_the_loaders_do(home_mnist: Path) -> None:
    home = home_mnist.parent
    assert data_spec_paths("mnist:~/mnist") == [str(home_mnist)]
    (home / "c.txt").write_text("the cat")
    (home / "tok").mkdir()
    spec = "text:~/c.txt,tokenizer=~/tok,block=4"
    assert data_spec_paths(spec) == [str(home / "c.txt"), str(home / "tok")]
    check_data_spec(spec)  # the files the guard names are the ones that exist
    assert load_data("mnist:~/mnist").x_train.shape[0] == 40


def test_train_out_onto_a_dataset_named_with_tilde_is_refused(home_mnist: Path) -> None:
    before = {p.name: p.read_bytes() for p in home_mnist.iterdir()}
    result = _cli("train", "--model", "mlp", "--width", "4", "--depth", "1", "--epochs", "1",
                  "--data", "mnist:~/mnist", "--out", home_mnist, "--force", "--quiet")  # fmt: skip
    _refused(result, "it is an input of this command")
    assert {p.name: p.read_bytes() for p in home_mnist.iterdir()} == before


def test_barrier_json_onto_a_data_file_named_with_tilde_is_refused(
    home_mnist: Path, tmp_path: Path
) -> None:
    a, b = _mlp(tmp_path / "a", 0, inputs=784), _mlp(tmp_path / "b", 1, inputs=784)
    labels = home_mnist / "t10k-labels-idx1-ubyte"
    before = labels.read_bytes()
    result = _cli("barrier", a, b, "--data", "mnist:~/mnist", "--points", "3", "--quiet",
                  "--json", labels)  # fmt: skip
    # the input guard refuses it (whatever --force says), before the existing-file rule
    _refused(result, f"lies inside the input {home_mnist}")
    assert labels.read_bytes() == before


# --------------------------------------------------------------- 10: one rule for existing files


def test_force_never_replaces_the_home_folder_or_its_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snap
) -> None:
    home = tmp_path / "users" / "me"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "main.tex").write_text("\\chapter{mine}")
    work = tmp_path / "elsewhere" / "work"  # the working directory is not under home
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    before = snap(tmp_path)
    for target in (home, home.parent):
        result = _cli("train", "--model", "mlp", "--width", "4", "--depth", "1", "--epochs",
                      "1", "--data", "digits", "--out", target, "--force", "--quiet")  # fmt: skip
        _refused(result, "it is the home folder")
        model, params = create_model("mlp", seed=0, in_features=64, hidden=[4], out_features=10)
        with pytest.raises(OutputError, match="home folder"):
            lmckit.save(target, model, params, overwrite=True)
    assert snap(tmp_path) == before


def _fake_demo(**_kwargs: object) -> dict[str, PathResult]:
    # the policy is checked before the demo trains: its results need not be real
    path = PathResult(t=[0.0, 0.5, 1.0], loss=[1.0, 2.0, 1.0], acc=[0.5, 0.4, 0.5])
    return {"naive": path, "weight_matching": path, "activation_matching": path}


def test_json_and_plot_never_go_into_a_model_folder(
    ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snap
) -> None:
    monkeypatch.setattr("lmckit.experiments._demo.run_demo", _fake_demo)
    monkeypatch.chdir(tmp_path)
    before = snap(ckpts)
    c = ckpts / "c"  # an lmckit checkpoint that is not an input of the command
    for args in (
        ["demo", "--json", c / "config.json", "--plot", tmp_path / "d.png"],
        ["demo", "--json", c / "config.json", "--force"],
        ["barrier", ckpts / "a", ckpts / "b", *DIGITS, "--json", c / "config.json", "--force"],
        ["barrier", ckpts / "a", ckpts / "b", *DIGITS, "--plot", c / "new.png"],
        ["symmetries", ckpts / "a", "--json", c / "report.json"],
    ):
        _refused(_cli(*args), f"{c} is a model folder")
    assert snap(ckpts) == before
    assert not (tmp_path / "d.png").exists()


def test_an_existing_file_is_replaced_only_if_lmckit_wrote_it_or_with_force(
    ckpts: Path, tmp_path: Path
) -> None:
    import matplotlib.pyplot as plt

    def barrier(*extra: str | Path) -> Result:
        return _cli("barrier", ckpts / "a", ckpts / "b", *DIGITS, *extra)

    ours, fig = tmp_path / "r.json", tmp_path / "r.png"
    _ok(barrier("--json", ours, "--plot", fig))
    ours.write_text(ours.read_text().replace('"meta"', '"meta" '))  # touched, still lmckit's
    _ok(barrier("--json", ours, "--plot", fig))  # a second run replaces its own outputs
    assert json.loads(ours.read_text())["barrier_loss"] >= 0
    # a user's JSON and a user's own matplotlib figure are not lmckit's
    notes, drawing = tmp_path / "notes.json", tmp_path / "drawing.png"
    notes.write_text('{"todo": "keep me"}')
    figure, ax = plt.subplots()
    ax.plot([0, 1])
    figure.savefig(drawing)
    plt.close(figure)
    kept = drawing.read_bytes()
    _refused(barrier("--json", notes), "it is a file lmckit did not write")
    _refused(barrier("--plot", drawing), "it is a file lmckit did not write")
    assert notes.read_text() == '{"todo": "keep me"}' and drawing.read_bytes() == kept
    # a link: the link itself is replaced with --force, never what it points to
    link = tmp_path / "link.json"
    link.symlink_to(notes)
    _refused(barrier("--json", link), "it is a symbolic link")
    _ok(barrier("--json", link, "--force"))
    assert not link.is_symlink() and notes.read_text() == '{"todo": "keep me"}'
    _ok(barrier("--json", notes, "--plot", drawing, "--force"))
    assert "barrier_loss" in json.loads(notes.read_text()) and drawing.read_bytes() != kept


def _experiment_folder(root: Path) -> tuple[Path, Path, Path]:
    """An lmckit experiment folder whose run folder is a link to a user's folder."""
    from lmckit.experiments._runner import config_hash

    out, victim = root / "runs" / "probe", root / "mine"
    out.mkdir(parents=True)
    (out / RUN_MARKER).write_text(json.dumps({"experiment": "probe"}))
    victim.mkdir()
    (victim / "config.json").write_text("my own config")
    (out / f"quick-{config_hash({'probe': 1})}").symlink_to(victim)
    return out, victim, victim / "config.json"


def test_reproduce_never_writes_through_a_link_in_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmckit.experiments import _registry as registry
    from lmckit.experiments._registry import ExperimentContext, ExperimentResult
    from lmckit.experiments._runner import Runner

    def probe(ctx: ExperimentContext) -> ExperimentResult:
        Runner(ctx, {"probe": 1}).stage("s", lambda: {"value": 1})
        return ExperimentResult("probe", [])

    monkeypatch.setattr(registry, "get_experiment", lambda name: probe)
    out, victim, config = _experiment_folder(tmp_path)
    for force in ([], ["--force"]):
        result = _cli("reproduce", "probe", "--quick", "--out", out, "--device", "cpu", *force)
        _refused(result, "is a symbolic link")
        assert config.read_text() == "my own config"
        assert sorted(p.name for p in victim.iterdir()) == ["config.json"]
    # the experiment folder itself a link: never written through either
    (tmp_path / "alias").symlink_to(victim)
    _refused(_cli("reproduce", "probe", "--quick", "--out", tmp_path / "alias", "--force"),
             "is a symbolic link")  # fmt: skip
    assert sorted(p.name for p in victim.iterdir()) == ["config.json"]


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)))


@pytest.fixture(scope="module")
def aligned_module() -> Aligned:
    """B aligned to A, two modules of the user's own, with A in the form written beside B
    (as a form that folds norm scales writes it: ``NAME.reference.safetensors``)."""
    import dataclasses

    torch.manual_seed(0)
    a, b = _Pair().eval(), _Pair().eval()
    aligned = lmckit.align(a, b, example_inputs=torch.randn(2, 4))
    # the file-name handling of save is the same whatever made A's form differ
    written = dataclasses.replace(aligned.written, reference=aligned.reference)
    return dataclasses.replace(aligned, written=written)


def test_aligned_save_checks_both_files_before_writing_either(
    aligned_module: Aligned, tmp_path: Path, snap
) -> None:
    path, ref = tmp_path / "x.safetensors", tmp_path / "x.reference.safetensors"
    # the reference name is a folder: refused before x.safetensors is written
    ref.mkdir()
    (ref / "mine.txt").write_text("keep")
    before = snap(tmp_path)
    with pytest.raises(OutputError, match="x.reference.safetensors: it is a folder"):
        aligned_module.save(path, overwrite=True)
    assert snap(tmp_path) == before
    shutil.rmtree(ref)
    # a user's files of those names: replaced only with overwrite=True
    for user in (path, ref):
        save_file({"w": torch.ones(2)}, str(user))
        before = snap(tmp_path)
        with pytest.raises(OutputError, match="it is a file lmckit did not write"):
            aligned_module.save(path)
        assert snap(tmp_path) == before
        user.unlink()
    aligned_module.save(path)
    aligned_module.save(path)  # lmckit's own files: replaced
    save_file({"w": torch.ones(2)}, str(ref))
    aligned_module.save(path, overwrite=True)
    assert sorted(load_file(ref)) == sorted(aligned_module.reference)


# --------------------------------------------------------------- 11: merge --force


def test_merge_force_is_the_force_used_at_write_time(ckpts: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    _refused(_cli("merge", ckpts / "a", ckpts / "b", "--out", user), "refusing to replace")
    assert (user / "notes.txt").read_text() == "mine"
    _ok(_cli("merge", ckpts / "a", ckpts / "b", "--out", user, "--force"))
    assert sorted(p.name for p in user.iterdir()) == ["config.json", "model.safetensors"]
    merged = lmckit.load(user).params
    a, b = lmckit.load(ckpts / "a").params, lmckit.load(ckpts / "b").params
    torch.testing.assert_close(merged["head.bias"], (a["head.bias"] + b["head.bias"]) / 2)


# --------------------------------------------------------------- 14: --json -


def test_json_dash_is_stdout_and_the_table_goes_to_stderr(
    ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lmckit.experiments._demo.run_demo", _fake_demo)
    monkeypatch.chdir(tmp_path)
    barrier = _ok(_cli("barrier", ckpts / "a", ckpts / "b", *DIGITS, "--json", "-"))
    assert json.loads(barrier.stdout)["t"] == [0.0, 0.5, 1.0]
    assert "linear" in barrier.stderr and "wrote" not in barrier.output
    report = _ok(_cli("symmetries", ckpts / "a", "--json", "-"))
    assert json.loads(report.stdout)["architecture"] == "mlp"
    assert "parameters some space moves" in report.stderr
    demo = _ok(_cli("demo", "--json", "-", "--plot", tmp_path / "d.png", "--quiet"))
    assert set(json.loads(demo.stdout)) == {"naive", "weight_matching", "activation_matching"}
    assert "wrote" in demo.stderr
    _refused(_cli("barrier", ckpts / "a", ckpts / "b", *DIGITS, "--plot", "-"),
             "--plot -: a figure is written to a file")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png"]  # no file named '-'


# --------------------------------------------------------------- 15: writers agree with readers


def test_save_refuses_integer_weights_load_would_refuse(ckpts: Path, tmp_path: Path) -> None:
    like = lmckit.load_model(ckpts / "a")
    ints = {**like.params, "head.bias": like.params["head.bias"].round().to(torch.int32)}
    with pytest.raises(CheckpointError, match="'head.bias' is stored as torch.int32, not float"):
        lmckit.save_model(tmp_path / "ints", like, ints)
    with pytest.raises(CheckpointError, match="not floating point"):
        lmckit.save(tmp_path / "ints", like.module, ints)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_models import build_hf_folder

    return build_hf_folder("gpt2", tmp_path_factory.mktemp("hf") / "gpt2")


@pytest.mark.parametrize(
    ("changes", "integer", "message"),
    [
        ({}, True, "weight transformer.wte.weight is torch.int32, not floating point"),
        ({"model_type": "gpt_bigcode"}, False, "config_changes make it a GPTBigCodeConfig"),
        ({"model_type": "openai-gpt"}, False, "config_changes make it a OpenAIGPTConfig"),
        ({"architectures": ["GPT2Model"]}, False, "set architectures to ['GPT2Model']"),
        ({"tie_word_embeddings": False}, False, "untie lm_head.weight from transformer.wte"),
    ],
    ids=["integer-weights", "model-type", "model-type-2", "architectures", "untie-unheld"],
)
def test_save_hf_refuses_folders_load_would_refuse(
    gpt2_folder: Path, tmp_path: Path, changes: dict, integer: bool, message: str
) -> None:
    like = lmckit.load_model(gpt2_folder)
    params = like.params
    if integer:
        params = {k: v.round().to(torch.int32) if v.is_floating_point() else v
                  for k, v in params.items()}  # fmt: skip
    with pytest.raises(HFError, match=message.replace("[", r"\[").replace("]", r"\]")):
        lmckit.save_model(tmp_path / "out", like, params, config_changes=changes)
    assert list(tmp_path.iterdir()) == []


def test_untying_with_both_weights_given_is_written_and_loads(
    gpt2_folder: Path, tmp_path: Path
) -> None:
    like = lmckit.load_model(gpt2_folder)
    params = {**like.params, "lm_head.weight": like.params["transformer.wte.weight"].clone()}
    out = lmckit.save_model(tmp_path / "out", like, params,
                            config_changes={"tie_word_embeddings": False})  # fmt: skip
    back = lmckit.load_model(out)
    torch.testing.assert_close(back.params["lm_head.weight"], params["lm_head.weight"])


def test_not_copied_lists_subfolders_and_hidden_entries(gpt2_folder: Path, tmp_path: Path) -> None:
    source = shutil.copytree(gpt2_folder, tmp_path / "src")
    (source / ".env").write_text("TOKEN=secret")
    (source / "onnx").mkdir()
    (source / "onnx" / "model.onnx").write_bytes(b"\x00")
    (source / "notes.txt").write_text("copied")
    like = lmckit.load_model(source)
    out = lmckit.save_model(tmp_path / "out", like, like.params)
    marker = json.loads((out / "lmckit.json").read_text())
    assert marker["not_copied"] == {
        ".env": "a hidden entry (never copied)",
        "onnx": "a subfolder (only the files at the top are copied)",
    }
    assert (out / "notes.txt").read_text() == "copied"
    assert not (out / ".env").exists() and not (out / "onnx").exists()
