"""The zoo's symmetry specs as they were written by hand, kept as test oracles.

The library infers every spec from the traced graph (:mod:`lmckit.inference`); these
functions spell the same specs out module by module, so the tests can check that
inference finds exactly them (names, groups, sizes, parameter axes, head circuits).
"""

from __future__ import annotations

from torch import nn

from lmckit.models import ZooModel
from lmckit.models._norms import group_norm_groups
from lmckit.symmetry._transform import (
    CircuitPart,
    Group,
    HeadCircuits,
    HeadPermutation,
    Orthogonal,
    Part,
    Permutation,
    Space,
    SymmetrySpec,
    Use,
)

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)
_Named = tuple[str, nn.Module]


def writes(name: str, module: nn.Module) -> list[Use]:
    if isinstance(module, _NORMS):
        uses = [Use(f"{name}.{p}", 0, "elementwise") for p, _ in module.named_parameters()]
        for b, value in module.named_buffers(recurse=False):
            if value is not None and value.is_floating_point():
                uses.append(Use(f"{name}.{b}", 0, "elementwise", compare=False))
        return uses
    return [Use(f"{name}.{p}", 0, "write") for p, _ in module.named_parameters(recurse=False)]


def reads(name: str, module: nn.Module) -> list[Use]:
    return [Use(f"{name}.weight", 1, "read")]


def space(name: str, n: int, group: Group, writers: list[_Named], readers: list[_Named]) -> Space:
    uses = [u for m, mod in writers for u in writes(m, mod)]
    uses += [u for m, mod in readers for u in reads(m, mod)]
    return Space(name, n, group, tuple(uses))


def channel_group(norm: str, channels: int) -> Permutation:
    return Permutation(blocks=group_norm_groups(channels)) if norm == "group" else Permutation()


def mlp_spec(m: ZooModel) -> SymmetrySpec:
    spaces = []
    for i, width in enumerate(m.hidden):
        last = i == len(m.hidden) - 1
        reader = ("head", m.head) if last else (f"layers.{i + 1}", m.layers[i + 1])
        writers = [(f"layers.{i}", m.layers[i]), (f"norms.{i}", m.norms[i])]
        spaces.append(space(f"hidden.{i}", width, Permutation(), writers, [reader]))
    return SymmetrySpec(tuple(spaces))


def vgg_spec(m: ZooModel) -> SymmetrySpec:
    spaces = []
    for i, (conv, norm, _relu, width) in enumerate(m.conv_sites):
        if i + 1 < len(m.conv_sites):
            nxt = m.conv_sites[i + 1][0]
            reader = (f"features.{nxt}", m.features[nxt])
        else:
            reader = ("classifier", m.classifier)
        writers = [(f"features.{conv}", m.features[conv]), (f"features.{norm}", m.features[norm])]
        group = channel_group(m.norm, width)
        spaces.append(space(f"features.{conv}", width, group, writers, [reader]))
    return SymmetrySpec(tuple(spaces))


def resnet_spec(m: ZooModel) -> SymmetrySpec:
    writers: list[list[_Named]] = [[] for _ in m.widths]
    readers: list[list[_Named]] = [[] for _ in m.widths]
    writers[0] += [("stem_conv", m.stem_conv), ("stem_norm", m.stem_norm)]
    inner = []
    stream = 0
    for s, stage in enumerate(m.stages):
        for b, block in enumerate(stage):
            name = f"stages.{s}.{b}"
            readers[stream].append((f"{name}.conv1", block.conv1))
            if block.projects:
                readers[stream].append((f"{name}.shortcut.conv", block.shortcut.conv))
                writers[s] += [
                    (f"{name}.shortcut.conv", block.shortcut.conv),
                    (f"{name}.shortcut.norm", block.shortcut.norm),
                ]
            writers[s] += [(f"{name}.conv2", block.conv2), (f"{name}.norm2", block.norm2)]
            stream = s
            width = m.widths[s]
            inner.append(
                space(
                    f"{name}.conv1",
                    width,
                    channel_group(m.norm, width),
                    [(f"{name}.conv1", block.conv1), (f"{name}.norm1", block.norm1)],
                    [(f"{name}.conv2", block.conv2)],
                )
            )
    readers[stream].append(("classifier", m.classifier))
    residual = [
        space(f"residual.{s}", w, channel_group(m.norm, w), writers[s], readers[s])
        for s, w in enumerate(m.widths)
    ]
    return SymmetrySpec((*residual, *inner))


def _head_space(name: str, heads: int, head_dim: int, qkv: list, output: str) -> Space:
    uses: list[Use] = []
    for module in dict.fromkeys(mod for mod, _, _ in qkv):
        blocks = next(bl for mod, _, bl in qkv if mod == module)
        # a fused projection's query, key and value rows are blocks of its output, each
        # moved by the head permutation (and by bases of its own inside each head)
        n = heads * head_dim
        for key in (f"{module}.weight", f"{module}.bias"):
            if blocks == 1:
                uses.append(Use(key, 0, "write"))
            else:
                uses += [Use(key, 0, "write", parts=(Part(0, b * n, n),)) for b in range(blocks)]
    uses.append(Use(f"{output}.weight", 1, "read"))
    parts = [CircuitPart(f"{mod}.weight", b, bl) for mod, b, bl in qkv]
    biases = [CircuitPart(f"{mod}.bias", b, bl) for mod, b, bl in qkv]
    circuits = HeadCircuits(
        parts[0],
        parts[1],
        parts[2],
        f"{output}.weight",
        query_bias=biases[0],
        key_bias=biases[1],
        value_bias=biases[2],
        heads=heads,
        kv_heads=heads,
    )
    group = HeadPermutation(heads, head_dim)
    return Space(name, heads * head_dim, group, tuple(uses), circuits=circuits)


