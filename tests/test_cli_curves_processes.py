"""``lmckit curve --kind neb`` and ``lmckit landscape`` under ``torchrun``: the band's pivots
and the plane's batches are split between two processes, process 0 alone writes, and the
results are one process's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
import torch
import torch.multiprocessing as mp
from click.testing import CliRunner
from tests.processes import free_port, set_rank_environment

from lmckit.cli import main
from lmckit.workflow import load_curve

PROCESSES = 2
TRAIN = ["--data", "digits", "--epochs", "3", "--optimizer", "adam", "--lr", "3e-3",
         "--batch-size", "64", "--quiet", "--width", "32", "--depth", "1"]  # fmt: skip


def _worker(rank: int, runs: list[list[str]], out_dir: str) -> None:
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


def _commands(root: Path, out: Path) -> list[list[str]]:
    a, b, c = (str(root / m) for m in ("a", "b", "c"))
    return [
        ["curve", a, b, "--kind", "neb", "--data", "digits", "--epochs", "2", "--batch-size",
         "64", "--cycles", "2", "--insert", "1", "--points", "5", "--out", str(out / "band"),
         "--json", str(out / "band.json"), "--quiet"],
        ["landscape", a, b, c, "--data", "digits", "--resolution", "3", "--json",
         str(out / "plane.json"), "--plot", str(out / "plane.png"), "--quiet"],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for seed, name in enumerate("abc"):
        result = CliRunner().invoke(main, ["train", "--model", "mlp", "--seed", str(seed),
                                           "--out", str(root / name), *TRAIN])  # fmt: skip
        assert result.exit_code == 0, result.output
    return root


def test_two_processes_fit_and_measure_what_one_does(models, tmp_path) -> None:
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    runs = [[str(free_port()), *args] for args in _commands(models, two)]
    mp.spawn(_worker, args=(runs, str(two)), nprocs=PROCESSES, join=True)
    for i in range(len(runs)):
        assert (two / f"run{i}-rank0.err").read_text() == ""
        assert (two / f"run{i}-rank1.err").read_text() == ""
        assert (two / f"run{i}-rank1.out").read_text() == ""  # process 0 alone reports
    for args in _commands(models, one):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    # the band: every pivot's gradient computed by one process and summed with zeros,
    # so the pivots are one process's to the bit
    band_two, band_one = load_curve(two / "band").curve, load_curve(one / "band").curve
    assert len(band_two.controls) == len(band_one.controls)
    for p, q in zip(band_two.controls, band_one.controls, strict=True):
        assert all(torch.equal(p[k], q[k]) for k in p)
    # evaluation sums the processes' batches: the same figures up to summation order
    for name, keys in (("band.json", ("loss", "acc")), ("plane.json", ())):
        got, want = (json.loads((d / name).read_text()) for d in (two, one))
        for key in keys:
            assert got[key] == pytest.approx(want[key], rel=1e-9)
    planes = [json.loads((d / "plane.json").read_text()) for d in (two, one)]
    flat = [[v for row in p["grid"]["loss"] for v in row] for p in planes]
    assert flat[0] == pytest.approx(flat[1], rel=1e-9)
    assert not (two / "run0-rank1.out").read_text()
