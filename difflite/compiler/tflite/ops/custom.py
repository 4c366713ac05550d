"""The difflite ops (DESIGN §2) the passes put into the ONNX graph.

A fused kind (in ctx.fuse) becomes one TFLite CUSTOM op run by the op library; otherwise the op
is decomposed here into builtins laid out for channels-last data, which is also the baseline the
fused kernels are measured against (no transposes around group norms)."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import lowers
from difflite.compiler.tflite.ops.norm import normalize
from difflite.core import custom_ops as contract

SIGMOID_GELU_FACTOR = 1.702


def options_of(ctx, node, op: contract.CustomOp) -> dict:
    try:
        return op.options({name: a.value for name, a in node.attributes.items()})
    except (TypeError, ValueError) as exc:
        raise ctx.unsupported(str(exc)) from exc


def channels_last_io(ctx, x, out_value):
    perm = layout.channels_last(ctx.rank(x))
    return ctx.input(x, perm), ctx.output(out_value, perm), perm


def emit_custom(ctx, op: contract.CustomOp, inputs: list[int], outputs: list[int], options: dict):
    ctx.builder.custom_op(op.custom_code, inputs, outputs, options)


def builtin_gelu(ctx, xi: int, out: int, approximate: str) -> None:
    if approximate == "sigmoid":
        shape = ctx.builder.shape_of(xi)
        scaled, gate = ctx.temp("scaled", shape), ctx.temp("sigmoid", shape)
        factor = ctx.float_constant(np.full((1,) * len(shape), SIGMOID_GELU_FACTOR, np.float32), "const/1.702")
        ctx.builder.op("MUL", [xi, factor], [scaled])
        ctx.builder.op("LOGISTIC", [scaled], [gate])
        ctx.builder.op("MUL", [xi, gate], [out])
    else:
        ctx.builder.op("GELU", [xi], [out], approximate=approximate == "tanh")


@lowers(contract.GELU.name, domain=contract.DOMAIN)
def lower_gelu(ctx, node):
    opts = options_of(ctx, node, contract.GELU)
    x = node.inputs[0]
    perm = ctx.perm(x)
    xi, out = ctx.input(x), ctx.output(node.outputs[0], perm)
    if contract.GELU.fuse_kind in ctx.fuse:
        emit_custom(ctx, contract.GELU, [xi], [out], opts)
    else:
        builtin_gelu(ctx, xi, out, opts["approximate"])


@lowers(contract.GEGLU.name, domain=contract.DOMAIN)
def lower_geglu(ctx, node):
    opts = options_of(ctx, node, contract.GEGLU)
    x = node.inputs[0]
    rank = ctx.rank(x)
    perm = ctx.perm(x)
    if perm[-1] != rank - 1:
        perm = layout.identity(rank)
    xi, out = ctx.input(x, perm), ctx.output(node.outputs[0], perm)
    if contract.GEGLU.fuse_kind in ctx.fuse:
        emit_custom(ctx, contract.GEGLU, [xi], [out], opts)
        return
    half_shape = ctx.builder.shape_of(out)
    hidden, gate, gelu = ctx.temp("hidden", half_shape), ctx.temp("gate", half_shape), ctx.temp("gelu", half_shape)
    ctx.builder.op("SPLIT", [ctx.int_constant(rank - 1), xi], [hidden, gate], numSplits=2)
    builtin_gelu(ctx, gate, gelu, opts["approximate"])
    ctx.builder.op("MUL", [hidden, gelu], [out])


@lowers(contract.GROUP_NORM.name, domain=contract.DOMAIN)
def lower_group_norm(ctx, node):
    opts = options_of(ctx, node, contract.GROUP_NORM)
    x, gamma_value, beta_value = node.inputs
    gamma, beta = ctx.const(gamma_value), ctx.const(beta_value)
    if gamma is None or beta is None:
        raise ctx.unsupported("GroupNorm gamma and beta must be constant")
    channels = ctx.shape(x)[1]
    groups = opts["groups"]
    if channels % groups:
        raise ctx.unsupported(f"{channels} channels do not split into {groups} groups")
    xi, out, _ = channels_last_io(ctx, x, node.outputs[0])
    gamma = ctx.constant(gamma.astype(np.float32).reshape(channels), gamma_value.name)
    beta = ctx.constant(beta.astype(np.float32).reshape(channels), beta_value.name)
    if contract.group_norm_kind(ctx.shape(x), groups) in ctx.fuse:
        emit_custom(ctx, contract.GROUP_NORM, [xi, gamma, beta], [out], opts)
        return
    stored = ctx.builder.shape_of(xi)
    grouped_shape = (stored[0], int(np.prod(stored[1:-1])), groups, channels // groups)
    grouped = ctx.temp("grouped", grouped_shape)
    ctx.reshape_op(xi, grouped, grouped_shape)
    normalized = normalize(ctx, grouped, [1, 3], opts["epsilon"])
    flat = ctx.temp("ungrouped", stored)
    ctx.reshape_op(normalized, flat, stored)
    scaled = ctx.temp("scaled", stored)
    ctx.builder.op("MUL", [flat, gamma], [scaled])
    if opts["activation"] == "silu":
        shifted, gate = ctx.temp("shifted", stored), ctx.temp("sigmoid", stored)
        ctx.builder.op("ADD", [scaled, beta], [shifted])
        ctx.builder.op("LOGISTIC", [shifted], [gate])
        ctx.builder.op("MUL", [shifted, gate], [out])
    else:
        ctx.builder.op("ADD", [scaled, beta], [out])


@lowers(contract.ATTENTION.name, domain=contract.DOMAIN)
def lower_attention(ctx, node):
    opts = options_of(ctx, node, contract.ATTENTION)
    q, k, v = node.inputs
    for value in (q, k, v):
        if ctx.rank(value) != 3:
            raise ctx.unsupported(f"Attention inputs must be [N, L, H*D], got {ctx.shape(value)}")
    qi, ki, vi = (ctx.input(value, layout.identity(3)) for value in (q, k, v))
    out = ctx.output(node.outputs[0], layout.identity(3))
    if contract.ATTENTION.fuse_kind in ctx.fuse:
        emit_custom(ctx, contract.ATTENTION, [qi, ki, vi], [out], opts)
        return
    decomposed_attention(ctx, qi, ki, vi, out, opts)


def split_heads(ctx, xi: int, heads: int, suffix: str) -> int:
    """[N, L, H*D] -> [N, H, L, D]."""
    n, length, width = ctx.builder.shape_of(xi)
    shape = (n, length, heads, width // heads)
    split = ctx.temp(f"{suffix}_split", shape)
    ctx.reshape_op(xi, split, shape)
    heads_first = ctx.temp(f"{suffix}_heads", (n, heads, length, width // heads))
    ctx.builder.op("TRANSPOSE", [split, ctx.int_constant([0, 2, 1, 3])], [heads_first])
    return heads_first


def decomposed_attention(ctx, qi: int, ki: int, vi: int, out: int, opts: dict) -> None:
    heads = opts["heads"]
    n, lq, _ = ctx.builder.shape_of(qi)
    lk = ctx.builder.shape_of(ki)[1]
    dv = ctx.builder.shape_of(vi)[2] // heads
    qh, kh, vh = split_heads(ctx, qi, heads, "q"), split_heads(ctx, ki, heads, "k"), split_heads(ctx, vi, heads, "v")
    scores = ctx.temp("scores", (n, heads, lq, lk))
    ctx.builder.op("BATCH_MATMUL", [qh, kh], [scores], adjX=False, adjY=True)
    scaled = ctx.temp("scaled_scores", (n, heads, lq, lk))
    ctx.builder.op("MUL", [scores, ctx.float_constant(np.full((1, 1, 1, 1), opts["scale"], np.float32),
                                                       "const/attention_scale")], [scaled])
    if opts["causal"]:
        # the lowest float16, not -1e9: stored exactly (and finite) at --precision fp16 too
        mask = np.triu(np.full((lq, lk), np.finfo(np.float16).min, np.float32), k=1).reshape(1, 1, lq, lk)
        masked = ctx.temp("masked_scores", (n, heads, lq, lk))
        ctx.builder.op("ADD", [scaled, ctx.float_constant(mask, "const/causal_mask")], [masked])
        scaled = masked
    probs = ctx.temp("probs", (n, heads, lq, lk))
    ctx.builder.op("SOFTMAX", [scaled], [probs], beta=1.0)
    context = ctx.temp("context", (n, heads, lq, dv))
    ctx.builder.op("BATCH_MATMUL", [probs, vh], [context], adjX=False, adjY=False)
    merged = ctx.temp("merged", (n, lq, heads, dv))
    ctx.builder.op("TRANSPOSE", [context, ctx.int_constant([0, 2, 1, 3])], [merged])
    ctx.reshape_op(merged, out, (n, lq, heads * dv))


@lowers(contract.WINOGRAD_CONV3X3.name, domain=contract.DOMAIN)
def lower_winograd(ctx, node):
    opts = options_of(ctx, node, contract.WINOGRAD_CONV3X3)
    if contract.WINOGRAD_CONV3X3.fuse_kind not in ctx.fuse:
        raise ctx.unsupported("WinogradConv3x3 has no builtin form; convert with --fuse winograd")
    x, w, bias = node.inputs
    weights, b = ctx.const(w), ctx.const(bias)
    if weights is None or b is None:
        raise ctx.unsupported("WinogradConv3x3 weights and bias must be constant")
    xi, out, _ = channels_last_io(ctx, x, node.outputs[0])
    if weights.ndim == 4:  # the filter form: [Cout, Cin, 3, 3], stored as any conv's OHWI filter
        w_index = ctx.weight(np.transpose(weights, (0, 2, 3, 1)), f"{w.name}/ohwi")
    else:
        w_index = ctx.constant(weights.astype(np.float32), w.name)
    emit_custom(ctx, contract.WINOGRAD_CONV3X3, [xi, w_index, ctx.constant(b.astype(np.float32), bias.name)],
                [out], opts)


@lowers(contract.LORA.name, domain=contract.DOMAIN)
def lower_lora(ctx, node):
    """A run-time LoRA slot (passes/lora.py writes it only where the file needs the op library):
    always the custom op, features on the stored last axis (NHWC for a 1x1 convolution's)."""
    opts = options_of(ctx, node, contract.LORA)
    y, x = node.inputs
    if ctx.rank(y) != ctx.rank(x) or ctx.rank(y) < 2:
        raise ctx.unsupported(f"LoRA y and x must have one rank >= 2, got {ctx.shape(y)} and {ctx.shape(x)}")
    perm = layout.channels_last(ctx.rank(y)) if ctx.rank(y) == 4 else layout.identity(ctx.rank(y))
    yi, xi = ctx.input(y, perm), ctx.input(x, perm)
    emit_custom(ctx, contract.LORA, [yi, xi], [ctx.output(node.outputs[0], perm)], opts)
