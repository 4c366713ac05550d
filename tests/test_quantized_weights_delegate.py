"""backend=opencl on files whose weights are int8 / int4 + DEQUANTIZE (issue 21, first slice):
the OpenCL backend folds DEQUANTIZE of a quantized constant as it folds float16 ones, so the
whole graph stays in one partition.

The weight forms are TFLite's standard ones (what `difflite convert --weights int8|int4` writes):
* int8: TensorType INT8, affine quantization per axis (one scale per output channel,
  quantized_dimension 0 of CONV_2D's OHWI filter and FULLY_CONNECTED's [N, K]) or per tensor;
* int4: TensorType INT4, two values a byte (even index in the low nibble, odd in the high one,
  each sign-extended from 4 bits), blockwise: [N, K] stored as [N*K/B, B], one scale per block
  of B inputs, back to [N, K] in one of two forms:
  - compact4d (what convert writes): per-tensor scale 1 and DEQUANTIZE to float32
    [N*K/B, 1, 1, B], MUL by a float16 [N*K/B, 1, 1, 1] constant of block scales (DEQUANTIZEd),
    RESHAPE to [N, K]; compact: the same in 2-D ([N*K/B, B] by [N*K/B, 1]);
  - per axis: scales on axis 0 of the INT4 tensor, DEQUANTIZE, RESHAPE.

Each model runs through ai_edge_litert with the delegate (backend=opencl, PoCL in CI) and
without it (stock LiteRT: XNNPACK / reference kernels): float storage within 1e-5 of stock,
relative to the output's max magnitude, half storage within HALF_TOL; the stats JSON shows
every node claimed into one partition. Refusals (integer types or quantization the backend
does not take) leave the DEQUANTIZE with TFLite, and the rest still computes right.
One case also runs on tensorflow's tf.lite (the second runtime of the ABI checks): the
quantization fields of the tensor struct are read at the same offsets there.

OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import json
import os
import re
import tempfile

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from support.numerics import SAME, VALID, conv_ref, fc_ref, nonzero, rel_err, rng
from support.opencl_helpers import opencl_options, run_model, run_reference
from support.oplib_helpers import load_runtime
from support.quantized_helpers import (
    BLOCK,
    QModel,
    dequantize,
    int4_blocks,
    pack_int4,
    quantize,
    write_int4_lookup,
)

TOL = 1e-5
HALF_TOL = 4e-3  # half storage rounds inputs, weights and outputs to 11 significant bits


# --------------------------------------------------------------------------
# References (float64)


# --------------------------------------------------------------------------
# Running


def n_nodes(path) -> int:
    from ai_edge_litert.interpreter import Interpreter

    return len(Interpreter(model_path=str(path))._get_ops_details())


def run_both(lib, path, x, precision="fp32", **opts):
    """(delegate output, stats, stock output) of the model at `path` fed `x`."""
    (got,), stats = run_model(path, lib, [x], opencl_options(precision=precision, **opts),
                              stats=True)
    (stock,) = run_reference(path, [x])
    return got, stats, stock


def check_whole(stats, path, precision):
    nodes = n_nodes(path)
    assert stats["nodes_claimed"] == nodes == stats["nodes_total"], stats
    assert stats["partitions"] == 1, stats
    assert stats["storage"] == ("float16" if precision == "fp16" else "float32"), stats
    assert stats["weights_zero_copy_bytes"] == 0, stats  # dequantized: always converted


def check_values(got, stock, want, precision):
    tol = HALF_TOL if precision == "fp16" else TOL
    assert rel_err(stock, want) <= TOL, "stock LiteRT disagrees with the float64 reference"
    err = rel_err(got, stock)
    assert err <= tol, f"relative error {err:.3g} > {tol} against stock LiteRT"


PRECISIONS = ["fp32", "fp16"]


# --------------------------------------------------------------------------
# int8


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("axis", [0, 1, None], ids=["per_channel", "per_input", "per_tensor"])
def test_int8_fully_connected(opencl_lib, tmp_path, precision, axis):
    """int8 DEQUANTIZE -> FULLY_CONNECTED (+ bias): per output channel (axis 0, what convert
    writes), per input channel (axis 1: the channel index wraps every element) and per tensor."""
    r = rng(1)
    n, k = 23, 37
    x = nonzero(r, (3, k))
    q, scale = quantize(nonzero(r, (n, k)), axis, 8)
    b = nonzero(r, (n,))
    want = fc_ref(x, dequantize(q, scale, np.zeros(scale.size), axis), b)
    m = QModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", want.shape)
    w = m.int8_weight("w", q, scale, axis=0 if axis is None else axis)
    m.builtin("FULLY_CONNECTED", [xi, w, m.constant("b", b)], [y])
    path = m.save(tmp_path / "fc_int8.tflite", [xi], [y])
    got, stats, stock = run_both(opencl_lib, path, x, precision)
    check_whole(stats, path, precision)
    check_values(got, stock, want, precision)


def check_conv_2d(m, w: int, x, b, want, padding, path, opencl_lib, precision) -> None:
    """x -> CONV_2D (stride 1) with the quantized weight `w` of model `m`, run on the OpenCL backend
    and stock TFLite: claimed whole, weights held quantized, values against `want`."""
    xi = m.activation("x", x.shape)
    y = m.activation("y", want.shape)
    m.builtin("CONV_2D", [xi, w, m.constant("b", b)], [y], padding=padding, strideH=1, strideW=1,
              dilationHFactor=1, dilationWFactor=1)
    path = m.save(path, [xi], [y])
    got, stats, stock = run_both(opencl_lib, path, x, precision)
    check_whole(stats, path, precision)
    check_values(got, stock, want, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_int8_conv_2d(opencl_lib, tmp_path, precision):
    """int8 per-output-channel DEQUANTIZE -> CONV_2D 3x3 (OHWI filter, odd channel counts)."""
    r = rng(2)
    x = nonzero(r, (1, 9, 7, 5))
    q, scale = quantize(nonzero(r, (7, 3, 3, 5)), 0, 8)
    b = nonzero(r, (7,))
    want = conv_ref(x, dequantize(q, scale, np.zeros(7), 0), b, padding=SAME)
    m = QModel()
    check_conv_2d(m, m.int8_weight("w", q, scale, axis=0), x, b, want, SAME, tmp_path / "conv_int8.tflite",
                  opencl_lib, precision)


def test_int8_with_zero_points_is_dequantized_across_staging_chunks(opencl_lib, tmp_path):
    """A weight of more than one staging chunk (4 MiB of float32 = 2^20 values; 1031 x 1027
    is not a whole number of rows of it, so a chunk starts mid-channel), with non-zero zero
    points, which the kernels do not read: values right, model pages released after the upload,
    and weights_bytes the same as the float32 file holding the dequantized values."""
    r = rng(3)
    n, k = 1031, 1027
    x = nonzero(r, (2, k))
    q, scale = quantize(nonzero(r, (n, k)), 0, 8)
    q = np.clip(q.astype(np.int16) + 3, -128, 127).astype(np.int8)
    zero = r.integers(-5, 6, n)
    wf = dequantize(q, scale, zero, 0)
    want = fc_ref(x, wf, None)
    m = QModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", want.shape)
    w = m.int8_weight("w", q, scale, axis=0, zero_point=zero)
    m.builtin("FULLY_CONNECTED", [xi, w, -1], [y])
    path = m.save(tmp_path / "fc_big.tflite", [xi], [y])
    got, stats, stock = run_both(opencl_lib, path, x)
    check_whole(stats, path, "fp32")
    check_values(got, stock, want, "fp32")
    assert stats["model_pages_released_bytes"] >= n * k - 2 * 4096, stats

    f = QModel()
    xi = f.activation("x", x.shape)
    y = f.activation("y", want.shape)
    f.builtin("FULLY_CONNECTED", [xi, f.constant("w", wf.astype(np.float32)), -1], [y])
    float_path = f.save(tmp_path / "fc_big_f32.tflite", [xi], [y])
    _, float_stats = run_model(float_path, opencl_lib, [x], opencl_options(), stats=True,
                               repeats=1)
    assert stats["weights_bytes"] == float_stats["weights_bytes"], (stats, float_stats)
    assert stats["weights_dequantized_bytes"] == stats["weights_bytes"], stats


# --------------------------------------------------------------------------
# int4 (blockwise: compact, DEQUANTIZE -> MUL -> RESHAPE; or per axis, DEQUANTIZE -> RESHAPE)


@pytest.mark.parametrize("form", ["compact4d", "compact", "per_axis"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_int4_fully_connected(opencl_lib, tmp_path, precision, form, capfd):
    """int4 [N*K/32, 32] -> DEQUANTIZE (-> MUL by block scales) -> RESHAPE [N, K] ->
    FULLY_CONNECTED: the chain of folded constants is folded whole (no copy per Invoke), one
    partition, the weight held as its integers and scales."""
    r = rng(4)
    n, k = 13, 96
    x = nonzero(r, (3, k))
    q, scale = int4_blocks(nonzero(r, (n, k)))
    b = nonzero(r, (n,))
    want = fc_ref(x, dequantize(q, scale, np.zeros(scale.size), 0).reshape(n, k), b)
    m = QModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", want.shape)
    w = m.int4_weight("w", (n, k), q, scale, form)
    m.builtin("FULLY_CONNECTED", [xi, w, m.constant("b", b)], [y])
    path = m.save(tmp_path / "fc_int4.tflite", [xi], [y])
    capfd.readouterr()
    got, stats, stock = run_both(opencl_lib, path, x, precision, verbose=1)
    check_whole(stats, path, precision)
    check_values(got, stock, want, precision)
    err = capfd.readouterr().err
    assert "not delegating" not in err, err
    folds = ["DEQUANTIZE", "RESHAPE"] if form == "per_axis" else ["DEQUANTIZE", "DEQUANTIZE", "MUL", "RESHAPE"]
    for node, op in enumerate(folds):
        assert re.search(rf"claim node {node} {op} .* folded", err), err
    assert stats["weights_quantized_bytes"] > 0 and stats["weights_dequantized_bytes"] == 0, stats
    assert "opencl: 1 partition(s)" in err, err
    # the weight (and the bias) once, in the storage type: nothing for the RESHAPE
    per = 2 if precision == "fp16" else 4
    assert stats["weights_bytes"] <= (n * k + n) * per + 4096, stats
    assert stats["arena_bytes"] < n * k * per, stats  # no reshaped copy of the weight


@pytest.mark.parametrize("precision", PRECISIONS)
def test_int8_lookup_table_stays_int8_on_the_device(opencl_lib, tmp_path, precision):
    """The int4 mix's token table as the writer stores it (difflite/compiler/tflite/context.py lookup):
    DEQUANTIZE of int8 rows, GATHER, times the gathered row scales. The GATHER reads the int8
    constant as it is (gather_q8): the device never holds the table as floats, and the rows
    are TFLite's exactly at fp32."""
    vocab, dim = 1000, 64
    r = rng(11)
    path = tmp_path / "lookup.tflite"
    write_int4_lookup(path, precision, r, vocab, dim)
    ids = r.integers(0, vocab, (1, 77)).astype(np.int32)
    ids[0, :3] = (0, vocab - 1, 0)
    got, stats, stock = run_both(opencl_lib, path, ids, precision)
    assert stats["nodes_claimed"] == n_nodes(path) == stats["nodes_total"] and stats["partitions"] == 1, stats
    assert stats["weights_quantized_bytes"] >= vocab * dim and stats["weights_dequantized_bytes"] == 0, stats
    assert np.abs(stock).max() > 0
    if precision == "fp32":
        np.testing.assert_array_equal(got, stock)
    else:
        assert rel_err(got, stock) <= HALF_TOL


