"""Every ONNX op lowering in difflite/compiler/tflite/ops agrees with onnxruntime (fp32 and fp16 weights),
in LiteRT and, as a cross-runtime check, in tensorflow's tf.lite.Interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from difflite.compiler.tflite.writer import write_tflite
from difflite.core.errors import UnsupportedOp

from support.lowering_helpers import (
    INT64_MAX,
    INT64_MIN,
    Case,
    Rand,
    check_case,
    check_case_fp16,
    i64,
    make_model,
    node,
    tensors_and_buffers,
    to_ir,
    weight,
    write,
)

# -- building blocks ---------------------------------------------------------------------------


def has(*ops, absent=()):
    """A WriteResult check: each op in `ops` is emitted, none in `absent` is."""
    def check(result):
        hist = result.op_histogram
        for op in ops:
            assert hist.get(op, 0) > 0, f"{op} missing from {hist}"
        for op in absent:
            assert op not in hist, f"{op} unexpectedly in {hist}"
    return check


def conv(x="x", out="c", cin=3, cout=4, seed=0, k=3, **attrs):
    """A Conv node (pads 1 unless given) and its initializers: makes `out` an NHWC-stored value."""
    attrs.setdefault("pads", [k // 2] * 4)
    w, b = f"{out}_w", f"{out}_b"
    return ([node("Conv", [x, w, b], [out], **attrs)],
            {w: weight(seed, cout, cin, k, k), b: weight(seed + 1, cout)})


def after_conv(id, nodes, outputs, inits=None, x=(1, 3, 6, 5), cout=4, extra_inputs=None, check=None, opset=18):
    """A case whose first node is a Conv x -> c (so `c` is stored NHWC) followed by `nodes`."""
    cnodes, cinits = conv(cin=x[1], cout=cout)
    return Case(id, cnodes + nodes, {"x": x, **(extra_inputs or {})}, outputs,
                {**cinits, **(inits or {})}, opset=opset, check=check)


def unary(id, op, shape=(2, 3, 5), positive=False, **attrs):
    return Case(id, [node(op, ["x"], ["y"], **attrs)], {"x": Rand(shape, positive=positive)}, ["y"])


CASES: list[Case] = []

# -- Conv --------------------------------------------------------------------------------------
cw = {"w": weight(0, 4, 3, 3, 3), "b": weight(1, 4)}
CASES += [
    Case("conv-3x3-pad1", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 8, 8)}, ["y"], cw, check=has("CONV_2D", absent=("PAD", "TRANSPOSE"))),
    Case("conv-3x3-s2-pad1", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
         {"x": (1, 3, 8, 8)}, ["y"], cw, check=has("PAD", "CONV_2D")),
    Case("conv-3x3-s2-pad1-odd", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
         {"x": (1, 3, 7, 5)}, ["y"], cw),
    Case("conv-3x3-s2x1", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1])],
         {"x": (1, 3, 8, 7)}, ["y"], cw),
    Case("conv-pads-0011", [node("Conv", ["x", "w", "b"], ["y"], pads=[0, 0, 1, 1])],
         {"x": (1, 3, 8, 8)}, ["y"], cw, check=has("PAD", "CONV_2D")),
    Case("conv-pads-0011-s2", [node("Conv", ["x", "w", "b"], ["y"], pads=[0, 0, 1, 1], strides=[2, 2])],
         {"x": (1, 3, 8, 8)}, ["y"], cw),
    Case("conv-valid", [node("Conv", ["x", "w", "b"], ["y"])], {"x": (1, 3, 7, 5)}, ["y"], cw),
    Case("conv-same-upper-s2", [node("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
         {"x": (1, 3, 8, 8)}, ["y"], cw),
    Case("conv-same-lower-s2", [node("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2])],
         {"x": (1, 3, 8, 8)}, ["y"], cw),
    Case("conv-1x1", [node("Conv", ["x", "w1", "b"], ["y"])], {"x": (1, 3, 7, 5)}, ["y"],
         {"w1": weight(2, 4, 3, 1, 1), "b": weight(1, 4)}),
    Case("conv-no-bias", [node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 3, 7, 5)}, ["y"],
         {"w": weight(0, 4, 3, 3, 3)}),
    Case("conv-odd-7x5-3to5", [node("Conv", ["x", "w5", "b5"], ["y"], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 7, 5)}, ["y"], {"w5": weight(3, 5, 3, 3, 3), "b5": weight(4, 5)}),
    Case("conv-batch2", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
         {"x": (2, 3, 5, 6)}, ["y"], cw),
    Case("conv-kernel-3x1", [node("Conv", ["x", "wk", "b"], ["y"], pads=[1, 0, 1, 0])],
         {"x": (1, 3, 7, 5)}, ["y"], {"wk": weight(5, 4, 3, 3, 1), "b": weight(1, 4)}),
    Case("conv-dilation2-same", [node("Conv", ["x", "w", "b"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2])],
         {"x": (1, 3, 9, 7)}, ["y"], cw),
    Case("conv-dilation2-pad1", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], dilations=[2, 2])],
         {"x": (1, 3, 9, 7)}, ["y"], cw),
    Case("conv-depthwise", [node("Conv", ["x", "wd", "bd"], ["y"], pads=[1, 1, 1, 1], group=5)],
         {"x": (1, 5, 7, 5)}, ["y"], {"wd": weight(6, 5, 1, 3, 3), "bd": weight(7, 5)},
         check=has("DEPTHWISE_CONV_2D")),
    Case("conv-depthwise-mult2-s2", [node("Conv", ["x", "wd", "bd"], ["y"], pads=[1, 1, 1, 1], group=3,
                                          strides=[2, 2])],
         {"x": (1, 3, 8, 6)}, ["y"], {"wd": weight(8, 6, 1, 3, 3), "bd": weight(9, 6)},
         check=has("DEPTHWISE_CONV_2D", "PAD")),
    after_conv("conv-chain", [node("Conv", ["c", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])], ["y"],
               {"w2": weight(10, 5, 4, 3, 3), "b2": weight(11, 5)}, check=has(absent=("TRANSPOSE",))),
]

# -- MatMul / Gemm -------------------------------------------------------------------------------
CASES += [
    Case("matmul-fc-3d", [node("MatMul", ["x", "W"], ["y"])], {"x": (2, 5, 8)}, ["y"],
         {"W": weight(20, 8, 6)}, check=has("FULLY_CONNECTED", absent=("BATCH_MATMUL",))),
    Case("matmul-fc-2d", [node("MatMul", ["x", "W"], ["y"])], {"x": (5, 8)}, ["y"], {"W": weight(20, 8, 6)},
         check=has("FULLY_CONNECTED")),
    Case("matmul-fc-4d-nhwc", [node("MatMul", ["x", "W"], ["y"])], {"x": (1, 3, 4, 8)}, ["y"],
         {"W": weight(20, 8, 6)}, check=has("FULLY_CONNECTED")),
    # A linear layer's bias Add folds into the FULLY_CONNECTED (either operand order, [N] or
    # [1, 1, N]); not when the product has another use or the constant varies along another axis.
    Case("matmul-linear-bias", [node("MatMul", ["x", "W"], ["h"]), node("Add", ["h", "B"], ["y"])],
         {"x": (2, 5, 8)}, ["y"], {"W": weight(20, 8, 6), "B": weight(21, 6)},
         check=has("FULLY_CONNECTED", absent=("ADD",))),
    Case("matmul-linear-bias-first-3d", [node("MatMul", ["x", "W"], ["h"]), node("Add", ["B3", "h"], ["y"])],
         {"x": (2, 5, 8)}, ["y"], {"W": weight(20, 8, 6), "B3": weight(21, 1, 1, 6)},
         check=has("FULLY_CONNECTED", absent=("ADD",))),
    Case("matmul-bias-product-also-output", [node("MatMul", ["x", "W"], ["h"]), node("Add", ["h", "B"], ["y"])],
         {"x": (2, 5, 8)}, ["y", "h"], {"W": weight(20, 8, 6), "B": weight(21, 6)},
         check=has("FULLY_CONNECTED", "ADD")),
    Case("matmul-add-per-row-not-folded", [node("MatMul", ["x", "W"], ["h"]), node("Add", ["h", "R"], ["y"])],
         {"x": (2, 5, 8)}, ["y"], {"W": weight(20, 8, 6), "R": weight(22, 5, 1)},
         check=has("FULLY_CONNECTED", "ADD")),
    Case("matmul-bmm-3d", [node("MatMul", ["a", "b"], ["y"])], {"a": (2, 5, 8), "b": (2, 8, 6)}, ["y"],
         check=has("BATCH_MATMUL")),
    Case("matmul-bmm-4d-broadcast", [node("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 4, 5), "b": (3, 5, 6)},
         ["y"], check=has("BATCH_MATMUL")),
    Case("matmul-bmm-4d-broadcast-unit", [node("MatMul", ["a", "b"], ["y"])],
         {"a": (2, 1, 4, 5), "b": (1, 3, 5, 6)}, ["y"]),
    Case("matmul-const-3d-b", [node("MatMul", ["a", "B3"], ["y"])], {"a": (2, 5, 8)}, ["y"],
         {"B3": weight(22, 2, 8, 6)}),
    Case("matmul-adjy-3d", [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["y"])],
         {"q": (2, 5, 8), "k": (2, 6, 8)}, ["y"], check=has("BATCH_MATMUL", absent=("TRANSPOSE",))),
    Case("matmul-adjy-4d", [node("Reshape", ["q", "s4"], ["q4"]), node("Reshape", ["k", "s4"], ["k4"]),
                            node("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2]),
                            node("MatMul", ["q4", "kt"], ["s"]), node("Reshape", ["s", "s3"], ["y"])],
         {"q": (2, 12, 8), "k": (2, 12, 8)}, ["y"], {"s4": i64(2, 2, 6, 8), "s3": i64(2, 12, 6)},
         check=has("BATCH_MATMUL", absent=("TRANSPOSE",))),
    Case("matmul-attention-heads", [
        node("Reshape", ["q", "sh"], ["q4"]), node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        node("Reshape", ["k", "sh"], ["k4"]), node("Transpose", ["k4"], ["kh"], perm=[0, 2, 3, 1]),
        node("Reshape", ["v", "sh"], ["v4"]), node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        node("MatMul", ["qh", "kh"], ["s"]), node("Mul", ["s", "scale"], ["ss"]),
        node("Softmax", ["ss"], ["p"], axis=-1), node("MatMul", ["p", "vh"], ["o4"]),
        node("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3]), node("Reshape", ["o", "sm"], ["y"])],
        {"q": (2, 6, 8), "k": (2, 6, 8), "v": (2, 6, 8)}, ["y"],
        {"sh": i64(2, 6, 2, 4), "sm": i64(2, 6, 8), "scale": np.array(0.5, np.float32)}),
    Case("gemm-transb1", [node("Gemm", ["x", "Wt", "C"], ["y"], transB=1)], {"x": (3, 8)}, ["y"],
         {"Wt": weight(23, 6, 8), "C": weight(24, 6)}, check=has("FULLY_CONNECTED")),
    Case("gemm-transb0", [node("Gemm", ["x", "W", "C"], ["y"])], {"x": (3, 8)}, ["y"],
         {"W": weight(25, 8, 6), "C": weight(24, 6)}),
    Case("gemm-alpha-beta", [node("Gemm", ["x", "Wt", "C"], ["y"], transB=1, alpha=0.5, beta=2.0)],
         {"x": (3, 8)}, ["y"], {"Wt": weight(23, 6, 8), "C": weight(24, 6)}),
    Case("gemm-no-bias", [node("Gemm", ["x", "Wt"], ["y"], transB=1)], {"x": (3, 8)}, ["y"],
         {"Wt": weight(23, 6, 8)}),
    Case("gemm-bias-1xN", [node("Gemm", ["x", "Wt", "C2"], ["y"], transB=1)], {"x": (3, 8)}, ["y"],
         {"Wt": weight(23, 6, 8), "C2": weight(26, 1, 6)}),
    Case("gemm-bias-scalar", [node("Gemm", ["x", "Wt", "C1"], ["y"], transB=1, beta=0.5)], {"x": (3, 8)},
         ["y"], {"Wt": weight(23, 6, 8), "C1": np.array([0.7], np.float32)}),
]

# -- binary elementwise ---------------------------------------------------------------------------
ARITH = ["Add", "Sub", "Mul", "Div", "Max", "Min"]
for op in ARITH:
    CASES += [
        Case(f"{op}-same-shape", [node(op, ["a", "b"], ["y"])], {"a": (2, 3, 4), "b": (2, 3, 4)}, ["y"]),
        Case(f"{op}-const-lower-rank", [node(op, ["a", "k"], ["y"])], {"a": (2, 3, 4)}, ["y"],
             {"k": weight(30, 4)}),
        Case(f"{op}-const-first-4d", [node(op, ["k", "a"], ["y"])], {"a": (2, 4, 3, 5)}, ["y"],
             {"k": weight(31, 4, 1, 1)}),
        Case(f"{op}-scalar-const", [node(op, ["a", "s"], ["y"])], {"a": (1, 4, 3, 5)}, ["y"],
             {"s": np.array(1.5, np.float32)}),
        Case(f"{op}-rank-broadcast-inputs", [node(op, ["a", "b"], ["y"])], {"a": (3, 1), "b": (2, 1, 4)}, ["y"]),
        # a computed [1,C,1,1] operand against an NHWC-stored [1,C,H,W] (after a Conv), both orders
        after_conv(f"{op}-computed-c11-after-conv", [
            node("ReduceMean", ["c", "ax23"], ["m"], keepdims=1), node(op, ["c", "m"], ["y"])],
            ["y"], {"ax23": i64(2, 3)}),
        after_conv(f"{op}-gemm-c11-first-after-conv", [
            node("Gemm", ["t", "Wt4"], ["e"], transB=1), node("Unsqueeze", ["e", "ax23"], ["e4"]),
            node(op, ["e4", "c"], ["y"])],
            ["y"], {"ax23": i64(2, 3), "Wt4": weight(32, 4, 5)}, extra_inputs={"t": (1, 5)}),
        after_conv(f"{op}-full-const-after-conv", [node(op, ["c", "kf"], ["y"])], ["y"],
                   {"kf": weight(33, 4, 6, 5)}),
        after_conv(f"{op}-graph-input-after-conv", [node(op, ["c", "z"], ["y"])], ["y"],
                   extra_inputs={"z": (1, 4, 6, 5)}),
    ]
for op in ["Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
    CASES += [
        Case(f"{op}-bool", [node(op, ["a", "b"], ["y"])], {"a": (2, 3, 4), "b": (3, 4)}, ["y"]),
        after_conv(f"{op}-after-conv", [node(op, ["c", "k"], ["y"])], ["y"], {"k": weight(34, 4, 1, 1)}),
    ]
CASES += [
    Case("Equal-int64", [node("Equal", ["a", "b"], ["y"])],
         {"a": np.array([[1, 2, 3], [4, 5, 6]], np.int64), "b": np.array([[1, 0, 3], [0, 5, 0]], np.int64)}, ["y"]),
    Case("Equal-float-floor", [node("Floor", ["a"], ["fa"]), node("Floor", ["b"], ["fb"]),
                               node("Equal", ["fa", "fb"], ["y"])], {"a": (3, 8), "b": (3, 8)}, ["y"]),
    Case("And-Or-Not", [node("Less", ["a", "b"], ["l"]), node("Greater", ["a", "z"], ["g"]),
                        node("And", ["l", "g"], ["y1"]), node("Or", ["l", "g"], ["y2"]),
                        node("Not", ["y1"], ["y3"])],
         {"a": (2, 6), "b": (2, 6)}, ["y1", "y2", "y3"], {"z": np.array(0.0, np.float32)}),
    Case("Pow-2", [node("Pow", ["x", "e"], ["y"])], {"x": (2, 3, 5)}, ["y"], {"e": np.array(2.0, np.float32)},
         check=has("MUL", absent=("POW",))),
    Case("Pow-0.5", [node("Pow", ["x", "e"], ["y"])], {"x": Rand((2, 3, 5), positive=True)}, ["y"],
         {"e": np.array(0.5, np.float32)}, check=has("SQRT", absent=("POW",))),
    Case("Pow-3", [node("Pow", ["x", "e"], ["y"])], {"x": (2, 3, 5)}, ["y"], {"e": np.array(3.0, np.float32)}),
    Case("Pow-3-1d-exponent", [node("Pow", ["x", "e"], ["y"])], {"x": Rand((2, 3, 5), positive=True)}, ["y"],
         {"e": np.array([3.0], np.float32)}),
    after_conv("Pow-2-after-conv", [node("Pow", ["c", "e"], ["y"])], ["y"], {"e": np.array(2.0, np.float32)}),
]

# -- unary ---------------------------------------------------------------------------------------
for op in ["Exp", "Tanh", "Sigmoid", "Neg", "Abs", "Sin", "Cos", "Relu", "Floor", "Ceil", "Sign",
           "Reciprocal", "Identity"]:
    CASES.append(unary(f"{op}", op))
for op in ["Sqrt", "Log"]:
    CASES.append(unary(f"{op}", op, positive=True))
CASES += [
    after_conv("Sigmoid-silu-after-conv", [node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
               ["y"]),
    after_conv("Reciprocal-after-conv", [node("Reciprocal", ["c"], ["y"])], ["y"]),
    Case("Erf-range", [node("Erf", ["x"], ["y"])],
         {"x": np.linspace(-6, 6, 2 * 3 * 101, dtype=np.float32).reshape(2, 3, 101)}, ["y"]),
    after_conv("Erf-after-conv", [node("Erf", ["c"], ["y"])], ["y"]),
    Case("Gelu-erf-decomposed", [node("Div", ["x", "r2"], ["d"]), node("Erf", ["d"], ["e"]),
                                 node("Add", ["e", "one"], ["p"]), node("Mul", ["x", "p"], ["m"]),
                                 node("Mul", ["m", "half"], ["y"])],
         {"x": Rand((2, 5, 8), lo=0.01, hi=4)}, ["y"],
         {"r2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
          "half": np.array(0.5, np.float32)}),
    Case("Gelu-none", [node("Gelu", ["x"], ["y"])], {"x": Rand((2, 5, 8), lo=0.01, hi=4)}, ["y"], opset=20,
         check=has("GELU")),
    Case("Gelu-tanh", [node("Gelu", ["x"], ["y"], approximate="tanh")], {"x": Rand((2, 5, 8), lo=0.01, hi=4)},
         ["y"], opset=20),
    after_conv("Gelu-after-conv", [node("Gelu", ["c"], ["y"])], ["y"], opset=20),
    Case("Cast-float-to-int64", [node("Cast", ["x"], ["y"], to=7)], {"x": Rand((2, 7), lo=0.1, hi=9)}, ["y"]),
    Case("Cast-int64-to-float", [node("Cast", ["x"], ["y"], to=1)], {"x": np.arange(-6, 6, dtype=np.int64).reshape(3, 4)},
         ["y"]),
    Case("Cast-float-to-float", [node("Cast", ["x"], ["c"], to=1), node("Neg", ["c"], ["y"])], {"x": (2, 7)}, ["y"]),
    Case("Cast-bool-to-float", [node("Less", ["a", "b"], ["l"]), node("Cast", ["l"], ["y"], to=1)],
         {"a": (2, 7), "b": (2, 7)}, ["y"]),
    after_conv("Cast-after-conv-int32", [node("Cast", ["c"], ["y"], to=6)], ["y"]),
    Case("Where-computed-cond", [node("Less", ["a", "b"], ["l"]), node("Where", ["l", "a", "k"], ["y"])],
         {"a": (2, 3, 4), "b": (2, 3, 4)}, ["y"], {"k": weight(35, 4)}),
    Case("Where-bool-input", [node("Where", ["cond", "a", "b"], ["y"])],
         {"cond": np.random.default_rng(3).random((3, 4)) > 0.5, "a": (2, 3, 4), "b": (4,)}, ["y"]),
    after_conv("Where-after-conv", [node("Greater", ["c", "z"], ["g"]), node("Where", ["g", "c", "k"], ["y"])],
               ["y"], {"z": np.array(0.0, np.float32), "k": weight(36, 4, 1, 1)}),
]

# -- normalisation -------------------------------------------------------------------------------
CASES += [
    Case("Softmax-axis-1-3d", [node("Softmax", ["x"], ["y"], axis=-1)], {"x": (2, 5, 8)}, ["y"]),
    Case("Softmax-axis1-4d-input", [node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 4, 3, 5)}, ["y"]),
    Case("Softmax-axis-1-4d-input", [node("Softmax", ["x"], ["y"], axis=-1)], {"x": (2, 4, 3, 5)}, ["y"]),
    after_conv("Softmax-axis1-after-conv", [node("Softmax", ["c"], ["y"], axis=1)], ["y"],
               check=has("SOFTMAX", absent=("TRANSPOSE",))),
    after_conv("Softmax-axis-1-after-conv", [node("Softmax", ["c"], ["y"], axis=-1)], ["y"]),
    after_conv("Softmax-axis2-after-conv", [node("Softmax", ["c"], ["y"], axis=2)], ["y"]),
    Case("LayerNorm-axis-1", [node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
         {"x": (2, 5, 8)}, ["y"], {"g": weight(40, 8), "b": weight(41, 8)}),
    Case("LayerNorm-axis-2", [node("LayerNormalization", ["x", "g2", "b2"], ["y"], axis=-2, epsilon=1e-5)],
         {"x": (2, 5, 8)}, ["y"], {"g2": weight(42, 5, 8), "b2": weight(43, 5, 8)}),
    Case("LayerNorm-no-bias", [node("LayerNormalization", ["x", "g"], ["y"], axis=-1)],
         {"x": (2, 5, 8)}, ["y"], {"g": weight(40, 8)}),
    after_conv("LayerNorm-axis-1-after-conv", [node("LayerNormalization", ["c", "g"], ["y"], axis=-1)],
               ["y"], {"g": weight(44, 5)}),
    after_conv("LayerNorm-axis1-after-conv", [node("LayerNormalization", ["c", "g", "b"], ["y"], axis=1)],
               ["y"], {"g": weight(45, 4, 6, 5), "b": weight(46, 4, 6, 5)}),
    after_conv("InstanceNorm-after-conv", [node("InstanceNormalization", ["c", "g", "b"], ["y"], epsilon=1e-5)],
               ["y"], {"g": weight(47, 4), "b": weight(48, 4)}),
    Case("InstanceNorm-3d", [node("InstanceNormalization", ["x", "g", "b"], ["y"])], {"x": (2, 3, 10)}, ["y"],
         {"g": weight(47, 3), "b": weight(48, 3)}),
    after_conv("GroupNorm-pattern-after-conv", [
        node("Reshape", ["c", "sg"], ["r"]),
        node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-5),
        node("Reshape", ["n", "sc"], ["nb"]), node("Mul", ["nb", "gamma"], ["m"]),
        node("Add", ["m", "beta"], ["y"])], ["y"],
        {"sg": i64(1, 2, -1), "sc": i64(1, 6, 6, 5), "ones": np.ones(2, np.float32),
         "zeros": np.zeros(2, np.float32), "gamma": weight(49, 6, 1, 1), "beta": weight(50, 6, 1, 1)}, cout=6),
]

# -- shape ops -----------------------------------------------------------------------------------
CASES += [
    after_conv("Reshape-attention-pattern", [node("Reshape", ["c", "s"], ["r"]),
                                             node("Transpose", ["r"], ["y"], perm=[0, 2, 1])],
               ["y"], {"s": i64(1, 4, 30)}, check=has("CONV_2D", absent=("TRANSPOSE",))),
    after_conv("Reshape-attention-roundtrip", [
        node("Reshape", ["c", "s"], ["r"]), node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        node("MatMul", ["t", "W"], ["p"]), node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
        node("Reshape", ["pt", "s4"], ["y"])],
        ["y"], {"s": i64(1, 4, 30), "s4": i64(1, 4, 6, 5), "W": weight(51, 4, 4)},
        check=has(absent=("TRANSPOSE",))),
    Case("Reshape-3d-to-4d", [node("Reshape", ["x", "s"], ["y"])], {"x": (2, 6, 8)}, ["y"], {"s": i64(2, 6, 2, 4)}),
    Case("Reshape-zero-minus1", [node("Reshape", ["x", "s"], ["y"])], {"x": (2, 6, 8)}, ["y"], {"s": i64(0, -1)}),
    after_conv("Reshape-nhwc-to-2d", [node("Reshape", ["c", "s"], ["y"])], ["y"], {"s": i64(4, 30)}),
    after_conv("Unsqueeze-after-conv", [node("Unsqueeze", ["c", "ax"], ["y"])], ["y"], {"ax": i64(2)}),
    after_conv("Unsqueeze-front-after-conv", [node("Unsqueeze", ["c", "ax"], ["u"]), node("Relu", ["u"], ["y"])],
               ["y"], {"ax": i64(0)}),
    after_conv("Squeeze-after-reduce", [node("ReduceMean", ["c", "ax23"], ["m"], keepdims=1),
                                        node("Squeeze", ["m", "ax23"], ["y"])], ["y"], {"ax23": i64(2, 3)}),
    Case("Squeeze-unit-axis", [node("Squeeze", ["x", "ax"], ["y"])], {"x": (2, 1, 5)}, ["y"], {"ax": i64(1)}),
    after_conv("Flatten-axis1-after-conv", [node("Flatten", ["c"], ["y"], axis=1)], ["y"]),
    after_conv("Flatten-axis2-after-conv", [node("Flatten", ["c"], ["y"], axis=2)], ["y"]),
    Case("Transpose-chain-4d", [node("Transpose", ["x"], ["t1"], perm=[0, 3, 1, 2]),
                                node("Transpose", ["t1"], ["t2"], perm=[1, 0, 3, 2]),
                                node("Relu", ["t2"], ["y"])], {"x": (2, 3, 4, 5)}, ["y"]),
    Case("Transpose-chain-identity", [node("Transpose", ["x"], ["t1"], perm=[1, 2, 0]),
                                      node("Transpose", ["t1"], ["y"], perm=[2, 0, 1])], {"x": (2, 3, 4)}, ["y"]),
    Case("Transpose-default-perm", [node("Transpose", ["x"], ["y"])], {"x": (2, 3, 4)}, ["y"]),
    Case("Transpose-then-add", [node("Transpose", ["a"], ["t"], perm=[0, 2, 1]), node("Add", ["t", "b"], ["y"])],
         {"a": (2, 3, 4), "b": (2, 4, 3)}, ["y"]),
    after_conv("Transpose-after-conv", [node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])], ["y"]),
    Case("Concat-computed-and-const", [node("Relu", ["a"], ["r"]), node("Concat", ["r", "k", "a"], ["y"], axis=-1)],
         {"a": (2, 3, 4)}, ["y"], {"k": weight(52, 2, 3, 2)}),
    after_conv("Concat-channels-nhwc", [node("Concat", ["c", "k", "x"], ["y"], axis=1)], ["y"],
               {"k": weight(53, 1, 2, 6, 5)}, check=has("CONCATENATION", absent=("TRANSPOSE",))),
    after_conv("Concat-axis2-nhwc", [node("Concat", ["c", "c"], ["y"], axis=2)], ["y"]),
    Case("Concat-axis0", [node("Concat", ["a", "b"], ["y"], axis=0)], {"a": (2, 3), "b": (1, 3)}, ["y"]),
    after_conv("Split-equal-num-outputs", [node("Split", ["c"], ["y1", "y2"], axis=1, num_outputs=2)],
               ["y1", "y2"], check=has("SPLIT_V", absent=("TRANSPOSE",))),
    after_conv("Split-unequal-channels", [node("Split", ["c", "sp"], ["y1", "y2"], axis=1)], ["y1", "y2"],
               {"sp": i64(1, 3)}),
    after_conv("Split-spatial", [node("Split", ["c", "sp"], ["y1", "y2"], axis=2)], ["y1", "y2"],
               {"sp": i64(2, 4)}),
    Case("Split-last-axis-3way", [node("Split", ["x", "sp"], ["y1", "y2", "y3"], axis=-1)], {"x": (2, 3, 8)},
         ["y1", "y2", "y3"], {"sp": i64(2, 3, 3)}),
    Case("Split-num-outputs-uneven", [node("Split", ["x"], ["y1", "y2", "y3"], axis=-1, num_outputs=3)],
         {"x": (2, 3, 7)}, ["y1", "y2", "y3"]),
]

SLICES = [  # (id, shape, starts, ends, axes, steps)
    ("basic", (4, 6, 8), [1, 2], [3, 5], [0, 2], None),
    ("no-axes", (4, 6, 8), [1, 0, 2], [3, 6, 7], None, None),
    ("negative-starts", (4, 6, 8), [-3, -5], [INT64_MAX, -1], [1, 2], None),
    ("int64max-end", (4, 6, 8), [2], [INT64_MAX], [-1], None),
    ("step2", (4, 6, 9), [1, 0], [INT64_MAX, 9], [1, 2], [2, 2]),
    ("reverse", (4, 6, 8), [-1], [INT64_MIN], [2], [-1]),
    ("reverse-neg-int64max", (4, 6, 8), [-1], [-INT64_MAX], [1], [-1]),
    ("reverse-partial", (4, 6, 8), [5, 6], [1, 0], [1, 2], [-2, -1]),
    ("reverse-start-clamped", (4, 6, 8), [100], [INT64_MIN], [2], [-1]),
    ("reverse-start-below", (4, 6, 8), [-100], [INT64_MIN], [2], [-1]),
    ("end-clamped", (4, 6, 8), [-100], [100], [2], [3]),
]
for sid, shape, starts, ends, axes, steps in SLICES:
    ins = ["x", "st", "en"] + (["ax"] if axes is not None or steps is not None else [])
    inits = {"st": i64(*starts), "en": i64(*ends)}
    if axes is not None or steps is not None:
        inits["ax"] = i64(*(axes if axes is not None else range(len(starts))))
    if steps is not None:
        ins.append("sp")
        inits["sp"] = i64(*steps)
    CASES.append(Case(f"Slice-{sid}", [node("Slice", ins, ["y"])], {"x": shape}, ["y"], inits))
CASES += [
    after_conv("Slice-channels-nhwc", [node("Slice", ["c", "st", "en", "ax"], ["y"])], ["y"],
               {"st": i64(1), "en": i64(3), "ax": i64(1)}, check=has("STRIDED_SLICE", absent=("TRANSPOSE",))),
    after_conv("Slice-spatial-step2-nhwc", [node("Slice", ["c", "st", "en", "ax", "sp"], ["y"])], ["y"],
               {"st": i64(-1, 0), "en": i64(INT64_MIN, INT64_MAX), "ax": i64(3, 2), "sp": i64(-1, 2)}),
    # token embedding: const table, int64 token ids from the graph input
    Case("Gather-token-embedding", [node("Gather", ["table", "ids"], ["y"])],
         {"ids": np.array([[0, 5, 49, 7, 7, 1, 30]], np.int64)}, ["y"], {"table": weight(60, 50, 16)},
         check=has("GATHER")),
    Case("Gather-position-embedding", [node("Gather", ["table", "ids"], ["e"]), node("Add", ["e", "pos"], ["y"])],
         {"ids": np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int64)}, ["y"],
         {"table": weight(60, 50, 16), "pos": weight(61, 5, 16)}),
    Case("Gather-scalar-index", [node("Gather", ["x", "i"], ["y"], axis=1)], {"x": (2, 3, 4)}, ["y"],
         {"i": np.array(1, np.int64)}),
    Case("Gather-scalar-negative-index", [node("Gather", ["x", "i"], ["y"], axis=2)], {"x": (2, 3, 4)}, ["y"],
         {"i": np.array(-1, np.int64)}),
    after_conv("Gather-scalar-after-conv", [node("Gather", ["c", "i"], ["y"], axis=1)], ["y"],
               {"i": np.array(2, np.int64)}),
    Case("Gather-1d-indices", [node("Gather", ["x", "i"], ["y"], axis=0)], {"x": (4, 3, 5)}, ["y"],
         {"i": i64(2, 0, -1, 2)}),
    after_conv("Gather-1d-indices-nhwc-axis1", [node("Gather", ["c", "i"], ["y"], axis=1)], ["y"],
               {"i": i64(3, 0, 1)}),
    Case("Gather-2d-const-indices", [node("Gather", ["x", "i"], ["y"], axis=1)], {"x": (2, 5, 3)}, ["y"],
         {"i": np.array([[0, 4], [3, 3]], np.int64)}),
    Case("Expand-same-rank", [node("Expand", ["x", "s"], ["y"])], {"x": (1, 4, 1)}, ["y"], {"s": i64(2, 4, 5)}),
    Case("Expand-rank-increase", [node("Expand", ["x", "s"], ["y"])], {"x": (3, 1)}, ["y"], {"s": i64(2, 3, 4)}),
    Case("Expand-keep-dim", [node("Expand", ["x", "s"], ["y"])], {"x": (2, 3)}, ["y"], {"s": i64(1, 3)}),
    after_conv("Expand-after-conv", [node("Expand", ["c", "s"], ["y"])], ["y"], {"s": i64(2, 4, 6, 5)}),
    Case("Tile-2d", [node("Tile", ["x", "r"], ["y"])], {"x": (2, 3)}, ["y"], {"r": i64(2, 3)}),
    after_conv("Tile-after-conv", [node("Tile", ["c", "r"], ["y"])], ["y"], {"r": i64(2, 1, 1, 2)}),
    after_conv("Tile-channels-after-conv", [node("Tile", ["c", "r"], ["y"])], ["y"], {"r": i64(1, 3, 2, 1)}),
    after_conv("Pad-spatial-nhwc", [node("Pad", ["c", "p"], ["y"])], ["y"], {"p": i64(0, 0, 1, 2, 0, 0, 2, 1)}),
    after_conv("Pad-channels-nhwc", [node("Pad", ["c", "p", "v"], ["y"])], ["y"],
               {"p": i64(0, 1, 0, 0, 0, 2, 0, 0), "v": np.array(0.0, np.float32)}),
    Case("Pad-3d", [node("Pad", ["x", "p"], ["y"])], {"x": (2, 3, 4)}, ["y"], {"p": i64(0, 1, 2, 1, 0, 3)}),
    Case("Pad-input-4d", [node("Pad", ["x", "p"], ["y"])], {"x": (1, 3, 4, 5)}, ["y"],
         {"p": i64(0, 0, 1, 1, 0, 0, 1, 1)}),
]

# -- reductions ----------------------------------------------------------------------------------
for op in ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"]:
    for axes, keep in [((2, 3), 1), ((2, 3), 0), ((1,), 0), ((1,), 1), ((-1,), 1), ((1, 3), 0)]:
        tag = "_".join(str(a) for a in axes)
        CASES.append(after_conv(f"{op}-axes{tag}-keep{keep}-nhwc",
                                [node(op, ["c", "ax"], ["y"], keepdims=keep)], ["y"], {"ax": i64(*axes)}))
    CASES.append(Case(f"{op}-3d-last", [node(op, ["x", "ax"], ["y"], keepdims=1)], {"x": (2, 3, 5)}, ["y"],
                      {"ax": i64(-1)}))
    CASES.append(Case(f"{op}-no-axes-keep1", [node(op, ["x"], ["y"], keepdims=1)], {"x": (2, 3, 5)}, ["y"]))

# -- Resize ----------------------------------------------------------------------------------------
CASES += [
    after_conv("Resize-nearest-x2-nhwc", [node("Resize", ["c", "", "sc"], ["y"], mode="nearest",
                                               coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
               ["y"], {"sc": np.array([1, 1, 2, 2], np.float32)},
               check=has("RESIZE_NEAREST_NEIGHBOR", absent=("TRANSPOSE",))),
    Case("Resize-nearest-x2-input", [node("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
         {"x": (1, 3, 5, 4)}, ["y"], {"sc": np.array([1, 1, 2, 2], np.float32)}),
    Case("Resize-nearest-sizes", [node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest",
                                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
         {"x": (1, 3, 5, 4)}, ["y"], {"sz": i64(1, 3, 10, 12)}),
    after_conv("Resize-linear-half-pixel-x2", [node("Resize", ["c", "", "sc"], ["y"], mode="linear",
                                                    coordinate_transformation_mode="half_pixel")],
               ["y"], {"sc": np.array([1, 1, 2, 2], np.float32)}, check=has("RESIZE_BILINEAR")),
    Case("Resize-linear-half-pixel-sizes", [node("Resize", ["x", "", "", "sz"], ["y"], mode="linear",
                                                 coordinate_transformation_mode="half_pixel")],
         {"x": (2, 3, 5, 4)}, ["y"], {"sz": i64(2, 3, 10, 8)}),
]

# -- mixed layouts: values stored in different perms meeting in one op ----------------------------
CASES += [
    after_conv("mixed-perms-add", [node("Reshape", ["z", "s4"], ["z4"]), node("Add", ["c", "z4"], ["y1"]),
                                   node("Add", ["z4", "c"], ["y2"])], ["y1", "y2"],
               {"s4": i64(1, 4, 6, 5)}, extra_inputs={"z": (4, 30)}),
    after_conv("mixed-perms-concat", [node("Reshape", ["z", "s4"], ["z4"]),
                                      node("Concat", ["z4", "c"], ["y"], axis=1)], ["y"],
               {"s4": i64(1, 2, 6, 5)}, extra_inputs={"z": (2, 30)}),
    Case("conv-on-transposed-input", [node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
                                      node("Conv", ["t", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 5, 7)}, ["y"], cw),
    Case("reduce-on-transposed", [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                                  node("ReduceSum", ["t", "ax"], ["y"], keepdims=0)],
         {"x": (2, 3, 5)}, ["y"], {"ax": i64(1)}),
    Case("layernorm-on-transposed", [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                                     node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1)],
         {"x": (2, 8, 5)}, ["y"], {"g": weight(40, 8), "b": weight(41, 8)}),
    Case("softmax-on-transposed", [node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                                   node("Softmax", ["t"], ["y"], axis=1)], {"x": (2, 8, 5)}, ["y"]),
    Case("lower-rank-transposed-operand", [node("Transpose", ["b"], ["bt"], perm=[1, 0]),
                                           node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
                                           node("Mul", ["at", "bt"], ["y"])],
         {"a": (2, 4, 3), "b": (4, 3)}, ["y"]),
    Case("Pow-computed-exponent", [node("Pow", ["x", "e"], ["y"])],
         {"x": Rand((2, 3, 5), positive=True), "e": Rand((3, 5), hi=1.5)}, ["y"]),
    after_conv("reduce-keep0-then-add", [node("ReduceMean", ["c", "ax"], ["m"], keepdims=0),
                                         node("Add", ["m", "k"], ["y"])], ["y"],
               {"ax": i64(2), "k": weight(71, 4, 1)}),
    after_conv("pad-then-slice-nhwc", [node("Pad", ["c", "p"], ["q"]),
                                       node("Slice", ["q", "st", "en", "ax"], ["y"])], ["y"],
               {"p": i64(0, 0, 1, 1, 0, 0, 1, 1), "st": i64(1, -2), "en": i64(-1, 1), "ax": i64(2, -1)}),
    after_conv("split-then-mul-geglu-like", [node("Split", ["c"], ["h", "g"], axis=1, num_outputs=2),
                                             node("Gelu", ["g"], ["gg"]), node("Mul", ["h", "gg"], ["y"])],
               ["y"], opset=20),
    Case("identity-4d-input-to-output", [node("Identity", ["x"], ["y"])], {"x": (1, 3, 4, 5)}, ["y"]),
    Case("gather-int-dtype-entry", [node("Gather", ["table", "ids"], ["y"])],
         {"ids": np.array([[1, 2]], np.int64)}, ["y"], {"table": weight(60, 50, 16)},
         check=lambda r: (r.inputs[0]["dtype"] == "int32") or pytest.fail(f"{r.inputs}")),
]

# -- 8-bit integers, mixed types, negative indices (issue 20: ONNX's node tests) --------------------
I8 = np.array([[100, 127, -128, 5, -7, 60], [-100, 3, 64, -64, 0, 1]], np.int8)
I8B = np.array([[100, 1, -1, -9, 2, 70], [-29, -4, 2, 3, 5, -1]], np.int8)
U8 = np.array([[200, 255, 0, 5, 7, 128], [1, 3, 64, 130, 0, 17]], np.uint8)
U8B = np.array([[100, 1, 1, 9, 2, 127], [29, 4, 2, 131, 5, 1]], np.uint8)
for op in ("Add", "Sub", "Mul", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
    # through int32 and back: results past the type's range wrap around as in onnxruntime
    CASES.append(Case(f"{op}-int8-wraps", [node(op, ["a", "b"], ["y"])], {"a": I8, "b": I8B}, ["y"]))
    CASES.append(Case(f"{op}-uint8-wraps", [node(op, ["a", "b"], ["y"])], {"a": U8, "b": U8B}, ["y"]))
CASES += [
    Case("Div-int8-truncates", [node("Div", ["a", "b"], ["y"])],
         {"a": np.array([[-7, 7, -127, 100, 5, 0]], np.int8), "b": np.array([[2, -2, 3, 7, -5, 9]], np.int8)}, ["y"]),
    Case("Div-uint8", [node("Div", ["a", "b"], ["y"])], {"a": U8, "b": U8B}, ["y"]),
    Case("Add-int8-constant-broadcast", [node("Add", ["a", "k"], ["y"])], {"a": I8}, ["y"],
         {"k": np.array([120, -120, 1, 2, 3, 4], np.int8)}),
    Case("Mul-uint8-constant-first", [node("Mul", ["k", "a"], ["y"])], {"a": U8}, ["y"],
         {"k": np.array([[3], [200]], np.uint8)}),
    Case("Relu-int8", [node("Relu", ["a"], ["y"])], {"a": I8}, ["y"], check=has("MAXIMUM", absent=("RELU",))),
    Case("Relu-int32", [node("Relu", ["a"], ["y"])], {"a": I8.astype(np.int32) * 1000}, ["y"]),
    Case("Abs-int8", [node("Abs", ["a"], ["y"])], {"a": np.array([[-5, 7, -127, 0]], np.int8)}, ["y"]),
    Case("Sign-uint8", [node("Sign", ["a"], ["y"])], {"a": np.array([[0, 7, 255, 1]], np.uint8)}, ["y"]),
    Case("Pow-float-base-int64-exponent", [node("Pow", ["x", "e"], ["y"])],
         {"x": Rand((2, 3), positive=True), "e": np.array([[1, 2, 3], [0, -1, 2]], np.int64)}, ["y"]),
    Case("Pow-float-base-int32-constant-exponent", [node("Pow", ["x", "e"], ["y"])],
         {"x": Rand((2, 3))}, ["y"], {"e": np.array([3, 2, 1], np.int32)}),
    Case("Pow-int32-base-float-exponent", [node("Pow", ["x", "e"], ["y"])],
         {"x": np.array([[2, 3, 5], [7, 0, 1]], np.int32),
          "e": np.array([[2.5, 1.5, 0.5], [2.0, 3.0, 1.2]], np.float32)}, ["y"]),
    Case("Pow-int64-base-whole-float-constant", [node("Pow", ["x", "e"], ["y"])],
         {"x": np.array([[2, -3, 5], [7, 0, 11]], np.int64)}, ["y"], {"e": np.array([3.0], np.float32)},
         check=has("POW", absent=("CAST",))),
    Case("Pow-float16-base-float-exponent", [node("Pow", ["x", "e"], ["y"])],
         {"x": np.array([[1.5, 2.0, 3.0], [0.25, 7.0, 1.0]], np.float16),
          "e": np.array([[2.5, 0.5, 3.0], [1.5, 2.0, -1.0]], np.float32)}, ["y"]),
    Case("Pow-float16-same-type", [node("Pow", ["x", "e"], ["y"])],
         {"x": np.array([[1.5, 2.0, 3.0]], np.float16), "e": np.array([[2.5, 0.5, 3.0]], np.float16)}, ["y"]),
    Case("Gather-runtime-negative-indices", [node("Gather", ["data", "ids"], ["y"], axis=0)],
         {"data": (5, 4), "ids": np.array([[-1, 0, -5], [2, -3, 4]], np.int64)}, ["y"],
         check=has("GATHER", "MAXIMUM", absent=("LESS", "SELECT_V2"))),
    Case("Gather-runtime-negative-indices-axis1", [node("Gather", ["data", "ids"], ["y"], axis=1)],
         {"data": (2, 6, 3), "ids": np.array([-6, 5, -1], np.int32)}, ["y"]),
    Case("Clip-computed-bounds", [node("Clip", ["x", "lo", "hi"], ["y"])],
         {"x": (2, 3, 4), "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}, ["y"]),
    Case("Clip-int32-constant-bounds", [node("Clip", ["x", "lo", "hi"], ["y"])],
         {"x": np.array([[-9, -2, 0, 3, 40]], np.int32)}, ["y"],
         {"lo": np.array(-3, np.int32), "hi": np.array(5, np.int32)}),
    Case("Clip-int8-computed-max", [node("Clip", ["x", "", "hi"], ["y"])],
         {"x": I8, "hi": np.array(6, np.int8)}, ["y"]),
]

# -- Resize forms the builtins sample differently: GATHER rows / FULLY_CONNECTED matrices --------
CASES += [
    Case("Resize-linear-downsample-scale-0.6", [node("Resize", ["x", "", "sc"], ["y"], mode="linear")],
         {"x": (1, 2, 4, 5)}, ["y"], {"sc": np.array([1, 1, 0.6, 0.6], np.float32)},
         check=has("FULLY_CONNECTED", absent=("RESIZE_BILINEAR",))),
    after_conv("Resize-linear-downsample-nhwc", [node("Resize", ["c", "", "sc"], ["y"], mode="linear")],
               ["y"], {"sc": np.array([1, 1, 0.6, 0.7], np.float32)}, x=(1, 3, 6, 7)),
    Case("Resize-linear-antialias-sizes", [node("Resize", ["x", "", "", "sz"], ["y"], mode="linear", antialias=1)],
         {"x": (1, 2, 8, 7)}, ["y"], {"sz": i64(1, 2, 3, 4)}),
    Case("Resize-linear-pytorch-half-pixel-to-1", [node("Resize", ["x", "", "", "sz"], ["y"], mode="linear",
                                                        coordinate_transformation_mode="pytorch_half_pixel")],
         {"x": (1, 2, 4, 5)}, ["y"], {"sz": i64(1, 2, 1, 3)}),
    Case("Resize-linear-pytorch-half-pixel-x2-builtin", [node("Resize", ["x", "", "sc"], ["y"], mode="linear",
                                                              coordinate_transformation_mode="pytorch_half_pixel")],
         {"x": (1, 2, 4, 5)}, ["y"], {"sc": np.array([1, 1, 2, 2], np.float32)}, check=has("RESIZE_BILINEAR")),
    Case("Resize-cubic-upsample", [node("Resize", ["x", "", "sc"], ["y"], mode="cubic")],
         {"x": (1, 2, 3, 4)}, ["y"], {"sc": np.array([1, 1, 2, 1.5], np.float32)}, check=has("FULLY_CONNECTED")),
    Case("Resize-cubic-rows-only", [node("Resize", ["x", "", "sc"], ["y"], mode="cubic",
                                         cubic_coeff_a=-0.5, exclude_outside=1)],
         {"x": (2, 3, 5, 4)}, ["y"], {"sc": np.array([1, 1, 1.6, 1], np.float32)}),
    Case("Resize-nearest-half-pixel-downsample", [node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest")],
         {"x": (1, 3, 6, 4)}, ["y"], {"sz": i64(1, 3, 3, 3)}, check=has("GATHER")),
    after_conv("Resize-nearest-round-prefer-ceil-x3-nhwc",
               [node("Resize", ["c", "", "sc"], ["y"], mode="nearest", nearest_mode="round_prefer_ceil")],
               ["y"], {"sc": np.array([1, 1, 3, 3], np.float32)}),
    Case("Resize-nearest-axes-not-larger", [node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest",
                                                 axes=[3, 2], keep_aspect_ratio_policy="not_larger")],
         {"x": (1, 2, 4, 4)}, ["y"], {"sz": i64(6, 7)}),
]

# ONNX defines align_corners with the unrounded output length (input x scale); onnxruntime uses the
# rounded one. These are checked against ONNX's reference implementation instead.
REFERENCE_CASES = [
    after_conv("Resize-linear-align-corners-fractional-length",
               [node("Resize", ["c", "", "sc"], ["y"], mode="linear", coordinate_transformation_mode="align_corners")],
               ["y"], {"sc": np.array([1, 1, 0.6, 0.7], np.float32)}, x=(1, 3, 6, 7),
               check=has("FULLY_CONNECTED", absent=("RESIZE_BILINEAR",))),
]

CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "duplicate case ids"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_lowering_litert(case):
    check_case(case, "litert")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_lowering_tf_lite(case):
    """Cross-runtime check: the same file in tensorflow's tf.lite.Interpreter."""
    pytest.importorskip("tensorflow")
    check_case(case, "tf")


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c.id for c in REFERENCE_CASES])
def test_lowering_against_onnx_reference(case):
    from onnx.reference import ReferenceEvaluator

    from support.lowering_helpers import compare, run_tflite
    model = make_model(case)
    result = write_tflite(to_ir(model))
    feeds = case.feeds()
    want = ReferenceEvaluator(model).run(None, feeds)
    compare(run_tflite(result, feeds), want, case.outputs, 1e-5)
    case.check(result)


