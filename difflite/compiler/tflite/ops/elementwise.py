"""Elementwise ops, with ONNX (numpy) broadcasting carried into the stored layout."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import attr, lowers

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
# Kernels that take int8 / uint8 only as quantized tensors (LiteRT 2.3, no quantization
# parameters given): ADD, SUB and the comparisons abort the interpreter while it prepares them,
# MUL and DIV return zeros, ABS, SIGN and NEG (uint8) fail at invoke. On these types they run on
# int32 copies of the operands instead; an arithmetic result is cast back, which wraps around
# as ONNX's (numpy's) 8-bit arithmetic does.
NARROW_INTS = (np.dtype(np.int8), np.dtype(np.uint8))
THROUGH_INT32 = {"ADD", "SUB", "MUL", "DIV", "EQUAL", "NOT_EQUAL", "LESS", "GREATER", "LESS_EQUAL",
                 "GREATER_EQUAL", "ABS", "SIGN", "NEG"}
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
    if op_name in THROUGH_INT32 and any(ctx.dtype(v) in NARROW_INTS for v in values):
        return through_int32(ctx, op_name, values, out_value, perm, dtype, **options)
    inputs = [ctx.input(v, perm, rank) for v in values]
    out = ctx.output(out_value, perm, dtype)
    ctx.builder.op(op_name, inputs, [out], **options)
    return out


def through_int32(ctx, op_name: str, values, out_value, perm, dtype=None, **options) -> int:
    """`op_name` on int32 copies of 8-bit integer operands (THROUGH_INT32). A boolean result
    (`dtype`) is the output itself; an integer one is cast back to the output's type."""
    rank = ctx.rank(out_value)
    inputs = [operand_as(ctx, v, perm, rank, np.int32) for v in values]
    out = ctx.output(out_value, perm, dtype)
    if ctx.builder.dtype_of(out) == np.bool_:
        ctx.builder.op(op_name, inputs, [out], **options)
        return out
    wide = ctx.temp(op_name.lower(), ctx.builder.shape_of(out), np.int32)
    ctx.builder.op(op_name, inputs, [wide], **options)
    ctx.builder.op("CAST", [wide], [out])
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
    """ONNX Pow takes a base (T) and an exponent (T1) of different types, the result being of the
    base's type; TFLite's POW wants one type, float32 or int32. A float base computes in float32
    (the exponent cast; float16 cast there and back); an integer base with an integer (or a
    constant holding whole numbers >= 0) exponent in int32; an integer base with a float exponent
    in float32, the result truncated towards zero as onnxruntime does (exact while |result| <
    2^24)."""
    base, exponent = node.inputs
    out_value = node.outputs[0]
    base_float = np.issubdtype(ctx.dtype(base), np.floating)
    e = ctx.const(exponent)
    scalar = float(e.reshape(-1)[0]) if e is not None and e.size == 1 else None
    if scalar == 2.0:
        elementwise(ctx, "MUL", [base, base], out_value)
    elif scalar == 0.5 and base_float:
        elementwise(ctx, "SQRT", [base], out_value)
    elif base_float:
        power(ctx, base, exponent, out_value, np.dtype(np.float32))
    elif e is not None and np.all(e >= 0) and np.all(np.floor(e) == e):
        power(ctx, base, exponent, out_value, np.dtype(np.int32))
    elif not np.issubdtype(ctx.dtype(exponent), np.floating):
        power(ctx, base, exponent, out_value, np.dtype(np.int32))
    else:
        power(ctx, base, exponent, out_value, np.dtype(np.float32))


def power(ctx, base, exponent, out_value, compute) -> None:
    """POW with both operands cast to `compute`, the result cast to the output's type."""
    rank = ctx.rank(out_value)
    perm = common_perm(ctx, [base, exponent], rank)
    operands = [operand_as(ctx, v, perm, rank, compute) for v in (base, exponent)]
    out = ctx.output(out_value, perm)
    if ctx.builder.dtype_of(out) == compute:
        ctx.builder.op("POW", operands, [out])
        return
    result = ctx.temp("pow", ctx.builder.shape_of(out), compute)
    ctx.builder.op("POW", operands, [result])
    ctx.builder.op("CAST", [result], [out])


def operand_as(ctx, value, perm, rank: int, dtype) -> int:
    """`value` as a tensor of `dtype` in layout `perm`, padded to `rank` (CAST where computed)."""
    if ctx.is_const(value):
        array = np.asarray(ctx.const(value)).astype(dtype)
        array = array.reshape((1,) * (rank - array.ndim) + array.shape)
        return ctx.constant(np.transpose(array, perm), f"{value.name}/{np.dtype(dtype).name}", perm)
    xi = ctx.input(value, perm, rank)
    if ctx.builder.dtype_of(xi) == dtype:
        return xi
    cast = ctx.temp(np.dtype(dtype).name, ctx.builder.shape_of(xi), dtype)
    ctx.builder.op("CAST", [xi], [cast])
    return cast


@lowers(*UNARY)
def lower_unary(ctx, node):
    x = node.inputs[0]
    if node.op_type == "Relu" and not np.issubdtype(ctx.dtype(x), np.floating):
        # RELU takes integers only quantized (int8 gave zeros, int32 fails at invoke): max(x, 0)
        perm = ctx.perm(x)
        zero = ctx.constant(np.zeros((1,) * ctx.rank(x), ctx.dtype(x)), "const/zero", perm)
        out = ctx.output(node.outputs[0], perm)
        ctx.builder.op("MAXIMUM", [ctx.input(x), zero], [out])
        return
    elementwise(ctx, UNARY[node.op_type], [x], node.outputs[0])


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
    """min(max(x, low), high); either bound may be absent, constant or computed (Clip before
    opset 11 gives them as float attributes). Bounds take x's type."""
    x = node.inputs[0]
    low, high = (list(node.inputs[1:3]) + [None, None])[:2]
    dtype = ctx.dtype(x)
    rank = ctx.rank(x)
    perm = ctx.perm(x)
    steps = []
    for op, value, name in (("MAXIMUM", low, "min"), ("MINIMUM", high, "max")):
        if value is not None:
            steps.append((op, operand_as(ctx, value, perm, rank, dtype)))
        elif attr(node, name) is not None:
            bound = np.full((1,) * rank, attr(node, name), dtype)
            steps.append((op, ctx.constant(bound, f"const/clip_{name}", perm)))
    if not steps:
        lower_identity(ctx, node)
        return
    current = ctx.input(x)
    for i, (op, bound) in enumerate(steps):
        last = i == len(steps) - 1
        target = ctx.output(node.outputs[0], perm) if last else ctx.temp("clip", ctx.builder.shape_of(current), dtype)
        ctx.builder.op(op, [current, bound], [target])
        current = target
