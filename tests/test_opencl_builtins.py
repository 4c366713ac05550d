"""OpenCL backend of the op library (backend=opencl): every builtin GPU op
against a float64 NumPy reference, run through ai_edge_litert with
load_delegate(lib, {"backend": "opencl"}) on whatever OpenCL device the
machine has (PoCL, the CPU device, in CI).

Each case is a single-op .tflite model (tests/support/opencl_helpers.OpModel) with odd
sizes (not multiples of 4, of 16 or of the GEMM tiles); outputs are poisoned
before every run; the stats JSON must show the node claimed by the delegate
(so TFLite never silently computed it). Both kernel styles run: "flat" (what
CPU-like devices get) and "tiled" (local-memory kernels, what GPUs get).

Also: a small model written by the project's ONNX->TFLite writer must be
claimed whole in one partition; memory plan, DEQUANTIZE folding, refusals,
options, and a clear failure when OpenCL is missing.

Tolerance: max |err| <= 2e-5 * max |reference| (float32 kernels).
OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support.numerics import SAME, VALID, assert_close, conv_ref, erf, nonzero, rng
from support.opencl_helpers import (
    OpModel,
    opencl_options,
    run_model,
    run_reference,
)

TOL = 2e-5
# fp16 storage rounds every input, weight and output to 11 significant bits.
HALF_TOL = 4e-3
# A style is the kernels option, "+fp16" adding precision=fp16 (half storage).
STYLES = ["flat", "tiled", "flat+fp16", "tiled+fp16"]
_tolerance_floor = [0.0]  # HALF_TOL while a "+fp16" style's test runs


@pytest.fixture(params=STYLES)
def style(request):
    _tolerance_floor[0] = HALF_TOL if request.param.endswith("+fp16") else 0.0
    yield request.param
    _tolerance_floor[0] = 0.0


def storage_bytes(style: str) -> int:
    return 2 if style.endswith("+fp16") else 4


def stored(style: str, values: np.ndarray) -> np.ndarray:
    """float32 `values` as the style's storage holds them."""
    return values.astype(np.float16).astype(np.float32) if style.endswith("+fp16") else values


def style_options(style: str, **extra) -> dict[str, str]:
    kernels, _, precision = style.partition("+")
    return opencl_options(kernels=kernels, **({"precision": precision} if precision else {}),
                          **extra)


def check(got, want, tol=TOL):
    assert_close(got, want, max(tol, _tolerance_floor[0]))


def run_op(tmp_path, lib, build, feeds, style, name="op", nodes=1, **opts):
    """Saves the model `build(m) -> (inputs, outputs)` and runs it with the
    delegate; asserts every node was claimed into one partition."""
    m = OpModel()
    ins, outs = build(m)
    path = m.save(tmp_path / f"{name}.tflite", ins, outs)
    got, stats = run_model(path, lib, feeds, style_options(style, **opts), stats=True)
    assert stats["nodes_claimed"] == nodes and stats["partitions"] == 1, stats
    want_storage = "float16" if style.endswith("+fp16") or opts.get("precision") == "fp16" else "float32"
    assert stats["storage"] == want_storage, stats
    return got, stats, path


# --------------------------------------------------------------------------
# References


def depthwise_ref(x, w, b, stride, dil, padding, mult):
    """w [1, KH, KW, C*mult]: output channel oc reads input channel oc // mult."""
    c = x.shape[-1]
    out = []
    for oc in range(c * mult):
        ci = oc // mult
        wk = w[0, :, :, oc][None, :, :, None]  # [1, kh, kw, 1]
        out.append(conv_ref(x[..., ci:ci + 1], wk, None, stride, dil, padding)[..., 0])
    y = np.stack(out, axis=-1)
    return y + b if b is not None else y


def unary_ref(name, x):
    x = x.astype(np.float64)
    return {
        "LOGISTIC": lambda: 1 / (1 + np.exp(-x)),
        "TANH": lambda: np.tanh(x),
        "EXP": lambda: np.exp(x),
        "LOG": lambda: np.log(x),
        "SQRT": lambda: np.sqrt(x),
        "RSQRT": lambda: 1 / np.sqrt(x),
        "NEG": lambda: -x,
        "ABS": lambda: np.abs(x),
        "SIN": lambda: np.sin(x),
        "COS": lambda: np.cos(x),
        "SIGN": lambda: np.sign(x),
        "GELU": lambda: 0.5 * x * (1 + erf(x / math.sqrt(2))),
        "GELU_TANH": lambda: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    }[name]()


BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum,
}


def resize_index_nearest(out_size, in_size, align, half):
    scale = np.float32((in_size - 1) / (out_size - 1)) if (align and out_size > 1) else \
        np.float32(in_size) / np.float32(out_size)
    o = np.arange(out_size, dtype=np.float32)
    v = (o + np.float32(0.5 if half else 0.0)) * scale
    r = np.floor(v + np.float32(0.5)) if align else np.floor(v)  # TFLite rounds half away from 0
    r = np.minimum(r.astype(np.int64), in_size - 1)
    return np.maximum(r, 0) if half else r


def resize_bilinear_ref(x, oh, ow, align, half):
    x = x.astype(np.float64)

    def coords(out_size, in_size):
        scale = np.float32((in_size - 1) / (out_size - 1)) if (align and out_size > 1) else \
            np.float32(in_size) / np.float32(out_size)
        o = np.arange(out_size, dtype=np.float32)
        v = ((o + np.float32(0.5)) * scale - np.float32(0.5)) if half else o * scale
        lo = np.maximum(np.floor(v), 0).astype(np.int64)
        hi = np.minimum(np.ceil(v), in_size - 1).astype(np.int64)
        return v.astype(np.float64), lo, hi

    fy, y0, y1 = coords(oh, x.shape[1])
    fx, x0, x1 = coords(ow, x.shape[2])
    dy = (fy - y0)[None, :, None, None]
    dx = (fx - x0)[None, None, :, None]
    g = lambda yy, xx: x[:, yy][:, :, xx]  # noqa: E731
    return (g(y0, x0) * (1 - dy) * (1 - dx) + g(y1, x0) * dy * (1 - dx) +
            g(y0, x1) * (1 - dy) * dx + g(y1, x1) * dy * dx)


# --------------------------------------------------------------------------
# Convolutions

CONV_CASES = {
    # name: (N, H, W, Cin, Cout, KH, KW, stride, dilation, padding, bias)
    "3x3_same": (2, 7, 9, 5, 11, 3, 3, (1, 1), (1, 1), SAME, True),
    "3x3_s2_same": (1, 9, 10, 6, 7, 3, 3, (2, 2), (1, 1), SAME, True),
    "3x3_s2_valid_nobias": (1, 11, 8, 3, 13, 3, 3, (2, 2), (1, 1), VALID, False),
    "3x3_dilated": (1, 10, 9, 4, 5, 3, 3, (1, 1), (2, 2), SAME, True),
    "1x1_gemm": (2, 5, 7, 13, 17, 1, 1, (1, 1), (1, 1), VALID, True),
    "1x1_s2": (1, 7, 7, 6, 5, 1, 1, (2, 2), (1, 1), SAME, True),
    "1x3_wide_cout": (1, 6, 8, 3, 70, 1, 3, (1, 1), (1, 1), SAME, True),
    "multi_tile": (1, 17, 19, 33, 67, 3, 3, (1, 1), (1, 1), SAME, True),
    "5x5_stride_mix": (1, 13, 12, 3, 9, 5, 5, (2, 1), (1, 1), SAME, True),
    # m = 17*19 = 323 pixels, 260 channels: the 128x128 tile with ragged edges
    "large_tile_3x3": (1, 17, 19, 20, 260, 3, 3, (1, 1), (1, 1), SAME, True),
    "large_tile_1x1": (1, 17, 19, 36, 300, 1, 1, (1, 1), (1, 1), VALID, True),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_2d(opencl_lib, tmp_path, style, case):
    n, h, w, cin, cout, kh, kw, stride, dil, padding, has_bias = CONV_CASES[case]
    r = rng(1)
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, kh, kw, cin))
    b = nonzero(r, (cout,)) if has_bias else None
    want = conv_ref(x, wt, b, stride, dil, padding)

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", want.shape)
        bi = m.constant("b", b) if has_bias else -1
        m.builtin("CONV_2D", [xi, m.constant("w", wt), bi], [y], padding=padding,
                  strideH=stride[0], strideW=stride[1], dilationHFactor=dil[0],
                  dilationWFactor=dil[1])
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


