"""Benchmark: what lmckit finds in every family of ``tests/tiny_models.py`` (docs/families.md).

Per family, on its tiny random folder (2 layers, width 32; built as ``tests/hf/conftest.py``
does, nothing downloaded), with lmckit's public API and its command line:

- **components** found by ``analyze_symmetries`` (as ``components()`` in
  ``tests/hf/test_families.py``), with the groups of their spaces, and the share of
  parameters some space moves;
- **orthogonal**: what ``--symmetry orthogonal`` makes of the stream (the residual
  spaces' groups and the form, e.g. norm scales folded) or the one-line refusal;
- **left out**: the lines ``lmckit symmetries`` prints under "left out";
- **time** of ``analyze_symmetries`` (trace, inference, the check by random elements),
  the least of three runs, each from a cold start (the kept traces forgotten first), on
  the inputs the command line uses;
- **planted**: the independent planter of ``tests/hf/oracle`` (not lmckit's spec) plants
  an element of the architecture's symmetries into a copy (the steps of
  ``tests/hf/test_families_oracle.py``), ``lmckit align A B --method weight`` writes A
  back; the distance left (after / before), and the same for a rotated stream where the
  planter folds every norm (``--symmetry orthogonal``).

Run: ``python benchmarks/families.py [--only llama,bert] [--json P|-] [--markdown P]
[--threads 2] [--from report.json]``. ``--markdown docs/families.md`` replaces the
tables between the page's markers (:mod:`families_table`); ``--from`` renders a saved
report without measuring. About 15 minutes for all 48 families on 2 idle cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent, HERE):  # the tests package (tiny models, oracle) and the table
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
import transformers  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from tests.hf.oracle import LAYOUTS, plant  # noqa: E402
from tests.hf.test_families import components  # noqa: E402
from tests.hf.test_families_oracle import (  # noqa: E402
    _distance,
    _folded,
    _outputs,
    _relative,
    family_inputs,
)
from tests.tiny_models import ALL_FAMILIES, auto_load, build_hf_folder  # noqa: E402

from lmckit.cli import main as lmckit_main  # noqa: E402
from lmckit.forms import aligned_form  # noqa: E402
from lmckit.forms._recipe import default_inputs  # noqa: E402
from lmckit.hf import load_hf  # noqa: E402
from lmckit.inference import analyze_symmetries  # noqa: E402
from lmckit.inference._traced_once import clear_traces  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


def _groups_by_component(spec: Any) -> dict[str, list[str]]:
    """Each component of :func:`components` with the group kinds of its spaces."""
    found: dict[str, set[str]] = {}
    for space in spec:
        (component,) = components([space]) or {"units"}
        found.setdefault(component, set()).add(type(space.group).__name__)
    return {k: sorted(v) for k, v in sorted(found.items())}


def _moved_share(spec: Any, params: dict[str, torch.Tensor]) -> float:
    moved = {u.param for s in spec for u in s.uses}
    total = sum(v.numel() for v in params.values())
    return sum(v.numel() for k, v in params.items() if k in moved) / total


def measure_inference(folder: Path, runs: int = 3) -> dict[str, Any]:
    """Components, share moved, left-out lines and the least time of ``runs`` analyses,
    on the example inputs the command line uses, each run tracing again."""
    model = load_hf(folder)
    x = default_inputs(model.module)
    times, analysis = [], None
    for _ in range(runs):
        clear_traces()  # a kept trace would make the second run a cache hit
        start = time.perf_counter()
        analysis = analyze_symmetries(model.module, x)
        times.append(time.perf_counter() - start)
    assert analysis is not None
    return {
        "components": sorted(components(analysis.spec)),
        "groups": _groups_by_component(analysis.spec),
        "spaces": len(analysis.spec),
        "moved": _moved_share(analysis.spec, model.params),
        "left_out": list(analysis.left_out),
        "time_s": min(times),
    }


def measure_orthogonal(folder: Path) -> dict[str, Any]:
    """What ``--symmetry orthogonal`` finds on the stream, or its refusal (one line)."""
    model = load_hf(folder)
    try:
        form = aligned_form(model.module, model.params, model.params, symmetry="orthogonal")
    except ValueError as refused:
        return {"admits": False, "reason": str(refused).splitlines()[0]}
    streams = sorted({type(s.group).__name__ for s in form.spec if s.name.startswith("residual")})
    rotating = [g for g in streams if "Orthogonal" in g]
    return {"admits": bool(rotating), "groups": streams, "form": form.form}


def _align(a: Path, b: Path, out: Path, symmetry: str | None) -> str | None:
    """``lmckit align A B --method weight``; None, or the failure's last line."""
    extra = ["--symmetry", symmetry] if symmetry else []
    args = ["align", str(a), str(b), "--method", "weight", *extra, "--no-circuits"]
    result = CliRunner().invoke(lmckit_main, [*args, "--out", str(out), "--quiet"])
    if result.exit_code == 0:
        return None
    lines = [line for line in result.output.splitlines() if line.strip()]
    return lines[-1] if lines else repr(result.exception)


