"""Function-preserving rewrites of transformer zoo models that expose more symmetry.

* :func:`layernorm_to_rmsnorm`: LayerNorm ``LN(x) = g * (x - mean(x)) / sigma(x) + b``
  becomes an affine-free RMSNorm. Every writer of the stream the LayerNorms read is
  projected onto the zero-mean subspace, ``W <- (I - 1 1^T / d) W``, so the stream always
  has mean zero, where ``LN(x) = g * x / rms(x) + b`` (``sigma`` and ``rms`` agree,
  ``eps`` included). ``g`` and ``b`` are folded into each reader ``R x + c``:
  ``R <- R diag(g)``, ``c <- c + R b``. The RMSNorm commutes with every orthogonal map,
  so the new model's residual space is ``Orthogonal``.
* :func:`~lmckit.forms._widen.embed_in_wider` (:mod:`lmckit.forms._widen`): a rectangular
  orthogonal map ``O`` (``m x n``, ``O^T O = I``) embeds an RMSNorm model of residual
  width ``n`` into one of width ``m`` exactly: head and MLP units are padded with zero
  units (queries rescaled by ``sqrt(head_dim' / head_dim)`` to undo the wider attention
  scale), readers of the norms rescaled by ``sqrt(n / m)`` and ``eps`` by ``n / m``.
* :func:`heads_to_circuits`: every attention head is replaced by its QK and OV circuit
  (:class:`~lmckit.models._transformer_blocks.CircuitAttention`), "multiplying out" the
  within-head bases. Interpolating two models in this form interpolates their circuits,
  the form in which Generalized LMC for Transformers (2025) merges heads; the
  interpolated model is a circuit-form model (heads of width ``d``, not ``d / heads``).

What each rewrite changes is read from the model's traced graph and inferred spec
(:mod:`lmckit.inference`): which stream the norms scale and who writes it, which layers read
each norm, where the heads' projections are. The zoo class contributes only its
constructor changes for the new form (:class:`Rewritable`). The first two rewrites need
projected heads: rewrite norms and widths before circuits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import torch
from torch import Tensor

from lmckit.groups import HeadPermutation
from lmckit.inference._fold import Reader, readers_of
from lmckit.inference._infer import SymmetryAnalysis, analyze_symmetries
from lmckit.models._registry import ModelConfig, ZooModel, build_zoo_model
from lmckit.symmetry._params import Params
from lmckit.symmetry._transform import (
    CircuitPart,
    Space,
    SymmetrySpec,
    Use,
)

__all__ = [
    "Rewritable",
    "centred_streams",
    "check_rewritten_keys",
    "folded_readers",
    "heads_to_circuits",
    "layernorm_to_rmsnorm",
    "norm_readers",
    "rebuilt",
    "rewrite_analysis",
    "shared_weights",
]


class Rewritable(Protocol):
    """What a zoo model tells the rewrites: the constructor changes of its other forms."""

    config: ModelConfig

    def example_inputs(self) -> tuple[Tensor, ...]: ...

    def untied(self, params: Params) -> Params:
        """``params`` with every shared weight stored once per user."""
        ...

    def rms_kwargs(self) -> dict[str, Any]:
        """Constructor changes of the RMSNorm form."""
        ...

    def widened_kwargs(self, width: int, inner: int) -> dict[str, Any]:
        """Constructor changes of a wider model."""
        ...


def rewrite_analysis(module: ZooModel) -> SymmetryAnalysis:
    """The module's analysis, its spec cut to the streams, whole heads and units (the
    rewrites change those; bases nested inside heads move with whatever they become)."""
    # the zoo's spec is verified when first inferred; the rewrites read the same graph
    analysis = analyze_symmetries(
        module, module.example_inputs(), names=module.space_names, check=False
    )
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    outer = tuple(_tiled(s, shapes) for s in analysis.spec if not s.enclosed)
    return dataclasses.replace(analysis, spec=SymmetrySpec(outer, analysis.spec.meta))


def _tiled(space: Space, shapes: dict[str, tuple[int, ...]]) -> Space:
    """``space`` with the uses of every equal block of one axis (a fused projection's
    query, key and value rows) made one use of the whole axis read as blocks
    (``outer``): the rewrites change the widths, which a use of a fixed slice cannot."""
    blocks: dict[tuple[str, int, str], list[Use]] = {}
    for use in space.uses:
        if len(use.parts) == 1 and use.parts[0].axis == use.axis and use.outer == 1:
            blocks.setdefault((use.param, use.axis, use.role), []).append(use)
    uses = list(space.uses)
    for (param, axis, _), found in blocks.items():
        length = found[0].parts[0].length
        starts = sorted(u.parts[0].start for u in found)
        whole = shapes[param][axis]
        same = all(u.parts[0].length == length and u.inner == 1 for u in found)
        if not same or starts != list(range(0, whole, length)):
            continue
        at = uses.index(found[0])
        uses = [u for u in uses if u not in found]
        tiled = Use(param, axis, found[0].role, outer=len(found), compare=found[0].compare)
        uses.insert(at, tiled)
    return dataclasses.replace(space, uses=tuple(uses))


def rebuilt(module: ZooModel, changes: dict[str, Any]) -> ZooModel:
    config = ModelConfig(module.config.name, {**module.config.kwargs, **changes})
    # the weights are replaced; fork the RNG so building leaves no trace in it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        new = build_zoo_model(config)
    new.train(module.training)
    return new


def check_rewritten_keys(module: ZooModel, params: Params) -> None:
    want = set(module.state_dict())
    if set(params) != want:
        raise ValueError(
            f"rewrite produced keys {sorted(set(params) ^ want)} that do not fit the new model"
        )


def _center(x: Tensor, axis: int) -> Tensor:
    """Project ``x`` onto the zero-mean subspace along ``axis``: ``x - mean(x)``."""
    x64 = x.double()
    return (x64 - x64.mean(dim=axis, keepdim=True)).to(x.dtype)


def norm_readers(
    analysis: SymmetryAnalysis, kind: str, module: ZooModel
) -> list[tuple[str, str, list[Reader]]]:
    """``(scale key, shift key, readers)`` of every norm of ``kind`` in ``module``'s graph."""
    params = dict(analysis.traced.params)
    nodes = {n.name: n for n in analysis.traced.graph.nodes}
    out = []
    for site in analysis.scales:
        if site.kind != kind:
            continue
        found = readers_of(nodes[site.node], params)
        if isinstance(found, str):
            # a model in circuit form reads its norms through QK circuits, which take
            # no scale; any other reader that is not linear (an activation) cannot either
            why = (
                "the rewrite needs projected heads; rewrite norms and widths before "
                "heads_to_circuits"
                if module.config.kwargs.get("attention") == "circuits"
                else "only linear layers reading a norm can take its scale"
            )
            raise ValueError(
                f"the {kind} norm {site.node!r} of {module.config.name} cannot be folded "
                f"into its readers ({found}): {why}"
            )
        scale = params[site.weight] if site.weight else ""
        shift = params[site.bias] if site.bias else ""
        out.append((scale, shift, found))
    return out


