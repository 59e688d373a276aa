"""Weight matching at the floor: similarities updated by what moved equal the ones
computed from scratch, the skipped spaces are exactly those whose subproblem did not
change, and the sweep loop returns what the plain loop returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmckit.aligners import WeightMatchingConfig, weight_matching
from lmckit.aligners._weight.folding import fold_single_use_params
from lmckit.aligners._weight.incremental import SimilarityCache
from lmckit.aligners._weight.similarity import space_problem
from lmckit.forms._rewrites import layernorm_to_rmsnorm
from lmckit.groups import Orthogonal
from lmckit.models import create_model
from lmckit.symmetry._draw import random_transform
from lmckit.symmetry._params import Float32View, LazyParams, Params
from lmckit.symmetry._transform import Permutation, Space, SymmetrySpec, Transform, Use, apply

GPT2 = {"vocab_size": 17, "n_layer": 2, "n_head": 4, "n_embd": 16, "n_inner": 24, "context": 8}
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("mlp", {"in_features": 12, "hidden": [16, 16, 16], "out_features": 3}),
    "resnet20": ("resnet20", {"in_channels": 1, "num_classes": 3, "width_mult": 1}),
    "vgg": (
        "vgg",
        {"in_channels": 1, "num_classes": 3, "image_size": 8, "widths": [8, "M", 16, "M"]},
    ),
    "gpt2-perm": ("gpt2", GPT2),
    "gpt2-orth": ("gpt2", GPT2),
}


def _pair(case: str) -> tuple[SymmetrySpec, Params, Params]:
    name, kwargs = MODELS[case]
    pairs = []
    for seed in (0, 1):
        module, params = create_model(name, seed=seed, **kwargs)
        gen = torch.Generator().manual_seed(seed + 5)
        # distinct values everywhere (zero biases and unit norm scales would hide terms)
        params = {
            k: v + 0.1 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in params.items()
        }
        if name == "gpt2":
            module, params = layernorm_to_rmsnorm(module, params)
        pairs.append(params)
    spec = module.symmetry_spec()
    if case == "gpt2-perm":
        spec = spec.with_groups(residual=Permutation())
    ref = {k: v.float() for k, v in pairs[0].items() if v.is_floating_point()}
    other = {k: v.float() for k, v in pairs[1].items() if v.is_floating_point()}
    fold_single_use_params(spec, ref, other)
    return spec, ref, other


def _nudge(spec: SymmetrySpec, transform: Transform, seed: int, swaps: int) -> Transform:
    """``transform`` with ``swaps`` pairs of entries exchanged in every index element."""
    gen = torch.Generator().manual_seed(seed)
    elements = dict(transform.elements)
    for space in spec:
        if not space.group.gathers:
            continue
        element = elements[space.name].clone()
        for _ in range(swaps):
            i, j = torch.randperm(element.numel(), generator=gen)[:2].tolist()
            element[[i, j]] = element[[j, i]]
        elements[space.name] = element
    return Transform(spec, elements)


@pytest.mark.parametrize("case", MODELS)
def test_updated_similarities_equal_the_ones_from_scratch(case: str, monkeypatch) -> None:
    spec, ref, other = _pair(case)
    cache = SimilarityCache(spec, ref, other)
    updates = 0
    update = SimilarityCache._update

    def counted(self, *args):
        nonlocal updates
        updates += 1
        return update(self, *args)

    monkeypatch.setattr(SimilarityCache, "_update", counted)
    start = random_transform(spec, 0)
    # a random start (from scratch), a few moved units (rank-k updates), then a new
    # random draw (too many moved: recomputed)
    steps = [start, _nudge(spec, start, 1, 1), _nudge(spec, start, 2, 2), random_transform(spec, 3)]
    for transform in steps:
        for space in spec:
            got = cache.problem(space, transform).sim
            want = space_problem(spec, space, ref, other, transform).sim
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if case != "gpt2-orth":  # an orthogonal residual leaves little to follow by index
        assert updates > 0


@pytest.mark.parametrize("case", ["mlp", "resnet20", "gpt2-perm", "gpt2-orth"])
def test_a_subproblem_reads_only_the_spaces_it_depends_on(case: str) -> None:
    spec, ref, other = _pair(case)
    cache = SimilarityCache(spec, ref, other)
    base = random_transform(spec, 0)
    draw = random_transform(spec, 1)
    for space in spec:
        deps = cache.depends_on(space.name)
        moved = base.replace(**{s.name: draw[s.name] for s in spec if s.name not in deps})
        before = space_problem(spec, space, ref, other, base).sim
        after = space_problem(spec, space, ref, other, moved).sim
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


# the loops below both start from the identity: what is compared is the sweep loop
#: the textbook loop below sweeps until no space improves: no stall rule either
FROM_IDENTITY = WeightMatchingConfig(start="identity", sweep_tol=0.0)


def _plain_weight_matching(
    spec: SymmetrySpec, ref: Params, other: Params, seed: int
) -> tuple[Transform, int]:
    """The textbook loop: every space, every sweep, every similarity from scratch."""
    gen = torch.Generator().manual_seed(seed)
    transform = Transform(spec, {s.name: s.group.identity(s.n) for s in spec})
    names = list(spec.names)
    for sweep in range(1, 101):
        improved = False
        for idx in torch.randperm(len(names), generator=gen).tolist():
            space = spec[names[idx]]
            problem = space_problem(spec, space, ref, other, transform)
            element = space.group.solve_subproblem(problem)
            new = space.group.objective(element, problem.sim)
            old = space.group.objective(transform[space.name], problem.sim)
            if new > old + 1e-9 * max(abs(old), 1.0):
                transform = transform.replace(**{space.name: element})
                improved = True
        if not improved:
            return transform, sweep
    return transform, 100


@pytest.mark.parametrize("case", ["mlp", "resnet20", "gpt2-perm"])
def test_the_sweep_loop_returns_what_the_plain_loop_returns(case: str) -> None:
    spec, ref, other = _pair(case)
    want, sweeps = _plain_weight_matching(spec, ref, other, seed=4)
    got = weight_matching(spec, ref, other, FROM_IDENTITY, seed=4)
    assert got.converged and got.iterations == sweeps
    for space in spec:
        assert torch.equal(got.transform[space.name], want[space.name]), space.name


def _total(spec: SymmetrySpec, ref: Params, other: Params, transform: Transform) -> float:
    moved = apply(spec, other, transform)
    return sum(float((ref[k].double() * moved[k].double()).sum()) for k in ref)


def test_an_orthogonal_residual_reaches_the_plain_loops_objective() -> None:
    # the cached sums add the same terms in another order: round-off can move the last
    # sweep of a continuous group across the tolerance, not the answer
    spec, ref, other = _pair("gpt2-orth")
    want, sweeps = _plain_weight_matching(spec, ref, other, seed=4)
    got = weight_matching(spec, ref, other, FROM_IDENTITY, seed=4)
    assert got.converged and abs(got.iterations - sweeps) <= 1
    assert _total(spec, ref, other, got.transform) == pytest.approx(
        _total(spec, ref, other, want), rel=1e-5
    )


def test_trained_pair_matches_the_plain_loop(mlp_pair) -> None:
    spec = mlp_pair.model.symmetry_spec()
    want, sweeps = _plain_weight_matching(spec, mlp_pair.a, mlp_pair.b, seed=0)
    got = weight_matching(spec, mlp_pair.a, mlp_pair.b, FROM_IDENTITY)
    assert got.iterations == sweeps
    for name in spec.names:
        assert torch.equal(got.transform[name], want[name])


def test_no_cache_budget_gives_the_same_answer(monkeypatch) -> None:
    spec, ref, other = _pair("mlp")
    full = weight_matching(spec, ref, other, WeightMatchingConfig(), seed=2)
    init = SimilarityCache.__init__

    def starved(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "budget": 0})

    monkeypatch.setattr(SimilarityCache, "__init__", starved)
    bare = weight_matching(spec, ref, other, WeightMatchingConfig(), seed=2)
    assert bare.iterations == full.iterations
    for name in spec.names:
        assert torch.equal(bare.transform[name], full.transform[name])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["mlp", "gpt2-perm", "gpt2-orth"])
def test_cuda_products_give_the_cpu_answer(case: str) -> None:
    # similarities (and their cached updates) on the GPU, solvers on the CPU
    spec, ref, other = _pair(case)
    on_cpu = weight_matching(spec, ref, other, seed=4)
    on_gpu = weight_matching(spec, ref, other, seed=4, device="cuda")
    assert on_gpu.iterations == on_cpu.iterations or case == "gpt2-orth"
    for space in spec:
        got, want = on_gpu.transform[space.name], on_cpu.transform[space.name]
        assert got.device.type == "cpu"
        if space.group.gathers and case != "gpt2-orth":
            assert torch.equal(got, want), space.name
    assert _total(spec, ref, other, on_gpu.transform) == pytest.approx(
        _total(spec, ref, other, on_cpu.transform), rel=1e-5
    )


def test_a_use_region_moved_alone_equals_the_region_of_the_moved_parameter(monkeypatch) -> None:
    # a Llama with grouped-query heads: query heads within groups, value bases and rotary
    # planes live in slices of q/k/v/o_proj, which the residual map rotates across
    transformers = pytest.importorskip("transformers")
    from tests.tiny_models import FAMILIES

    from lmckit.aligners._weight.similarity import moved_region
    from lmckit.forms._recipe import aligned_form
    from lmckit.symmetry._transform import apply_to_param

    family = FAMILIES["llama"]
    config = getattr(transformers, family.config)(**family.kwargs, use_cache=False)
    pair = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module = getattr(transformers, family.model)(config).eval()
        pair.append({k: v.detach().clone() for k, v in module.state_dict().items()})
    form = aligned_form(module, pair[0], pair[1], symmetry="orthogonal")
    transform = random_transform(form.spec, torch.Generator().manual_seed(3))
    sliced = 0
    for space in form.spec:
        for use in space.uses:
            value = form.b[use.param]
            got = moved_region(form.spec, use.param, use.parts, value, transform,
                               skip_use=(space.name, use))  # fmt: skip
            whole = apply_to_param(
                form.spec, use.param, value, transform, skip_use=(space.name, use)
            )
            torch.testing.assert_close(got, use.region(whole), rtol=1e-5, atol=1e-6)
            sliced += bool(use.parts)
    assert sliced >= 8  # the slices were there to be moved alone
    # heads nested in one key/value group read that group's rows only: its circuits
    # are the same from the moved rows as from the whole moved projections
    from lmckit.aligners._weight import similarity as similarity

    nested = [s for s in form.spec if s.circuits is not None and s.nest is not None]
    assert nested
    shapes = {k: v.shape for k, v in form.b.items()}
    assert all(similarity._unit_slices(s, shapes) for s in nested)
    sliced_sims = [space_problem(form.spec, s, form.a, form.b, transform).sim for s in nested]
    monkeypatch.setattr(similarity, "_unit_slices", lambda space, shapes: {})
    whole_sims = [space_problem(form.spec, s, form.a, form.b, transform).sim for s in nested]
    for got, want in zip(sliced_sims, whole_sims, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class _RowsOnly(LazyParams):
    """A lazy model that can be read a block of rows at a time and refuses whole reads of
    its large matrices (what a fold must not do with a vocabulary-sized embedding)."""

    def __getitem__(self, key: str) -> torch.Tensor:
        value = self.source[key]
        if value.ndim == 2 and value.shape[0] > 20:
            raise AssertionError(f"{key} read whole")
        return value

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        return self.source[key][start:stop]

    def dtype_of(self, key: str) -> torch.dtype:
        return self.source[key].dtype

    def meta(self, key: str) -> torch.Tensor:
        return torch.empty_like(self.source[key], device="meta")


def test_a_large_single_use_matrix_is_folded_a_block_of_rows_at_a_time(monkeypatch) -> None:
    from lmckit.aligners._weight import folding

    gen = torch.Generator().manual_seed(0)
    a = {"w": torch.randn(100, 6, generator=gen).to(torch.bfloat16), "b": torch.randn(6)}
    b = {"w": torch.randn(100, 6, generator=gen).to(torch.bfloat16), "b": torch.randn(6)}
    uses = (Use("w", 1, "read"), Use("b", 0, "write"))
    spec = SymmetrySpec((Space("s", 6, Orthogonal(), uses),))
    monkeypatch.setattr(folding, "FOLD_BLOCK_BYTES", 4 * 6 * 7)  # blocks of 7 rows
    ref, other = Float32View(_RowsOnly(a)), Float32View(_RowsOnly(b))
    fold_single_use_params(spec, ref, other)
    expected = a["w"].double().T @ b["w"].double()
    torch.testing.assert_close(other["w"].double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(ref["w"], torch.eye(6))
    assert torch.equal(other["b"], b["b"])  # not a large matrix: left as it is


class _Counted(LazyParams):
    """A lazy model that counts how often each tensor is computed."""

    def __init__(self, source: Params) -> None:
        super().__init__(source)
        self.reads: dict[str, int] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        self.reads[key] = self.reads.get(key, 0) + 1
        return self.source[key]

    def dtype_of(self, key: str) -> torch.dtype:
        return self.source[key].dtype

    def meta(self, key: str) -> torch.Tensor:
        return torch.empty_like(self.source[key], device="meta")


def test_a_subproblem_computes_each_parameter_it_reads_once(monkeypatch) -> None:
    spec, ref, other = _pair("gpt2-perm")
    lazy_ref, lazy_other = _Counted(ref), _Counted(other)
    cache = SimilarityCache(spec, Float32View(lazy_ref), Float32View(lazy_other))
    assert lazy_ref.reads == lazy_other.reads == {}  # shapes are not values
    base, nudged = random_transform(spec, 0), _nudge(spec, random_transform(spec, 0), 1, 1)
    for transform in (base, base, nudged):  # first solve, kept sum, rank-k update
        for space in spec:
            lazy_other.reads.clear()
            got = cache.problem(space, transform).sim
            torch.testing.assert_close(
                got, space_problem(spec, space, ref, other, transform).sim, rtol=1e-5, atol=1e-5
            )
            assert set(lazy_other.reads.values()) <= {1}, (space.name, lazy_other.reads)
