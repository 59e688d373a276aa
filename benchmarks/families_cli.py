"""Benchmark: Qwen3 and OLMo2 from the command line (docs/families.md, issue 40).

For each family a tiny random folder A (``tests/tiny_models.py``) and B = A with an
element planted by the independent planter (``tests/hf/oracle``, from the architecture's
math: residual stream, MLP units, key/value groups, query heads, value bases and the
query/key maps that commute with the family's qk-norm); then, as a user types them,
``lmckit symmetries A``, ``lmckit align A B --out C`` and, where the planter can rotate
the stream (norms folded), ``lmckit align A' B' --symmetry orthogonal --out C'``. Prints
the commands, their output (abridged), the distance of the planted element left in C
(after / before) and how closely C computes B's logits.

Run: ``python benchmarks/families_cli.py [--families qwen3,olmo2] [--keep DIR]``
(commands run in-process through the CLI's entry point: the same output as a shell).
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import tempfile
from pathlib import Path

from click.testing import CliRunner
from families import _distance, _folded, _outputs, _relative, family_inputs  # sets sys.path

from lmckit.cli import main as lmckit_main

from tests.hf.oracle import LAYOUTS, plant  # isort: skip
from tests.tiny_models import auto_load, build_hf_folder  # isort: skip


def _run(args: list[str], keep: int = 24) -> tuple[int, str]:
    """``lmckit ARGS`` printed as typed, its output's first ``keep`` lines, exit code."""
    result = CliRunner().invoke(lmckit_main, args)
    lines = [line for line in result.output.splitlines() if "Writing model shards" not in line]
    print(f"$ lmckit {shlex.join(args)}")
    more = f"\n... ({len(lines) - keep} more lines)" if len(lines) > keep else ""
    print("\n".join(lines[:keep]) + more)
    print(f"(exit {result.exit_code})\n")
    return result.exit_code, result.output


def _pair(name: str, root: Path, *, rotate: bool) -> tuple[Path, Path, dict, dict]:
    """A (folded first when ``rotate``) and B = A with a planted element, written."""
    a_path = build_hf_folder(name, root / "a")
    a = auto_load(name, a_path)
    layout = LAYOUTS[name](a.config)
    if rotate:
        a_path = root / "a-folded"
        a = _folded(a, layout, a_path)
    state = {k: v.clone() for k, v in a.state_dict().items()}
    moved = plant(state, layout, seed=7, rotate=rotate)
    b = copy.deepcopy(a)
    b.load_state_dict(moved)
    b.save_pretrained(root / "b")
    x = family_inputs(a)
    kept = _relative(_outputs(b, x), _outputs(a, x))
    print(
        f"planted in B: {', '.join(layout.maps(rotate=rotate))} (B's logits vs A's: {kept:.1e})\n"
    )
    return a_path, root / "b", state, moved


def _aligned(name: str, out: Path, b: Path, state: dict, moved: dict) -> None:
    """The distance of the planted element left in ``out`` and B's logits kept."""
    c = auto_load(name, out)
    reference = out / "reference"
    target = auto_load(name, reference).state_dict() if reference.is_dir() else state
    before = _distance(moved, state)
    left = _distance(c.state_dict(), target) / before
    b_model = auto_load(name, b)
    x = family_inputs(b_model)
    kept = _relative(_outputs(c, x), _outputs(b_model, x))
    print(f"C: distance to A {left:.1e} of B's ({before:.2f}); C's logits vs B's: {kept:.1e}\n")


def demo(name: str, root: Path) -> None:
    """The commands on one family's pair, with and without a rotated stream."""
    print(f"## {name}\n")
    a, b, state, moved = _pair(name, root / "plain", rotate=False)
    _run(["symmetries", str(a)])
    code, _ = _run(["align", str(a), str(b), "--out", str(root / "c")], keep=12)
    if code == 0:
        _aligned(name, root / "c", b, state, moved)
    _run(["symmetries", str(a), "--symmetry", "orthogonal"], keep=6)
    a_rot = auto_load(name, a)
    if LAYOUTS[name](a_rot.config).rotates:
        a, b, state, moved = _pair(name, root / "rotated", rotate=True)
        out = root / "c-rotated"
        args = ["align", str(a), str(b), "--symmetry", "orthogonal", "--out", str(out)]
        code, _ = _run(args, keep=12)
        if code == 0:
            _aligned(name, out, b, state, moved)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--families", default="qwen3,olmo2")
    parser.add_argument("--keep", help="write the folders here (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmckit-cli-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        os.chdir(root)  # the commands read as typed there: paths relative to it
        for name in args.families.split(","):
            demo(name, Path(name))


if __name__ == "__main__":
    main()
