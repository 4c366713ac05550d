"""Reductions over constant axes: MEAN, SUM, REDUCE_MAX, REDUCE_MIN."""

from __future__ import annotations

from difflite.compiler.tflite.ops import attr, lowers

REDUCERS = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "REDUCE_MAX",
            "ReduceMin": "REDUCE_MIN"}


@lowers(*REDUCERS)
def lower_reduce(ctx, node):
    x = node.inputs[0]
    rank = ctx.rank(x)
    axes_value = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_value is not None:
        axes = ctx.const(axes_value)
        if axes is None:
            raise ctx.unsupported("reduction axes must be constant")
        axes = [int(a) % rank for a in axes.reshape(-1)]
    else:
        axes = [a % rank for a in attr(node, "axes", list(range(rank)))]
    if not axes and attr(node, "noop_with_empty_axes", 0):
        lower_identity_like(ctx, node)
        return
    axes = axes or list(range(rank))
    keep = bool(attr(node, "keepdims", 1))
    perm = ctx.perm(x)
    if keep:
        out_perm = perm
    else:
        kept = [a for a in range(rank) if a not in axes]
        out_perm = tuple(kept.index(a) for a in perm if a in kept)
    out = ctx.output(node.outputs[0], out_perm)
    ctx.builder.op(REDUCERS[node.op_type], [ctx.input(x), ctx.int_constant(sorted(perm.index(a) for a in axes))],
                   [out], keepDims=keep)


def lower_identity_like(ctx, node):
    stored = ctx.values[node.inputs[0].name]
    ctx.define(node.outputs[0], stored.index, stored.perm)