@pytest.mark.parametrize("width", ["int8", "int4"])
def test_linear_as_1x1_convolution_stays_quantized(opencl_lib, tmp_path, width):
    """A `--no-fuse` file's quantized linear layer (RESHAPE to [1, 1, M, K], CONV_2D with the
    [N, 1, 1, K] filter, RESHAPE back: difflite/compiler/tflite/ops/matmul.py) is claimed whole, its
    weight held quantized on the device, and computes what stock LiteRT computes."""
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from difflite.compiler.tflite import quantize as writer_quantize
    from difflite.compiler.tflite.writer import write_tflite

    m_rows, k, n = 77, 96, 40
    r = rng(12)
    weight = (r.standard_normal((k, n)) * 0.1).astype(np.float32)
    bias = (r.standard_normal(n) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m_rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m_rows, n])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    path = tmp_path / f"linear_{width}.tflite"
    write_tflite(ir.serde.deserialize_model(model), path=path, stock_gpu_forms=True,
                 quantization=writer_quantize.WeightQuantization(width, min_elements=1))
    x = nonzero(r, (1, m_rows, k))
    got, stats, stock = run_both(opencl_lib, path, x)
    assert stats["nodes_claimed"] == n_nodes(path) == stats["nodes_total"] and stats["partitions"] == 1, stats
    assert stats["weights_quantized_bytes"] >= n * k // (2 if width == "int4" else 1), stats
    assert stats["weights_dequantized_bytes"] == 0, stats
    assert rel_err(got, stock) <= TOL


