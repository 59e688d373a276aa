"""Weight matching: lmckit vs git-re-basin-pytorch and PyPI ``rebasin``, same weights.

Two MLPs 64 -> H x3 -> 10 (lmckit's zoo ``mlp``, seeds 0 and 1, random initialisation:
the cost of a sweep does not depend on training), matched to convergence (at most
``--max-iter`` sweeps) by

* lmckit ``weight_matching`` (with the assignment backend it finds: ``lapx`` if
  installed, else SciPy), and with SciPy forced (``--scipy-row``);
* git-re-basin-pytorch (themrzmaster): its ``utils/weight_matching.py`` loaded from the
  checkout given by ``--grb`` (the repository is not vendored);
* PyPI ``rebasin`` (snimu) ``PermutationCoordinateDescent`` on the same weights loaded
  into two modules (its time includes tracing the model graph; its per-sweep time
  does not).

Each implementation runs on the same weights, one after the other for each width, in
one process; the final objective of each is ``sum_p <A_p, B'_p>`` over all parameters
in float64. Prints one table and the ratios of lmckit to the fastest peer (total time,
time per sweep) with the load average before and after.

Run: ``python benchmarks/bench_weight_matching.py --grb ../ext/git-re-basin-pytorch
[--widths 512 2048 4096] [--threads 2]``.

``--memory``: each implementation and width runs alone in a fresh process instead (the
peak resident set of a process is one number for its whole life), which reports its
time, its peak RSS (``ru_maxrss``) and the RSS it started from once the two models were
built (interpreter, imports and weights), beside the two models' float32 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

import lmckit
from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.groups import _assignment
from lmckit.models import create_model

Params = dict[str, Tensor]


class Row(NamedTuple):
    name: str
    seconds: float
    sweeps: int
    per_sweep: float
    objective: float


def objective(a: Params, b: Params) -> float:
    return sum(float((a[k].double() * b[k].double()).sum()) for k in a)


def run_lmckit(model, pa: Params, pb: Params, max_iter: int) -> tuple[float, int, Params]:
    spec = model.symmetry_spec()  # inferred once per architecture, before the clock
    start = time.perf_counter()
    result = weight_matching(spec, pa, pb, WeightMatchingConfig(max_iter=max_iter))
    aligned = lmckit.apply(spec, pb, result.transform)
    return time.perf_counter() - start, result.iterations, aligned


def load_grb(checkout: Path):
    path = checkout / "utils" / "weight_matching.py"
    spec = importlib.util.spec_from_file_location("grb_weight_matching", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_grb(grb, pa: Params, pb: Params, max_iter: int) -> tuple[float, int, Params]:
    names = ["layers.0", "layers.1", "layers.2", "head"]
    rename = {f"{n}.{w}": f"layer{i}.{w}" for i, n in enumerate(names) for w in ("weight", "bias")}
    back = {v: k for k, v in rename.items()}
    a = {rename[k]: v for k, v in pa.items()}
    b = {rename[k]: v for k, v in pb.items()}
    ps = grb.mlp_permutation_spec(num_hidden_layers=3)
    log = io.StringIO()
    torch.manual_seed(0)  # its sweep order comes from the global generator
    start = time.perf_counter()
    with contextlib.redirect_stdout(log):  # it prints every update
        perm = grb.weight_matching(ps, a, b, max_iter=max_iter)
    aligned = grb.apply_permutation(ps, perm, b)
    seconds = time.perf_counter() - start
    sweeps = 1 + max(int(m) for m in re.findall(r"^(\d+)/", log.getvalue(), re.M))
    return seconds, sweeps, {back[k]: v for k, v in aligned.items()}


def run_rebasin(model, pa: Params, pb: Params, max_iter: int) -> tuple[float, int, Params]:
    from rebasin import PermutationCoordinateDescent

    model_a, model_b = copy.deepcopy(model), copy.deepcopy(model)
    model_a.load_state_dict(pa)
    model_b.load_state_dict(pb)
    torch.manual_seed(0)
    start = time.perf_counter()
    pcd = PermutationCoordinateDescent(
        model_a, model_b, torch.zeros(2, pa["layers.0.weight"].shape[1])
    )
    sweeps = 0
    step = pcd._calculate_permutations_step

    def counted(loop):
        nonlocal sweeps
        sweeps += 1
        return step(loop)

    pcd._calculate_permutations_step = counted  # type: ignore[method-assign]
    pcd.calculate_permutations(max_iter)
    pcd.apply_permutations()
    seconds = time.perf_counter() - start
    return seconds, sweeps, {k: v.detach() for k, v in model_b.state_dict().items()}


def scipy_backend(fn: Callable) -> Callable:
    def run(*args):
        saved = _assignment._lapjvr
        _assignment._lapjvr = None
        try:
            return fn(*args)
        finally:
            _assignment._lapjvr = saved

    return run


def _rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_alone(name: str, run: Callable, width: int) -> None:
    """Run one implementation at one width in this (fresh) process; print one
    ``MEMORY`` line: seconds, sweeps, peak RSS, RSS before the run, models' bytes."""
    kwargs = dict(in_features=64, hidden=[width] * 3, out_features=10)
    model, pa = create_model("mlp", seed=0, **kwargs)
    _, pb = create_model("mlp", seed=1, **kwargs)
    model.symmetry_spec()
    before = _rss_bytes()
    seconds, sweeps, _ = run(model, pa, pb)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    models = sum(t.numel() * t.element_size() for p in (pa, pb) for t in p.values())
    print(f"MEMORY {name}|{seconds:.2f}|{sweeps}|{peak}|{before}|{models}", flush=True)