def test_lowering_second_seed():
    """A second input seed over a few structurally different cases."""
    for case in CASES:
        if case.id in ("conv-3x3-s2-pad1", "matmul-attention-heads", "GroupNorm-pattern-after-conv",
                       "Reshape-attention-roundtrip", "Erf-after-conv"):
            check_case(case, "litert", seed=7)


# -- fp16 weights ----------------------------------------------------------------------------------
FP16_CASES = [
    Case("fp16-conv", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 3, 7, 5)}, ["y"], cw),
    Case("fp16-conv-s2", [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
         {"x": (1, 3, 8, 8)}, ["y"], cw),
    Case("fp16-depthwise", [node("Conv", ["x", "wd", "bd"], ["y"], pads=[1, 1, 1, 1], group=8)],
         {"x": (1, 8, 5, 6)}, ["y"], {"wd": weight(6, 8, 1, 3, 3), "bd": weight(7, 8)}),
    Case("fp16-matmul-fc", [node("MatMul", ["x", "W"], ["y"])], {"x": (2, 5, 16)}, ["y"], {"W": weight(20, 16, 8)}),
    Case("fp16-gemm", [node("Gemm", ["x", "Wt", "C"], ["y"], transB=1)], {"x": (3, 16)}, ["y"],
         {"Wt": weight(23, 8, 16), "C": weight(24, 8)}),
    Case("fp16-matmul-const-3d", [node("MatMul", ["a", "B3"], ["y"])], {"a": (2, 5, 8)}, ["y"],
         {"B3": weight(22, 2, 8, 6)}),
    Case("fp16-layernorm", [node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], {"x": (2, 3, 80)},
         ["y"], {"g": weight(40, 80), "b": weight(41, 80)}),
    Case("fp16-embedding", [node("Gather", ["table", "ids"], ["y"])],
         {"ids": np.array([[0, 5, 49, 7]], np.int64)}, ["y"], {"table": weight(60, 50, 16)}),
    after_conv("fp16-add-const-after-conv", [node("Add", ["c", "kf"], ["y"])], ["y"], {"kf": weight(33, 4, 6, 5)}),
    after_conv("fp16-concat-const", [node("Concat", ["c", "k"], ["y"], axis=1)], ["y"],
               {"k": weight(53, 1, 3, 6, 5)}),
]


