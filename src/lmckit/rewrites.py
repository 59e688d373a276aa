"""Function-preserving rewrites of transformer zoo models that expose more symmetry.

* :func:`layernorm_to_rmsnorm`: LayerNorm ``LN(x) = g * (x - mean(x)) / sigma(x) + b``
  becomes an affine-free RMSNorm. Every residual writer (embeddings, attention and
  MLP output projections, their biases) is projected onto the zero-mean subspace,
  ``W <- (I - 1 1^T / d) W``, so the residual stream always has mean zero, where
  ``LN(x) = g * x / rms(x) + b`` (``sigma`` and ``rms`` agree, ``eps`` included).
  ``g`` and ``b`` are folded into each reader ``R x + c``: ``R <- R diag(g)``,
  ``c <- c + R b``. The RMSNorm commutes with every orthogonal map, so the new
  model's residual space is ``Orthogonal``.
* :func:`embed_in_wider`: a rectangular orthogonal map ``O`` (``m x n``, ``O^T O = I``)
  embeds an RMSNorm model of residual width ``n`` into one of width ``m`` exactly:
  head and MLP units are padded with zero units (queries rescaled by
  ``sqrt(head_dim' / head_dim)`` to undo the wider attention scale), readers of the
  norms rescaled by ``sqrt(n / m)`` and ``eps`` by ``n / m``.
* :func:`heads_to_circuits`: every attention head is replaced by its QK and OV circuit
  (:class:`~lmckit.models.transformer_blocks.CircuitAttention`), "multiplying out" the
  within-head bases. Interpolating two models in this form interpolates their circuits,
  the form in which Generalized LMC for Transformers (2025) merges heads; the
  interpolated model is a circuit-form model (heads of width ``d``, not ``d / heads``).

Models that support these rewrites (GPT-2, ViT) implement :class:`NormRewritable`.
The first two need projected heads: rewrite norms and widths before circuits.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import Tensor

from lmckit.models.registry import ModelConfig, ZooModel, build_module
from lmckit.params import Params
from lmckit.symmetry import (
    CircuitPart,
    HeadPermutation,
    Orthogonal,
    SymmetrySpec,
    Transform,
    apply,
    random_transform,
)

__all__ = ["NormRewritable", "embed_in_wider", "heads_to_circuits", "layernorm_to_rmsnorm"]


class NormRewritable(Protocol):
    """What a zoo model tells the rewrites about its residual-stream norms and heads."""

    config: ModelConfig
    norm: str

    def symmetry_spec(self) -> SymmetrySpec: ...

    def norm_readers(self) -> dict[str, list[str]]:
        """Norm module -> the Linear modules reading its output."""
        ...

    def untied(self, params: Params) -> Params:
        """``params`` with every shared weight stored once per user."""
        ...

    def rms_kwargs(self) -> dict[str, Any]:
        """Constructor changes of the RMSNorm form."""
        ...

    def widened_kwargs(self, width: int, inner: int) -> dict[str, Any]:
        """Constructor changes of a wider model."""
        ...

    def attention_modules(self) -> dict[str, str]:
        """Head space -> the attention module that holds its heads."""
        ...


def _rebuild(module: ZooModel, changes: dict[str, Any]) -> ZooModel:
    config = ModelConfig(module.config.name, {**module.config.kwargs, **changes})
    # the weights are replaced; fork the RNG so building leaves no trace in it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        new = build_module(config)
    new.train(module.training)
    return new


def _check_keys(module: ZooModel, params: Params) -> None:
    want = set(module.state_dict())
    if set(params) != want:
        raise ValueError(
            f"rewrite produced keys {sorted(set(params) ^ want)} that do not fit the new model"
        )


def _check_projected_heads(module: ZooModel, rewrite: str) -> None:
    if getattr(module, "attention", "heads") != "heads":
        raise ValueError(
            f"{rewrite} needs projected heads (attention='heads'); apply it before "
            "heads_to_circuits"
        )


def _center(x: Tensor, axis: int) -> Tensor:
    """Project ``x`` onto the zero-mean subspace along ``axis``: ``x - mean(x)``."""
    x64 = x.double()
    return (x64 - x64.mean(dim=axis, keepdim=True)).to(x.dtype)


def layernorm_to_rmsnorm(module: ZooModel, params: Params) -> tuple[ZooModel, Params]:
    """Rewrite a LayerNorm transformer as an RMSNorm one with the same outputs.

    Args:
        module: a ``norm="layer"`` model implementing :class:`NormRewritable`.
        params: its parameters; not modified.

    Returns:
        ``(module', params')``: a new model of the same zoo class with the changes of
        ``module.rms_kwargs()`` (``norm="rms"``), whose spec's residual space is
        ``Orthogonal``, and its parameters.
    """
    model: NormRewritable = module  # type: ignore[assignment]
    if getattr(module, "norm", None) != "layer":
        raise ValueError("layernorm_to_rmsnorm needs a model with norm='layer'")
    _check_projected_heads(module, "layernorm_to_rmsnorm")
    residual = model.symmetry_spec()["residual"]
    work = {k: v.detach().clone() for k, v in model.untied(params).items()}
    for use in residual.uses:
        if use.role == "write":
            if use.outer != 1 or use.inner != 1:
                raise ValueError(f"cannot center blocked residual writer {use.param!r}")
            work[use.param] = _center(work[use.param], use.axis % work[use.param].ndim)
    for norm, readers in model.norm_readers().items():
        gain = work.pop(f"{norm}.weight").double()
        shift = work.pop(f"{norm}.bias").double()
        for reader in readers:
            weight = work[f"{reader}.weight"]
            w64 = weight.double()
            bias = work.get(f"{reader}.bias")
            b64 = torch.zeros(w64.shape[0], dtype=torch.float64) if bias is None else bias.double()
            work[f"{reader}.bias"] = (b64 + w64 @ shift).to(weight.dtype)
            work[f"{reader}.weight"] = (w64 * gain[None, :]).to(weight.dtype)
    new = _rebuild(module, model.rms_kwargs())
    _check_keys(new, work)
    return new, work


def _padding(rows: int, cols: int) -> Tensor:
    """``[I; 0]``: embeds ``cols`` units as the first of ``rows`` (zero units after)."""
    return torch.eye(rows, cols)


def _head_padding(group: HeadPermutation, head_dim: int) -> Tensor:
    """Block-diagonal ``[I; 0]`` per head: ``heads * head_dim`` x ``heads * group.head_dim``."""
    return torch.block_diag(*[_padding(head_dim, group.head_dim)] * group.heads)


def embed_in_wider(
    module: ZooModel,
    params: Params,
    width: int,
    *,
    inner: int | None = None,
    rotation: Tensor | int = 0,
) -> tuple[ZooModel, Params]:
    """Embed an RMSNorm transformer into one of residual width ``width``, exactly.

    Args:
        module: a ``norm="rms"`` model implementing :class:`NormRewritable`.
        params: its parameters; not modified.
        width: the new residual width ``m >= n``; a multiple of the number of heads.
        inner: the new MLP width (default: scaled like the residual width).
        rotation: ``(m, n)`` matrix with orthonormal columns, or a seed for a random one.

    Returns:
        ``(module', params')``: the wider model (same outputs) and its parameters.
    """
    model: NormRewritable = module  # type: ignore[assignment]
    if getattr(module, "norm", None) != "rms":
        raise ValueError("embed_in_wider needs norm='rms' (see layernorm_to_rmsnorm)")
    _check_projected_heads(module, "embed_in_wider")
    spec = model.symmetry_spec()
    n = spec["residual"].n
    ffn = [s for s in spec if s.name.startswith("ffn.")]
    inner = round(ffn[0].n * width / n) if inner is None else inner
    if width < n or any(inner < s.n for s in ffn):
        raise ValueError(f"cannot embed width {n} into {width} (MLP {ffn[0].n} into {inner})")
    if isinstance(rotation, int):
        o = random_transform(
            spec.with_groups(residual=Orthogonal()), rotation, widths={"residual": width}
        )
        rotation = o["residual"]  # type: ignore[assignment]
    if tuple(rotation.shape) != (width, n):
        raise ValueError(f"rotation must be ({width}, {n}), got {tuple(rotation.shape)}")
    if not torch.allclose(
        rotation.double().T @ rotation.double(), torch.eye(n, dtype=torch.float64), atol=1e-5
    ):
        raise ValueError("rotation must have orthonormal columns")
    elements: dict[str, object] = {"residual": rotation}
    scales: dict[str, float] = {}
    for space in spec:
        if isinstance(space.group, HeadPermutation):
            if width % space.group.heads:
                raise ValueError(f"width {width} does not split into {space.group.heads} heads")
            head_dim = width // space.group.heads
            elements[space.name] = _head_padding(space.group, head_dim)
            scales[space.name] = math.sqrt(head_dim / space.group.head_dim)
        elif space.name != "residual":
            elements[space.name] = _padding(inner, space.n)
    # every space is mapped by a (rectangular) matrix with orthonormal columns
    flat = spec.with_groups(**{s.name: Orthogonal() for s in spec})
    work = apply(flat, params, Transform(flat, elements))
    for space in spec:
        circuits = space.circuits
        if circuits is None:
            continue
        # the wider heads' scores are scaled by 1/sqrt(head_dim'): pre-scale the queries
        for part in (circuits.query, circuits.query_bias):
            if part is None:
                continue
            x = work[part.param].clone()
            rows = x.shape[0] // part.blocks
            x[part.block * rows : (part.block + 1) * rows] *= scales[space.name]
            work[part.param] = x
    # an RMSNorm of width m sees |O x|^2 / m: its output grows by sqrt(m / n)
    for readers in model.norm_readers().values():
        for reader in readers:
            key = f"{reader}.weight"
            if key not in work:
                raise ValueError(f"{key} is missing: untie shared weights first")
            work[key] = work[key] * math.sqrt(n / width)
    new = _rebuild(module, model.widened_kwargs(width, inner))
    _check_keys(new, work)
    return new, work


def _rows(params: Params, part: CircuitPart | None, like: CircuitPart) -> Tensor:
    """The rows of ``part`` in float64 (zeros shaped like ``like``'s biases if absent)."""
    if part is None:
        ref = params[like.param]
        return torch.zeros(ref.shape[0] // like.blocks, dtype=torch.float64)
    x = params[part.param].double()
    rows = x.shape[0] // part.blocks
    return x[part.block * rows : (part.block + 1) * rows]


def heads_to_circuits(module: ZooModel, params: Params) -> tuple[ZooModel, Params]:
    """Rewrite a transformer's attention heads as QK and OV circuits, same outputs.

    Args:
        module: a model with ``attention="heads"`` implementing :class:`NormRewritable`
            (either norm; the residual group is unchanged).
        params: its parameters; not modified.

    Returns:
        ``(module', params')``: the same architecture with ``attention="circuits"`` and
        its parameters; per head ``qk_weight = W_k^T W_q / sqrt(head_dim)``,
        ``qk_bias = W_k^T b_q / sqrt(head_dim)``, ``ov_weight = W_o W_v``, and
        ``ov_bias = b_o + W_o b_v`` (see
        :class:`~lmckit.models.transformer_blocks.CircuitAttention`).
    """
    model: NormRewritable = module  # type: ignore[assignment]
    _check_projected_heads(module, "heads_to_circuits")
    targets = model.attention_modules()
    work = {k: v.detach().clone() for k, v in params.items()}
    for space in model.symmetry_spec():
        c = space.circuits
        if c is None:
            continue
        if not isinstance(space.group, HeadPermutation) or space.name not in targets:
            raise ValueError(f"head space {space.name!r} cannot be rewritten to circuits")
        heads, head_dim = space.group.heads, space.group.head_dim
        dtype = params[c.query.param].dtype
        wq, wk, wv = (
            _rows(params, p, p).reshape(heads, head_dim, -1) for p in (c.query, c.key, c.value)
        )
        bq = _rows(params, c.query_bias, c.query).reshape(heads, head_dim)
        bv = _rows(params, c.value_bias, c.value)
        wo = params[c.output].double()
        out_bias = c.output.removesuffix("weight") + "bias"
        bo = (
            params[out_bias].double()
            if out_bias in params
            else torch.zeros(wo.shape[0], dtype=torch.float64)
        )
        scale = 1.0 / math.sqrt(head_dim)
        wo_heads = wo.reshape(wo.shape[0], heads, head_dim)
        new = {
            "qk_weight": torch.einsum("hkd,hke->hde", wk, wq) * scale,
            "qk_bias": torch.einsum("hkd,hk->hd", wk, bq) * scale,
            "ov_weight": torch.einsum("ohk,hke->hoe", wo_heads, wv),
            "ov_bias": bo + wo @ bv,
        }
        for name in (*space.params, out_bias):
            work.pop(name, None)
        for name, value in new.items():
            work[f"{targets[space.name]}.{name}"] = value.to(dtype)
    rewritten = _rebuild(module, {"attention": "circuits"})
    _check_keys(rewritten, work)
    return rewritten, work
