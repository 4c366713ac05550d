"""Reference implementations of the difflite ops as ONNX functions, so onnxruntime (which inlines
model-local functions) can run graphs the passes produced.

`with_reference_functions(model_proto)` returns a copy in which every difflite node calls a
model-local FunctionProto built from standard ONNX ops. onnxruntime cannot compare strings, so a
string attribute cannot select the formula inside a function: the copy specializes instead
(node `difflite.Gelu<approximate="tanh">` becomes a call of function `Gelu__tanh`). Numeric
attributes (groups, epsilon, heads, scale, causal) stay attributes the functions reference.
All math is the contract's (DESIGN §2), written independently of the fused patterns.
WinogradConv3x3 has no reference yet.
"""

from __future__ import annotations

import copy

import onnx
import onnx.parser

from difflite.core import custom_ops

MIN_OPSET = 15  # the bodies use CastLike (15); otherwise only ops unchanged since 13/14
IR_VERSION = 10  # onnxruntime 1.31 reads up to 13; exporters write 10
MASKED = -1e30  # added above the diagonal for causal attention (the reference runs in float32)

_HEADER = f'<domain: "{custom_ops.DOMAIN}", opset_import: ["" : {MIN_OPSET}, "{custom_ops.DOMAIN}" : 1]>'

# erf and tanh GELU: 0.5 x (1 + s), s = erf(x / sqrt 2) or tanh(sqrt(2 / pi) (x + 0.044715 x^3))
_HALF_X_ONE_PLUS_S = """
        half = Constant <value_float = 0.5> ()
        one = Constant <value_float = 1.0> ()
        one_t = CastLike(one, x)
        s1 = Add(s, one_t)
        half_t = CastLike(half, x)
        hx = Mul(x, half_t)
        y = Mul(hx, s1)
"""

_GELU_BODY = {
    "erf": """
        inv_sqrt2 = Constant <value_float = 0.70710678118654752> ()
        inv_sqrt2_t = CastLike(inv_sqrt2, x)
        arg = Mul(x, inv_sqrt2_t)
        s = Erf(arg)
    """ + _HALF_X_ONE_PLUS_S,
    "tanh": """
        c = Constant <value_float = 0.79788456080286536> ()
        k = Constant <value_float = 0.044715> ()
        x2 = Mul(x, x)
        x3 = Mul(x2, x)
        k_t = CastLike(k, x)
        kx3 = Mul(x3, k_t)
        inner = Add(x, kx3)
        c_t = CastLike(c, x)
        arg = Mul(inner, c_t)
        s = Tanh(arg)
    """ + _HALF_X_ONE_PLUS_S,
    "sigmoid": """
        k = Constant <value_float = 1.702> ()
        k_t = CastLike(k, x)
        kx = Mul(x, k_t)
        s = Sigmoid(kx)
        y = Mul(x, s)
    """,
}

_GROUP_NORM_BODY = """
    g = Constant <value_int: int = @groups> ()
    one_d = Constant <value_ints = [1]> ()
    g1 = Reshape(g, one_d)
    keep = Constant <value_ints = [0]> ()
    rest = Constant <value_ints = [-1]> ()
    grouped = Concat <axis = 0> (keep, g1, rest)
    xg = Reshape(x, grouped)
    red = Constant <value_ints = [2]> ()
    three = Constant <value_ints = [3]> ()
    xgs = Shape(xg)
    count_i = Slice(xgs, red, three)
    count_f = Cast <to = 1> (count_i)
    count = CastLike(count_f, x)
    total = ReduceSum <keepdims = 1> (xg, red)
    mean = Div(total, count)
    d = Sub(xg, mean)
    d2 = Mul(d, d)
    total2 = ReduceSum <keepdims = 1> (d2, red)
    var = Div(total2, count)
    eps = Constant <value_float: float = @epsilon> ()
    eps_t = CastLike(eps, x)
    ve = Add(var, eps_t)
    sd = Sqrt(ve)
    ng = Div(d, sd)
    xs = Shape(x)
    n = Reshape(ng, xs)
    rank = Size(xs)
    first = Constant <value_int = 1> ()
    stop = Sub(rank, first)
    axes = Range(first, stop, first)
    gu = Unsqueeze(gamma, axes)
    bu = Unsqueeze(beta, axes)
    scaled = Mul(n, gu)
    {out} = Add(scaled, bu)
"""

_SILU_TAIL = """
    s = Sigmoid(pre)
    y = Mul(pre, s)
"""

