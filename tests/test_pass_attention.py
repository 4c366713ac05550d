"""The attention fusion (difflite/passes/attention.py): onnxruntime before vs after, causal masks, and near misses that must not match."""

from __future__ import annotations

import math

import onnx_ir as ir
import pytest
import torch
from onnx import helper
from support import passes_helpers as H
from support.passes_helpers import apply, onnx_model

from difflite.core import custom_ops
from difflite.passes.attention import fuse_attention
from difflite.passes.gelu import fuse_gelu
from difflite.passes.group_norm import fuse_group_norm


@pytest.mark.parametrize("processor,opset,dynamo", [
    ("sdpa", 18, True), ("plain", 18, True), ("sdpa", 18, False), ("plain", 17, False), ("sdpa", 23, True)])
def test_attention_forms_in_transformer_block(processor, opset, dynamo):
    module, args = H.transformer_block(processor)
    model = apply(H.export(module, args, opset=opset, dynamo=dynamo), fuse_gelu, fuse_attention)
    nodes = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert [(H.attr(n, "heads"), round(H.attr(n, "scale"), 6), H.attr(n, "causal")) for n in nodes] == \
        [(2, 0.25, 0)] * 2
    assert [n.inputs[1].shape.dims[1] for n in nodes] == [10, 5]  # self, then cross attention
    assert not {n.op_type for n in model.graph if n.domain == ""} & {"Softmax", "Attention", "Transpose"}


def test_attention_head_dim_64():
    module, args = H.transformer_block(dim=128, heads=2, head_dim=64)
    model = apply(H.export(module, args), fuse_attention)
    assert [round(H.attr(n, "scale"), 6) for n in H.difflite_nodes(model, custom_ops.ATTENTION)] == [0.125] * 2


def test_onnx_attention_op_with_3d_inputs():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=3, kv_num_heads=3, is_causal=1)
    model = apply(onnx_model([node], {"q": [2, 5, 12], "k": [2, 5, 12], "v": [2, 5, 18]}, [2, 5, 18], {},
                             opset=23), fuse_attention)
    [fused] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(fused, "heads"), H.attr(fused, "causal")) == (3, 1)
    assert math.isclose(H.attr(fused, "scale"), 0.5, rel_tol=1e-6)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_clip_attention_is_causal(implementation, dynamo):
    """legacy + eager: the causal mask's expand(b, 1, L, L) is shape arithmetic around a
    ConstantOfShape, which cleanup must fold for the mask to be a constant."""
    model = apply(H.export(*H.tiny_clip(implementation), dynamo=dynamo), fuse_gelu, fuse_attention)
    nodes = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert [(H.attr(n, "heads"), H.attr(n, "causal")) for n in nodes] == [(4, 1)] * 2
    assert math.isclose(H.attr(nodes[0], "scale"), 8 ** -0.5, rel_tol=1e-6)
    assert H.difflite_ops(model)[custom_ops.GELU.name] == 2


