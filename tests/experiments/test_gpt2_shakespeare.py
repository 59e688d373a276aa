"""The GPT-2 / Tiny Shakespeare pipeline in its quick (CPU) form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmckit.experiments import ExperimentContext, list_experiments, run_experiment
from lmckit.experiments._gpt2_shakespeare import GPT2ShakespeareConfig, paper_config, quick_config

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"
TEXT = DATA_ROOT / "tinyshakespeare" / "input.txt"
TOKENIZER = DATA_ROOT / "gpt2_tokenizer"
needs_text = pytest.mark.skipif(
    not (TEXT.exists() and TOKENIZER.exists()), reason="needs ../shared/data (Tiny Shakespeare)"
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory):
    if not (TEXT.exists() and TOKENIZER.exists()):
        pytest.skip("needs ../shared/data (Tiny Shakespeare)")
    out = tmp_path_factory.mktemp("gpt2_shakespeare")
    ctx = ExperimentContext(out_dir=out, data_root=DATA_ROOT, quick=True, progress=False)
    return ctx, run_experiment("gpt2-shakespeare", ctx)


def test_registered() -> None:
    assert "gpt2-shakespeare" in list_experiments()


def test_paper_config_is_the_paper_setting() -> None:
    c = paper_config()
    assert (c.n_layer, c.n_head, c.n_embd, c.n_inner, c.context) == (6, 4, 256, 1024, 256)
    assert (c.train.optimizer, c.train.lr, c.train.weight_decay) == ("adamw", 3e-4, 0.01)
    assert (c.train.schedule, c.train.warmup, c.train.batch_size) == ("cosine", 0.05, 32)
    assert c.train.patience is not None  # early stopping on validation
    assert c.tokens is None and c.points == 11 and c.wide_embd == 512
    assert paper_config().fingerprint() == c.fingerprint() != quick_config().fingerprint()


@pytest.mark.parametrize(
    "changes",
    [{"n_embd": 0}, {"wide_embd": 16}, {"n_embd": 30}, {"tokens": 100}, {"points": 1}],
)
def test_config_rejects_bad_values(changes: dict) -> None:
    with pytest.raises(ValueError):
        GPT2ShakespeareConfig(**changes)


def test_quick_rows_are_finite_and_orthogonal_wm_helps(quick_run) -> None:
    _, result = quick_run
    rows = {r["method"]: r for r in result.rows}
    # every rewrite and alignment keeps the models' functions: the paths share their ends
    ends = rows["vanilla"]["end_losses"]  # model A at t = 0, B at t = 1
    for name, row in rows.items():
        assert math.isfinite(row["barrier_loss"]), name
        if name.startswith("width"):  # the wide model at t = 0, A embedded in it at t = 1
            assert row["end_losses"][1] == pytest.approx(ends[0], abs=1e-4), name
        elif name.startswith("3 models"):  # vertices A, B, C
            assert row["end_losses"][:2] == pytest.approx(ends, abs=1e-4), name
        else:
            assert row["end_losses"] == pytest.approx(ends, abs=1e-4), name
    assert rows["WM (orthogonal)"]["barrier_loss"] <= rows["vanilla"]["barrier_loss"]
    assert rows["WM (orthogonal)"]["barrier_loss"] <= rows["vanilla (RMS form)"]["barrier_loss"]
    width = [r for name, r in rows.items() if name.startswith("width")]
    assert width[1]["barrier_loss"] <= width[0]["barrier_loss"]  # WM vs embedded unaligned
    # the narrow model is embedded exactly into the wide one's shape
    assert width[0]["embed_max_logit_diff"] < 1e-3
    simplex = [r for name, r in rows.items() if name.startswith("3 models")]
    assert simplex[1]["barrier_loss"] <= simplex[0]["barrier_loss"]
    # the query/key and value bases inside each head are spaces of the spec: aligning them
    # again inside matched heads (data-free) changes nothing, and the projected form comes
    # within 10 % of interpolating circuits, where nothing inside a head is left to
    # misalign (0.0138 both, measured)
    for base in ("WM (orthogonal)", "learned (orthogonal)"):
        with_bases = rows[f"{base} + head bases"]["barrier_loss"]
        assert with_bases == pytest.approx(rows[base]["barrier_loss"], abs=1e-3), base
    wm = rows["WM (orthogonal)"]["barrier_loss"]
    circuit = rows["WM (orthogonal), circuit form, unweighted tokens"]["barrier_loss"]
    assert wm <= 1.1 * circuit + 1e-3, (wm, circuit)
    # with token rows weighted by frequency (the reference's setting) these barely trained
    # models lose some of that (0.0235 against 0.0138, measured), but the barrier stays a
    # small fraction of the unaligned one
    for base, unaligned in (
        ("WM (orthogonal)", "vanilla"),
        ("3 models: universe matching", "3 models: unaligned"),
    ):
        circuits = rows[f"{base}, circuit form"]["barrier_loss"]
        assert circuits < 0.25 * rows[unaligned]["barrier_loss"], base
    width_unaligned = rows["width 64 vs 32: vanilla (embedded)"]["barrier_loss"]
    width_circuits = rows["width 64 vs 32: WM (orthogonal), circuit form"]["barrier_loss"]
    assert width_circuits < 0.5 * width_unaligned
    # the reference code's numbers sit beside the circuit-form rows
    assert rows["WM (orthogonal), circuit form"]["reference"] == "0.107 / 0.091"
    # t in steps of 0.1
    assert len(rows["vanilla"]["loss"]) == 11
    assert "paper" in result.table and "2.02" in result.table


def test_quick_writes_figures_and_reuses_its_cache(quick_run) -> None:
    ctx, result = quick_run
    assert len(result.figures) == 2
    for fig in result.figures:
        assert fig.exists() and fig.stat().st_size > 1000
    saved = json.loads((ctx.out_dir / "results.json").read_text())
    assert [r["method"] for r in saved["rows"]] == [r["method"] for r in result.rows]
    (root,) = [p for p in ctx.out_dir.iterdir() if p.name.startswith("quick-")]
    assert len(list((root / "models").iterdir())) == 4
    # a second run loads the checkpoints and stages: the same numbers
    again = run_experiment("gpt2-shakespeare", ctx)
    assert [r["barrier_loss"] for r in again.rows] == [r["barrier_loss"] for r in result.rows]


@needs_text
def test_dropout_models_embed_exactly_and_stages_run_data_free_first(tmp_path: Path) -> None:
    from dataclasses import replace

    from lmckit.experiments._gpt2_shakespeare import run_gpt2_shakespeare

    config = replace(quick_config(), dropout=0.1, simplex_resolution=2, universe_sweeps=1)
    config = replace(config, learned=replace(config.learned, steps=2, eval_every=1))
    logged: list[str] = []
    ctx = ExperimentContext(
        out_dir=tmp_path, data_root=DATA_ROOT, quick=True, progress=False, log=logged.append
    )
    rows = {r["method"]: r for r in run_gpt2_shakespeare(ctx, config).rows}
    # the exactness check runs in eval mode: dropout must not make it read a difference
    assert rows["width 64 vs 32: vanilla (embedded)"]["embed_max_logit_diff"] < 1e-3
    ran = [line.split("]")[0][1:] for line in logged if line.endswith("running")]
    first_learned = min(i for i, name in enumerate(ran) if name.startswith("learned"))
    assert "simplex-universe" in ran[:first_learned] and "width-wm-orth" in ran[:first_learned]