_ATTENTION_BODY = """
    h = Constant <value_int: int = @heads> ()
    one_d = Constant <value_ints = [1]> ()
    h1 = Reshape(h, one_d)
    rest = Constant <value_ints = [-1]> ()
    start = Constant <value_ints = [0]> ()
    two = Constant <value_ints = [2]> ()
    qs = Shape(q)
    ks = Shape(k)
    vs = Shape(v)
    nq = Slice(qs, start, two)
    nk = Slice(ks, start, two)
    nv = Slice(vs, start, two)
    q4s = Concat <axis = 0> (nq, h1, rest)
    k4s = Concat <axis = 0> (nk, h1, rest)
    v4s = Concat <axis = 0> (nv, h1, rest)
    q4 = Reshape(q, q4s)
    k4 = Reshape(k, k4s)
    v4 = Reshape(v, v4s)
    qh = Transpose <perm = [0, 2, 1, 3]> (q4)
    kt = Transpose <perm = [0, 2, 3, 1]> (k4)
    vh = Transpose <perm = [0, 2, 1, 3]> (v4)
    raw = MatMul(qh, kt)
    sc = Constant <value_float: float = @scale> ()
    sc_t = CastLike(sc, q)
    scores = Mul(raw, sc_t)
    lq = Slice(qs, one_d, two)
    lk = Slice(ks, one_d, two)
    square = Concat <axis = 0> (lq, lk)
    ones = ConstantOfShape <value = float[1] {1.0}> (square)
    diag = Constant <value_int = 1> ()
    upper = Trilu <upper = 1> (ones, diag)
    causal = Constant <value_int: int = @causal> ()
    cf = Cast <to = 1> (causal)
    big = Constant <value_float = %(masked)r> ()
    weight = Mul(cf, big)
    mask = Mul(upper, weight)
    mask_t = CastLike(mask, q)
    masked = Add(scores, mask_t)
    p = Softmax <axis = -1> (masked)
    oh = MatMul(p, vh)
    ot = Transpose <perm = [0, 2, 1, 3]> (oh)
    merged = Concat <axis = 0> (nq, rest)
    y = Reshape(ot, merged)
""" % {"masked": MASKED}


def _function(name: str, attrs: str, inputs: str, body: str) -> onnx.FunctionProto:
    attr_list = f"<{attrs}>" if attrs else ""
    return onnx.parser.parse_function(f"{_HEADER}\n{name} {attr_list} ({inputs}) => (y)\n{{{body}}}")


def _gelu(approximate: str) -> list[onnx.FunctionProto]:
    return [_function(f"Gelu__{approximate}", "", "x", _GELU_BODY[approximate])]


def _geglu(approximate: str) -> list[onnx.FunctionProto]:
    body = f"""
        xs = Shape(x)
        minus1 = Constant <value_ints = [-1]> ()
        end = Constant <value_ints = [9223372036854775807]> ()
        zero = Constant <value_ints = [0]> ()
        two = Constant <value_ints = [2]> ()
        width = Slice(xs, minus1, end)
        half = Div(width, two)
        hidden = Slice(x, zero, half, minus1)
        gate = Slice(x, half, end, minus1)
        act = {custom_ops.DOMAIN}.Gelu__{approximate} (gate)
        y = Mul(hidden, act)
    """
    return [_function(f"GeGLU__{approximate}", "", "x", body), *_gelu(approximate)]


def _group_norm(activation: str) -> list[onnx.FunctionProto]:
    if activation == "silu":
        body = _GROUP_NORM_BODY.format(out="pre") + _SILU_TAIL
    else:
        body = _GROUP_NORM_BODY.format(out="y")
    return [_function(f"GroupNorm__{activation}", "groups, epsilon", "x, gamma, beta", body)]


def _attention(_unused: None) -> list[onnx.FunctionProto]:
    return [_function("Attention", "heads, scale, causal", "q, k, v", _ATTENTION_BODY)]


# op name -> (the string attribute that selects the function or None, builder)
_SPECIALIZE = {
    custom_ops.GELU.name: ("approximate", _gelu),
    custom_ops.GEGLU.name: ("approximate", _geglu),
    custom_ops.GROUP_NORM.name: ("activation", _group_norm),
    custom_ops.ATTENTION.name: (None, _attention),  # `variant` changes no result
}


def with_reference_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose difflite nodes call reference functions attached to it."""
    out = copy.deepcopy(model)
    functions: dict[str, onnx.FunctionProto] = {f.name: f for f in out.functions}
    for node in out.graph.node:
        if node.domain == custom_ops.DOMAIN:
            _specialize(node, functions)
    # onnxruntime inlines a function with the model's opset, so the functions declare that one.
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), MIN_OPSET)
    if opset < MIN_OPSET:
        raise ValueError(f"reference functions need opset >= {MIN_OPSET}, the model has {opset}")
    for function in functions.values():
        for entry in function.opset_import:
            if entry.domain == "":
                entry.version = opset
    del out.functions[:]
    out.functions.extend(functions.values())
    if not any(o.domain == custom_ops.DOMAIN for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(custom_ops.DOMAIN, custom_ops.DOMAIN_VERSION))
    out.ir_version = max(out.ir_version, IR_VERSION)
    return out


def _specialize(node: onnx.NodeProto, functions: dict[str, onnx.FunctionProto]) -> None:
    if node.op_type not in _SPECIALIZE:
        raise NotImplementedError(f"no reference implementation for {custom_ops.DOMAIN}.{node.op_type}")
    given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    options = custom_ops.BY_NAME[node.op_type].options(given)
    selector, build = _SPECIALIZE[node.op_type]
    choice = options[selector] if selector else None
    for function in build(choice):
        functions.setdefault(function.name, function)
    kept = [onnx.helper.make_attribute(name, int(value) if isinstance(value, bool) else value)
            for name, value in options.items() if not isinstance(value, str)]
    node.op_type = f"{node.op_type}__{choice}" if selector else node.op_type
    del node.attribute[:]
    node.attribute.extend(kept)