def test_vae_single_head_attention_keeps_layout_outside():
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    block = H.perturb(Attention(16, heads=1, dim_head=16, norm_num_groups=4, residual_connection=True,
                                bias=True, upcast_softmax=True, _from_deprecated_attn_block=True))
    model = apply(H.export(H.Wrapper(block), (torch.randn(1, 16, 6, 5),)), fuse_group_norm, fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert H.attr(node, "heads") == 1 and list(node.inputs[0].shape) == [1, 30, 16]
    assert H.difflite_ops(model)[custom_ops.GROUP_NORM.name] == 1


class ToyAttention(torch.nn.Module):
    """Hand-written attention: the knobs make near misses."""

    def __init__(self, mask=None, softmax_dim=-1, split="heads_last"):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
        self.mask, self.softmax_dim, self.split = mask, softmax_dim, split

    def _heads(self, t):
        n, length, _ = t.shape
        if self.split == "heads_first":  # mixes tokens into heads: not a head split
            return t.reshape(n, 2, length, 8)
        return t.reshape(n, length, 2, 8).transpose(1, 2)

    def forward(self, x):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = q @ k.transpose(-1, -2) * 8 ** -0.5
        if self.mask is not None:
            scores = scores + self.mask
        out = scores.softmax(self.softmax_dim) @ v
        return out.transpose(1, 2).reshape(x.shape)


def _toy(**kwargs) -> ir.Model:
    torch.manual_seed(0)
    return apply(H.export(H.perturb(ToyAttention(**kwargs)), (torch.randn(2, 6, 16),)), fuse_attention)


def test_causal_mask_of_a_toy_attention():
    model = _toy(mask=torch.full((6, 6), -1e9).triu(1))
    assert [H.attr(n, "causal") for n in H.difflite_nodes(model, custom_ops.ATTENTION)] == [1]


class CausalAttention(torch.nn.Module):
    """Causal self-attention as transformers' eager attention writes it (scores + full((L, L),
    min).triu(1)[None, None].expand(N, 1, L, L)) or as F.scaled_dot_product_attention(is_causal)."""

    def __init__(self, sdpa: bool):
        super().__init__()
        self.sdpa = sdpa

    def forward(self, q, k, v):
        n, length, width = q.shape

        def split(t):
            return t.reshape(n, length, 2, width // 2).transpose(1, 2)

        if self.sdpa:
            out = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        else:
            scores = split(q) @ split(k).transpose(-1, -2) * (width // 2) ** -0.5
            mask = torch.full((length, length), torch.finfo(q.dtype).min).triu(1)
            scores = scores + mask[None, None].expand(n, 1, length, length)
            out = scores.softmax(-1) @ split(v)
        return out.transpose(1, 2).reshape(n, length, width)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("sdpa", [False, True], ids=["eager", "sdpa"])
@pytest.mark.parametrize("length", [77, 97])  # the [L, L] mask within / over cleanup's folding limit
def test_causal_mask_of_any_length(length, sdpa, dynamo):
    q, k, v = (torch.randn(2, length, 16) for _ in range(3))
    model = apply(H.export(CausalAttention(sdpa), (q, k, v), dynamo=dynamo), fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(node, "heads"), H.attr(node, "causal")) == (2, 1)
    assert not {n.op_type for n in model.graph} & {"Trilu", "Expand", "Where", "Softmax"}


class BaddbmmCausal(torch.nn.Module):
    """diffusers AttnProcessor's scores with a mask: baddbmm(mask, q, k^T, beta=1, alpha=scale) on
    [N*H, L, D]; the TorchScript exporter writes beta * mask as Mul(mask, 1)."""

    def forward(self, q, k, v):
        length = q.shape[1]
        mask = torch.full((length, length), -10000.0).triu(1).expand(q.shape[0], length, length)
        scores = torch.baddbmm(mask, q, k.transpose(-1, -2), beta=1, alpha=0.25)
        return torch.bmm(scores.softmax(-1), v)


@pytest.mark.parametrize("batch_heads", [2, 16])  # the expanded mask within / over the folding limit
def test_baddbmm_causal_mask_of_any_size(batch_heads):
    q, k, v = (torch.randn(batch_heads, 24, 8) for _ in range(3))
    model = apply(H.export(BaddbmmCausal(), (q, k, v), dynamo=False), fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(node, "causal"), round(H.attr(node, "scale"), 6)) == (1, 0.25)


def _causal_mask_with(row: int, col: int, value: float) -> torch.Tensor:
    mask = torch.full((6, 6), -1e9).triu(1)
    mask[row, col] = value
    return mask


@pytest.mark.parametrize("case", ["softmax_over_queries", "mask_lower_triangle", "mask_partial",
                                  "mask_bias_below", "heads_first_split"])
def test_attention_near_misses_are_not_fused(case):
    kwargs = {
        "softmax_over_queries": {"softmax_dim": -2},
        "mask_lower_triangle": {"mask": torch.full((6, 6), -1e9).tril(-1)},
        "mask_partial": {"mask": _causal_mask_with(0, 4, -1.0)},  # one entry not masked off
        "mask_bias_below": {"mask": _causal_mask_with(3, 1, 0.5)},  # a bias, not a mask
        "heads_first_split": {"split": "heads_first"},
    }[case]
    assert not H.difflite_ops(_toy(**kwargs))
