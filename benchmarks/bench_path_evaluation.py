"""Path evaluation at the forward-pass floor: batched points vs the point loop.

An 11-point linear path between two models, evaluated three ways on the same data,
interleaved and repeated so that other load on a shared machine hits all three alike:

(a) ``batched``: ``lmckit.evaluate_path`` with ``Batching("batched")``: the points'
    parameters stacked and run through ``torch.func.vmap`` (chunks of points when
    memory is short), each batch read once;
(b) ``loop``: ``lmckit.evaluate_path`` with ``Batching("loop")``: one point at a time;
(c) ``floor``: 11 plain forward passes of one model (``module(x)`` with the same loss
    and accuracy sums) -- the time any evaluation of 11 points must take.

Both lmckit ways must give the same losses (checked to 1e-5). Ratios are of medians
taken in the same run.

Run: .venv/bin/python benchmarks/bench_path_evaluation.py [--repeats 3] [--threads 2]
     [--device cuda] [--precision bfloat16] [--cases resnet20 gpt2 mlp]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lmckit.data import batches
from lmckit.measure._batched import Batching
from lmckit.measure._evaluate import evaluate_path
from lmckit.models import create_model

POINTS = 11

# name -> (zoo model, kwargs, input maker, examples, batch size)
CASES: dict[str, tuple[str, dict, Callable[[int, torch.Generator], tuple], int, int]] = {
    "resnet20": (
        "resnet20",
        dict(in_channels=3, num_classes=10, width_mult=1),
        lambda n, g: (
            torch.randn(n, 3, 32, 32, generator=g),
            torch.randint(0, 10, (n,), generator=g),
        ),
        256,
        128,
    ),
    "gpt2": (
        "gpt2",
        dict(vocab_size=50257, n_layer=2, n_head=4, n_embd=128, context=128),
        lambda n, g: (
            torch.randint(0, 50257, (n, 128), generator=g),
            torch.randint(0, 50257, (n, 128), generator=g),
        ),
        16,
        4,
    ),
    "mlp": (
        "mlp",
        dict(in_features=784, hidden=[512] * 3, out_features=10),
        lambda n, g: (torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)),
        2000,
        500,
    ),
}


def floor(module: torch.nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """11 plain forward passes over the data, with the path's loss and accuracy sums."""
    total = 0.0
    with torch.no_grad():
        for _ in range(POINTS):
            for x, y in data:
                logits = module(x)
                flat, labels = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
                loss = F.cross_entropy(flat, labels, reduction="sum")
                total += float(loss) + float((flat.argmax(-1) == labels).sum())
    return total


def measure(label: str, device: torch.device, precision: str, repeats: int) -> None:
    """Time the three ways on one case and print a row of the table."""
    name, kwargs, make, n, size = CASES[label]
    module, pa = create_model(name, seed=0, **kwargs)
    _, pb = create_model(name, seed=1, **kwargs)
    module = module.to(device).eval()
    pa = {k: v.to(device) for k, v in pa.items()}
    pb = {k: v.to(device) for k, v in pb.items()}
    module.load_state_dict(pa)
    x, y = make(n, torch.Generator().manual_seed(0))
    data = list(batches(x.to(device), y.to(device), size))

    def path(mode: str):
        batching = Batching(mode, precision=precision)  # type: ignore[arg-type]
        return evaluate_path(module, pa, pb, lambda: data, points=POINTS, batching=batching)

    runs = {
        "floor": lambda: floor(module, data),
        "batched": lambda: path("batched"),
        "loop": lambda: path("loop"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    results = {}
    order = list(runs)
    for rep in range(repeats):
        # rotate the order each repeat: warm-up and load drift hit every way alike
        for key in order[rep % 3 :] + order[: rep % 3]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            results[key] = runs[key]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[key].append(time.perf_counter() - start)
    diff = max(
        abs(u - v) for u, v in zip(results["batched"].loss, results["loop"].loss, strict=True)
    )
    assert diff < 1e-5 or precision != "float32", f"batched and loop differ by {diff}"
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{label:<10}{med['floor']:>11.3f}{med['batched']:>13.3f}{med['loop']:>10.3f}"
        f"{med['batched'] / med['floor']:>14.2f}x{med['loop'] / med['floor']:>11.2f}x"
        f"{med['loop'] / med['batched']:>13.2f}x",
        flush=True,
    )
    print(
        "  all runs (s): "
        + "; ".join(f"{k} " + ", ".join(f"{t:.2f}" for t in v) for k, v in times.items()),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--cases", nargs="+", default=["resnet20", "gpt2"], choices=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load = os.getloadavg()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {args.threads} torch threads, "
        f"torch {torch.__version__}, device {device}, precision {args.precision}, "
        f"load average {load[0]:.1f}"
    )
    print(
        f"{'model':<10}{'floor (s)':>11}{'batched (s)':>13}{'loop (s)':>10}"
        f"{'batched/floor':>15}{'loop/floor':>12}{'loop/batched':>14}"
    )
    for label in args.cases:
        measure(label, device, args.precision, args.repeats)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