def shared_weights(analysis: SymmetryAnalysis) -> set[str]:
    """Parameters the graph uses more than once (tied weights)."""
    users: dict[str, int] = {}
    for node in analysis.traced.graph.nodes:
        if node.op == "placeholder" and node.name in analysis.traced.params:
            key = analysis.traced.params[node.name]
            users[key] = users.get(key, 0) + len(node.users)
    return {k for k, n in users.items() if n > 1}


def _untie(reader: Reader, params: Params, work: Params, shared: set[str]) -> Reader:
    """The reader's own copy of a shared weight (the untied layout's extra key)."""
    if reader.weight not in shared:
        return reader
    copies = [k for k in work if k not in params and torch.equal(work[k], params[reader.weight])]
    if len(copies) != 1:
        raise ValueError(f"{reader.weight!r} is shared and has no separate untied copy")
    return Reader(copies[0], reader.axis, None)


def _reader_keys(
    readers: list[Reader], params: Params, work: Params, shared: set[str]
) -> list[tuple[Reader, str]]:
    """Each reader as :func:`layernorm_to_rmsnorm` writes it (a tied weight's own untied
    copy, from ``work``), and the key of its bias there (made when it has none)."""
    out = []
    for reader in (_untie(r, params, work, shared) for r in readers):
        out.append((reader, reader.bias or reader.weight.removesuffix("weight") + "bias"))
    return out


def folded_readers(
    module: ZooModel, params: Params
) -> list[tuple[str, str, list[tuple[Reader, str]]]]:
    """``(scale key, shift key, [(reader, its bias key)])`` of every LayerNorm of
    ``module``, under the names :func:`layernorm_to_rmsnorm` gives them in the RMSNorm
    form (a tied reader is its own untied copy): what the rewrite folds where."""
    analysis = rewrite_analysis(module)
    model: Rewritable = module  # type: ignore[assignment]
    work, shared = model.untied(params), shared_weights(analysis)
    return [(scale, shift, _reader_keys(readers, params, work, shared))
            for scale, shift, readers in norm_readers(analysis, "layer", module)]  # fmt: skip


def centred_streams(module: ZooModel) -> tuple[str, ...]:
    """Names of the spaces :func:`layernorm_to_rmsnorm` centres: the streams its
    LayerNorms read (every writer of them is projected onto the zero-mean subspace)."""
    analysis = rewrite_analysis(module)
    scales = {scale for scale, _, _ in norm_readers(analysis, "layer", module)}
    return tuple(s.name for s in analysis.spec if any(u.param in scales for u in s.uses))