NARROW_CASES = {
    # name: (N, H, W, Cin, Cout, KH, KW, stride, dilation, padding, bias), as CONV_CASES
    "c3_cin128": (1, 9, 11, 128, 3, 3, 3, (1, 1), (1, 1), SAME, True),  # the VAE's conv_out, small
    "c1_cin5_valid": (1, 8, 7, 5, 1, 3, 3, (1, 1), (1, 1), VALID, True),  # Cin % 4 == 1
    "c4_cin3_s2": (2, 9, 10, 3, 4, 3, 3, (2, 2), (1, 1), SAME, False),  # Cin < 4: tail only
    "c3_cin5_s2_valid": (1, 11, 13, 5, 3, 3, 3, (2, 2), (1, 1), VALID, False),
    "c8_cin128_s2": (1, 7, 9, 128, 8, 3, 3, (2, 2), (1, 1), SAME, True),  # 2 pixels an item
    "c5_mixed_5x3": (1, 10, 9, 12, 5, 5, 3, (1, 2), (2, 1), SAME, True),  # strides, dilations mixed
    "c2_1x1": (2, 5, 7, 13, 2, 1, 1, (1, 1), (1, 1), VALID, True),  # otherwise a plain GEMM
    "c7_cin6_1x3_s2": (1, 5, 17, 6, 7, 1, 3, (1, 2), (1, 1), SAME, True),  # Cin % 4 == 2
}


def conv_labels(stats) -> set[str]:
    """The launch labels of the profile=2 stats' CONV_2D entries ("CONV_2D <shapes> <label>")."""
    return {key.rsplit(" ", 1)[1] for key in stats["profile_ms_per_invoke"] if key.startswith("CONV_2D ")}


def conv_model(x, wt, b, stride, dil, padding, out_shape):
    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", out_shape)
        bi = m.constant("b", b) if b is not None else -1
        m.builtin("CONV_2D", [xi, m.constant("w", wt), bi], [y], padding=padding,
                  strideH=stride[0], strideW=stride[1], dilationHFactor=dil[0],
                  dilationWFactor=dil[1])
        return [xi], [y]
    return build


def narrow_case(case, kernels, **opts):
    """NARROW_CASES[case] against a float64 reference of the values as stored (half storage rounds
    the inputs, filter and bias), so with half storage only the output's rounding is allowed for:
    conv2d_narrow accumulates in float. Returns the CONV_2D launch labels."""
    n, h, w, cin, cout, kh, kw, stride, dil, padding, has_bias = NARROW_CASES[case]
    r = rng(30)
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, kh, kw, cin))
    b = nonzero(r, (cout,)) if has_bias else None
    want = conv_ref(stored(kernels, x), stored(kernels, wt),
                    stored(kernels, b) if has_bias else None, stride, dil, padding)
    tmp_path = opts.pop("tmp_path")
    (got,), stats, _ = run_op(tmp_path, opts.pop("lib"), conv_model(x, wt, b, stride, dil, padding, want.shape),
                              [x], kernels, profile=2, **opts)
    assert_close(got, want, 1e-3 if kernels.endswith("+fp16") else TOL)
    return conv_labels(stats), kh == kw == 1


@pytest.mark.parametrize("kernels", ["tiled", "tiled+fp16", "flat", "flat+fp16"])
@pytest.mark.parametrize("case", list(NARROW_CASES))
def test_conv_2d_narrow(opencl_lib, tmp_path, monkeypatch, kernels, case):
    """conv2d_narrow (conv.cc: PlanNarrow) takes every float CONV_2D of <= 8 output channels on
    the GPU (tiled) kernels, 1x1 ones too, never on the flat ones; the profile names the launch."""
    monkeypatch.delenv("DIFFLITE_CONV_NARROW", raising=False)
    labels, one_by_one = narrow_case(case, kernels, tmp_path=tmp_path, lib=opencl_lib)
    assert labels == ({"conv2d_narrow"} if kernels.startswith("tiled") else
                      {"conv2d_1x1" if one_by_one else "conv2d"}), labels


@pytest.mark.parametrize("plan", ["4x1", "4x8", "2x4", "1x32", "2x16"])
@pytest.mark.parametrize("case", list(NARROW_CASES))
def test_conv_2d_narrow_plans(opencl_lib, tmp_path, monkeypatch, plan, case):
    """DIFFLITE_CONV_NARROW=PxL forces P pixels and L lanes a group: lanes past Cin's runs of 4
    (L = 32 at Cin 3..128), the Cin % 4 tail spread over lanes, rows ending mid-group."""
    monkeypatch.setenv("DIFFLITE_CONV_NARROW", plan)
    labels, _ = narrow_case(case, "tiled", tmp_path=tmp_path, lib=opencl_lib)
    assert labels == {"conv2d_narrow"}, labels


def test_conv_2d_narrow_off_and_bad_setting(opencl_lib, tmp_path, monkeypatch, capfd):
    """DIFFLITE_CONV_NARROW=0 keeps the GEMM; 9 output channels keep it anyway; a malformed value
    refuses the node with the reason (TFLite then runs it)."""
    monkeypatch.setenv("DIFFLITE_CONV_NARROW", "0")
    assert narrow_case("c3_cin128", "tiled", tmp_path=tmp_path, lib=opencl_lib)[0] == {"conv2d"}
    monkeypatch.delenv("DIFFLITE_CONV_NARROW")
    r = rng(31)
    x = nonzero(r, (1, 6, 7, 5))
    wt = nonzero(r, (9, 3, 3, 5))
    want = conv_ref(x, wt, None, (1, 1), (1, 1), SAME)
    (got,), stats, _ = run_op(tmp_path, opencl_lib, conv_model(x, wt, None, (1, 1), (1, 1), SAME, want.shape),
                              [x], "tiled", profile=2)
    check(got, want)
    assert conv_labels(stats) == {"conv2d"}, stats
    monkeypatch.setenv("DIFFLITE_CONV_NARROW", "4x3")
    m = OpModel()
    b = nonzero(r, (3,))  # TFLite's own CONV_2D wants a bias
    path = m.save(tmp_path / "bad.tflite", *conv_model(x, wt[:3], b, (1, 1), (1, 1), SAME, want.shape[:3] + (3,))(m))
    (got,), stats = run_model(path, opencl_lib, [x], style_options("tiled"), stats=True)
    check(got, conv_ref(x, wt[:3], b, (1, 1), (1, 1), SAME))
    assert stats["nodes_claimed"] == 0, stats
    assert "DIFFLITE_CONV_NARROW=4x3: expected 0 or PxL" in capfd.readouterr().err


NARROW_CHILD = """
import sys
import numpy as np
from pathlib import Path
sys.path.insert(0, {tests!r})
from support.numerics import SAME, nonzero, rng
from support.opencl_helpers import OpModel, run_model
from test_opencl_builtins import conv_model, style_options
r = rng(32)
x = nonzero(r, {shape!r})
wt = nonzero(r, (3, 3, 3, {shape!r}[-1]))
m = OpModel()
path = m.save(Path({work!r}) / "narrow.tflite", *conv_model(x, wt, None, (1, 1), (1, 1), SAME, {shape!r}[:3] + (3,))(m))
run_model(path, Path({lib!r}), [x], style_options("tiled", verbose=1))
"""