@pytest.mark.parametrize("precision", PRECISIONS)
def test_int4_conv_2d(opencl_lib, tmp_path, precision):
    """int4 blocks of the flattened OHWI filter (7 x 3 x 3 x 32 = 63 blocks) -> DEQUANTIZE ->
    RESHAPE [7, 3, 3, 32] -> CONV_2D (VALID)."""
    r = rng(5)
    x = nonzero(r, (1, 8, 6, 32))
    shape = (7, 3, 3, 32)
    q, scale = int4_blocks(nonzero(r, shape))
    b = nonzero(r, (7,))
    want = conv_ref(x, dequantize(q, scale, np.zeros(scale.size), 0).reshape(shape), b, padding=VALID)
    m = QModel()
    check_conv_2d(m, m.int4_weight("w", shape, q, scale), x, b, want, VALID, tmp_path / "conv_int4.tflite",
                  opencl_lib, precision)


def test_int4_with_tiled_kernels(opencl_lib, tmp_path):
    """The same int4 FULLY_CONNECTED with the kernels GPUs get (kernels=tiled)."""
    r = rng(6)
    n, k = 19, 64
    x = nonzero(r, (5, k))
    q, scale = int4_blocks(nonzero(r, (n, k)))
    want = fc_ref(x, dequantize(q, scale, np.zeros(scale.size), 0).reshape(n, k), None)
    m = QModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", want.shape)
    m.builtin("FULLY_CONNECTED", [xi, m.int4_weight("w", (n, k), q, scale), -1], [y])
    path = m.save(tmp_path / "fc_int4_tiled.tflite", [xi], [y])
    got, stats, stock = run_both(opencl_lib, path, x, kernels="tiled")
    check_whole(stats, path, "fp32")
    assert stats["kernels"] == "tiled", stats
    check_values(got, stock, want, "fp32")


