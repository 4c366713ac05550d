"""MatMul and Gemm: FULLY_CONNECTED for constant right operands, BATCH_MATMUL otherwise."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import attr, lowers


def last_axis_last(perm) -> tuple[int, ...]:
    """`perm` if the last ONNX axis is stored last (FULLY_CONNECTED contracts the stored last
    axis and keeps the others in place), else the identity."""
    rank = len(perm)
    return tuple(perm) if perm[-1] == rank - 1 else layout.identity(rank)


def fully_connected(ctx, x, weights_nk: np.ndarray, bias: np.ndarray | None, out_value, name: str):
    perm = last_axis_last(ctx.perm(x))
    xi = ctx.input(x, perm)
    if ctx.stock_gpu_forms and ctx.weight_width(np.asarray(weights_nk, np.float32), name)[0] != "float":
        linear_as_1x1_convolution(ctx, xi, weights_nk, bias, ctx.output(out_value, perm), name)
        return
    inputs = [xi, ctx.weight(weights_nk, name)]
    if bias is not None:
        inputs.append(ctx.constant(np.asarray(bias, np.float32).reshape(-1), name + "/bias"))
    else:
        inputs.append(-1)
    out = ctx.output(out_value, perm)
    ctx.builder.op("FULLY_CONNECTED", inputs, [out], keepNumDims=True)


def linear_as_1x1_convolution(ctx, xi: int, weights_nk: np.ndarray, bias: np.ndarray | None, out: int, name: str):
    """out = xi W^T + bias as a 1x1 CONV_2D over xi's rows viewed [1, 1, M, K], the filter
    [N, 1, 1, K]. `--no-fuse` files (the ones stock LiteRT runs) write quantized linear layers so:
    stock LiteRT's GPU accelerator compiles an int8 / int4 weight only as a convolution's 4-D
    filter, and fails on a quantized FULLY_CONNECTED with a shape
    mismatch (LiteRT 2.3.0 on an H100, 2026-11)."""
    n, k = weights_nk.shape
    rows = int(np.prod(ctx.builder.shape_of(xi)[:-1]))
    image = ctx.temp("rows", (1, 1, rows, k))
    ctx.reshape_op(xi, image, (1, 1, rows, k))
    filt = ctx.weight(weights_nk, name, shape=(n, 1, 1, k))
    b = np.zeros(n, np.float32) if bias is None else np.asarray(bias, np.float32).reshape(-1)
    conv = ctx.temp("conv", (1, 1, rows, n))
    ctx.builder.op("CONV_2D", [image, filt, ctx.constant(b, name + "/bias")], [conv], padding=1, strideH=1,
                   strideW=1, dilationHFactor=1, dilationWFactor=1)
    ctx.reshape_op(conv, out, ctx.builder.shape_of(out))


def matmul_operand(ctx, value, rank: int) -> tuple[int, bool]:
    """An operand for BATCH_MATMUL: stored as ONNX orders it, or with its last two axes swapped
    (then the adjoint flag is set instead of transposing)."""
    if ctx.is_const(value):
        return ctx.input(value, layout.identity(rank), rank), False
    perm = ctx.perm(value)
    own = len(perm)
    swapped = (*range(own - 2), own - 1, own - 2)
    if own == rank and tuple(perm) == swapped and own >= 2:
        return ctx.input(value), True
    return ctx.input(value, layout.identity(rank), rank), False


def sole_bias_add(ctx, value, n: int):
    """(Add node, bias [n]) when `value`'s only use is an Add of a constant that varies along
    the last axis alone (a linear layer's bias) and the sum has `value`'s shape and type: the
    FULLY_CONNECTED computing `value` can add it itself. Else None."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    add = uses[0].node
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
        return None
    other = add.inputs[1 - uses[0].idx]
    bias = ctx.const(other)
    if bias is None or other is value or bias.size != n or (bias.ndim and bias.shape[-1] != n):
        return None
    out = add.outputs[0]
    if ctx.shape(out) != ctx.shape(value) or ctx.dtype(out) != ctx.dtype(value):
        return None
    return add, np.asarray(bias, np.float32).reshape(n)


@lowers("MatMul")
def lower_matmul(ctx, node):
    a, b = node.inputs
    out_value = node.outputs[0]
    weights = ctx.const(b)
    if weights is not None and weights.ndim == 2 and ctx.rank(a) >= 2:
        folded = sole_bias_add(ctx, out_value, weights.shape[1])
        if folded is not None:
            add, bias = folded
            fully_connected(ctx, a, weights.T, bias, add.outputs[0], f"{b.name}/nk")
            ctx.absorbed.add(add)
            return
        fully_connected(ctx, a, weights.T, None, out_value, f"{b.name}/nk")
        return
    rank = ctx.rank(out_value)
    if ctx.rank(a) < 2 or ctx.rank(b) < 2:
        raise ctx.unsupported("MatMul with a 1-D operand")
    ai, adj_x = matmul_operand(ctx, a, rank)
    bi, adj_y = matmul_operand(ctx, b, rank)
    out = ctx.output(out_value, layout.identity(rank))
    ctx.builder.op("BATCH_MATMUL", [ai, bi], [out], adjX=adj_x, adjY=adj_y)


@lowers("Gemm")
def lower_gemm(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    weights = ctx.const(b)
    bias = ctx.const(c) if c is not None else None
    if weights is None or (c is not None and bias is None):
        raise ctx.unsupported("Gemm needs constant B and C")
    if attr(node, "transA", 0):
        raise ctx.unsupported("Gemm with transA=1")
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    weights_nk = weights if attr(node, "transB", 0) else weights.T
    n = weights_nk.shape[0]
    if bias is not None:
        bias = np.broadcast_to(np.asarray(bias, np.float32).reshape(-1) * beta, (n,)) if bias.size in (1, n) else None
        if bias is None:
            raise ctx.unsupported("Gemm bias must be a vector over the output features")
    fully_connected(ctx, a, weights_nk * alpha if alpha != 1.0 else weights_nk, bias,
                    node.outputs[0], f"{b.name}/nk")