@pytest.mark.parametrize("shape", [(1, 40, 44, 128), (1, 5, 6, 320)])
def test_conv_2d_narrow_plan_in_trace(opencl_lib, tmp_path, shape):
    """The driver trace (DIFFLITE_CL_TRACE=1, in a child process: the trace is installed when the
    library loads) shows conv2d_narrow's launch with the automatic plan's work-group (L lanes x
    64 / L pixel groups, conv.cc: PlanNarrow): Cin / 8 lanes (at most 16), then, while the launch
    has fewer than 1024 items per compute unit, twice the lanes (at most 32 and Cin / 4), else
    half the pixels (from 4)."""
    env = {k: v for k, v in os.environ.items() if k != "DIFFLITE_CONV_NARROW"}
    code = NARROW_CHILD.format(tests=str(os.path.dirname(__file__)), work=str(tmp_path), lib=str(opencl_lib),
                               shape=shape)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "DIFFLITE_CL_TRACE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    units = int(re.search(r"(\d+) compute units", run.stderr).group(1))
    (launch,) = {tuple(line.split()) for line in run.stderr.splitlines()
                 if line.startswith("difflite-cl: launch conv2d_narrow ")}  # the same each invoke
    _, h, w, cin = shape
    px, lanes = 4, 1
    while lanes < 16 and lanes * 16 <= cin:
        lanes *= 2
    while h * -(-w // px) * lanes < 1024 * units:
        if lanes < 32 and lanes * 8 <= cin:
            lanes *= 2
        elif px > 1:
            px //= 2
        else:
            break
    groups = h * -(-w // px)
    assert launch[3] == f"global={lanes},{-(-groups // (64 // lanes)) * (64 // lanes)},1", launch
    assert launch[4] == f"local={lanes},{64 // lanes},0", launch


@pytest.mark.parametrize("case", [
    # N, H, W, C, mult, K, stride, dilation, padding
    (1, 9, 7, 5, 2, 3, (1, 1), (1, 1), SAME),
    (2, 8, 9, 3, 1, 3, (2, 2), (1, 1), VALID),
    (1, 11, 10, 7, 1, 3, (1, 1), (2, 2), SAME),
])
def test_depthwise_conv_2d(opencl_lib, tmp_path, style, case):
    n, h, w, c, mult, k, stride, dil, padding = case
    r = rng(2)
    x = nonzero(r, (n, h, w, c))
    wt = nonzero(r, (1, k, k, c * mult))
    b = nonzero(r, (c * mult,))
    want = depthwise_ref(x, wt, b, stride, dil, padding, mult)

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", want.shape)
        m.builtin("DEPTHWISE_CONV_2D", [xi, m.constant("w", wt), m.constant("b", b)], [y],
                  padding=padding, strideH=stride[0], strideW=stride[1], depthMultiplier=mult,
                  dilationHFactor=dil[0], dilationWFactor=dil[1])
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


# --------------------------------------------------------------------------
# Matrix products

@pytest.mark.parametrize("case", [
    # x shape, N, bias, keep_num_dims, weights constant
    ((2, 7, 19), 23, True, True, True),
    ((13, 37), 5, False, False, True),
    ((1, 70), 45, True, False, True),
    ((3, 50, 40), 70, True, True, True),
    ((5, 21), 9, True, False, False),  # weights as a graph input
    ((2, 150, 37), 270, True, True, True),  # m = 300, n = 270: the 128x128 tile, ragged
    ((2, 150, 36), 268, True, True, True),  # K % 4 == 0: both operands staged in quads
    # <= 8 rows, K % 4 == 0 (the time embedding): gemm_skinny with the GPU kernels
    ((2, 64), 40, True, False, True),
    ((3, 36), 7, False, False, True),  # ragged last column block
    ((1, 1, 296), 10, True, True, True),  # K past one pass of the work-group (4 x 64)
    ((8, 520), 13, True, False, True),
])
def test_fully_connected(opencl_lib, tmp_path, style, case):
    shape, n, has_bias, keep, const_w = case
    r = rng(3)
    x = nonzero(r, shape)
    k = shape[-1]
    wt = nonzero(r, (n, k))
    b = nonzero(r, (n,)) if has_bias else None
    want = x.reshape(-1, k).astype(np.float64) @ wt.T.astype(np.float64)
    if has_bias:
        want = want + b
    want = want.reshape(shape[:-1] + (n,)) if keep else want

    def build(m):
        xi = m.activation("x", x.shape)
        wi = m.constant("w", wt) if const_w else m.activation("w", wt.shape)
        y = m.activation("y", want.shape)
        m.builtin("FULLY_CONNECTED", [xi, wi, m.constant("b", b) if has_bias else -1], [y],
                  keepNumDims=keep)
        return ([xi] if const_w else [xi, wi]), [y]

    feeds = [x] if const_w else [x, wt]
    (got,), _, _ = run_op(tmp_path, opencl_lib, build, feeds, style)
    check(got, want)


@pytest.mark.parametrize("case", [
    # lhs shape, rhs shape, adj_x, adj_y
    ((2, 3, 17, 9), (2, 3, 9, 13), False, False),
    ((2, 3, 9, 17), (2, 3, 9, 13), True, False),
    ((2, 3, 17, 9), (2, 3, 13, 9), False, True),
    ((3, 17, 9), (9, 13), False, False),
    ((2, 1, 17, 9), (1, 3, 9, 13), False, False),
    ((2, 9, 17), (2, 70, 9), True, True),
    ((1, 2, 67, 19), (1, 2, 71, 19), False, True),
    ((2, 300, 33), (2, 33, 270), False, False),  # the 128x128 tile, ragged edges
    # multiples of 4: A staged in quads along k (or m, adj_x), B along n (or k, adj_y)
    ((2, 3, 20, 12), (2, 3, 12, 16), False, False),
    ((2, 12, 20), (2, 12, 16), True, False),
    ((2, 3, 20, 44), (2, 3, 16, 44), False, True),
    ((2, 300, 36), (2, 36, 272), False, False),
])
def test_batch_matmul(opencl_lib, tmp_path, style, case):
    sa, sb, adj_x, adj_y = case
    r = rng(4)
    a = nonzero(r, sa)
    b = nonzero(r, sb)
    a64 = np.swapaxes(a, -1, -2) if adj_x else a
    b64 = np.swapaxes(b, -1, -2) if adj_y else b
    want = np.matmul(a64.astype(np.float64), b64.astype(np.float64))

    def build(m):
        ai = m.activation("a", sa)
        bi = m.activation("b", sb)
        y = m.activation("y", want.shape)
        m.builtin("BATCH_MATMUL", [ai, bi], [y], adjX=adj_x, adjY=adj_y)
        return [ai, bi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [a, b], style)
    check(got, want)


@pytest.mark.parametrize("tile", ["64x64x16x4x4", "128x128x16x8x8v", "128x64x16x8x4v"])
def test_forced_tiles(opencl_lib, tmp_path, monkeypatch, tile):
    """Tiles other than the default (vectorised 64x64), forced through DIFFLITE_GEMM_TILE (read
    when the kernels are picked; the -D options are part of the program cache key), including
    the scalar kernel: ragged m, n and k, both staging layouts of each GEMM operand, scalar
    (n % 4 != 0) and vstore4 (n % 4 == 0) stores."""
    monkeypatch.setenv("DIFFLITE_GEMM_TILE", tile)
    test_fully_connected(opencl_lib, tmp_path, "tiled", ((2, 150, 37), 270, True, True, True))
    test_batch_matmul(opencl_lib, tmp_path, "tiled", ((2, 33, 300), (2, 270, 33), True, True))
    monkeypatch.setitem(CONV_CASES, "vec_3x3", (1, 15, 20, 19, 268, 3, 3, (1, 1), (1, 1), SAME, True))
    test_conv_2d(opencl_lib, tmp_path, "tiled", "vec_3x3")  # m = 300, k = 171


@pytest.mark.parametrize("splits", ["2", "3", "16"])
def test_forced_split_k(opencl_lib, tmp_path, monkeypatch, splits):
    """Split-K (gemm.h), forced through DIFFLITE_SPLIT_K on the vectorised kernels: K ranges that
    end mid-slice and empty trailing splits (16 splits of k = 33), partial planes per batch,
    the bias added once by splitk_sum, and the 3x3 implicit-GEMM convolution."""
    monkeypatch.setenv("DIFFLITE_SPLIT_K", splits)
    test_fully_connected(opencl_lib, tmp_path, "tiled", ((2, 150, 37), 270, True, True, True))
    test_batch_matmul(opencl_lib, tmp_path, "tiled", ((2, 3, 17, 33), (2, 3, 33, 13), False, False))
    test_batch_matmul(opencl_lib, tmp_path, "tiled", ((2, 33, 300), (2, 270, 33), True, True))
    monkeypatch.setitem(CONV_CASES, "vec_3x3", (2, 9, 7, 19, 68, 3, 3, (1, 1), (1, 1), SAME, True))
    test_conv_2d(opencl_lib, tmp_path, "tiled", "vec_3x3")  # k = 171
    test_conv_2d(opencl_lib, tmp_path, "tiled", "3x3_s2_valid_nobias")


TILE_ENVS = ["", "64x64x32x8x8m", "128x128x32x8x8m", "split3"]


@pytest.mark.parametrize("mode,env", [(mode, env) for mode in ("device", "emulate") for env in TILE_ENVS]
                         + [("on", "")])
def test_tensor_cores(opencl_lib, tmp_path, monkeypatch, mode, env):
    """GEMMs on tensor cores (gemm_mma.cl) where the device has them (NVIDIA's OpenCL, compute
    capability >= 8.0) and the storage is half, or with the instruction emulated in OpenCL C
    (DIFFLITE_TENSOR_CORES=emulate: the same tiles, fragments and epilogue on any device, PoCL in
    CI): the results agree with float64 as the float tiles' do (tensor_cores=off), through both
    tensor-core tiles (128x128x16 for m, n > 64; 64x64x32 and 128x128x32 forced), split-K, ragged m, n and k,
    both staging layouts of each operand and a bias. DIFFLITE_TENSOR_CORES=on asks for the tiles
    without the device's answer: where the PTX instruction cannot be built (PoCL's CPU device) the
    tensor-core programs fail and the float tiles run, with the same results. The stats' gemm_tiles
    say which tiles the GEMMs took: tensor-core ones (a trailing m) exactly where they can build."""
    if mode in ("emulate", "on"):
        monkeypatch.setenv("DIFFLITE_TENSOR_CORES", mode)
    if env == "split3":
        monkeypatch.setenv("DIFFLITE_SPLIT_K", "3")
    elif env:
        monkeypatch.setenv("DIFFLITE_GEMM_TILE", env)
    r = rng(47)
    x, wt, b = nonzero(r, (2, 150, 300)), nonzero(r, (270, 300)), nonzero(r, (270,))
    want = x.astype(np.float64) @ wt.T.astype(np.float64) + b

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", want.shape)
        m.builtin("FULLY_CONNECTED", [xi, m.constant("w", wt), m.constant("b", b)], [y], keepNumDims=True)
        return [xi], [y]

    for tc in ("auto", "off"):
        (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "tiled+fp16", tensor_cores=tc)
        assert_close(got, want, HALF_TOL)
        has_them = mode in ("emulate", "on") or stats["nv_compute_capability"] >= 80
        assert stats["tensor_cores"] == (tc == "auto" and has_them), stats
        builds_them = mode == "emulate" or stats["nv_compute_capability"] >= 80
        took = [tile for tile in stats["gemm_tiles"] if tile.endswith("m")]
        assert bool(took) == (tc == "auto" and builds_them), stats["gemm_tiles"]
    _tolerance_floor[0] = HALF_TOL
    try:
        for case in (((2, 33, 300), (2, 270, 33), True, True), ((2, 300, 36), (2, 36, 272), False, False),
                     ((3, 200, 90), (90, 97), False, False)):
            test_batch_matmul(opencl_lib, tmp_path, "tiled+fp16", case)
    finally:
        _tolerance_floor[0] = 0.0


TC_CONV_CASES = {
    # name: as CONV_CASES. m = 180 pixels, 130 channels: the 128x128 tile with ragged edges, K = 360
    "tc_3x3": (2, 9, 10, 40, 130, 3, 3, (1, 1), (1, 1), SAME, True),
    # stride 2, no padding, no bias, K = 5 * 9 (not a multiple of the 16-deep slice)
    "tc_3x3_s2_valid_nobias": (1, 23, 21, 5, 36, 3, 3, (2, 2), (1, 1), VALID, False),
    "tc_3x3_dilated": (1, 14, 13, 24, 33, 3, 3, (1, 1), (2, 2), SAME, True),
}


@pytest.mark.parametrize("mode,env", [(mode, env) for mode in ("device", "emulate")
                                      for env in ("", "128x128x32x8x8m", "128x128x32x8x8m+split3")])
def test_tensor_cores_in_convolutions(opencl_lib, tmp_path, monkeypatch, mode, env):
    """The implicit-GEMM convolution on the tensor-core tiles (conv.cl's -DMMA=1, with
    common/mma_tile.cl's fragments): where the device has them, or emulated in OpenCL C
    (DIFFLITE_TENSOR_CORES=emulate, PoCL in CI), the results agree with float64 as the float
    tiles' do (tensor_cores=off) through a forced tile 32 deep, split-K, strides, dilations,
    padding, ragged pixels, channels and depth. The stats' gemm_tiles name a tensor-core tile
    where the forced one is emulated, or on NVIDIA with compute capability >= 8.0 and the real
    instruction (the first case is large enough for the 128x128 tiles). The default 16-deep tile
    emulated is passed over on PoCL's CPU device (it spills) and on NVIDIA's OpenCL (H200,
    2026-11-30), as is the 64-item 64x64x32 tile for convolutions: emulation promises the
    results, not the tile."""
    if mode == "emulate":
        monkeypatch.setenv("DIFFLITE_TENSOR_CORES", mode)
    tile, _, split = env.partition("+")
    if tile:
        monkeypatch.setenv("DIFFLITE_GEMM_TILE", tile)
    if split:
        monkeypatch.setenv("DIFFLITE_SPLIT_K", "3")
    for case, (n, h, w, cin, cout, kh, kw, stride, dil, padding, has_bias) in TC_CONV_CASES.items():
        r = rng(48)
        x = nonzero(r, (n, h, w, cin))
        wt = nonzero(r, (cout, kh, kw, cin))
        b = nonzero(r, (cout,)) if has_bias else None
        want = conv_ref(x, wt, b, stride, dil, padding)
        for tc in ("auto", "off"):
            (got,), stats, _ = run_op(tmp_path, opencl_lib, conv_model(x, wt, b, stride, dil, padding, want.shape),
                                      [x], "tiled+fp16", tensor_cores=tc)
            assert_close(got, want, HALF_TOL)
            if case == "tc_3x3":
                takes_them = bool(tile) if mode == "emulate" else stats["nv_compute_capability"] >= 80
                took = [name for name in stats["gemm_tiles"] if name.endswith("m")]
                assert bool(took) == (tc == "auto" and takes_them), stats["gemm_tiles"]


def test_a_bad_tensor_core_choice_in_the_environment_is_refused(opencl_lib, monkeypatch):
    from ai_edge_litert.interpreter import load_delegate

    monkeypatch.setenv("DIFFLITE_TENSOR_CORES", "yes")
    with pytest.raises(ValueError, match=re.escape("DIFFLITE_TENSOR_CORES must be auto, off, on or emulate, got 'yes'")):
        load_delegate(str(opencl_lib), {"backend": "opencl"})


def test_automatic_split_k(opencl_lib, tmp_path, monkeypatch):
    """One output tile and a long K on a device of few compute units: split-K is chosen without
    the override (2 work-groups per compute unit wanted, K / 256 at most)."""
    monkeypatch.delenv("DIFFLITE_SPLIT_K", raising=False)
    test_fully_connected(opencl_lib, tmp_path, "tiled", ((3, 1100), 45, True, False, True))
    monkeypatch.setitem(CONV_CASES, "auto_split", (1, 4, 4, 130, 20, 3, 3, (1, 1), (1, 1), SAME, True))
    test_conv_2d(opencl_lib, tmp_path, "tiled", "auto_split")  # k = 1170


# --------------------------------------------------------------------------
# Elementwise

BROADCASTS = [
    ((2, 3, 5, 7), (2, 3, 5, 7)),
    ((2, 3, 5, 19), (19,)),
    ((2, 1, 5, 1), (1, 3, 1, 7)),
    ((1,), (3, 17)),
    ((2, 1, 3, 1, 5, 2), (1, 4, 1, 2, 1, 2)),
    ((3, 41, 1), (3, 1, 1)),
    ((2, 3, 5, 8), (2, 3, 5, 8)),  # elements % 4 == 0: 4 an item (GPU kernels)
    ((4, 12), (1,)),  # the same with a broadcast scalar
    # innermost dim % 4 == 0: binary_nd4 (GPU kernels), 4 elements an item
    ((2, 3, 5, 8), (2, 1, 1, 8)),  # the UNet's time-embedding ADD
    ((2, 1, 1, 8), (2, 3, 5, 8)),
    ((3, 1, 12), (3, 5, 1)),  # one operand broadcast along the innermost dim
    ((2, 4, 6), (2, 1, 6)),  # 6 % 4 != 0: binary_nd
]


# ADD on every broadcast pattern, the other ops on three of them (keeps the file fast).
BINARY_CASES = [("ADD", s) for s in BROADCASTS] + [
    (op, s) for op in BINARY if op != "ADD" for s in (BROADCASTS[1], BROADCASTS[4], BROADCASTS[6])]


@pytest.mark.parametrize("op,shapes", BINARY_CASES,
                         ids=[f"{op}-" + "x".join(map(str, s[0])) + "_" + "x".join(map(str, s[1]))
                              for op, s in BINARY_CASES])
def test_binary(opencl_lib, tmp_path, style, op, shapes):
    sa, sb = shapes
    r = rng(5)
    a = nonzero(r, sa, 2.0)
    b = nonzero(r, sb, 2.0)
    want = BINARY[op](a.astype(np.float64), b.astype(np.float64))

    def build(m):
        ai = m.activation("a", sa)
        bi = m.constant("b", b) if op == "SUB" else m.activation("b", sb)  # one constant operand
        y = m.activation("y", want.shape)
        m.builtin(op, [ai, bi], [y])
        return ([ai] if op == "SUB" else [ai, bi]), [y]

    feeds = [a] if op == "SUB" else [a, b]
    (got,), _, _ = run_op(tmp_path, opencl_lib, build, feeds, style)
    check(got, want)


UNARY = ["LOGISTIC", "TANH", "EXP", "LOG", "SQRT", "RSQRT", "NEG", "ABS", "SIN", "COS", "SIGN",
         "GELU", "GELU_TANH"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(opencl_lib, tmp_path, style, op):
    r = rng(6)
    shape = (3, 7, 19)
    positive = op in ("LOG", "SQRT", "RSQRT")
    x = nonzero(r, shape, 3.0)
    if positive:
        x = np.abs(x) + 0.05
    if op == "SIGN":
        x.reshape(-1)[::7] = 0.0  # sign(0) = 0
    want = unary_ref(op, x)
    name = "GELU" if op.startswith("GELU") else op

    def build(m):
        xi = m.activation("x", shape)
        y = m.activation("y", shape)
        if name == "GELU":
            m.builtin("GELU", [xi], [y], approximate=op == "GELU_TANH")
        else:
            m.builtin(name, [xi], [y])
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


def test_select_v2_and_cast(opencl_lib, tmp_path, style):
    r = rng(7)
    cond = r.random((1, 5, 1)) > 0.5
    a = nonzero(r, (3, 5, 7))
    b = nonzero(r, (7,))
    i = r.integers(-1000, 1000, size=(3, 5, 7)).astype(np.int32)
    want_sel = np.where(cond, a, b)
    want_i2f = i.astype(np.float64)
    a100 = stored(style, stored(style, a) * np.float32(100))
    want_f2i = a100.astype(np.int32)  # truncation toward zero

    def build(m):
        ai = m.activation("a", a.shape)
        bi = m.activation("b", b.shape)
        ii = m.activation("i", i.shape, np.int32)
        s = m.activation("sel", a.shape)
        f = m.activation("i2f", i.shape)
        a100 = m.activation("a100", a.shape)
        f2i = m.activation("f2i", a.shape, np.int32)
        m.builtin("SELECT_V2", [m.constant("cond", cond), ai, bi], [s])
        m.builtin("CAST", [ii], [f], inDataType=2, outDataType=0)
        m.builtin("MUL", [ai, m.constant("hundred", np.full((1,), 100.0, np.float32))], [a100])
        m.builtin("CAST", [a100], [f2i], inDataType=0, outDataType=2)
        return [ai, bi, ii], [s, f, f2i]

    (sel, i2f, f2i), _, _ = run_op(tmp_path, opencl_lib, build, [a, b, i], style, nodes=4)
    check(sel, want_sel)
    check(i2f, want_i2f)
    assert f2i.dtype == np.int32 and np.array_equal(f2i, want_f2i)


def test_float16_tensors_inside_and_at_the_boundary(opencl_lib, tmp_path, style):
    """float16 runtime tensors are floats to the ops (held in the storage type; CAST between the
    float types a copy) and are converted where they cross the partition: a float16 graph input,
    a float16 tensor between two claimed nodes (fp16 files' token lookup: GATHER of the float16
    table, CAST of the rows), a float16 graph output."""
    r = rng(21)
    h = nonzero(r, (3, 5, 7)).astype(np.float16)
    a = nonzero(r, (3, 5, 7))
    table = nonzero(r, (50, 9)).astype(np.float16)
    ids = r.integers(0, 50, size=(6,)).astype(np.int32)
    want_sum = stored(style, h.astype(np.float32)) + stored(style, a)
    want_rows = table[ids].astype(np.float32)
    want_square = (stored(style, a) * stored(style, a)).astype(np.float16)

    def build(m):
        hi = m.activation("h", h.shape, np.float16)
        ai = m.activation("a", a.shape)
        ii = m.activation("ids", ids.shape, np.int32)
        wide = m.activation("h32", h.shape)
        total = m.activation("sum", a.shape)
        half_rows = m.activation("rows16", want_rows.shape, np.float16)
        rows = m.activation("rows", want_rows.shape)
        square = m.activation("square", a.shape)
        narrow = m.activation("square16", a.shape, np.float16)
        m.builtin("CAST", [hi], [wide], inDataType=1, outDataType=0)
        m.builtin("ADD", [wide, ai], [total])
        m.builtin("GATHER", [m.constant("table", table), ii], [half_rows], axis=0)
        m.builtin("CAST", [half_rows], [rows], inDataType=1, outDataType=0)
        m.builtin("MUL", [ai, ai], [square])
        m.builtin("CAST", [square], [narrow], inDataType=0, outDataType=1)
        return [hi, ai, ii], [total, rows, narrow]

    (total, rows, narrow), _, _ = run_op(tmp_path, opencl_lib, build, [h, a, ids], style, nodes=6)
    check(total, want_sum)
    assert rows.dtype == np.float32 and np.array_equal(rows, want_rows)  # float16 values, copied
    assert narrow.dtype == np.float16
    check(narrow.astype(np.float32), want_square.astype(np.float32), tol=1e-3)


# --------------------------------------------------------------------------
# Softmax, reductions

@pytest.mark.parametrize("shape,beta", [((3, 5, 77), 1.0), ((2, 1100), 0.7), ((4, 13), 1.0),
                                        ((1, 2, 33, 40), 2.5)])
def test_softmax(opencl_lib, tmp_path, style, shape, beta):
    x = nonzero(rng(8), shape, 6.0)
    z = beta * x.astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)

    def build(m):
        xi = m.activation("x", shape)
        y = m.activation("y", shape)
        m.builtin("SOFTMAX", [xi], [y], beta=beta)
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


@pytest.mark.parametrize("op", ["MEAN", "SUM"])
@pytest.mark.parametrize("shape,axes,keep", [
    ((2, 5, 7, 9), [1, 2], True),
    ((2, 5, 7, 9), [3], False),
    ((2, 5, 7, 9), [0, 3], True),
    ((2, 5, 7, 9), [-1], True),
    ((3, 4, 5), [0, 2], False),
    ((3, 4, 5), [0, 1, 2], True),
    ((1, 300, 41), [1], True),
    ((1, 129, 6, 10), [1, 3], True),  # a GroupNorm-style reduction
])
def test_reduce(opencl_lib, tmp_path, style, op, shape, axes, keep):
    x = nonzero(rng(9), shape, 2.0, 0.3)
    f = np.mean if op == "MEAN" else np.sum
    want = f(x.astype(np.float64), axis=tuple(axes), keepdims=keep)

    def build(m):
        xi = m.activation("x", shape)
        y = m.activation("y", want.shape)
        m.builtin(op, [xi, m.constant("axes", np.array(axes, np.int32))], [y], keepDims=keep)
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


# --------------------------------------------------------------------------
# Data movement

@pytest.mark.parametrize("shape,perm", [((5, 7, 3), (2, 0, 1)), ((2, 5, 7, 3), (0, 2, 1, 3)),
                                        ((2, 3, 4, 5, 3), (4, 0, 3, 1, 2)),
                                        ((2, 3, 1, 5, 3, 2), (5, 3, 1, 0, 4, 2)),
                                        ((1, 37, 41), (0, 2, 1))])
def test_transpose(opencl_lib, tmp_path, style, shape, perm):
    x = nonzero(rng(10), shape)
    want = np.transpose(x, perm)

    def build(m):
        xi = m.activation("x", shape)
        y = m.activation("y", want.shape)
        m.builtin("TRANSPOSE", [xi, m.constant("perm", np.array(perm, np.int32))], [y])
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


def test_reshape_alias_inside_and_at_boundary(opencl_lib, tmp_path, style):
    """x -> ADD -> RESHAPE (a view inside the partition) -> MUL -> y1, and
    RESHAPE of the graph input straight to a second output."""
    r = rng(11)
    x = nonzero(r, (2, 3, 35))
    c = nonzero(r, (35,))
    d = nonzero(r, (1, 5, 7))
    t = x.astype(np.float64) + c
    want1 = t.reshape(6, 5, 7) * d
    want2 = x.reshape(2, 105)

    def build(m):
        xi = m.activation("x", x.shape)
        a = m.activation("a", x.shape)
        rs = m.activation("rs", (6, 5, 7))
        y1 = m.activation("y1", (6, 5, 7))
        y2 = m.activation("y2", (2, 105))
        m.builtin("ADD", [xi, m.constant("c", c)], [a])
        m.builtin("RESHAPE", [a, m.constant("s", np.array([6, 5, 7], np.int32))], [rs])
        m.builtin("MUL", [rs, m.constant("d", d)], [y1])
        m.builtin("RESHAPE", [xi, m.constant("s2", np.array([2, 105], np.int32))], [y2])
        return [xi], [y1, y2]

    (g1, g2), stats, _ = run_op(tmp_path, opencl_lib, build, [x], style, nodes=4)
    check(g1, want1)
    check(g2, want2)


def test_concatenation_split(opencl_lib, tmp_path, style):
    r = rng(12)
    a = nonzero(r, (2, 3, 5, 7))
    b = nonzero(r, (2, 4, 5, 7))
    c = nonzero(r, (2, 1, 5, 7))
    cat = np.concatenate([a, b, c], axis=1)          # [2, 8, 5, 7]
    lastcat = np.concatenate([a, a[..., :3]], axis=-1)  # [2, 3, 5, 10]
    s1, s2, s3 = np.split(cat, [3, 4], axis=1)       # SPLIT_V sizes 3, 1, 4
    e1, e2 = np.split(lastcat, 2, axis=3)            # SPLIT in 2 along the last axis

    def build(m):
        ai = m.activation("a", a.shape)
        bi = m.activation("b", b.shape)
        ci = m.constant("c", c)
        k = m.activation("cat", cat.shape)
        sl = m.activation("slice3", (2, 3, 5, 3))
        lc = m.activation("lastcat", lastcat.shape)
        outs = [m.activation(f"s{i}", s.shape) for i, s in enumerate((s1, s2, s3))]
        halves = [m.activation(f"e{i}", e.shape) for i, e in enumerate((e1, e2))]
        m.builtin("CONCATENATION", [ai, bi, ci], [k], axis=1)
        m.builtin("STRIDED_SLICE", [ai, m.constant("b0", np.zeros(4, np.int32)),
                                    m.constant("e0", np.array([2, 3, 5, 3], np.int32)),
                                    m.constant("st0", np.ones(4, np.int32))], [sl])
        m.builtin("CONCATENATION", [ai, sl], [lc], axis=-1)
        m.builtin("SPLIT_V", [k, m.constant("sizes", np.array([3, 1, -1], np.int32)),
                              m.constant("ax", np.array(1, np.int32))], outs, numSplits=3)
        m.builtin("SPLIT", [m.constant("ax3", np.array(3, np.int32)), lc], halves, numSplits=2)
        return [ai, bi], outs + halves

    got, _, _ = run_op(tmp_path, opencl_lib, build, [a, b], style, nodes=5)
    for g, w in zip(got, (s1, s2, s3, e1, e2)):
        check(g, w)


@pytest.mark.parametrize("channels", [(8, 16), (6, 10), (4, 3)])
def test_concatenation_copies_vectors(opencl_lib, tmp_path, style, channels):
    """Channel concatenations as the UNet has them: each input is copied as vectors of up to 16
    bytes where the channel counts and offsets allow (8 and 16 channels: 4 floats or 8 halves an
    item; 6 and 10: 2; 4 and 3: single elements), into the right place."""
    r = rng(14)
    a = nonzero(r, (2, 3, 5, channels[0]))
    b = nonzero(r, (2, 3, 5, channels[1]))
    c = nonzero(r, (2, 3, 5, channels[0]))
    want = np.concatenate([a, b, c], axis=-1)

    def build(m):
        ins = [m.activation(name, v.shape) for name, v in (("a", a), ("b", b), ("c", c))]
        y = m.activation("y", want.shape)
        m.builtin("CONCATENATION", ins, [y], axis=3)
        return ins, [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [a, b, c], style)
    assert np.array_equal(got, stored(style, want)), "a copy moves the stored bits unchanged"


@pytest.mark.parametrize("case", [
    # shape, begin, end, strides, begin_mask, end_mask, shrink_mask
    ((5, 7, 9), [1, 0, 2], [4, 7, 9], [1, 2, 3], 0, 0, 0),
    ((5, 7, 9), [4, -1, 0], [0, 0, 9], [-1, -2, 1], 0, 0, 0),
    ((5, 7, 9), [1, 3, 0], [3, 0, 5], [1, 1, 2], 2, 2, 0),
    ((5, 7, 9), [2, 0, -3], [3, 7, -1], [1, 1, 1], 0, 0, 1),
    ((2, 77, 33), [0, 5], [2, 6], [1, 1], 0, 0, 2),
])
def test_strided_slice(opencl_lib, tmp_path, style, case):
    shape, begin, end, strides, bm, em, sm = case
    x = nonzero(rng(13), shape)
    sl = []
    for d in range(len(shape)):
        if d < len(begin):
            if (sm >> d) & 1:
                sl.append(begin[d])
                continue
            b = None if (bm >> d) & 1 else begin[d]
            e = None if (em >> d) & 1 else end[d]
            sl.append(slice(b, e, strides[d]))
        else:
            sl.append(slice(None))
    want = x[tuple(sl)]

    def build(m):
        xi = m.activation("x", shape)
        y = m.activation("y", want.shape)
        m.builtin("STRIDED_SLICE", [xi, m.constant("b", np.array(begin, np.int32)),
                                    m.constant("e", np.array(end, np.int32)),
                                    m.constant("s", np.array(strides, np.int32))], [y],
                  beginMask=bm, endMask=em, shrinkAxisMask=sm)
        return [xi], [y]

    (got,), _, _ = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)


def test_pad_tile_gather(opencl_lib, tmp_path, style):
    r = rng(14)
    x = nonzero(r, (2, 5, 7, 3))
    pads = np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32)
    want_pad = np.pad(x, pads)
    want_padv2 = np.pad(x, pads, constant_values=-1.5)
    t = nonzero(r, (2, 3, 5))
    want_tile = np.tile(t, (2, 1, 3))
    table = nonzero(r, (50, 7))
    ids = r.integers(0, 50, size=(2, 5)).astype(np.int32)
    want_gather = table[ids]                      # axis 0, runtime indices
    cols = np.array([6, 0, 3], np.int32)
    want_gather1 = np.take(x, cols, axis=2)                 # axis 2, constant indices

    def build(m):
        xi = m.activation("x", x.shape)
        ti = m.activation("t", t.shape)
        ii = m.activation("ids", ids.shape, np.int32)
        p1 = m.activation("pad", want_pad.shape)
        p2 = m.activation("padv2", want_padv2.shape)
        tl = m.activation("tile", want_tile.shape)
        g0 = m.activation("g0", want_gather.shape)
        g1 = m.activation("g1", want_gather1.shape)
        pi = m.constant("pads", pads)
        m.builtin("PAD", [xi, pi], [p1])
        m.builtin("PADV2", [xi, pi, m.constant("v", np.array([-1.5], np.float32))], [p2])
        m.builtin("TILE", [ti, m.constant("mult", np.array([2, 1, 3], np.int32))], [tl])
        m.builtin("GATHER", [m.constant("table", table), ii], [g0], axis=0)
        m.builtin("GATHER", [xi, m.constant("cols", cols)], [g1], axis=2)
        return [xi, ti, ii], [p1, p2, tl, g0, g1]

    got, _, _ = run_op(tmp_path, opencl_lib, build, [x, t, ids], style, nodes=5)
    for g, w in zip(got, (want_pad, want_padv2, want_tile, want_gather, want_gather1)):
        check(g, w)