def _circuit_uses(module: str) -> tuple[list[Use], list[Use]]:
    residual = [
        Use(f"{module}.qk_weight", 1, "read"),
        Use(f"{module}.qk_weight", 2, "read"),
        Use(f"{module}.qk_bias", 1, "read"),
        Use(f"{module}.ov_weight", 1, "write"),
        Use(f"{module}.ov_weight", 2, "read"),
        Use(f"{module}.ov_bias", 0, "write"),
    ]
    heads = [Use(f"{module}.{p}", 0, "write") for p in ("qk_weight", "qk_bias", "ov_weight")]
    return residual, heads


def _residual_group(norm: str) -> Group:
    return Permutation() if norm == "layer" else Orthogonal()


def gpt2_spec(m: ZooModel) -> SymmetrySpec:
    d, h = m.n_embd, m.n_head
    res = [Use("transformer.wte.weight", 1, "write"), Use("transformer.wpe.weight", 1, "write")]
    spaces: list[Space] = []
    for i, block in enumerate(m.transformer.h):
        pre = f"transformer.h.{i}"
        res += writes(f"{pre}.ln_1", block.ln_1)
        if m.attention == "circuits":
            res_uses, head_uses = _circuit_uses(f"{pre}.attn")
            res += res_uses
            spaces.append(Space(f"heads.{i}", h, Permutation(), tuple(head_uses)))
        else:
            res += reads(f"{pre}.attn.c_attn", block.attn.c_attn)
            res += writes(f"{pre}.attn.c_proj", block.attn.c_proj)
            attn = f"{pre}.attn.c_attn"
            qkv = [(attn, 0, 3), (attn, 1, 3), (attn, 2, 3)]
            spaces.append(_head_space(f"heads.{i}", h, d // h, qkv, f"{pre}.attn.c_proj"))
        res += writes(f"{pre}.ln_2", block.ln_2)
        res += reads(f"{pre}.mlp.c_fc", block.mlp.c_fc)
        res += writes(f"{pre}.mlp.c_proj", block.mlp.c_proj)
        ffn = space(
            f"ffn.{i}",
            m.n_inner,
            Permutation(),
            [(f"{pre}.mlp.c_fc", block.mlp.c_fc)],
            [(f"{pre}.mlp.c_proj", block.mlp.c_proj)],
        )
        spaces.append(ffn)
    res += writes("transformer.ln_f", m.transformer.ln_f)
    if m.lm_head is not None:
        res += reads("lm_head", m.lm_head)
    return SymmetrySpec((Space("residual", d, _residual_group(m.norm), tuple(res)), *spaces))


def vit_spec(m: ZooModel) -> SymmetrySpec:
    d, nh = m.width, m.heads
    emb = "vit.embeddings"
    res = [Use(f"{emb}.position_embeddings", 2, "write")]
    if m.class_token:
        res.append(Use(f"{emb}.cls_token", 2, "write"))
    res += writes(
        f"{emb}.patch_embeddings.projection", m.vit.embeddings.patch_embeddings.projection
    )
    spaces: list[Space] = []
    for i, layer in enumerate(m.vit.encoder.layer):
        pre = f"vit.encoder.layer.{i}"
        att = f"{pre}.attention.attention"
        res += writes(f"{pre}.layernorm_before", layer.layernorm_before)
        if m.attention == "circuits":
            res_uses, head_uses = _circuit_uses(f"{pre}.attention")
            res += res_uses
            spaces.append(Space(f"heads.{i}", nh, Permutation(), tuple(head_uses)))
        else:
            for part in ("query", "key", "value"):
                res += reads(f"{att}.{part}", getattr(layer.attention.attention, part))
            res += writes(f"{pre}.attention.output.dense", layer.attention.output.dense)
            qkv = [(f"{att}.{part}", 0, 1) for part in ("query", "key", "value")]
            spaces.append(
                _head_space(f"heads.{i}", nh, d // nh, qkv, f"{pre}.attention.output.dense")
            )
        res += writes(f"{pre}.layernorm_after", layer.layernorm_after)
        res += reads(f"{pre}.intermediate.dense", layer.intermediate.dense)
        res += writes(f"{pre}.output.dense", layer.output.dense)
        ffn = space(
            f"ffn.{i}",
            m.mlp_dim,
            Permutation(),
            [(f"{pre}.intermediate.dense", layer.intermediate.dense)],
            [(f"{pre}.output.dense", layer.output.dense)],
        )
        spaces.append(ffn)
    res += writes("vit.layernorm", m.vit.layernorm)
    res += reads("classifier", m.classifier)
    return SymmetrySpec((Space("residual", d, _residual_group(m.norm), tuple(res)), *spaces))


REFERENCE_SPECS = {
    "mlp": mlp_spec,
    "vgg": vgg_spec,
    "resnet20": resnet_spec,
    "gpt2": gpt2_spec,
    "vit": vit_spec,
}
