"""Softmax and the normalisations TFLite has no builtin for, decomposed into MEAN/SUB/MUL/RSQRT."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite.ops import attr, lowers


def axes_last(perm, axes) -> tuple[int, ...]:
    """A layout storing the ONNX `axes` last (in order), keeping `perm` if it already does."""
    axes = tuple(axes)
    if tuple(perm[len(perm) - len(axes):]) == axes:
        return tuple(perm)
    rest = [a for a in perm if a not in axes]
    return (*rest, *axes)


def normalize(ctx, xi: int, stored_axes: list[int], epsilon: float) -> int:
    """(x - mean) / sqrt(var + eps) over `stored_axes` of TFLite tensor xi (biased variance)."""
    shape = ctx.builder.shape_of(xi)
    reduced = tuple(1 if i in stored_axes else d for i, d in enumerate(shape))
    axes = ctx.int_constant(sorted(stored_axes))

    def new(suffix, s=shape):
        return ctx.temp(suffix, s)

    mean, centered, square, var, var_eps, inv, out = (
        new("mean", reduced), new("centered"), new("square"), new("var", reduced),
        new("var_eps", reduced), new("rstd", reduced), new("normalized"))
    ctx.builder.op("MEAN", [xi, axes], [mean], keepDims=True)
    ctx.builder.op("SUB", [xi, mean], [centered])
    ctx.builder.op("MUL", [centered, centered], [square])
    ctx.builder.op("MEAN", [square, axes], [var], keepDims=True)
    eps = ctx.float_constant(np.full((1,) * len(shape), epsilon, np.float32), "const/eps")
    ctx.builder.op("ADD", [var, eps], [var_eps])
    ctx.builder.op("RSQRT", [var_eps], [inv])
    ctx.builder.op("MUL", [centered, inv], [out])
    return out


def affine(ctx, xi: int, scale: np.ndarray | None, bias: np.ndarray | None, out: int, name: str):
    """out = xi * scale + bias with constant, already layout-aligned scale and bias."""
    current = xi
    if scale is not None:
        target = out if bias is None else ctx.temp("scaled", ctx.builder.shape_of(xi))
        ctx.builder.op("MUL", [current, ctx.constant(scale, name + "/scale")], [target])
        current = target
    if bias is not None:
        ctx.builder.op("ADD", [current, ctx.constant(bias, name + "/bias")], [out])
    elif scale is None:
        ctx.reshape_op(current, out, ctx.builder.shape_of(out))


def aligned(vector: np.ndarray | None, onnx_shape, axes, perm) -> np.ndarray | None:
    """A per-`axes` constant broadcast-shaped for a tensor of `onnx_shape` stored in `perm`."""
    if vector is None:
        return None
    full = [1] * len(onnx_shape)
    for a in axes:
        full[a] = onnx_shape[a]
    array = np.asarray(vector, np.float32).reshape([onnx_shape[a] for a in axes])
    return np.transpose(array.reshape(full), perm)


@lowers("Softmax")
def lower_softmax(ctx, node):
    x = node.inputs[0]
    rank = ctx.rank(x)
    axis = attr(node, "axis", -1) % rank
    perm = axes_last(ctx.perm(x), (axis,))
    out = ctx.output(node.outputs[0], perm)
    ctx.builder.op("SOFTMAX", [ctx.input(x, perm)], [out], beta=1.0)


@lowers("LayerNormalization")
def lower_layer_norm(ctx, node):
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    shape = ctx.shape(x)
    rank = len(shape)
    axis = attr(node, "axis", -1) % rank
    axes = tuple(range(axis, rank))
    perm = axes_last(ctx.perm(x), axes)
    normalized = normalize(ctx, ctx.input(x, perm), [perm.index(a) for a in axes],
                           attr(node, "epsilon", 1e-5))
    scale_c, bias_c = ctx.const(scale), ctx.const(bias) if bias is not None else None
    if scale_c is None or (bias is not None and bias_c is None):
        raise ctx.unsupported("LayerNormalization scale and bias must be constant")
    out = ctx.output(node.outputs[0], perm)
    affine(ctx, normalized, aligned(scale_c, shape, axes, perm), aligned(bias_c, shape, axes, perm),
           out, scale.name)


@lowers("InstanceNormalization")
def lower_instance_norm(ctx, node):
    x, scale, bias = node.inputs
    shape = ctx.shape(x)
    perm = ctx.perm(x)
    spatial = tuple(range(2, len(shape)))
    normalized = normalize(ctx, ctx.input(x), [perm.index(a) for a in spatial],
                           attr(node, "epsilon", 1e-5))
    scale_c, bias_c = ctx.const(scale), ctx.const(bias)
    if scale_c is None or bias_c is None:
        raise ctx.unsupported("InstanceNormalization scale and bias must be constant")
    out = ctx.output(node.outputs[0], perm)
    identity_scale = np.all(scale_c == 1.0)
    zero_bias = np.all(bias_c == 0.0)
    affine(ctx, normalized, None if identity_scale else aligned(scale_c, shape, (1,), perm),
           None if zero_bias else aligned(bias_c, shape, (1,), perm), out, scale.name)