@pytest.mark.parametrize("case", FP16_CASES, ids=[c.id for c in FP16_CASES])
def test_lowering_fp16(case):
    result = check_case_fp16(case)
    # float16 weights reach float32 through DEQUANTIZE; a table GATHER reads rows of is gathered as
    # float16 and its rows CAST (stock LiteRT's GPU refuses DEQUANTIZE feeding GATHER)
    widened = "CAST" if case.id == "fp16-embedding" else "DEQUANTIZE"
    assert result.op_histogram.get(widened, 0) > 0, result.op_histogram
    from ai_edge_litert import schema_py_generated as schema
    types = [t for _, _, t, _ in tensors_and_buffers(result.data)]
    assert schema.TensorType.FLOAT16 in types
    # the fp16 weights take less room than the fp32 ones
    assert result.weight_bytes < write(case, "fp32").weight_bytes


def test_fp16_weights_really_rounded():
    """The fp16 file differs from exact fp32 weights by about fp16 rounding (so the reference
    rounding in check_case_fp16 is what makes the comparison tight)."""
    from support.lowering_helpers import run_onnxruntime, run_tflite
    case = FP16_CASES[3]
    feeds = case.feeds()
    exact = run_onnxruntime(make_model(case), feeds)[0]
    got = run_tflite(write(case, "fp16"), feeds)[0]
    err = np.max(np.abs(got - exact)) / np.max(np.abs(exact))
    assert 1e-6 < err < 1e-2


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type,domain", [("Hardmax", ""), ("FrobnicateTensor", "example.custom")])
def test_unsupported_op_names_op_and_node(op_type, domain):
    import onnx
    from onnx import helper
    n = helper.make_node(op_type, ["x"], ["y"], name="my_node_17", domain=domain)
    graph = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(UnsupportedOp) as info:
        write_tflite(to_ir(model))
    message = str(info.value)
    assert op_type in message and "my_node_17" in message
    assert info.value.node_name == "my_node_17"