def measure_plant(name: str, folder: Path, work: Path, *, rotate: bool) -> dict[str, Any]:
    """The independent plant (``tests/hf/oracle``) and what ``lmckit align`` leaves of it:
    the steps of ``tests/hf/test_families_oracle.py``, measured instead of asserted."""
    a_path, a = folder, auto_load(name, folder)
    layout = LAYOUTS[name](a.config)
    x = family_inputs(a)
    if rotate:
        a_path = work / "a"
        a = _folded(a, layout, a_path)
    state = {k: v.clone() for k, v in a.state_dict().items()}
    moved = plant(state, layout, seed=7, rotate=rotate)
    b = copy.deepcopy(a)
    b.load_state_dict(moved)
    want = _outputs(b, x)
    result: dict[str, Any] = {
        "maps": layout.maps(rotate=rotate),
        "plant_keeps_outputs": _relative(want, _outputs(a, x)),
    }
    b.save_pretrained(work / "b")
    failure = _align(a_path, work / "b", work / "out", "orthogonal" if rotate else None)
    before = _distance(moved, state)
    if failure is not None:
        return result | {"refused": failure, "before": before}
    aligned = auto_load(name, work / "out")
    reference = work / "out" / "reference"  # A in a form that moved it too
    target = auto_load(name, reference).state_dict() if reference.is_dir() else state
    left = _distance(aligned.state_dict(), target) / before
    kept = _relative(_outputs(aligned, x), want)
    return result | {"before": before, "left": left, "b_outputs_kept": kept}


def _guarded(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``step()``, or its error as one line: a refusal is a result of the benchmark."""
    try:
        return step()
    except Exception as error:  # noqa: BLE001 -- any failure is reported, not raised
        lines = str(error).strip().splitlines() or [""]
        return {"error": f"{type(error).__name__}: {lines[0]}"}


def measure(name: str, root: Path, *, runs: int = 3) -> dict[str, Any]:
    """Every measurement of one family, its folders under ``root`` (``runs`` analyses timed)."""
    folder = build_hf_folder(name, root / name / "a")
    row: dict[str, Any] = {"family": name, "model": ALL_FAMILIES[name].model}
    row["inference"] = _guarded(lambda: measure_inference(folder, runs))
    row["orthogonal"] = _guarded(lambda: measure_orthogonal(folder))
    if name in LAYOUTS:
        work = root / name
        row["planted"] = _guarded(lambda: measure_plant(name, folder, work / "p", rotate=False))
        if LAYOUTS[name](auto_load(name, folder).config).rotates:
            row["rotated"] = _guarded(lambda: measure_plant(name, folder, work / "r", rotate=True))
    return row


def _families(only: str | None) -> list[str]:
    if not only:
        return sorted(ALL_FAMILIES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_FAMILIES]
    if unknown:
        raise SystemExit(f"error: unknown families {unknown}; known: {sorted(ALL_FAMILIES)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    parser.add_argument("--json", help="write the measurements as JSON here ('-': stdout)")
    parser.add_argument(
        "--markdown", help="write the tables here (in a page: between its table markers)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--from", dest="source", help="no measuring: a --json report to render")
    parser.add_argument(
        "--update",
        help="a --json report whose rows of the --only families are replaced by new "
        "measurements (the others kept, the replaced ones recorded)",
    )
    args = parser.parse_args(argv)
    if args.source:
        report = json.loads(Path(args.source).read_text())
    else:
        report = _measure_all(_families(args.only), args.threads)
    if args.update:
        report = _updated(json.loads(Path(args.update).read_text()), report)
    if args.json == "-":
        json.dump(report, sys.stdout, indent=1)
        print()
    elif args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        from families_table import splice

        target = Path(args.markdown)
        target.write_text(splice(target.read_text() if target.exists() else "", report))


def _measure_all(names: list[str], threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    rows, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmckit-families-") as tmp:
        for name in names:
            t0 = time.perf_counter()
            rows.append(measure(name, Path(tmp)))
            print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    wall = time.perf_counter() - start
    print(f"{len(rows)} families in {wall:.0f} s", file=sys.stderr)
    command = " ".join(["python benchmarks/families.py", *sys.argv[1:]])
    return {"date": stamp, "command": command, "threads": threads, "wall_s": wall,
            "families": rows}  # fmt: skip


def _updated(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the rows ``new`` measured replaced, and a note of when and how."""
    fresh = {row["family"]: row for row in new["families"]}
    rows = [fresh.pop(row["family"], row) for row in old["families"]] + list(fresh.values())
    note = {"date": new["date"], "command": new["command"], "families": sorted(
        row["family"] for row in new["families"])}  # fmt: skip
    return old | {"families": rows, "updates": [*old.get("updates", []), note]}


if __name__ == "__main__":
    main()
