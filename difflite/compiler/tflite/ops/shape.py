"""Data movement: Reshape family, Transpose, Concat, Split, Slice, Gather, Expand, Tile, Pad.

Shapes are static, so every shape operand must be a compile-time constant; the output shape comes
from the graph's shape annotations."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import attr, lowers

INT64_MAX = np.iinfo(np.int64).max


def reshape_to(ctx, x, out_value) -> None:
    """RESHAPE `x` to the (static) shape of `out_value`, in a layout that needs no transpose
    when one exists."""
    src_shape = ctx.shape(x)
    dst_shape = ctx.shape(out_value)
    perm = layout.reshape_in_layout(src_shape, ctx.perm(x), dst_shape)
    if perm is None:
        xi = ctx.input(x, layout.identity(len(src_shape)))
        perm = layout.identity(len(dst_shape))
    else:
        xi = ctx.input(x)
    out = ctx.output(out_value, perm)
    ctx.reshape_op(xi, out, ctx.builder.shape_of(out))


@lowers("Reshape", "Unsqueeze", "Squeeze", "Flatten")
def lower_reshape(ctx, node):
    reshape_to(ctx, node.inputs[0], node.outputs[0])


@lowers("Transpose")
def lower_transpose(ctx, node):
    """Free: the output is the same stored tensor seen through a composed layout."""
    x = node.inputs[0]
    rank = ctx.rank(x)
    onnx_perm = tuple(attr(node, "perm", list(reversed(range(rank)))))
    stored = ctx.values[x.name]
    out_perm = tuple(layout.inverse(onnx_perm)[a] for a in stored.perm)
    ctx.define(node.outputs[0], stored.index, out_perm)


def computed_perm(ctx, values, rank):
    for v in values:
        if v is not None and not ctx.is_const(v):
            return ctx.perm(v)
    return layout.identity(rank)


@lowers("Concat")
def lower_concat(ctx, node):
    values = [v for v in node.inputs if v is not None and 0 not in ctx.shape(v)]
    rank = ctx.rank(node.outputs[0])
    axis = attr(node, "axis") % rank
    perm = computed_perm(ctx, values, rank)
    out = ctx.output(node.outputs[0], perm)
    inputs = [ctx.input(v, perm) for v in values]
    ctx.builder.op("CONCATENATION", inputs, [out], axis=perm.index(axis))


@lowers("Split")
def lower_split(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = attr(node, "axis", 0) % len(shape)
    sizes = [ctx.shape(v)[axis] for v in node.outputs]
    perm = ctx.perm(x)
    outs = [ctx.output(v, perm) for v in node.outputs]
    ctx.builder.op("SPLIT_V", [ctx.input(x), ctx.int_constant(sizes), ctx.int_constant(perm.index(axis))],
                   outs, numSplits=len(outs))


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int, bool]:
    """Clamp ONNX Slice bounds for one axis the way ONNX defines them. Returns (begin, end,
    end_is_open) where end_is_open means "run to the array's edge" (end_mask)."""
    if start < 0:
        start += dim
    if end < 0 and end > -INT64_MAX:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        return start, end, False
    start = min(max(start, 0), dim - 1)  # ONNX clamps to [0, dim-1]; TFLite reads -1 as the last
    if end < 0:
        return start, 0, True
    return start, min(end, dim - 1), False


@lowers("Slice")
def lower_slice(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    operands = [ctx.const(v) if v is not None else None for v in node.inputs[1:]]
    if any(o is None for o, v in zip(operands, node.inputs[1:]) if v is not None):
        raise ctx.unsupported("Slice starts/ends/axes/steps must be constant")
    starts, ends = operands[0], operands[1]
    axes = operands[2] if len(operands) > 2 and operands[2] is not None else np.arange(len(starts))
    steps = operands[3] if len(operands) > 3 and operands[3] is not None else np.ones(len(starts), np.int64)
    perm = ctx.perm(x)
    stored_shape = layout.apply(shape, perm)
    begin, end, strides = [0] * rank, list(stored_shape), [1] * rank
    end_mask = 0
    for start, stop, axis, step in zip(starts, ends, axes, steps):
        axis = int(axis) % rank
        pos = perm.index(axis)
        b, e, open_end = slice_bounds(shape[axis], int(start), int(stop), int(step))
        begin[pos], end[pos], strides[pos] = b, e, int(step)
        if open_end:
            end_mask |= 1 << pos
    out = ctx.output(node.outputs[0], perm)
    ctx.builder.op("STRIDED_SLICE", [ctx.input(x), ctx.int_constant(begin), ctx.int_constant(end),
                                     ctx.int_constant(strides)], [out], endMask=end_mask)


FLOAT_EXACT_INDEX = 1 << 24  # float32 holds every integer below this exactly


def wrapped_indices(ctx, idx: int, size: int) -> int:
    """Runtime indices with ONNX's negative form (-1 = the last along an axis of `size`) made
    non-negative, as GATHER wants them: idx + size where idx < 0 (out-of-range ones stay out of
    range, for GATHER to reject). ONNX indices are int32 or int64, both int32 in the .tflite.

    Computed in float32 (exact below 2^24): the OpenCL backend runs elementwise ops in float only,
    and so claims these six with the GATHER, keeping a text encoder's graph whole. Larger axes
    compute in int32 (LESS, ADD, SELECT_V2)."""
    shape = ctx.builder.shape_of(idx)
    ones = (1,) * len(shape)
    if size >= FLOAT_EXACT_INDEX:
        negative, shifted, out = (ctx.temp("negative", shape, np.bool_), ctx.temp("shifted", shape, np.int32),
                                  ctx.temp("indices", shape, np.int32))
        ctx.builder.op("LESS", [idx, ctx.int_constant(np.zeros(ones, np.int32))], [negative])
        ctx.builder.op("ADD", [idx, ctx.int_constant(np.full(ones, size, np.int32))], [shifted])
        ctx.builder.op("SELECT_V2", [negative, shifted, idx], [out])
        return out

    def step(op, inputs, suffix, dtype=np.float32):
        out = ctx.temp(suffix, shape, dtype)
        ctx.builder.op(op, inputs, [out])
        return out

    def scalar(value):
        return ctx.float_constant(np.full(ones, value, np.float32), f"const/index{value:g}")

    position = step("CAST", [idx], "indices_float")
    below_zero = step("MINIMUM", [position, scalar(0.0)], "below_zero")
    flag = step("MAXIMUM", [below_zero, scalar(-1.0)], "negative")  # -1 where idx < 0, else 0
    shift = step("MUL", [flag, scalar(-float(size))], "shift")
    return step("CAST", [step("ADD", [position, shift], "wrapped")], "indices", np.int32)


@lowers("Gather")
def lower_gather(ctx, node):
    data, indices = node.inputs
    shape = ctx.shape(data)
    axis = attr(node, "axis", 0) % len(shape)
    index_const = ctx.const(indices)
    if index_const is not None:
        index_const = np.where(index_const < 0, index_const + shape[axis], index_const)
    if index_const is not None and index_const.ndim == 0:
        # A scalar index drops the axis: a strided slice with shrink_axis_mask.
        perm = layout.identity(len(shape))
        begin = [0] * len(shape)
        begin[axis] = int(index_const)
        end = list(shape)
        end[axis] = int(index_const) + 1
        out = ctx.output(node.outputs[0], layout.identity(len(shape) - 1))
        ctx.builder.op("STRIDED_SLICE", [ctx.input(data, perm), ctx.int_constant(begin),
                                         ctx.int_constant(end), ctx.int_constant([1] * len(shape))],
                       [out], shrinkAxisMask=1 << axis)
        return
    index_rank = ctx.rank(indices)
    rank_out = len(shape) - 1 + index_rank
    out = ctx.output(node.outputs[0], layout.identity(rank_out))
    gathered = out
    if index_const is not None:
        idx = ctx.constant(index_const.astype(np.int32), indices.name)
    else:
        idx = ctx.input(indices, layout.identity(index_rank))
        if index_rank > 1:
            # Runtime indices of rank > 1 (token ids [batch, length]) go flat, the rows reshaped
            # after: LiteRT's GPU accelerator refuses GATHER with 2-D indices (FACTS).
            count = int(np.prod(ctx.builder.shape_of(idx)))
            flat = ctx.temp("flat_indices", (count,), np.int32)
            ctx.reshape_op(idx, flat, (count,))
            idx = flat
            gathered = ctx.temp("rows", (*shape[:axis], count, *shape[axis + 1:]), ctx.builder.dtype_of(out))
        idx = wrapped_indices(ctx, idx, shape[axis])
    table = ctx.const(data)
    if not (index_const is None and axis == 0 and table is not None and table.ndim == 2
            and np.issubdtype(table.dtype, np.floating) and ctx.lookup(table, data.name, idx, gathered)):
        # (ctx.lookup wrote the rows of a table stored quantized or as float16)
        ctx.builder.op("GATHER", [ctx.input(data, layout.identity(len(shape))), idx], [gathered], axis=axis)
    if gathered != out:
        ctx.reshape_op(gathered, out, ctx.builder.shape_of(out))


@lowers("Expand")
def lower_expand(ctx, node):
    x = node.inputs[0]
    out_value = node.outputs[0]
    rank = ctx.rank(out_value)
    perm = ctx.perm(x) if ctx.rank(x) == rank and not ctx.is_const(x) else layout.identity(rank)
    out = ctx.output(out_value, perm)
    # TILE, not BROADCAST_TO: the runtimes register BROADCAST_TO from op version 2 only, and the
    # builder writes version 1. Broadcast axes have size 1 in the input, so the repeats are exact.
    xi = ctx.input(x, perm, rank)
    reps = [o // i for o, i in zip(ctx.builder.shape_of(out), ctx.builder.shape_of(xi))]
    ctx.builder.op("TILE", [xi, ctx.int_constant(reps)], [out])


@lowers("Tile")
def lower_tile(ctx, node):
    x, repeats = node.inputs
    reps = ctx.const(repeats)
    if reps is None:
        raise ctx.unsupported("Tile repeats must be constant")
    perm = ctx.perm(x)
    out = ctx.output(node.outputs[0], perm)
    ctx.builder.op("TILE", [ctx.input(x), ctx.int_constant(layout.apply(list(reps), perm))], [out])


@lowers("Pad")
def lower_pad(ctx, node):
    x = node.inputs[0]
    pads = ctx.const(node.inputs[1])
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    value = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    axes_value = node.inputs[3] if len(node.inputs) > 3 else None
    if pads is None or mode != "constant" or axes_value is not None:
        raise ctx.unsupported(f"Pad mode={mode} with non-constant pads or axes")
    if value is not None and float(np.asarray(value).reshape(-1)[0]) != 0.0:
        raise ctx.unsupported("Pad with a non-zero constant value")
    rank = ctx.rank(x)
    perm = ctx.perm(x)
    pairs = np.stack([pads[:rank], pads[rank:]], axis=1)[list(perm)]
    if (pairs < 0).any():
        raise ctx.unsupported("Pad with negative pads")
    out = ctx.output(node.outputs[0], perm)
    ctx.builder.op("PAD", [ctx.input(x), ctx.int_constant(pairs)], [out])