@pytest.mark.parametrize("kind", ["RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"])
@pytest.mark.parametrize("size,align,half", [((10, 14), False, False), ((8, 11), False, False),
                                             ((9, 13), True, False), ((8, 11), False, True),
                                             ((3, 4), False, True)])
def test_resize(opencl_lib, tmp_path, style, kind, size, align, half):
    x = nonzero(rng(15), (2, 5, 7, 3))
    oh, ow = size
    if kind == "RESIZE_NEAREST_NEIGHBOR":
        iy = resize_index_nearest(oh, 5, align, half)
        ix = resize_index_nearest(ow, 7, align, half)
        want = x[:, iy][:, :, ix]
    else:
        want = resize_bilinear_ref(x, oh, ow, align, half)

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", want.shape)
        m.builtin(kind, [xi, m.constant("size", np.array(size, np.int32))], [y],
                  alignCorners=align, halfPixelCenters=half)
        return [xi], [y]

    (got,), _, path = run_op(tmp_path, opencl_lib, build, [x], style)
    check(got, want)
    # and TFLite's own kernel agrees with the reference formula
    check(run_reference(path, [x])[0], want)


# --------------------------------------------------------------------------
# Constants: float16 weights (DEQUANTIZE folded at prepare)


def test_dequantize_is_folded(opencl_lib, tmp_path, style):
    r = rng(16)
    x = nonzero(r, (3, 29))
    w16 = nonzero(r, (31, 29)).astype(np.float16)
    c16 = nonzero(r, (31,)).astype(np.float16)
    want = x.astype(np.float64) @ w16.astype(np.float64).T + c16.astype(np.float64)

    def build(m):
        xi = m.activation("x", x.shape)
        wf = m.activation("w32", w16.shape)
        cf = m.activation("c32", c16.shape)
        f = m.activation("fc", want.shape)
        y = m.activation("y", want.shape)
        m.builtin("DEQUANTIZE", [m.constant("w16", w16)], [wf])
        m.builtin("DEQUANTIZE", [m.constant("c16", c16)], [cf])
        m.builtin("FULLY_CONNECTED", [xi, wf, -1], [f])
        m.builtin("ADD", [f, cf], [y])
        return [xi], [y]

    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], style, nodes=4)
    check(got, want)
    # weights uploaded once, in the storage type (31*29 + 31 values; flat
    # kernels keep their own transposed copy of the FC weight instead of the original)
    assert stats["weights_bytes"] == (31 * 29 + 31) * storage_bytes(style), stats


