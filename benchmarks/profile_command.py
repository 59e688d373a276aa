"""Where an ``lmckit`` command spends its time: the main thread's stack sampled at a fixed
interval while the command runs in this process.

``python benchmarks/profile_command.py [--every S] [--top N] -- align A B --method weight
--symmetry orthogonal --out X``

Prints, per lmckit function, the share of samples whose stack holds it (inclusive: a
function and its callers all count), then the lines the samples stopped in (the first
lmckit frame from the top of the stack, so time in torch is charged to the lmckit line
that called it). Sampling costs a few percent of the run's time; the shares are what
it is for, not the wall time.
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import lmckit

#: where lmckit's own modules are (a frame of any other file is not lmckit's)
PACKAGE = str(Path(lmckit.__file__).resolve().parent)


def _ours(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE)


def _where(frame: FrameType) -> str:
    """The frame's file, from the package's folder on (``lmckit/...``)."""
    return "lmckit" + frame.f_code.co_filename[len(PACKAGE) :]


def _frames(frame: FrameType | None) -> list[str]:
    """``file:function`` of each lmckit frame, innermost first."""
    out = []
    while frame is not None:
        if _ours(frame):
            out.append(f"{_where(frame)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--top", type=int, default=40, help="functions and lines to print")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the lmckit command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the lmckit command after --")

    main_id = threading.main_thread().ident
    inclusive: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    samples = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal samples
        while not done.wait(args.every):
            frame = sys._current_frames().get(main_id)  # noqa: SLF001 (the sampler's purpose)
            if frame is None:
                continue
            samples += 1
            inclusive.update(set(_frames(frame)))
            while frame is not None and not _ours(frame):
                frame = frame.f_back
            if frame is not None:
                lines[f"{_where(frame)}:{frame.f_lineno}"] += 1

    from lmckit.cli import main as lmckit_main

    sys.argv = ["lmckit", *command]
    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    sampler.start()
    try:
        lmckit_main()
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    finally:
        done.set()
        sampler.join()
    print(f"wall {time.perf_counter() - start:.1f} s, {samples} samples every {args.every} s")
    for name, count in inclusive.most_common(args.top):
        print(f"{100 * count / max(samples, 1):5.1f}%  {name}")
    print("--- lines")
    for name, count in lines.most_common(args.top):
        print(f"{100 * count / max(samples, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
