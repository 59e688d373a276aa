"""A norm of the queries and keys before rotary positions ("qk-norm"), as a rule.

``g * x / rms(x)`` over each head's features with one weight for all heads (Qwen3), or over
the whole projection with a weight per feature of every head (OLMo2). The ``rms`` is
invariant under any orthogonal map; the weight ``g`` is applied after it, so a map ``Q``
of a head's query/key rows survives only if ``diag(g) Q diag(g)^-1`` is orthogonal and
commutes with the rotary planes: for a weight that differs from feature to feature, a
sign per plane (:class:`~lmckit.groups.PlaneSigns`). Heads, key/value groups and the query
heads of a group still permute (OLMo2's weight moving with its heads), value bases stay.
A weight declared one value throughout (``uniform``: a folded scale) keeps every rotation
of the planes; one that only happens to be ones on a model does not count.

These used to stop every command with one error line (an axis claimed by two spaces; a
rotation acting on a norm's weight). The plants are written from the architectures' math
on the Hugging Face parameter names, not from lmckit's spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tests.inference.tiny_hf import DECODER, outputs, params_of, recover, relative, tiny
from tests.planters import distance, orthogonal, plane_rotation

from lmckit.aligners import weight_matching
from lmckit.cli import main
from lmckit.groups import PlaneSigns, RotaryPlanes
from lmckit.hf import example_inputs, load_hf
from lmckit.inference import analyze_symmetries
from lmckit.symmetry._transform import apply

HEAD_DIM, GROUPS, PER_GROUP = 8, 2, 2
HEADS = GROUPS * PER_GROUP


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    config, cls = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                   "olmo2": ("Olmo2Config", "Olmo2ForCausalLM")}[family]  # fmt: skip
    return tiny(config, cls, seed=seed, **DECODER, head_dim=HEAD_DIM)


def _components(spec) -> dict[str, set]:  # type: ignore[no-untyped-def]
    """Per kind of nested space, the groups it has."""
    out: dict[str, set] = {}
    for s in spec:
        if s.nest is not None:
            out.setdefault(s.nest.kind, set()).add(s.group)
    return out


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_heads_groups_value_bases_and_plane_signs_are_found(family: str) -> None:
    model = _model(family)
    analysis = analyze_symmetries(model, example_inputs(model))
    found = _components(analysis.spec)
    assert {"query", "value", "qk"} <= set(found), analysis.left_out
    assert found["qk"] == {PlaneSigns(HEAD_DIM)}
    heads = [s for s in analysis.spec if s.name in ("heads.0", "heads.1")]
    assert [s.n for s in heads] == [GROUPS, GROUPS]
    if family == "olmo2":  # the weight over the whole projection moves with its heads
        moved = {(u.param, u.role) for s in heads for u in s.uses}
        assert ("model.layers.0.self_attn.q_norm.weight", "elementwise") in moved


def _q_rows(head: int) -> torch.Tensor:
    return torch.arange(head * HEAD_DIM, (head + 1) * HEAD_DIM)


def _plant(params: dict[str, torch.Tensor], family: str, seed: int, *, rotate: bool = False):  # type: ignore[no-untyped-def]
    """Per layer: the key/value groups permuted, the query heads of each group permuted,
    a value basis per key/value head, and per group a sign of each rotary plane (or,
    with ``rotate``, a rotation of each plane) on its key head and query heads."""
    gen = torch.Generator().manual_seed(seed)
    out = {k: v.clone().double() for k, v in params.items()}
    for layer in range(2):
        at = f"model.layers.{layer}.self_attn"
        q, k, v, o = (out[f"{at}.{p}_proj.weight"] for p in "qkvo")
        groups = torch.randperm(GROUPS, generator=gen)
        # query head i of the result is old head order[i]
        within = [torch.randperm(PER_GROUP, generator=gen) for _ in groups]
        order = torch.cat([g * PER_GROUP + w for g, w in zip(groups, within, strict=True)])
        q_rows = torch.cat([_q_rows(int(h)) for h in order])
        kv_rows = torch.cat([_q_rows(int(g)) for g in groups])
        q, o, k, v = q[q_rows], o[:, q_rows], k[kv_rows], v[kv_rows]
        if family == "olmo2":  # the norms' weights span the projections: they move along
            out[f"{at}.q_norm.weight"] = out[f"{at}.q_norm.weight"][q_rows]
            out[f"{at}.k_norm.weight"] = out[f"{at}.k_norm.weight"][kv_rows]
        for g in range(GROUPS):
            value = orthogonal(HEAD_DIM, gen)
            v[_q_rows(g)] = value @ v[_q_rows(g)]
            if rotate:
                basis = plane_rotation(HEAD_DIM, gen)
            else:
                signs = torch.randint(0, 2, (HEAD_DIM // 2,), generator=gen) * 2.0 - 1.0
                basis = torch.diag(torch.cat([signs, signs])).double()
            k[_q_rows(g)] = basis @ k[_q_rows(g)]
            for head in range(g * PER_GROUP, (g + 1) * PER_GROUP):
                q[_q_rows(head)] = basis @ q[_q_rows(head)]
                o[:, _q_rows(head)] = o[:, _q_rows(head)] @ value.T
        for p, w in zip("qkvo", (q, k, v, o), strict=True):
            out[f"{at}.{p}_proj.weight"] = w
    return {key: value.float() for key, value in out.items()}


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_align_undoes_a_planted_element(family: str) -> None:
    model = _model(family)
    planted = _plant(params_of(model), family, seed=4)
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    found = recover(model, planted)
    assert found.before > 0.5
    assert found.after / found.before < 1e-4, found
    assert found.function < 1e-5


def test_a_norm_weight_declared_one_value_keeps_every_rotation_of_the_planes() -> None:
    model = _model("qwen3")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
    norms = [k for k in params_of(model) if "_norm." in k]
    # weights that are ones on this model only are no rule: a rotation that keeps its
    # function would move a trained weight, so only the signs are proposed
    spec = analyze_symmetries(model, example_inputs(model)).spec
    assert _components(spec)["qk"] == {PlaneSigns(HEAD_DIM)}
    # declared one value throughout (folded), the weight keeps every rotation
    spec = analyze_symmetries(model, example_inputs(model), uniform=norms).spec
    assert _components(spec)["qk"] == {RotaryPlanes(HEAD_DIM)}
    a = params_of(model)
    planted = _plant(a, "qwen3", seed=6, rotate=True)
    assert relative(outputs(model), outputs(model, planted)) < 1e-5
    moved = apply(spec, planted, weight_matching(spec, a, planted).transform)
    assert distance(a, moved) / distance(a, planted) < 1e-4


@pytest.mark.parametrize("family", ["qwen3", "olmo2"])
def test_the_command_line_lists_and_aligns_a_planted_pair(family: str, tmp_path: Path) -> None:
    model = _model(family)
    model.save_pretrained(tmp_path / "a")
    planted = _plant(params_of(model), family, seed=8)
    model.load_state_dict(planted)
    model.save_pretrained(tmp_path / "b")
    listing = CliRunner().invoke(main, ["symmetries", str(tmp_path / "a")])
    assert listing.exit_code == 0, listing.output
    assert "PlaneSigns(8)" in listing.output and "Error" not in listing.output
    result = CliRunner().invoke(
        main,
        ["align", str(tmp_path / "a"), str(tmp_path / "b"), "--method", "weight",
         "--no-circuits", "--out", str(tmp_path / "out"), "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    a, b, out = (load_hf(tmp_path / n).params for n in ("a", "b", "out"))
    assert distance(a, out) / distance(a, b) < 1e-4