# --------------------------------------------------------------------------
# A whole model from the project's writer: one partition


def _writer_model(tmp_path):
    """A small conv + attention-like block as ONNX, written by difflite/compiler/tflite."""
    from onnx import helper

    from difflite.compiler.tflite.writer import write_tflite

    from support.lowering_helpers import Case, i64, make_model, to_ir, weight

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["silu"]),
        helper.make_node("ReduceMean", ["silu", "ax"], ["mu"], keepdims=1),
        helper.make_node("Sub", ["silu", "mu"], ["cen"]),
        helper.make_node("Mul", ["cen", "cen"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "ax"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["cen", "sd"], ["nrm"]),
        helper.make_node("Reshape", ["nrm", "shape"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["tok"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["tok", "wq"], ["q"]),
        helper.make_node("MatMul", ["tok", "wk"], ["kk"]),
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "tok"], ["att"]),
        helper.make_node("Add", ["att", "tok"], ["res"]),
        helper.make_node("Transpose", ["res"], ["ch"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["ch", "shape4"], ["img"]),
        helper.make_node("Resize", ["img", "", "scales"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Conv", ["up", "w2", "b2"], ["y"], pads=[0, 0, 0, 0], strides=[2, 2]),
    ]
    inits = {
        "w1": weight(1, 6, 3, 3, 3), "b1": weight(2, 6), "ax": i64(1),
        "eps": np.array(1e-5, np.float32), "shape": i64(1, 6, 35),
        "wq": weight(3, 6, 5), "wk": weight(4, 6, 5), "shape4": i64(1, 6, 5, 7),
        "scales": np.array([1, 1, 2, 2], np.float32), "w2": weight(5, 4, 6, 3, 3),
        "b2": weight(6, 4),
    }
    case = Case("opencl-block", nodes, {"x": (1, 3, 5, 7)}, ["y"], inits)
    result = write_tflite(to_ir(make_model(case)), precision="fp32")
    path = tmp_path / "block.tflite"
    path.write_bytes(bytes(result.data))
    return path


def test_writer_model_is_one_partition(opencl_lib, tmp_path, style, capfd):
    path = _writer_model(tmp_path)
    from ai_edge_litert.interpreter import Interpreter

    n_nodes = len(Interpreter(model_path=str(path))._get_ops_details())
    x = nonzero(rng(17), (1, 5, 7, 3))
    (got,), stats = run_model(path, opencl_lib, [x], style_options(style, verbose=1), stats=True)
    want = run_reference(path, [x])[0]
    check(got, want, 1e-5)
    assert stats["nodes_claimed"] == n_nodes == stats["nodes_total"], stats
    assert stats["partitions"] == 1, stats
    err = capfd.readouterr().err
    assert f"opencl: claimed {n_nodes} of {n_nodes} nodes" in err, err
    assert "opencl: 1 partition(s)" in err, err
    assert "not delegating" not in err, err


# --------------------------------------------------------------------------
# Memory plan and stats


def test_arena_reuses_memory(opencl_lib, tmp_path):
    """A chain of 12 elementwise ops over [64, 127] floats: the arena holds a
    few tensors at a time, not twelve."""
    x = nonzero(rng(18), (64, 127))
    tensor_bytes = x.nbytes
    n_ops = 12

    def build(m):
        xi = m.activation("x", x.shape)
        prev = xi
        for i in range(n_ops):
            nxt = m.activation(f"t{i}", x.shape)
            m.builtin("ADD" if i % 2 else "MUL", [prev, m.constant(f"c{i}", np.full((1,), 1.01, np.float32))],
                      [nxt])
            prev = nxt
        return [xi], [prev]

    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "flat", nodes=n_ops)
    want = x.astype(np.float64)
    for i in range(n_ops):
        want = want + 1.01 if i % 2 else want * 1.01
    check(got, want)
    assert set(stats) >= {"arena_bytes", "weights_bytes", "scratch_bytes", "nodes_claimed",
                          "partitions", "device"}
    assert isinstance(stats["device"], str) and stats["device"]
    assert tensor_bytes * 2 <= stats["arena_bytes"] <= tensor_bytes * 3 + 4096, stats
    assert stats["weights_bytes"] == n_ops * 4, stats


def test_profile_option(opencl_lib, tmp_path):
    x = nonzero(rng(19), (5, 33))

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", x.shape)
        m.builtin("TANH", [xi], [y])
        return [xi], [y]

    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "flat", profile=1)
    check(got, np.tanh(x.astype(np.float64)))
    assert stats["invokes"] == 2 and "TANH" in stats["profile_ms_per_invoke"], stats
    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "flat", profile=2)
    check(got, np.tanh(x.astype(np.float64)))
    (key,) = stats["profile_ms_per_invoke"]
    assert key.startswith("TANH 5x33->5x33 "), stats