@pytest.mark.parametrize("n_inputs", [1, 3])
def test_variadic_max_is_a_clean_error(n_inputs):
    names = ["a", "b", "c"][:n_inputs]
    case = Case("max-variadic", [node("Max", names, ["y"], name="max_node")], {n: (2, 3) for n in names}, ["y"])
    with pytest.raises(UnsupportedOp, match="Max.*max_node"):
        write(case)


def test_gather_negative_indices_int32_form(monkeypatch):
    """Axes too long for float32's exact integers wrap negative indices in int32 (LESS, ADD,
    SELECT_V2); the bound lowered here so a small table takes that form."""
    from difflite.compiler.tflite.ops import shape
    monkeypatch.setattr(shape, "FLOAT_EXACT_INDEX", 4)
    case = next(c for c in CASES if c.id == "Gather-runtime-negative-indices")
    result = check_case(Case(case.id + "-int32", case.nodes, case.inputs, case.outputs))
    assert has("GATHER", "LESS", "SELECT_V2", absent=("MAXIMUM",))(result) is None


def resize_model(x_shape, out_shape, scales=None, sizes=None, computed=(), **attributes):
    """A Resize model; inputs named in `computed` ("scales", "sizes") are graph inputs."""
    import onnx
    from onnx import helper, numpy_helper
    operands = {"scales": scales, "sizes": sizes}
    names = ["x", "", "scales" if scales is not None else "", "sizes" if sizes is not None else ""]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)]
    inits = []
    for name in ("scales", "sizes"):
        if operands[name] is None:
            continue
        array = np.asarray(operands[name], np.float32 if name == "scales" else np.int64)
        if name in computed:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                        array.shape))
        else:
            inits.append(numpy_helper.from_array(array, name))
    graph = helper.make_graph([helper.make_node("Resize", names, ["y"], name="resize_node", **attributes)], "g",
                              inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("model,reason", [
    (resize_model([1, 2, 4, 5], [1, 2, 2, 3], scales=[1, 1, 0.6, 0.6], computed=("scales",), mode="linear"),
     "scales must be constant"),
    (resize_model([1, 2, 4, 5], [1, 2, 6, 7], sizes=[1, 2, 6, 7], computed=("sizes",), mode="nearest",
                  keep_aspect_ratio_policy="not_larger"), "computed sizes and keep_aspect_ratio_policy"),
    (resize_model([1, 2, 3, 4], [1, 2, 5, 6], sizes=[6, 5], axes=[3, 2], mode="nearest",
                  keep_aspect_ratio_policy="not_larger"), "rounds the output length|is not floor"),
    (resize_model([1, 2, 4, 5], [1, 2, 3, 3], sizes=[1, 2, 3, 3], mode="linear",
                  coordinate_transformation_mode="tf_crop_and_resize"), "tf_crop_and_resize"),
])
def test_resize_refusals_name_the_node(model, reason):
    """Forms whose sampling grid is not known at conversion (computed scales), or that are not an
    interpolation, are refused with the reason, naming the node."""
    with pytest.raises(UnsupportedOp, match=reason) as info:
        write_tflite(to_ir(model))
    assert info.value.op_type == "Resize" and "resize_node" in str(info.value)


def test_resize_computed_sizes_take_the_output_shape():
    """Computed sizes under the stretch policy can only equal the static output shape: written,
    and the file samples as onnxruntime does with those sizes."""
    from support.lowering_helpers import compare, run_onnxruntime, run_tflite
    model = resize_model([1, 2, 4, 5], [1, 2, 3, 7], sizes=[1, 2, 3, 7], computed=("sizes",), mode="linear")
    result = write_tflite(to_ir(model))
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 2, 4, 5)).astype(np.float32),
             "sizes": np.array([1, 2, 3, 7], np.int64)}
    compare(run_tflite(result, feeds), run_onnxruntime(model, feeds), ["y"], 1e-5)


