"""What comes in as a bfloat16 / float16, sharded Hugging Face folder goes out as one:
the same dtype, the same shard files holding the same weights, the other files copied,
a model card, and ``from_pretrained`` computing B's function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from tests.tiny_models import auto_load, build_hf_folder

import lmckit
from lmckit.cli import main
from lmckit.hf._layout import INDEX_FILE, stored_layout
from lmckit.symmetry._average import interpolate

CARD = "---\nlicense: mit\n---\n\n# the source model\n\nTrained on nothing at all.\n"


def _folder(path: Path, seed: int, dtype: torch.dtype, shard_size: int | None) -> Path:
    build_hf_folder("llama", path, seed=seed, dtype=dtype, shard_size=shard_size)
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {}}}))
    (path / "README.md").write_text(CARD)
    return path


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    return out


def _run(*args: object) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def sharded_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bf16")
    # shards of at most 12 kB: the tiny Llama's 36 kB of bfloat16 weights in 3+ files
    return (
        _folder(root / "a", 0, torch.bfloat16, 12_000),
        _folder(root / "b", 1, torch.bfloat16, 12_000),
    )


def test_align_keeps_dtype_shards_files_and_writes_a_card(sharded_pair, tmp_path) -> None:
    a, b = sharded_pair
    out = tmp_path / "aligned"
    _run("align", a, b, "--symmetry", "permutation", "--out", out, "--quiet")
    source, written = stored_layout(b), stored_layout(out)
    assert source.shards is not None and len(set(source.shards.values())) >= 3
    # the same weights in the same shard files, an index, bfloat16 throughout
    assert written.shards == source.shards and written.dtype == torch.bfloat16
    assert (out / INDEX_FILE).is_file() and not (out / "model.safetensors").exists()
    assert {f.name for f in out.glob("*.safetensors")} == set(source.shards.values())
    # config.json as B's (its dtype included), but for the writing library's version
    config, config_b = (json.loads((f / "config.json").read_text()) for f in (out, b))
    config.pop("transformers_version", None)
    config_b.pop("transformers_version", None)
    assert config == config_b and config["dtype"] == "bfloat16"
    assert (out / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    # permutations move bfloat16 values without rounding: every tensor holds B's values
    got, want = _tensors(out), _tensors(b)
    assert got.keys() == want.keys()
    moved = 0
    for key, value in want.items():
        assert got[key].dtype == torch.bfloat16
        assert torch.equal(got[key].flatten().sort().values, value.flatten().sort().values), key
        moved += not torch.equal(got[key], value)
    assert moved > 0
    # B's function, loaded by transformers
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits_out = auto_load("llama", out)(ids).logits.float()
        logits_b = auto_load("llama", b)(ids).logits.float()
    torch.testing.assert_close(logits_out, logits_b, rtol=0, atol=1e-2)
    # the card: the source's front matter on top, what was done, the source's card below
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: mit\n---\n")
    assert "| method | weight_matching |" in card and f"| aligned to | {a} |" in card
    assert "| stored as | bfloat16 |" in card
    assert "## The source's model card" in card and "Trained on nothing at all." in card


def test_the_sources_tensors_go_straight_into_its_shards(sharded_pair, tmp_path, monkeypatch):
    """Aligned weights are the source's tensors under its names and shapes: each is
    written into the source's shard files as it is read, without a transformers model
    built around them (that would hold a second copy of the model)."""
    import lmckit.hf._save as save
    from lmckit.formats._io import save_model

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a module was built to write the weights")

    monkeypatch.setattr(save, "build_module", refuse)
    a, b = sharded_pair
    out = tmp_path / "rotated"
    _run("align", a, b, "--symmetry", "orthogonal", "--out", out, "--quiet")
    # B and A with their norm scales folded, rotated, stored as B is
    assert stored_layout(out) == stored_layout(b) == stored_layout(out / "reference")
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits_out = auto_load("llama", out)(ids).logits.float()
        logits_b = auto_load("llama", b)(ids).logits.float()
        logits_ref = auto_load("llama", out / "reference")(ids).logits.float()
        logits_a = auto_load("llama", a)(ids).logits.float()
    torch.testing.assert_close(logits_out, logits_b, rtol=0, atol=5e-2)
    torch.testing.assert_close(logits_ref, logits_a, rtol=0, atol=5e-2)
    # a changed config is not the source's layout: transformers builds and saves it
    loaded = lmckit.load_model(b)
    with pytest.raises(AssertionError, match="a module was built"):
        save_model(tmp_path / "eps", loaded, loaded.params, config_changes={"rms_norm_eps": 1e-5})


def test_dtype_option_and_the_library_store_what_is_asked(sharded_pair, tmp_path) -> None:
    a, b = sharded_pair
    out = tmp_path / "f32"
    _run("align", a, b, "--dtype", "float32", "--out", out, "--quiet")
    assert stored_layout(out).dtype == torch.float32
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    aligned = lmckit.align(a, b)
    saved = aligned.save(tmp_path / "lib")
    assert stored_layout(saved) == stored_layout(tmp_path / "lib")
    assert stored_layout(saved).dtype == torch.bfloat16
    assert stored_layout(saved).shards == stored_layout(b).shards
    half = aligned.save(tmp_path / "half", dtype=torch.float16)
    assert stored_layout(half).dtype == torch.float16


def test_merge_keeps_the_storage_too(sharded_pair, tmp_path) -> None:
    a, b = sharded_pair
    out = tmp_path / "merged"
    _run("merge", a, b, "--t", "0.25", "--out", out)
    assert stored_layout(out) == stored_layout(a)
    assert "| model A (t = 0) |" in (out / "README.md").read_text()
    # the average each tensor is written as: summed in float32, rounded once
    got, want = _tensors(out), interpolate(_tensors(a), _tensors(b), 0.25)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_float16_single_file_stays_one(tmp_path) -> None:
    a = _folder(tmp_path / "a", 0, torch.float16, None)
    b = _folder(tmp_path / "b", 1, torch.float16, None)
    out = tmp_path / "out"
    _run("align", a, b, "--out", out, "--quiet")
    layout = stored_layout(out)
    assert layout.dtype == torch.float16 and layout.shards is None
    assert (out / "model.safetensors").is_file() and not (out / INDEX_FILE).exists()


def test_dtype_for_a_checkpoint_output_is_refused(tmp_path) -> None:
    from lmckit.models import create_model

    for name, seed in (("a", 0), ("b", 1)):
        model, params = create_model("mlp", seed=seed, in_features=4, hidden=[8], out_features=3)
        lmckit.save(tmp_path / name, model, params)
    result = CliRunner().invoke(
        main, ["align", str(tmp_path / "a"), str(tmp_path / "b"), "--dtype", "bfloat16",
               "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "--dtype bfloat16 is for Hugging Face outputs" in result.output
    assert not (tmp_path / "o").exists()


def test_a_pair_stored_in_two_dtypes_is_refused(sharded_pair, tmp_path) -> None:
    a, _ = sharded_pair
    b = _folder(tmp_path / "b32", 1, torch.float32, None)
    result = CliRunner().invoke(main, ["align", str(a), str(b), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "stored in different dtypes (bfloat16 and float32)" in result.output
    assert not (tmp_path / "o").exists()


def test_barrier_measures_bfloat16_folders_in_float32_as_stored(
    sharded_pair, tmp_path, monkeypatch
) -> None:
    """The endpoints stay bfloat16 (no float32 copy of either); each point is built in
    float32, so the path is the one measured on float32 loads of the same files."""
    from tests.hf.test_cli_hf import _char_tokenizer

    import lmckit.cli._barrier as barrier_cli
    from lmckit.data import load_data
    from lmckit.hf import load_hf
    from lmckit.measure._measure import EvalSettings, measure_path

    seen: list[torch.dtype] = []
    measure = barrier_cli.pair_barrier

    def spy(a, b, *args, **kwargs):  # the endpoints as the path evaluation gets them
        seen.extend({v.dtype for m in (a, b) for v in m.params.values()})
        return measure(a, b, *args, **kwargs)

    monkeypatch.setattr(barrier_cli, "pair_barrier", spy)
    a, b = sharded_pair
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    spec = f"text:{text},tokenizer={_char_tokenizer(tmp_path / 'tok', text)},block=8"
    _run("barrier", a, b, "--data", spec, "--points", 5, "--json", tmp_path / "p.json",
         "--quiet")  # fmt: skip
    path = json.loads((tmp_path / "p.json").read_text())
    wide_a, wide_b = load_hf(a), load_hf(b)  # float32, as the command once loaded them
    assert wide_a.params["lm_head.weight"].dtype == torch.float32
    ref = measure_path(wide_a.module, wide_a.params, wide_b.params, load_data(spec),
                       EvalSettings(points=5))  # fmt: skip
    assert path["loss"] == pytest.approx(ref.loss, abs=1e-6)
    assert set(seen) == {torch.bfloat16}