def test_fp16_runs_in_half_storage(opencl_lib, tmp_path, capfd):
    """precision=fp16 stores activations as half on any device: through
    cl_khr_fp16 where the device has it, else through vload_half / vstore_half
    (PoCL), which the verbose log names."""
    x = nonzero(rng(20), (4, 21))

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", x.shape)
        m.builtin("EXP", [xi], [y])
        return [xi], [y]

    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "flat", precision="fp16", verbose=1)
    want = np.exp(stored("flat+fp16", x).astype(np.float64))
    check(got, want, 1e-3)
    assert np.array_equal(got, stored("flat+fp16", got)), "outputs pass through half storage"
    err = capfd.readouterr().err
    assert "storage=float16" in err, err
    if "cl_khr_fp16" not in err:
        assert "(vload_half, float arithmetic)" in err, err
    else:
        assert "(half multiply-adds in GEMMs and attention)" in err, err


def test_fp16_arithmetic_in_gemm_tiles(opencl_lib, tmp_path):
    """precision=fp16 on a device with cl_khr_fp16 multiplies and adds in half in the tiled
    GEMMs (math=auto), with a float carry per K slice; math=fp32 keeps float arithmetic. Without
    cl_khr_fp16 both are float. DIFFLITE_EXPECT_ARITHMETIC names what this device must do (the
    CI lane on Intel's CPU OpenCL, which has cl_khr_fp16, sets float16)."""
    r = rng(21)
    x = nonzero(r, (96, 1000))
    wt = nonzero(r, (72, 1000))
    hx, hw = (stored("tiled+fp16", v).astype(np.float64) for v in (x, wt))
    want = hx @ hw.T

    def build(m):
        xi = m.activation("x", x.shape)
        y = m.activation("y", want.shape)
        m.builtin("FULLY_CONNECTED", [xi, m.constant("w", wt), -1], [y])
        return [xi], [y]

    (as_float,), stats32, _ = run_op(tmp_path, opencl_lib, build, [x], "tiled+fp16", math="fp32")
    assert stats32["arithmetic"] == "float32", stats32
    (got,), stats, _ = run_op(tmp_path, opencl_lib, build, [x], "tiled+fp16")
    expected = os.environ.get("DIFFLITE_EXPECT_ARITHMETIC")
    if expected:
        assert stats["arithmetic"] == expected, stats
    check(as_float, want, HALF_TOL)
    check(got, want, HALF_TOL)
    if stats["arithmetic"] == "float16":
        # Half products and partial sums round differently from float ones.
        assert not np.array_equal(got, as_float), "math=auto ran float arithmetic"
    else:
        assert np.array_equal(got, as_float), "float arithmetic either way"