def memory_table(argv: list[str], names: list[str], widths: list[int]) -> None:
    """Each implementation and width in a fresh process: time and memory, one table."""
    gib = 2.0**30
    print(f"{'H':>6} {'implementation':<24}{'total s':>9}{'sweeps':>7}{'peak RSS':>10}"
          f"{'at start':>10}{'above start':>12}{'models':>8}  (GiB)")  # fmt: skip
    for width in widths:
        for name in names:
            out = subprocess.run(
                [sys.executable, __file__, *argv, "--only", name, "--widths", str(width)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            line = next(x for x in out.stdout.splitlines() if x.startswith("MEMORY "))
            _, seconds, sweeps, peak, before, models = line.split("|")
            peak_b, before_b, models_b = int(peak), int(before), int(models)
            above = (peak_b - before_b) / gib
            print(f"{width:>6} {name:<24}{float(seconds):>9.2f}{int(sweeps):>7}"
                  f"{peak_b / gib:>10.2f}{before_b / gib:>10.2f}{above:>12.2f}"
                  f"{models_b / gib:>8.2f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grb", type=Path, required=True, help="git-re-basin-pytorch checkout")
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--no-rebasin", action="store_true", help="skip PyPI rebasin")
    parser.add_argument("--scipy-row", action="store_true", help="also lmckit with SciPy")
    parser.add_argument("--memory", action="store_true", help="each run in its own process")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one run, for --memory
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    grb = load_grb(args.grb)
    runners: list[tuple[str, Callable]] = [
        ("lmckit", lambda m, a, b: run_lmckit(m, a, b, args.max_iter)),
        ("git-re-basin-pytorch", lambda m, a, b: run_grb(grb, a, b, args.max_iter)),
    ]
    if not args.no_rebasin:
        runners.append(("rebasin (PyPI)", lambda m, a, b: run_rebasin(m, a, b, args.max_iter)))
    if args.scipy_row:
        runners.append(
            (
                "lmckit, SciPy assignment",
                scipy_backend(lambda m, a, b: run_lmckit(m, a, b, args.max_iter)),
            )
        )
    if args.only is not None:
        name, run = next((n, r) for n, r in runners if n == args.only)
        warm = dict(in_features=64, hidden=[32] * 3, out_features=10)
        model, pa = create_model("mlp", seed=0, **warm)
        _, pb = create_model("mlp", seed=1, **warm)
        run(model, pa, pb)  # imports, first calls: not timed
        measure_alone(name, run, args.widths[0])
        return
    if args.memory:
        argv = ["--grb", str(args.grb), "--threads", str(args.threads),
                "--max-iter", str(args.max_iter)]  # fmt: skip
        argv += ["--no-rebasin"] if args.no_rebasin else []
        argv += ["--scipy-row"] if args.scipy_row else []
        memory_table(argv, [n for n, _ in runners], args.widths)
        return
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, {args.threads} torch threads, "
        f"torch {torch.__version__}, lmckit assignment backend: {_assignment.assignment_backend()}"
    )
    warm = dict(in_features=64, hidden=[32] * 3, out_features=10)
    model, pa = create_model("mlp", seed=0, **warm)
    _, pb = create_model("mlp", seed=1, **warm)
    for _, run in runners:  # imports, first calls: not timed
        run(model, pa, pb)
    for width in args.widths:
        kwargs = dict(in_features=64, hidden=[width] * 3, out_features=10)
        model, pa = create_model("mlp", seed=0, **kwargs)
        _, pb = create_model("mlp", seed=1, **kwargs)
        model.symmetry_spec()
        load = os.getloadavg()[0]
        rows = []
        for name, run in runners:
            seconds, sweeps, aligned = run(model, pa, pb)
            rows.append(Row(name, seconds, sweeps, seconds / sweeps, objective(pa, aligned)))
            print(f"  H={width} {name}: {seconds:.2f} s, {sweeps} sweeps", flush=True)
        print(f"\nH = {width} (load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)")
        print(f"{'implementation':<28}{'total s':>10}{'sweeps':>8}{'s/sweep':>10}{'objective':>14}")
        for r in rows:
            print(
                f"{r.name:<28}{r.seconds:>10.2f}{r.sweeps:>8d}{r.per_sweep:>10.3f}{r.objective:>14.4f}"
            )
        ours = rows[0]
        peers = [r for r in rows if not r.name.startswith("lmckit")]
        fastest = min(peers, key=lambda r: r.seconds)
        fastest_sweep = min(peers, key=lambda r: r.per_sweep)
        print(
            f"ratio total time lmckit / fastest peer ({fastest.name}): "
            f"{ours.seconds / fastest.seconds:.2f}; objective lmckit - peer: "
            f"{ours.objective - fastest.objective:+.4f}"
        )
        print(
            f"ratio s/sweep lmckit / fastest peer ({fastest_sweep.name}): "
            f"{ours.per_sweep / fastest_sweep.per_sweep:.2f}\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