def test_optional_graph_input_is_refused():
    """An optional-typed graph input has no .tflite form: refused, naming the node reading it."""
    import onnx
    from onnx import helper
    tensor = helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [5])
    graph = helper.make_graph([helper.make_node("Identity", ["opt"], ["y"], name="reads_optional")], "g",
                              [helper.make_value_info("opt", helper.make_optional_type_proto(tensor))],
                              [helper.make_value_info("y", helper.make_optional_type_proto(tensor))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(UnsupportedOp, match="reads_optional.*graph input 'opt' is of type") as info:
        write_tflite(to_ir(model))
    assert info.value.op_type == "Identity"


def test_unnamed_node_is_named_by_its_output():
    """Exporters leave nodes unnamed: a refusal then names the node's first output."""
    case = Case("unnamed", [node("Hardmax", ["x"], ["hard_out"])], {"x": (2, 3)}, ["hard_out"])
    with pytest.raises(UnsupportedOp) as info:
        write(case)
    assert "an unnamed node (output 'hard_out')" in str(info.value)
    assert info.value.output == "hard_out" and info.value.detail == "no TFLite lowering"


# -- determinism and constant deduplication ---------------------------------------------------------


def test_write_is_deterministic():
    case = next(c for c in CASES if c.id == "matmul-attention-heads")
    model = make_model(case)
    first = write_tflite(to_ir(model)).data
    second = write_tflite(to_ir(model)).data
    assert bytes(first) == bytes(second)
    gn = next(c for c in CASES if c.id == "GroupNorm-pattern-after-conv")
    assert bytes(write(gn, "fp16").data) == bytes(write(gn, "fp16").data)


def test_identical_constants_share_one_buffer():
    w = weight(70, 4, 6, 5)
    case = after_conv("dedup", [node("Add", ["c", "W1"], ["a"]), node("Mul", ["a", "W2"], ["y"])], ["y"],
                      {"W1": w, "W2": w.copy()})
    result = check_case(case)
    tensors = {name: buf for name, buf, _, _ in tensors_and_buffers(result.data)}
    w1 = [b for n, b in tensors.items() if n.startswith("W1")]
    w2 = [b for n, b in tensors.items() if n.startswith("W2")]
    assert w1 and w2 and w1[0] == w2[0] != 0
    # and different contents do not share
    other = after_conv("nodedup", [node("Add", ["c", "W1"], ["a"]), node("Mul", ["a", "W2"], ["y"])], ["y"],
                       {"W1": w, "W2": w + 1})
    tensors = {name: buf for name, buf, _, _ in tensors_and_buffers(write(other).data)}
    assert tensors["W1"] != tensors["W2"]
    # dedup also shrinks the file by the size of one copy
    assert len(write(other).data) - len(result.data) >= w.nbytes