# --------------------------------------------------------------------------
# Refusals and options


def test_unsupported_nodes_stay_with_tflite(opencl_lib, tmp_path, capfd):
    """A CONV_2D with a fused RELU is refused (the reason is logged); the ADD
    after it is claimed; the model still computes the right thing."""
    r = rng(21)
    x = nonzero(r, (1, 6, 5, 3))
    wt = nonzero(r, (4, 3, 3, 3))
    c = nonzero(r, (4,))
    b = nonzero(r, (4,))
    want = np.maximum(conv_ref(x, wt, b, (1, 1), (1, 1), SAME), 0) + c

    def build(m):
        xi = m.activation("x", x.shape)
        t = m.activation("t", want.shape)
        y = m.activation("y", want.shape)
        m.builtin("CONV_2D", [xi, m.constant("w", wt), m.constant("b", b)], [t], padding=SAME,
                  strideH=1, strideW=1,
                  fusedActivationFunction=1, dilationHFactor=1, dilationWFactor=1)
        m.builtin("ADD", [t, m.constant("c", c)], [y])
        return [xi], [y]

    m = OpModel()
    ins, outs = build(m)
    path = m.save(tmp_path / "relu.tflite", ins, outs)
    (got,), stats = run_model(path, opencl_lib, [x], opencl_options(), stats=True)
    check(got, want)
    assert stats["nodes_claimed"] == 1 and stats["nodes_total"] == 2, stats
    err = capfd.readouterr().err
    assert re.search(r"not delegating node 0 \(CONV_2D\): .*fused activation", err), err