@pytest.mark.parametrize("variant", ["unit_half", "relu"])
def test_int4_lookalikes_of_the_compact_form_compute_as_written(opencl_lib, tmp_path, variant, capfd):
    """Chains that look like the compact form but are not (a per-tensor scale of 0.5; a MUL
    with a fused RELU) are not folded into block scales: the MUL runs as written (an OpenCL
    op, or TFLite's where the backend has none for it) and the result still agrees with stock
    LiteRT."""
    r = rng(7)
    n, k = 11, 64
    x = nonzero(r, (4, k))
    q, scale = int4_blocks(nonzero(r, (n, k)))
    wd = dequantize(q, scale, np.zeros(scale.size), 0).reshape(n, k)
    opts = {"unit": 0.5} if variant == "unit_half" else {"fusedActivationFunction": 1}  # RELU
    m = QModel()
    xi = m.activation("x", x.shape)
    want = fc_ref(x, np.maximum(wd, 0) if variant == "relu" else wd, None)
    y = m.activation("y", want.shape)
    m.builtin("FULLY_CONNECTED", [xi, m.int4_weight("w", (n, k), q, scale, **opts), -1], [y])
    path = m.save(tmp_path / f"fc_int4_{variant}.tflite", [xi], [y])
    capfd.readouterr()
    got, stats, stock = run_both(opencl_lib, path, x, verbose=1)
    check_values(got, stock, want, "fp32")
    err = capfd.readouterr().err
    assert "node 2 (MUL)" in err or re.search(r"claim node 2 MUL ", err), err
    assert not re.search(r"claim node 2 MUL .* folded", err), err
    assert stats["weights_quantized_bytes"] == 0, stats


# --------------------------------------------------------------------------
# Kernels reading the weights quantized (dl_qweights.cl): the integers and their scales are
# what the device holds, dequantized in registers by the GEMM and convolution kernels


def _quantized_weight(m, r, name, shape, bits):
    """A random weight of `shape` ([N, K] or OHWI) as convert writes it: int8 per output channel
    or int4 blocks of 32 along the input. (tensor index, float64 dequantized weight)."""
    wf = nonzero(r, shape)
    if bits == 8:
        q, scale = quantize(wf, 0, 8)
        return m.int8_weight(name, q, scale), dequantize(q, scale, np.zeros(scale.size), 0)
    q, scale = int4_blocks(wf)
    return (m.int4_weight(name, shape, q, scale),
            dequantize(q, scale, np.zeros(scale.size), 0).reshape(shape))


def _quantized_case(tmp_path, case, bits, seed):
    """(path, x, float64 reference, weight elements, output channels) of one randomized case:
    fc_skinny (M <= 8: gemm_skinny), fc (the tiled GEMM), conv3x3 (the implicit-GEMM
    convolution, SAME, any channel count) or conv1x1 (a GEMM over the pixels)."""
    r = rng(seed)
    m = QModel()
    cin = int(r.choice([32, 64, 96]))
    cout = int(r.integers(5, 70))
    if case.startswith("fc"):
        rows = int(r.integers(2, 9)) if case == "fc_skinny" else int(r.integers(20, 90))
        x = nonzero(r, (rows, cin))
        w, wd = _quantized_weight(m, r, "w", (cout, cin), bits)
        b = nonzero(r, (cout,))
        want = fc_ref(x, wd, b)
        xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
        m.builtin("FULLY_CONNECTED", [xi, w, m.constant("b", b)], [y])
    else:
        kh = 3 if case == "conv3x3" else 1
        x = nonzero(r, (1, int(r.integers(5, 12)), int(r.integers(5, 12)), cin))
        w, wd = _quantized_weight(m, r, "w", (cout, kh, kh, cin), bits)
        b = nonzero(r, (cout,))
        want = conv_ref(x, wd, b, padding=SAME)
        xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
        m.builtin("CONV_2D", [xi, w, m.constant("b", b)], [y], padding=SAME, strideH=1,
                  strideW=1, dilationHFactor=1, dilationWFactor=1)
    path = m.save(tmp_path / f"{case}_int{bits}.tflite", [xi], [y])
    return path, x, want, wd.size, cout