def layernorm_to_rmsnorm(module: ZooModel, params: Params) -> tuple[ZooModel, Params]:
    """Rewrite a LayerNorm transformer as an RMSNorm one with the same outputs.

    Args:
        module: a zoo model with LayerNorms on its residual stream (:class:`Rewritable`).
        params: its parameters; not modified.

    Returns:
        ``(module', params')``: a new model of the same zoo class with the changes of
        ``module.rms_kwargs()``, whose spec's residual space is ``Orthogonal``, and its
        parameters.
    """
    model: Rewritable = module  # type: ignore[assignment]
    analysis = rewrite_analysis(module)
    norms = norm_readers(analysis, "layer", module)
    if not norms:
        raise ValueError("layernorm_to_rmsnorm needs a model whose residual stream has LayerNorms")
    scales = {scale for scale, _, _ in norms}
    work = {k: v.detach().clone() for k, v in model.untied(params).items()}
    streams = [s for s in analysis.spec if any(u.param in scales for u in s.uses)]
    for use in (u for s in streams for u in s.uses if u.role == "write"):
        if use.outer != 1 or use.inner != 1:
            raise ValueError(f"cannot center blocked residual writer {use.param!r}")
        work[use.param] = _center(work[use.param], use.axis % work[use.param].ndim)
    shared = shared_weights(analysis)
    for scale, shift, readers in norms:
        gain, bias = work.pop(scale).double(), work.pop(shift).double()
        for reader, bias_key in _reader_keys(readers, params, work, shared):
            weight = work[reader.weight]
            w64 = weight.double().movedim(reader.axis, -1)  # (..., in)
            old = work.get(bias_key)
            b64 = torch.zeros(w64.shape[:-1], dtype=torch.float64) if old is None else old.double()
            work[bias_key] = (b64 + w64 @ bias).to(weight.dtype)
            work[reader.weight] = (w64 * gain).movedim(-1, reader.axis).to(weight.dtype)
    new = rebuilt(module, model.rms_kwargs())
    check_rewritten_keys(new, work)
    return new, work


def _rows(params: Params, part: CircuitPart | None, like: CircuitPart, heads: int) -> Tensor:
    """The rows of ``part`` for ``heads`` heads in float64 (zeros shaped like ``like``'s
    biases if absent)."""
    if part is None:
        ref = params[like.param]
        return torch.zeros(ref[like.index(ref.shape[0], heads)].shape[0], dtype=torch.float64)
    x = params[part.param].double()
    return x[part.index(x.shape[0], heads)]


def _owner(*params: str) -> str:
    """The innermost module holding all of ``params`` (their common module path)."""
    paths = [p.split(".")[:-1] for p in params]
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def heads_to_circuits(module: ZooModel, params: Params) -> tuple[ZooModel, Params]:
    """Rewrite a transformer's attention heads as QK and OV circuits, same outputs.

    Args:
        module: a zoo model with projected attention heads (either norm; the residual
            group is unchanged).
        params: its parameters; not modified.

    Returns:
        ``(module', params')``: the same architecture with ``attention="circuits"``, each
        head's projections replaced by ``qk_weight = W_k^T W_q / sqrt(head_dim)``,
        ``qk_bias = W_k^T b_q / sqrt(head_dim)``, ``ov_weight = W_o W_v``, and
        ``ov_bias = b_o + W_o b_v`` on the module holding them (see
        :class:`~lmckit.models._transformer_blocks.CircuitAttention`).
    """
    heads = [s for s in rewrite_analysis(module).spec if isinstance(s.group, HeadPermutation)]
    if not heads or any(s.circuits is None for s in heads):
        raise ValueError(
            f"heads_to_circuits needs projected heads; {module.config.name} "
            f"({dict(module.config.kwargs).get('attention', 'heads')}) has none to rewrite"
        )
    work = {k: v.detach().clone() for k, v in params.items()}
    for space in heads:
        c = space.circuits
        group = space.group
        assert c is not None and isinstance(group, HeadPermutation)
        heads_n, head_dim = group.heads, group.head_dim
        dtype = params[c.query.param].dtype
        wq, wk, wv = (
            _rows(params, p, p, heads_n).reshape(heads_n, head_dim, -1)
            for p in (c.query, c.key, c.value)
        )
        bq = _rows(params, c.query_bias, c.query, heads_n).reshape(heads_n, head_dim)
        bv = _rows(params, c.value_bias, c.value, heads_n)
        wo = params[c.output].double()
        out_bias = c.output.removesuffix("weight") + "bias"
        bo = (
            params[out_bias].double()
            if out_bias in params
            else torch.zeros(wo.shape[0], dtype=torch.float64)
        )
        scale = 1.0 / math.sqrt(head_dim)
        wo_heads = wo.reshape(wo.shape[0], heads_n, head_dim)
        new = {
            "qk_weight": torch.einsum("hkd,hke->hde", wk, wq) * scale,
            "qk_bias": torch.einsum("hkd,hk->hd", wk, bq) * scale,
            "ov_weight": torch.einsum("ohk,hke->hoe", wo_heads, wv),
            "ov_bias": bo + wo @ bv,
        }
        for name in (*space.params, out_bias):
            work.pop(name, None)
        owner = _owner(c.query.param, c.output)
        for name, value in new.items():
            work[f"{owner}.{name}"] = value.to(dtype)
    rewritten = rebuilt(module, {"attention": "circuits"})
    check_rewritten_keys(rewritten, work)
    return rewritten, work