@pytest.mark.parametrize("opts,msg", [
    ({"backend": "opencl", "device": "99"}, "device=99 is out of range"),
    ({"backend": "opencl", "kernels": "fast"}, "kernels must be auto, tiled or flat"),
    ({"backend": "opencl", "profile": "yes"}, "profile must be 0, 1"),
    ({"backend": "cpu", "stats_path": "/tmp/x.json"}, "apply to backend=opencl only"),
    ({"backend": "opencl", "math": "fp16"}, "math must be auto or fp32"),
    ({"backend": "cpu", "math": "fp32"}, "apply to backend=opencl only"),
    ({"backend": "opencl", "device": "-7"}, "device must be an integer"),
    ({"backend": "opencl", "tensor_cores": "on"}, "tensor_cores must be auto or off"),
    ({"backend": "cpu", "tensor_cores": "off"}, "apply to backend=opencl only"),
])
def test_bad_opencl_options(opencl_lib, opts, msg):
    from ai_edge_litert.interpreter import load_delegate

    with pytest.raises(ValueError, match=re.escape(msg)):
        load_delegate(str(opencl_lib), opts)


@pytest.mark.parametrize("env,option,want", [
    ("tiled", None, "tiled"),   # the environment picks the style where the caller left it auto
    ("flat", None, "flat"),
    ("tiled", "flat", "flat"),  # an explicit option wins
])
def test_kernel_style_from_the_environment(tmp_path, opencl_lib, monkeypatch, env, option, want):
    r = rng(31)
    x, wt, b = nonzero(r, (1, 9, 7, 6)), nonzero(r, (5, 3, 3, 6)), nonzero(r, (5,))
    monkeypatch.setenv("DIFFLITE_KERNELS", env)
    (got,), stats, _ = run_op(tmp_path, opencl_lib, conv_model(x, wt, b, (1, 1), (1, 1), SAME, (1, 9, 7, 5)), [x],
                           option or "auto")
    check(got, conv_ref(x, wt, b, (1, 1), (1, 1), SAME))
    assert stats["kernels"] == want, stats


def test_a_bad_kernel_style_in_the_environment_is_refused(opencl_lib, monkeypatch):
    from ai_edge_litert.interpreter import load_delegate

    monkeypatch.setenv("DIFFLITE_KERNELS", "fast")
    with pytest.raises(ValueError, match=re.escape("DIFFLITE_KERNELS must be auto, tiled or flat, got 'fast'")):
        load_delegate(str(opencl_lib), {"backend": "opencl"})
    load_delegate(str(opencl_lib), {"backend": "cpu"})  # the CPU backend has no kernel styles: not read


_NO_OPENCL = textwrap.dedent("""
    import sys
    from ai_edge_litert.interpreter import load_delegate
    try:
        load_delegate(sys.argv[1], {"backend": "opencl"})
    except ValueError as e:
        print("REFUSED:", e)
    else:
        print("CREATED")
    load_delegate(sys.argv[1], {"backend": "cpu"})
    print("CPU_OK")
""")


@pytest.mark.parametrize("env,needle", [
    ({"DIFFLITE_OPENCL_LIBRARY": "/nonexistent/libOpenCL.so.1"}, "no OpenCL library could be loaded"),
    ({"OCL_ICD_VENDORS": "EMPTY_DIR"}, "no OpenCL platform found"),
])
def test_missing_opencl_is_a_clear_error(opencl_lib, tmp_path, env, needle):
    env = {k: (str(tmp_path) if v == "EMPTY_DIR" else v) for k, v in env.items()}
    proc = subprocess.run([sys.executable, "-c", _NO_OPENCL, str(opencl_lib)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REFUSED:" in proc.stdout and "backend=opencl unavailable" in proc.stdout, proc.stdout
    assert needle in proc.stdout, proc.stdout
    assert "CPU_OK" in proc.stdout, proc.stdout


def test_input_resize_after_prepare_is_refused(opencl_lib, tmp_path):
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    m = OpModel()
    xi = m.activation("x", (2, 9))
    y = m.activation("y", (2, 9))
    m.builtin("EXP", [xi], [y])
    path = m.save(tmp_path / "exp.tflite", [xi], [y])
    interp = Interpreter(model_path=str(path), experimental_delegates=[load_delegate(str(opencl_lib), opencl_options())])
    interp.allocate_tensors()
    interp.resize_tensor_input(xi, [3, 9])
    with pytest.raises(RuntimeError, match="plans static shapes"):
        interp.allocate_tensors()


def test_tensorflow_runtime(opencl_lib, tmp_path):
    """The same delegate under tensorflow's tf.lite (the second runtime)."""
    from support.oplib_helpers import load_runtime

    interp_cls, load_delegate = load_runtime("tf")
    r = rng(22)
    a = nonzero(r, (3, 17, 9))
    b = nonzero(r, (9, 13))

    m = OpModel()
    ai = m.activation("a", a.shape)
    bi = m.constant("b", b)
    t = m.activation("t", (3, 17, 13))
    y = m.activation("y", (3, 17, 13))
    m.builtin("BATCH_MATMUL", [ai, bi], [t])
    m.builtin("SOFTMAX", [t], [y], beta=1.0)
    path = m.save(tmp_path / "tf.tflite", [ai], [y])
    interp = interp_cls(model_path=str(path), experimental_delegates=[load_delegate(str(opencl_lib), {"backend": "opencl"})])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], a)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    z = a.astype(np.float64) @ b.astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    check(got, e / e.sum(-1, keepdims=True))