QUANTIZED_CASES = ["fc_skinny", "fc", "conv3x3", "conv1x1"]


@pytest.mark.parametrize("kernels", ["flat", "tiled"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("case", QUANTIZED_CASES)
def test_kernels_read_quantized_weights(opencl_lib, tmp_path, case, bits, kernels):
    """Randomized shapes (seeded by the case): the output agrees with stock LiteRT (which
    dequantizes) and the float64 reference, and the device holds the integers and their scales
    only: weights_bytes is the weight's int8 / int4 bytes, its scales and the bias (the flat
    kernels' packed copy: output channels padded to 16, int4 widened to a byte)."""
    seed = 100 + QUANTIZED_CASES.index(case) * 10 + bits + (kernels == "tiled")
    path, x, want, size, cout = _quantized_case(tmp_path, case, bits, seed)
    got, stats, stock = run_both(opencl_lib, path, x, kernels=kernels)
    check_whole(stats, path, "fp32")
    check_values(got, stock, want, "fp32")
    k = size // cout
    scales = cout if bits == 8 else size // BLOCK
    if kernels == "tiled":  # int8's float32 scales; int4's block scales as the model stores them: float16
        weight = (size if bits == 8 else size // 2) + (4 if bits == 8 else 2) * scales
    else:
        np16 = -(-cout // 16) * 16
        weight = np16 * k + 4 * np16 * (1 if bits == 8 else k // BLOCK)
    assert stats["weights_quantized_bytes"] == weight, stats
    assert stats["weights_dequantized_bytes"] == 0, stats
    assert stats["weights_bytes"] == weight + 4 * cout, stats


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kernels", ["flat", "tiled"])
def test_kernels_read_quantized_weights_in_half_storage(opencl_lib, tmp_path, bits, kernels):
    """The same kernels with half storage (dequantized values rounded to half where staged)."""
    path, x, want, _, _ = _quantized_case(tmp_path, "conv3x3", bits, 200 + bits)
    got, stats, stock = run_both(opencl_lib, path, x, "fp16", kernels=kernels)
    check_whole(stats, path, "fp16")
    check_values(got, stock, want, "fp16")
    assert stats["weights_quantized_bytes"] > 0 and stats["weights_dequantized_bytes"] == 0


@pytest.mark.parametrize("bits,cin", [(8, 32), (4, 32), (8, 5)], ids=["int8_quads", "int4_quads", "int8_elements"])
def test_quantized_convolution_on_tensor_cores(opencl_lib, tmp_path, monkeypatch, bits, cin):
    """The implicit-GEMM convolution on the tensor-core tiles (conv.cl's -DMMA=1; emulated in
    OpenCL C here: DIFFLITE_TENSOR_CORES=emulate) reads a quantized filter's integers as the
    float tiles do, dequantized where staged and rounded to half: in aligned quads of k (int8 per
    output channel, int4 blocks) or element by element (K = 9 x 5, not a multiple of 4). The
    stats name a tensor-core tile, and nothing was dequantized at upload. The 32-deep tile is
    forced: PoCL's CPU device spills the default one, which is then passed over."""
    monkeypatch.setenv("DIFFLITE_TENSOR_CORES", "emulate")
    monkeypatch.setenv("DIFFLITE_GEMM_TILE", "128x128x32x8x8m")
    r = rng(300 + bits + cin)
    m = QModel()
    x = nonzero(r, (2, 9, 10, cin))
    w, wd = _quantized_weight(m, r, "w", (70, 3, 3, cin), bits)
    b = nonzero(r, (70,))
    want = conv_ref(x, wd, b, padding=SAME)
    xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
    m.builtin("CONV_2D", [xi, w, m.constant("b", b)], [y], padding=SAME, strideH=1, strideW=1,
              dilationHFactor=1, dilationWFactor=1)
    path = m.save(tmp_path / f"tc_conv_int{bits}.tflite", [xi], [y])
    got, stats, stock = run_both(opencl_lib, path, x, "fp16", kernels="tiled")
    assert stats["nodes_claimed"] == n_nodes(path) and stats["partitions"] == 1, stats
    assert stats["storage"] == "float16", stats
    check_values(got, stock, want, "fp16")
    assert any(tile.endswith("m") for tile in stats["gemm_tiles"]), stats["gemm_tiles"]
    assert stats["weights_quantized_bytes"] > 0 and stats["weights_dequantized_bytes"] == 0, stats


@pytest.mark.parametrize("precision", PRECISIONS)
def test_dequantized_weights_read_back_exactly(opencl_lib, tmp_path, precision):
    """A folded DEQUANTIZE (int8) and a folded RESHAPE of one (int4) whose outputs are also graph
    outputs: TFLite reads them from the delegate bit for bit as TFLite's own DEQUANTIZE kernel
    computes them, float32(q - zero_point) * scale (host-side, whatever the storage). That
    kernel runs without XNNPACK here: XNNPACK takes the DEQUANTIZE as its FULLY_CONNECTED's
    static weight and leaves such a graph output unwritten."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    r = rng(11)
    n, k = 9, 64
    x = nonzero(r, (2, k))
    q8, s8 = quantize(nonzero(r, (n, k)), 0, 8)
    q4, s4 = int4_blocks(nonzero(r, (n, k)))
    m = QModel()
    xi = m.activation("x", x.shape)
    w8 = m.int8_weight("w8", q8, s8)
    w4 = m.int4_weight("w4", (n, k), q4, s4)
    a = m.activation("a", (2, n))
    c = m.activation("c", (2, n))
    m.builtin("FULLY_CONNECTED", [xi, w8, -1], [a])
    m.builtin("FULLY_CONNECTED", [xi, w4, -1], [c])
    path = m.save(tmp_path / "read_back.tflite", [xi], [a, c, w8, w4])
    got, stats = run_model(path, opencl_lib, [x], opencl_options(precision=precision), stats=True)
    stock = run_reference(path, [x])
    check_whole(stats, path, precision)
    plain = Interpreter(model_path=str(path),
                        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    plain.allocate_tensors()
    plain.set_tensor(plain.get_input_details()[0]["index"], x)
    plain.invoke()
    kernel = [plain.get_tensor(d["index"]) for d in plain.get_output_details()]
    assert np.array_equal(got[2], kernel[2]) and np.array_equal(got[3], kernel[3])
    assert np.array_equal(got[2], q8.astype(np.float32) * s8[:, None])
    assert np.array_equal(got[3], (q4.astype(np.float32) * s4[:, None]).reshape(n, k))
    tol = HALF_TOL if precision == "fp16" else TOL
    assert rel_err(got[0], stock[0]) <= tol and rel_err(got[1], stock[1]) <= tol


# --------------------------------------------------------------------------
# Refusals: the DEQUANTIZE stays with TFLite, the rest is claimed, the output is right


def _refused_model(tmp_path, name, data, shape, tensor_type, scale, zero, axis, wf):
    r = rng(7)
    n, k = shape
    x = nonzero(r, (3, k))
    m = QModel()
    xi = m.activation("x", x.shape)
    qi = m.quantized("w", data, shape, tensor_type, scale, zero, axis)
    wt = m.activation("w_f32", shape)
    y = m.activation("y", (3, n))
    m.builtin("DEQUANTIZE", [qi], [wt])
    m.builtin("FULLY_CONNECTED", [xi, wt, -1], [y])
    return m.save(tmp_path / f"{name}.tflite", [xi], [y]), x, fc_ref(x, wf, None)


def _refusal_cases():
    r = rng(8)
    q, scale = quantize(nonzero(r, (6, 20)), 0, 8)
    u8 = r.integers(0, 256, (6, 20)).astype(np.uint8)
    i16 = r.integers(-900, 900, (6, 20)).astype(np.int16)
    q4 = r.integers(-8, 8, (5, 3)).astype(np.int8)
    s0 = scale[:1]
    return {
        # name: (bytes, shape, type, scale, zero point, axis, float64 weight, reason)
        "zero_point_out_of_range": (
            q.tobytes(), q.shape, schema.TensorType.INT8, scale, np.full(6, 300), 0,
            dequantize(q, scale, np.full(6, 300), 0), r"zero point 0 \(300\) is outside"),
        "uint8": (u8.tobytes(), u8.shape, schema.TensorType.UINT8, s0, [128], 0,
                  (u8.astype(np.float64) - 128) * s0[0], r"DEQUANTIZE of uint8 is not supported"),
        "int16": (i16.tobytes(), i16.shape, schema.TensorType.INT16, s0, [0], 0,
                  i16.astype(np.float64) * s0[0], r"DEQUANTIZE of int16 is not supported"),
        "int4_odd_count": (pack_int4(q4), q4.shape, schema.TensorType.INT4, s0, [0], 0,
                           q4.astype(np.float64) * s0[0], r"odd element count \(15\)"),
    }


@pytest.mark.parametrize("case", sorted(_refusal_cases()))
def test_refused_dequantize_stays_with_tflite(opencl_lib, tmp_path, capfd, case):
    data, shape, ttype, scale, zero, axis, wf, reason = _refusal_cases()[case]
    path, x, want = _refused_model(tmp_path, case, data, shape, ttype, scale, zero, axis, wf)
    capfd.readouterr()
    got, stats, stock = run_both(opencl_lib, path, x)
    err = capfd.readouterr().err
    assert re.search(r"not delegating node 0 \(DEQUANTIZE\): .*" + reason, err), err
    assert stats["nodes_claimed"] == 1 and stats["nodes_total"] == 2, stats
    assert stats["partitions"] == 1, stats
    check_values(got, stock, want, "fp32")


def test_scale_count_not_matching_the_dimension_does_not_load(tmp_path, opencl_lib):
    """7 scales for a dimension of 6: the interpreter itself refuses the file when it loads it,
    before any delegate sees a node, so no file brings such a tensor to the delegate here. The
    backend checks the count anyway (claim.cc QuantizedConstant) for runtimes that would not."""
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    r = rng(9)
    q, scale = quantize(nonzero(r, (6, 20)), 0, 8)
    bad = np.concatenate([scale, scale[:1]])
    path, _, _ = _refused_model(tmp_path, "bad_scales", q.tobytes(), q.shape,
                                schema.TensorType.INT8, bad, np.zeros(7, np.int64), 0,
                                dequantize(q, scale, np.zeros(6), 0))
    with pytest.raises(ValueError, match="num_scales"):
        Interpreter(model_path=str(path),
                    experimental_delegates=[load_delegate(str(opencl_lib), opencl_options())])


# --------------------------------------------------------------------------
# The second runtime


def test_tensorflow_runtime_reads_the_same_quantization(tmp_path, opencl_lib):
    """tensorflow's tf.lite interpreter with the delegate: int8 per channel and int4 blockwise
    (compact form) weights, claimed whole and right (the AffineQuantization layout of
    tflite_abi.h), held quantized.

    The model runs on ai_edge_litert first, so that its programs are in the disk cache before
    tensorflow is loaded: PoCL compiling a program in a process holding tensorflow crashes
    (its libclang-cpp binds LLVM symbols to libtensorflow_framework's copy of LLVM); loading a
    cached program does not compile."""
    r = rng(10)
    n, k = 11, 64
    x = nonzero(r, (3, k))
    q8, s8 = quantize(nonzero(r, (n, k)), 0, 8)
    q4, s4 = int4_blocks(nonzero(r, (n, k)))
    w8 = dequantize(q8, s8, np.zeros(n), 0)
    w4 = dequantize(q4, s4, np.zeros(s4.size), 0).reshape(n, k)
    want = fc_ref(x, w8, None) + fc_ref(x, w4, None)
    m = QModel()
    xi = m.activation("x", x.shape)
    a = m.activation("a", (3, n))
    c = m.activation("c", (3, n))
    y = m.activation("y", (3, n))
    m.builtin("FULLY_CONNECTED", [xi, m.int8_weight("w8", q8, s8), -1], [a])
    m.builtin("FULLY_CONNECTED", [xi, m.int4_weight("w4", (n, k), q4, s4), -1], [c])
    m.add(a, c, y)
    path = m.save(tmp_path / "two_runtimes.tflite", [xi], [y])
    (warm,), _ = run_model(path, opencl_lib, [x], opencl_options(), repeats=1)
    assert rel_err(warm, want) <= TOL
    interp_cls, load_delegate = load_runtime("tf")
    fd, stats_file = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        delegate = load_delegate(str(opencl_lib), opencl_options(stats_path=stats_file))
        interp = interp_cls(model_path=str(path), experimental_delegates=[delegate])
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        out = interp.get_output_details()[0]["index"]
        interp.tensor(out)()[...] = np.nan
        interp.invoke()
        got = interp.get_tensor(out).copy()
        with open(stats_file) as f:
            stats = json.load(f)
    finally:
        os.unlink(stats_file)
    assert stats["nodes_claimed"] == n_nodes(path) == stats["nodes_total"] == 8, stats
    assert stats["partitions"] == 1 and stats["weights_dequantized_bytes"] == 0, stats
    assert rel_err(got, want) <= TOL


# --------------------------------------------------------------------------
# difflite.WinogradConv3x3 in the filter form


def _winograd_filter_file(path, width, precision, r, n=2, h=13, w=10, cin=32, cout=24):
    """A WinogradConv3x3 whose weight is its 3x3 filter, written by the writer at `width`: (path,
    x, the float64 reference of a 3x3 convolution with the filter the file stores)."""
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from difflite.compiler.tflite import quantize as writer_quantize
    from difflite.compiler.tflite.writer import write_tflite
    from difflite.core import custom_ops

    filt = (r.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32)
    bias = (r.standard_normal(cout) * 0.1).astype(np.float32)
    node = helper.make_node(custom_ops.WINOGRAD_CONV3X3.name, ["x", "w", "b"], ["y"], domain=custom_ops.DOMAIN,
                            tile=4, activation="none")
    graph = helper.make_graph([node], "winograd",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, cin, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, cout, h, w])],
                              [numpy_helper.from_array(filt, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid(custom_ops.DOMAIN, 1)])
    write_tflite(ir.serde.deserialize_model(model), precision=precision, fuse={"winograd"}, path=path,
                 quantization=writer_quantize.WeightQuantization(width, min_elements=1))
    ohwi = filt.transpose(0, 2, 3, 1)
    if width == "int8":
        stored = writer_quantize.dequantize(writer_quantize.quantize_int8(ohwi, 0))
    else:
        scales = writer_quantize.scale_dtype(precision)
        stored = writer_quantize.dequantize(writer_quantize.quantize_int4(ohwi, BLOCK, scales)).reshape(ohwi.shape)
    x = nonzero(r, (n, h, w, cin))
    return path, x, conv_ref(x, stored.astype(np.float64), bias, padding=SAME)


def _random_winograd_shape(seed):
    """(n, h, w, cin, cout) drawn with a fixed seed: odd sizes, partial tiles, Cin a multiple of 32
    (int4's blocks of 32 tile 9 Cin only then)."""
    r = rng(100 + seed)
    return (int(r.integers(1, 3)), int(r.integers(5, 22)), int(r.integers(5, 22)), int(r.choice([32, 64, 96])),
            int(r.integers(8, 71)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("width", ["int8", "int4"])
def test_winograd_filter_form_on_random_shapes(opencl_lib, tmp_path, width, seed):
    n, h, w, cin, cout = _random_winograd_shape(seed)
    path, x, want = _winograd_filter_file(tmp_path / "wino.tflite", width, "fp32", rng(seed), n, h, w, cin, cout)
    for kernels in ("auto", "tiled"):
        (got,), stats = run_model(path, opencl_lib, [x], opencl_options(kernels=kernels), stats=True)
        assert stats["weights_dequantized_bytes"] == 0 and stats["partitions"] == 1, stats
        assert rel_err(got, want) <= 2e-5, (kernels, n, h, w, cin, cout)


@pytest.mark.parametrize("kernels", ["auto", "tiled"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("width", ["int8", "int4"])
def test_winograd_filter_form_reads_the_filter_quantized(opencl_lib, tmp_path, width, precision, kernels):
    """The writer stores a filter-form Winograd convolution's filter as any convolution's (int8
    per output channel, int4 blockwise with its scale chain); the OpenCL backend claims the whole
    file, holds the integers as stored (nothing dequantized) and transforms them at every call.
    n = 2, 13 x 10: partial border tiles."""
    path, x, want = _winograd_filter_file(tmp_path / f"wino_{width}.tflite", width, precision, rng(21))
    (got,), stats = run_model(path, opencl_lib, [x], opencl_options(precision=precision, kernels=kernels), stats=True)
    assert stats["nodes_claimed"] == n_nodes(path) == stats["nodes_total"] and stats["partitions"] == 1, stats
    values = 24 * 9 * 32 // (2 if width == "int4" else 1)
    assert values <= stats["weights_quantized_bytes"] <= values + 24 * 9 * 32 // BLOCK * 4, stats
    assert stats["weights_dequantized_bytes"] == 0, stats
    elem = 2 if precision == "fp16" else 4
    tiles = 2 * 4 * 3
    staging = 4 * (x.size + want.size) if precision == "fp16" else 0  # the float32 input and output, converted
    assert stats["scratch_bytes"] == elem * 36 * (tiles * (32 + 24) + 32 * 24) + staging, stats  # V, M and U
    if precision == "fp32":
        assert rel_err(got, want) <= 2e-5
    else:  # x, V, U, M and y in half: DESIGN §7's fp16 bar
        from difflite.verify import FP16_MIN_PSNR_DB

        rmse = float(np.sqrt(np.mean((got.astype(np.float64) - want) ** 2)))
        psnr = 20 * np.log10(np.abs(want).max() / rmse)
        assert psnr >= FP16_MIN_PSNR_DB, psnr
