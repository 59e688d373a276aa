"""The command line under ``torchrun``: ``align`` and ``barrier`` split their work between
the processes, process 0 alone reports and writes, and the result is one process's.

Two processes are started with ``torch.multiprocessing.spawn`` and given the
environment ``torchrun`` sets; each runs the command line in-process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
import torch
import torch.multiprocessing as mp
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from tests.processes import rendezvous, set_rank_environment
from tests.tiny_models import build_hf_folder

from lmckit.cli import main
from lmckit.formats._io import load_model
from lmckit.hf._files import read_hf_weights, shard_map, weights_path

PROCESSES = 2
BROKEN = "model.layers.1.mlp.down_proj.weight"
#: The text the barrier is measured on: written by the test, read by a word-level tokenizer.
WORDS = ["<unk>", "the", "cat", "sat", "on", "mat", "and", "dog", "ran"]


def _worker(rank: int, runs: list[list[str]], out_dir: str) -> None:
    """Run each command line of ``runs`` as process ``rank`` of ``PROCESSES``; record
    its stdout and its one-line error (empty when it succeeded)."""
    torch.set_num_threads(1)
    for i, args in enumerate(runs):
        set_rank_environment(rank, PROCESSES, int(args[0]))
        stdout, error = sys.stdout, ""
        with open(Path(out_dir) / f"run{i}-rank{rank}.out", "w") as fh:
            sys.stdout = fh
            try:
                main.main(args=args[1:], standalone_mode=False)
            except click.ClickException as err:
                error = err.format_message()
            finally:
                sys.stdout = stdout
        (Path(out_dir) / f"run{i}-rank{rank}.err").write_text(error)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two bfloat16 Llama folders in shards (a vocabulary of GPT-2's size, so the weights
    span several shards; the text's tokenizer uses its first ids), and B with a NaN in
    one weight."""
    root = tmp_path_factory.mktemp("pair")
    kw = dict(dtype=torch.bfloat16, shard_size=200_000, vocab_size=50257, hidden_size=16,
              intermediate_size=24, max_position_embeddings=16)  # fmt: skip
    a = build_hf_folder("llama", root / "a", seed=0, **kw)
    b = build_hf_folder("llama", root / "b", seed=1, **kw)
    broken = build_hf_folder("llama", root / "broken", seed=1, **kw)
    shards = shard_map(weights_path(broken))
    shard = broken / next(name for name, keys in shards.items() if BROKEN in keys)
    tensors = load_file(shard)
    tensors[BROKEN][0, 0] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})
    return a, b, broken


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A data spec of 3,000 words of text and a word-level tokenizer, both written here."""
    tokenizers = pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("text")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    words = [WORDS[1 + (i * 7 + i // 5) % (len(WORDS) - 1)] for i in range(3000)]
    (root / "corpus.txt").write_text(" ".join(words))
    return f"text:{root / 'corpus.txt'},tokenizer={root},block=16,split=80/10/10"


@pytest.fixture(scope="module")
def ranks(pair, text, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Three command lines run by two processes: align, barrier, align of a broken B."""
    a, b, broken = pair
    out = tmp_path_factory.mktemp("ranks")
    commands = [
        ["align", str(a), str(b), "--symmetry", "orthogonal", "--out", str(out / "aligned")],
        ["barrier", str(a), str(b), "--data", text, "--points", "3",
         "--json", str(out / "barrier.json")],
        ["align", str(a), str(broken), "--out", str(out / "never")],
    ]  # fmt: skip
    with rendezvous(len(commands)) as ports:  # one process group per command line
        runs = [[str(port), *args] for port, args in zip(ports, commands, strict=True)]
        mp.spawn(_worker, args=(runs, str(out)), nprocs=PROCESSES, join=True)
    got = [
        {
            "out": [(out / f"run{i}-rank{r}.out").read_text() for i in range(len(runs))],
            "err": [(out / f"run{i}-rank{r}.err").read_text() for i in range(len(runs))],
        }
        for r in range(PROCESSES)
    ]
    return out, got


def test_align_under_two_processes_writes_one_process_result(pair, ranks, tmp_path) -> None:
    a, b, _ = pair
    out, got = ranks
    one = tmp_path / "one"
    result = CliRunner().invoke(main, ["align", str(a), str(b), "--symmetry", "orthogonal",
                                       "--out", str(one)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert got[0]["err"][0] == got[1]["err"][0] == ""
    # process 0 reports (the same lines as one process), the other prints nothing
    assert got[0]["out"][0].splitlines()[-2:] == [
        line.replace(str(one), str(out / "aligned")) for line in result.output.splitlines()[-2:]
    ]
    assert got[1]["out"][0] == ""
    written = sorted(p.name for p in (out / "aligned").iterdir())
    assert written == sorted(p.name for p in one.iterdir())
    two_w, one_w = read_hf_weights(out / "aligned"), read_hf_weights(one)
    assert two_w.keys() == one_w.keys()
    for key in one_w:
        # the residual's sums are added in another order: the transforms agree to ~1e-5
        # (tests/test_distributed.py), and a value may round to the neighbouring
        # bfloat16 (relative spacing 2**-7); weights are ~0.1, a wrong alignment moves them
        # by as much
        assert two_w[key].dtype == torch.bfloat16
        torch.testing.assert_close(two_w[key].float(), one_w[key].float(), rtol=2**-7, atol=1e-4)
    same = sum(int((two_w[k] == one_w[k]).sum()) for k in one_w)
    assert same / sum(v.numel() for v in one_w.values()) > 0.9  # most bit for bit


def test_barrier_under_two_processes_measures_what_one_does(pair, text, ranks, tmp_path) -> None:
    a, b, _ = pair
    out, got = ranks
    one = tmp_path / "one.json"
    args = ["barrier", str(a), str(b), "--data", text, "--points", "3", "--json", str(one)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert got[0]["err"][1] == got[1]["err"][1] == "" and got[1]["out"][1] == ""
    two_path, one_path = json.loads((out / "barrier.json").read_text()), json.loads(one.read_text())
    for key in ("loss", "acc"):
        assert two_path[key] == pytest.approx(one_path[key], rel=1e-9)


def test_values_are_checked_by_the_process_that_reads_them(pair, ranks) -> None:
    _, _, broken = pair
    out, got = ranks
    # loading reads no value when the caller checks what it reads
    load_model(broken, dtype=None, check_values=False)
    with pytest.raises(ValueError, match="contains NaN"):
        load_model(broken, dtype=None)
    # across processes weight matching checks each tensor where it is read, and every
    # process stops with the same one-line error; nothing is written
    message = f"second model: {BROKEN!r} contains NaN or infinite values"
    assert got[0]["err"][2] == got[1]["err"][2] == message
    assert not (out / "never").exists()


@pytest.mark.parametrize(
    ("size", "command", "message"),
    [
        (
            "2",
            "merge",
            "lmckit merge runs in one process; under torchrun only align, barrier, curve, "
            "landscape and ensemble",
        ),
        ("two", "align", "WORLD_SIZE must be a whole number of processes, got 'two'"),
    ],
)
def test_commands_that_do_not_split_refuse_torchrun(pair, tmp_path, size, command, message):
    a, b, _ = pair
    args = [command, str(a), str(b), "--out", str(tmp_path / "out")]
    result = CliRunner(env={"WORLD_SIZE": size}).invoke(main, args)
    assert result.exit_code == 1 and message in result.output
    assert not (tmp_path / "out").exists()
