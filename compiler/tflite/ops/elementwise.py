"""Elementwise ops, with ONNX (numpy) broadcasting carried into the stored layout."""

from __future__ import annotations

import numpy as np

from compiler.tflite import layout
from compiler.tflite.ops import attr, lowers

BINARY = {
    "Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "Max": "MAXIMUM", "Min": "MINIMUM",
    "Equal": "EQUAL", "Less": "LESS", "Greater": "GREATER", "LessOrEqual": "LESS_EQUAL",
    "GreaterOrEqual": "GREATER_EQUAL", "And": "LOGICAL_AND", "Or": "LOGICAL_OR",
}
UNARY = {
    "Sqrt": "SQRT", "Exp": "EXP", "Log": "LOG", "Tanh": "TANH", "Sigmoid": "LOGISTIC",
    "Neg": "NEG", "Abs": "ABS", "Sin": "SIN", "Cos": "COS", "Relu": "RELU", "Floor": "FLOOR",
    "Ceil": "CEIL", "Not": "LOGICAL_NOT", "Sign": "SIGN",
}
# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7 over the real line.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def common_perm(ctx, values, rank: int) -> tuple[int, ...]:
    """The layout an elementwise op works in: that of its first full-rank computed input, so
    the big operand is never transposed; constants and small operands follow it."""
    for value in values:
        if value is not None and not ctx.is_const(value) and ctx.rank(value) == rank:
            return ctx.perm(value)
    return layout.identity(rank)


def elementwise(ctx, op_name: str, values, out_value, dtype=None, **options) -> int:
    rank = ctx.rank(out_value)
    perm = common_perm(ctx, values, rank)
    inputs = [ctx.input(v, perm, rank) for v in values]
    out = ctx.output(out_value, perm, dtype)
    ctx.builder.op(op_name, inputs, [out], **options)
    return out


@lowers(*BINARY)
def lower_binary(ctx, node):
    if len(node.inputs) != 2:  # Max/Min are variadic in ONNX
        raise ctx.unsupported(f"{len(node.inputs)} inputs (only the 2-input form is lowered)")
    a, b = node.inputs
    dtype = np.bool_ if node.op_type in ("Equal", "Less", "Greater", "LessOrEqual",
                                         "GreaterOrEqual", "And", "Or") else None
    elementwise(ctx, BINARY[node.op_type], [a, b], node.outputs[0], dtype)


@lowers("Pow")
def lower_pow(ctx, node):
    base, exponent = node.inputs
    e = ctx.const(exponent)
    if e is not None and e.size == 1 and float(e.reshape(-1)[0]) == 2.0:
        elementwise(ctx, "MUL", [base, base], node.outputs[0])
    elif e is not None and e.size == 1 and float(e.reshape(-1)[0]) == 0.5:
        elementwise(ctx, "SQRT", [base], node.outputs[0])
    else:
        elementwise(ctx, "POW", [base, exponent], node.outputs[0])


@lowers(*UNARY)
def lower_unary(ctx, node):
    elementwise(ctx, UNARY[node.op_type], [node.inputs[0]], node.outputs[0])


@lowers("Reciprocal")
def lower_reciprocal(ctx, node):
    x = node.inputs[0]
    perm = ctx.perm(x)
    out = ctx.output(node.outputs[0], perm)
    one = ctx.float_constant(np.ones((1,) * ctx.rank(x), np.float32), "const/one")
    ctx.builder.op("DIV", [one, ctx.input(x)], [out])


@lowers("Identity")
def lower_identity(ctx, node):
    stored = ctx.values[node.inputs[0].name]
    ctx.define(node.outputs[0], stored.index, stored.perm)


@lowers("Cast")
def lower_cast(ctx, node):
    x, out_value = node.inputs[0], node.outputs[0]
    if ctx.dtype(x) == ctx.dtype(out_value):
        lower_identity(ctx, node)
        return
    elementwise(ctx, "CAST", [x], out_value)


@lowers("Where")
def lower_where(ctx, node):
    elementwise(ctx, "SELECT_V2", list(node.inputs), node.outputs[0])


@lowers("Gelu")
def lower_gelu(ctx, node):
    approximate = attr(node, "approximate", "none")
    elementwise(ctx, "GELU", [node.inputs[0]], node.outputs[0], approximate=approximate == "tanh")


@lowers("Erf")
def lower_erf(ctx, node):
    """erf from builtins: sign(x) * (1 - poly(t) * exp(-x^2)), t = 1 / (1 + p|x|)."""
    x = node.inputs[0]
    perm = ctx.perm(x)
    shape = ctx.builder.shape_of(ctx.input(x))
    xi = ctx.input(x)

    def tmp(suffix):
        return ctx.temp(suffix, shape)

    def scalar(v):
        return ctx.float_constant(np.full((1,) * len(shape), v, np.float32), f"const/erf{v}")

    def op(name, inputs, suffix):
        out = tmp(suffix)
        ctx.builder.op(name, inputs, [out])
        return out

    ax = op("ABS", [xi], "abs")
    t = op("DIV", [scalar(1.0), op("ADD", [op("MUL", [ax, scalar(ERF_P)], "px"), scalar(1.0)], "den")], "t")
    poly = op("MUL", [t, scalar(ERF_A[4])], "p4")
    for i, a in enumerate(reversed(ERF_A[:4])):
        poly = op("MUL", [op("ADD", [poly, scalar(a)], f"s{i}"), t], f"p{i}")
    decay = op("EXP", [op("NEG", [op("MUL", [ax, ax], "x2")], "nx2")], "exp")
    one_minus = op("SUB", [scalar(1.0), op("MUL", [poly, decay], "pe")], "erfabs")
    sign = op("SIGN", [xi], "sign")
    out = ctx.output(node.outputs[0], perm)
    ctx.builder.op("MUL", [sign, one_minus], [out])


@lowers("Clip")
def lower_clip(ctx, node):
    """min(max(x, low), high) with constant bounds (either may be absent)."""
    x = node.inputs[0]
    bounds = [v for v in node.inputs[1:3]]
    low, high = (bounds + [None, None])[:2]
    if any(b is not None and not ctx.is_const(b) for b in (low, high)):
        raise ctx.unsupported("Clip bounds must be constant")
    perm = ctx.perm(x)
    shape = ctx.builder.shape_of(ctx.input(x))
    current = ctx.input(x)
    steps = [(op, b) for op, b in (("MAXIMUM", low), ("MINIMUM", high)) if b is not None]
    if not steps:
        lower_identity(ctx, node)
        return
    for i, (op, bound) in enumerate(steps):
        value = float(np.asarray(ctx.const(bound)).reshape(-1)[0])
        target = ctx.output(node.outputs[0], perm) if i == len(steps) - 1 else ctx.temp("clip", shape)
        ctx.builder.op(op, [current, ctx.float_constant(np.full((1,) * len(shape), value, np.float32),
                                                        f"const/clip{value}")], [target])
        current = target
