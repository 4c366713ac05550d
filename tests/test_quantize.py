"""--weights int8|int4: the packing round-trips bit-exactly, the quantizers keep their error
bounds, stock LiteRT's interpreter runs the written forms and gets the dequantized weights'
numbers exactly, and a converted tiny pipeline verifies against PyTorch at the width's bar."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from difflite.compiler.tflite import quantize
from difflite.compiler.tflite.writer import write_tflite
from difflite.folder.reader import read_tflite

from support import ROOT


def test_int4_packing_round_trips_every_value():
    rng = np.random.default_rng(0)
    for count in (1, 2, 7, 64, 1001):
        values = rng.integers(-8, 8, size=count).astype(np.int8)
        packed = quantize.pack_int4(values)
        assert packed.dtype == np.uint8 and packed.size == (count + 1) // 2
        assert np.array_equal(quantize.unpack_int4(packed, count), values)
    # the nibble order stock LiteRT reads: element 0 in the low nibble
    assert quantize.pack_int4(np.array([-1, 2], np.int8)).tolist() == [0x2F]


@pytest.mark.parametrize("shape,axis", [((16, 40), 0), ((8, 3, 3, 5), 0), ((5, 7), 1)])
def test_int8_per_channel(shape, axis):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3, size=shape[axis]).reshape(
        [-1 if i == axis else 1 for i in range(len(shape))])).astype(np.float32)
    q = quantize.quantize_int8(w, axis)
    assert q.data.dtype == np.int8 and q.scales.shape == (shape[axis],)
    assert np.abs(q.data).max() <= 127
    back = quantize.dequantize(q)
    # each channel's error is at most half its own step
    step = q.scales.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    # every channel uses its full range: the largest magnitude maps to +-127
    per_channel = np.moveaxis(np.abs(q.data), axis, 0).reshape(shape[axis], -1).max(axis=1)
    assert np.all(per_channel == 127)


def test_int4_blockwise_and_zero_blocks():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    w[2, :32] = 0.0  # an all-zero block keeps a usable scale
    q = quantize.quantize_int4(w, 32)
    assert q.shape == (12, 32) and q.scales.shape == (12,) and np.all(q.scales > 0)
    back = quantize.dequantize(q).reshape(w.shape)
    assert np.all(back[2, :32] == 0.0)
    # within half a step where the block's scale does not clip the value (a scale below max / 7
    # may clip a block's largest ones when that lowers its error: tests/test_int4_scales.py)
    step = np.repeat(q.scales, 32).reshape(w.shape)
    inside = (w >= -8.5 * step) & (w <= 7.5 * step)
    assert inside.mean() > 0.95
    assert np.all((np.abs(back - w) <= step / 2 + 1e-7)[inside])
    with pytest.raises(ValueError):
        quantize.quantize_int4(rng.standard_normal((4, 48)).astype(np.float32), 32)


def linear_and_conv_model(n=24, cin=32, cout=64) -> onnx.ModelProto:
    """x [1, cin, 8, 8] -> 3x3 convolution -> NHWC -> MatMul over the channels [cout, n]."""
    rng = np.random.default_rng(3)
    conv_w = (rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32)
    conv_b = rng.standard_normal(cout).astype(np.float32) * 0.1
    mat_w = (rng.standard_normal((cout, n)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["t", "mat_w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, n])],
        [numpy_helper.from_array(conv_w, "conv_w"), numpy_helper.from_array(conv_b, "conv_b"),
         numpy_helper.from_array(mat_w, "mat_w")])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def run_litert(path: Path, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(path))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def reference(model: onnx.ModelProto, x_nhwc: np.ndarray, weights: dict) -> np.ndarray:
    """The graph in NumPy (float64) with the given (dequantized) weights, NHWC."""
    conv_w, conv_b, mat_w = weights["conv_w"], model.graph.initializer[1], weights["mat_w"]
    b = numpy_helper.to_array(conv_b).astype(np.float64)
    x = np.pad(x_nhwc.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((1, 8, 8, conv_w.shape[0]))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,oc->nhwo", x[:, i:i + 8, j:j + 8, :], conv_w[:, :, i, j].astype(np.float64))
    return (out + b) @ mat_w.astype(np.float64)


@pytest.mark.parametrize("width", ["int8", "int4"])
def test_litert_runs_the_quantized_forms_exactly(width, tmp_path):
    model = linear_and_conv_model()
    path = tmp_path / f"{width}.tflite"
    quant = quantize.WeightQuantization(width, 32, min_elements=1)
    result = write_tflite(ir.serde.deserialize_model(model), path=path, quantization=quant)
    widths = {w["name"].split("/")[0]: w["width"] for w in result.weight_widths}
    assert widths == {"conv_w": width, "mat_w": width}
    summary = read_tflite(path)
    assert summary.op_histogram.get("DEQUANTIZE") == 2
    assert {t.dtype for t in summary.tensors if t.constant} >= {width}
    # the weights as the file stores them, dequantized by us
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    ohwi = np.transpose(init["conv_w"], (0, 2, 3, 1))
    nk = init["mat_w"].T
    if width == "int8":
        conv = quantize.dequantize(quantize.quantize_int8(ohwi, 0))
        mat = quantize.dequantize(quantize.quantize_int8(nk, 0))
    else:
        conv = quantize.dequantize(quantize.quantize_int4(ohwi, 32)).reshape(ohwi.shape)
        mat = quantize.dequantize(quantize.quantize_int4(nk, 32)).reshape(nk.shape)
    weights = {"conv_w": np.transpose(conv, (0, 3, 1, 2)), "mat_w": mat.T}
    x = np.random.default_rng(4).standard_normal((1, 8, 8, 32)).astype(np.float32)
    got = run_litert(path, x).transpose(0, 3, 1, 2)  # a rank-4 output is stored NHWC: back to ONNX's order
    want = reference(model, x, weights)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    # and not the float weights' numbers: the file really holds the quantized ones
    exact = reference(model, x, init)
    assert np.abs(got - exact).max() > 1e-3 * np.abs(exact).max()


def embedding_model(vocab=300, dim=48) -> tuple[onnx.ModelProto, np.ndarray]:
    """ids [2, 7] (int64) -> Gather of a [vocab, dim] table: the text encoder's token lookup."""
    table = (np.random.default_rng(5).standard_normal((vocab, dim)) * 0.02).astype(np.float32)
    table[3] = 0.0  # an all-zero row keeps a usable scale
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [2, 7, dim])],
        [numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), table


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("width", ["int8", "int4"])
def test_mixes_store_a_lookup_table_as_int8_rows(width, precision, tmp_path):
    """Under --weights int4 and int8 a table that GATHER reads rows of is stored as int8 with a
    scale a row (the rows gathered from its DEQUANTIZE, times their gathered scales), and computes
    exactly the dequantized table's rows; without --weights it stays float."""
    model, table = embedding_model()
    ids = np.array([[0, 3, 299, 17, 17, 150, 1], [5, 4, 3, 2, 1, 0, 298]], np.int32)
    float_path = tmp_path / "float.tflite"
    write_tflite(ir.serde.deserialize_model(model), path=float_path, precision=precision)
    assert "int8" not in {t.dtype for t in read_tflite(float_path).tensors if t.constant}
    path = tmp_path / f"{width}.tflite"
    result = write_tflite(ir.serde.deserialize_model(model), path=path, precision=precision,
                          quantization=quantize.WeightQuantization(width))
    summary, rows = read_tflite(path), run_litert(path, ids)
    (entry,) = [w for w in result.weight_widths if w.get("lookup")]
    assert entry["width"] == "int8" and entry["shape"] == [300, 48]
    stored = [t for t in summary.tensors if t.constant and t.dtype == "int8"]
    assert [tuple(t.shape) for t in stored] == [(300, 48)]
    assert not any(t.constant and t.dtype in ("float32", "float16") and np.prod(t.shape) >= table.size
                   for t in summary.tensors)
    q = quantize.quantize_int8(table, 0, quantize.scale_dtype(precision))
    np.testing.assert_array_equal(rows, quantize.dequantize(q)[ids])
    assert np.all(rows[0, 1] == 0.0) and np.abs(rows - table[ids]).max() > 0  # quantized, not float


def test_fp16_table_is_gathered_as_float16_rows_and_cast(tmp_path):
    """At --precision fp16 a float table is GATHERed as float16 and its rows CAST to float32: no
    DEQUANTIZE feeds a GATHER (stock LiteRT's GPU accelerator refuses that form), and
    the rows are the float16 table's exactly."""
    model, table = embedding_model()
    ids = np.array([[0, 3, 299, 17, 17, 150, 1], [5, 4, 3, 2, 1, 0, 298]], np.int32)
    path = tmp_path / "fp16.tflite"
    write_tflite(ir.serde.deserialize_model(model), path=path, precision="fp16")
    summary = read_tflite(path)
    (gather,) = [op for op in summary.ops if op.name == "GATHER" and summary.tensors[op.inputs[0]].constant]
    assert summary.tensors[gather.inputs[0]].dtype == "float16"
    assert summary.tensors[gather.outputs[0]].dtype == "float16"
    (cast,) = [op for op in summary.ops if op.name == "CAST" and op.inputs == gather.outputs]
    assert summary.tensors[cast.outputs[0]].dtype == "float32"
    assert not [op for op in summary.ops if op.name == "DEQUANTIZE"]
    np.testing.assert_array_equal(run_litert(path, ids), table.astype(np.float16).astype(np.float32)[ids])


@pytest.mark.parametrize("width", ["int8", "int4"])
def test_stock_gpu_forms_write_quantized_linears_as_1x1_convolutions(width, tmp_path):
    """`convert --no-fuse` (stock_gpu_forms) writes a quantized linear layer as RESHAPE to
    [1, 1, M, K], CONV_2D with the filter [N, 1, 1, K], RESHAPE back: stock LiteRT's GPU compiles
    a quantized weight only as a convolution's 4-D filter (LiteRT 2.3.0). Same layer widths, bytes
    and digests as the FULLY_CONNECTED form, and the same outputs on LiteRT's interpreter."""
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 32)).astype(np.float32)
    results, outputs, summaries = {}, {}, {}
    for stock in (False, True):
        path = tmp_path / f"{width}-{stock}.tflite"
        results[stock] = write_tflite(ir.serde.deserialize_model(linear_and_conv_model()), path=path,
                                      quantization=quantize.WeightQuantization(width, min_elements=1),
                                      stock_gpu_forms=stock)
        summaries[stock], outputs[stock] = read_tflite(path), run_litert(path, x)
    assert results[True].weight_widths == results[False].weight_widths
    assert "FULLY_CONNECTED" in {op.name for op in summaries[False].ops}
    summary = summaries[True]
    assert "FULLY_CONNECTED" not in {op.name for op in summary.ops}
    filters = [tuple(summary.tensors[op.inputs[1]].shape) for op in summary.ops if op.name == "CONV_2D"]
    assert (24, 1, 1, 64) in filters  # mat_w [64, 24] as an [N, 1, 1, K] filter
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=0, atol=1e-5 * np.abs(outputs[False]).max())


def test_small_and_kept_weights_stay_float(tmp_path):
    model = linear_and_conv_model(cin=4, cout=8, n=4)  # 288 and 32 elements: under MIN_ELEMENTS
    result = write_tflite(ir.serde.deserialize_model(model), path=tmp_path / "small.tflite",
                          quantization=quantize.WeightQuantization("int8"))
    assert {w["width"] for w in result.weight_widths} == {"fp32"}
    kept = write_tflite(ir.serde.deserialize_model(linear_and_conv_model()), path=tmp_path / "kept.tflite",
                        quantization=quantize.WeightQuantization("int8", keep_float=("conv_w",), min_elements=1))
    assert {w["name"].split("/")[0]: w["width"] for w in kept.weight_widths} == {"conv_w": "fp32", "mat_w": "int8"}


def test_convert_int8_tiny_verifies_against_pytorch(tmp_path):
    out = tmp_path / "q8"
    run = subprocess.run([sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o", str(out),
                          "--weights", "int8", "--height", "64", "--width", "64", "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    unet = report["components"]["unet"]["weight_widths"]
    assert unet["by_width"]["int8"]["layers"] > 20 and unet["saved_mb"] > 2.0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["weights"] == "int8" and manifest["options"]["weights_target_db"] == 35.0
    # the int8 mix's recipe, at verify's int8 bar by default (layers int8 or float)
    assert {r["width"] for r in manifest["weights_recipe"].values()} == {"int8"}
    assert all(r["target_snr_db"] == 35.0 for r in manifest["weights_recipe"].values())
    vae = {w["name"]: w["width"] for w in report["components"]["vae_decoder"]["weight_widths"]["layers"]}
    assert all(width == "fp32" for name, width in vae.items() if "conv_in" in name or "conv_out" in name)
    for backend in ("cpu", "opencl"):  # PoCL here: the kernels read the int8 weights as stored
        check = subprocess.run([sys.executable, "-m", "difflite", "verify", str(out), "--backend", backend,
                                "--json"], capture_output=True, text=True, cwd=ROOT)
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
        checks = json.loads(check.stdout)["checks"]
        assert all(c["tolerance"].startswith("SNR >= 35") for c in checks)
        quantized = [c for c in checks if c["component"] in ("unet", "vae_decoder")]
        assert all(35 <= c["snr_db"] < 80 for c in quantized), [c["snr_db"] for c in quantized]


CLAIMS = """
import sys
from ai_edge_litert.interpreter import Interpreter, load_delegate
delegate = load_delegate(sys.argv[2], {"backend": "cpu", "verbose": "1"})
Interpreter(model_path=sys.argv[1], experimental_delegates=[delegate]).allocate_tensors()
"""


def test_convert_int4_tiny_verifies_on_the_cpu_backend(tmp_path):
    """--weights int4 (the int4 mix: int4 layers in the compact form, the rest int8) verifies at the
    int4 bar on the CPU backend, where the op library runs every FULLY_CONNECTED and CONV_2D of a
    quantized weight from its integers: the UNet's verbose claims list one for each quantized
    layer, and one folded block-scale MUL for each int4 one. The UNet only (its linear layers and
    convolutions, int4 and int8, are what the VAE decoder's would add; the tiny text encoder has
    none to quantize), one probe for the recipe: the recipe is most of the test's time; the
    session's export cache holds the tiny preset's export at this size once the int8 test ran."""
    from support.oplib_helpers import build_oplib

    out = tmp_path / "q4"
    run = subprocess.run([sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o", str(out),
                          "--components", "unet", "--weights", "int4", "--weights-probes", "1",
                          "--height", "64", "--width", "64", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    widths = json.loads(run.stdout)["components"]["unet"]["weight_widths"]["by_width"]
    int4, int8 = widths["int4"]["layers"], widths.get("int8", {}).get("layers", 0)
    assert int4 > 10, widths
    check = subprocess.run([sys.executable, "-m", "difflite", "verify", str(out), "--backend", "cpu",
                            "--json"], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    checks = json.loads(check.stdout)["checks"]
    assert checks and all(c["tolerance"].startswith("SNR >= 28") for c in checks)
    assert {c["component"] for c in checks} == {"unet"} and all(28 <= c["snr_db"] < 80 for c in checks), checks
    claims = subprocess.run([sys.executable, "-c", CLAIMS, str(out / "unet.tflite"), str(build_oplib())],
                            capture_output=True, text=True)
    assert claims.returncode == 0, claims.stderr[-2000:]
    ops = re.findall(r"claim node \d+ (\S+) .*?( folded)?$", claims.stderr, re.MULTILINE)
    readers = sum(op in ("FULLY_CONNECTED", "CONV_2D") for op, _ in ops)
    assert readers == int4 + int8, (readers, widths)
    assert sum(op == "MUL" and bool(folded) for op, folded in ops) == int4, claims.stderr[-3000:]
    assert "not delegating" not in claims.stderr


def test_convert_int8_takes_winograds_filter_form(tmp_path):
    """--weights int8 at 512x512, where the tiny UNet's 64-channel convolutions are Winograd
    candidates: with no budget (int8's default is 0) the filter form takes them, storing no
    transformed filter; the file verifies on PoCL and on the CPU backend. `--winograd-budget-mb
    unet=off` takes none. Float weights at budget 0 take the same filter form (float filters)."""
    def convert(out, *flags, weights=("--weights", "int8", "--weights-target-db", "0")):
        run = subprocess.run([sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o", str(out),
                              "--components", "unet", *weights,
                              "--height", "512", "--width", "512", "--export-cache", str(tmp_path / "cache"),
                              "--json", *flags], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout)["components"]["unet"], json.loads((out / "manifest.json").read_text())

    def verifies(folder, low_db, high_db=float("inf"), backends=("opencl", "cpu")):
        for backend in backends:
            check = subprocess.run([sys.executable, "-m", "difflite", "verify", str(folder), "--backend",
                                    backend, "--seeds", "0", "--json"], capture_output=True, text=True, cwd=ROOT)
            assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
            assert all(low_db <= c["snr_db"] < high_db for c in json.loads(check.stdout)["checks"])

    report, manifest = convert(tmp_path / "q8")
    assert manifest["options"]["winograd_budgets_mb"] == {"unet": 0.0}
    filters = [c for c in report["winograd"]["convs"] if c["form"] == "filter"]
    assert filters and all(c["extra_mb"] == 0 for c in filters) and report["winograd"]["extra_weights_mb"] == 0
    assert report["fusion"]["winograd"]["matched"] == len(filters) and report["fusion"]["winograd"]["custom_op"]
    layers = {tuple(w["shape"]): w["width"] for w in report["weight_widths"]["layers"]}
    assert all(layers[(c["cout"], 3, 3, c["cin"])] == "int8" for c in filters)  # stored as any conv's filter
    verifies(tmp_path / "q8", 35, 80)  # PoCL's wino_filter; the CPU backend's quantized 3x3 CONV_2D
    report, _ = convert(tmp_path / "f32", "--winograd-budget-mb", "0", weights=())
    assert [c["form"] for c in report["winograd"]["convs"]] == ["filter"] * len(filters)
    assert report["winograd"]["extra_weights_mb"] == 0
    verifies(tmp_path / "f32", 60, backends=("opencl",))  # wino_filter on float filters (the CPU
    # kernel's per-call U of a float filter: test_op_winograd's filter-form cases)
    report, manifest = convert(tmp_path / "off", "--winograd-budget-mb", "unet=off")
    assert manifest["options"]["winograd_budgets_mb"] == {"unet": "off"}
    assert report["winograd"]["convs"] == [] and not report["fusion"]["winograd"]["custom_op"]


def test_bad_weight_options_exit_2(tmp_path):
    for flags, message in ((["--weights", "int3"], "int3"), (["--weights", "int4", "--weights-block", "33"],
                                                              "--weights-block")):
        run = subprocess.run([sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o",
                              str(tmp_path / "x"), *flags], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
        assert not (tmp_path / "x").exists()


def test_int4_falls_back_to_int8_where_blocks_do_not_tile(tmp_path):
    """mat_w's input dimension is 40: blocks of 32 do not tile it, so it is stored int8."""
    result = write_tflite(ir.serde.deserialize_model(linear_and_conv_model(cout=40)), path=tmp_path / "m.tflite",
                          quantization=quantize.WeightQuantization("int4", 32, min_elements=1))
    assert {w["name"].split("/")[0]: w["width"] for w in result.weight_widths} == {"conv_w": "int4", "mat_w": "int8"}


def test_winograd_counts_a_quantized_layers_float_filters():
    """Winograd's transformed filters are float: against an int8 / int4 direct convolution its
    extra weight memory is larger than against a float one, and the same budget buys fewer."""
    from difflite.passes.winograd import conv_cost

    fp16 = conv_cost(1, 320, 320, 64, 64, "adreno-740", "fp16")
    int8 = conv_cost(1, 320, 320, 64, 64, "adreno-740", "fp16", quantize.value_bytes("int8"))
    int4 = conv_cost(1, 320, 320, 64, 64, "adreno-740", "fp16", quantize.value_bytes("int4", 32))
    assert fp16.extra_weight_bytes == 27 * 320 * 320 * 2
    assert int8.extra_weight_bytes == 36 * 320 * 320 * 2 - 9 * 320 * 320 * 1
    assert fp16.extra_weight_bytes < int8.extra_weight_bytes < int4.extra_weight_bytes
    assert int8.direct_bytes < fp16.direct_bytes  # the direct convolution reads fewer weight bytes
    assert quantize.value_bytes("float") is None and quantize.value_bytes("int4", 64) == 0.5625


def test_int4_compact_form_costs_four_and_a_half_bits_a_weight_at_fp16(tmp_path):
    """int4 at fp16: the values (half a byte each) and a float16 scale per block of 32 in a
    tensor of their own, with one per-tensor scale and zero point (12 bytes) in the metadata:
    4.5 bits a weight, not the 7 that per-axis scales and int64 zero points would cost."""
    path = tmp_path / "q4.tflite"
    result = write_tflite(ir.serde.deserialize_model(linear_and_conv_model()), precision="fp16", path=path,
                          quantization=quantize.WeightQuantization("int4", 32, min_elements=1))
    summary = read_tflite(path)
    sizes = [int(np.prod(w["shape"])) for w in result.weight_widths]
    assert [w["width"] for w in result.weight_widths] == ["int4", "int4"]
    int4 = [t for t in summary.tensors if t.constant and t.dtype == "int4"]
    assert sorted(t.nbytes for t in int4) == sorted(size // 2 for size in sizes)
    scales = [t for t in summary.tensors if t.constant and t.dtype == "float16" and t.shape[-1:] == (1,)]
    assert sorted(t.nbytes for t in scales) == sorted(2 * size // 32 for size in sizes)
    assert summary.quantization_bytes == 12 * len(int4)
    assert [w["bytes"] for w in result.weight_widths] == [s // 2 + 2 * s // 32 for s in sizes]
    # DEQUANTIZE: two int4 values, two block scales, the convolution bias (64 values: float16)
    assert summary.op_histogram.get("MUL") == 2 and summary.op_histogram.get("DEQUANTIZE") == 5


def test_weight_bytes_count_the_quantization_parameters_the_file_holds(tmp_path):
    """A per-axis scale is a float32 and its zero point an int64 in the file (int8: one per output
    channel; int4's compact form: one per tensor). The reader's weight bytes count them (the
    scales also go to the device), so reports do not undercount quantized files."""
    from ai_edge_litert import schema_py_generated as schema

    path = tmp_path / "q4.tflite"
    write_tflite(ir.serde.deserialize_model(linear_and_conv_model()), path=path,
                 quantization=quantize.WeightQuantization("int8", 32, min_elements=1))
    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    buffers = sum(len(b.data) for b in model.buffers if b.data is not None)
    scales = zero_points = 0
    for t in model.subgraphs[0].tensors:
        if t.quantization is not None and t.quantization.scale is not None:
            scales += len(t.quantization.scale)
            zero_points += len(t.quantization.zeroPoint)
    summary = read_tflite(path)
    assert scales > 0 and zero_points == scales
    assert summary.quantization_bytes == 4 * scales + 8 * zero_points
    assert summary.weight_bytes == buffers + summary.quantization_bytes <= summary.file_bytes


def beyond_float16_model() -> onnx.ModelProto:
    """linear_and_conv_model with its MatMul weight scaled past float16's range (largest ~1e6):
    finite in float32, infinite as float16 values and as int4's float16 block scales."""
    model = linear_and_conv_model()
    mat_w = model.graph.initializer[2]
    mat_w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(mat_w) * np.float32(1e6), "mat_w"))
    return model


@pytest.mark.parametrize("precision, width, refused", [
    ("fp32", "float", False), ("fp16", "float", True),  # float32 holds 1e6; float16 stops at 65504
    ("fp16", "int8", False),  # int8's per-channel scales are float32 quantization parameters
    ("fp16", "int4", True),  # int4's block scales are float16 at fp16: 1e6 / 7 is past 65504
])
def test_weights_the_storage_cannot_hold_are_refused_naming_them(precision, width, refused, tmp_path):
    """A weight (or a quantized weight's scale) that float16 storage turns into an infinity is
    refused with its name, and nothing is written."""
    from difflite.core.finite import NonFiniteWeights

    path = tmp_path / "m.tflite"
    quant = quantize.WeightQuantization(width, 32, min_elements=1)

    def write():
        return write_tflite(ir.serde.deserialize_model(beyond_float16_model()), precision=precision, path=path,
                            quantization=quant)

    if not refused:
        write()
        assert path.stat().st_size > 0
        return
    with pytest.raises(NonFiniteWeights, match=r"weight 'mat_w[^']*'.*(stored as float16 .*overflow|NaN or infinite)") as error:
        write()
    assert "\n" not in str(error.value)


def test_scales_past_float16_stay_infinite():
    """Quantizing does not hide an overflow: a float16 block scale past 65504 stays infinite (the
    writer then refuses it) rather than becoming float16's smallest scale."""
    weight = np.full((2, 32), 1e8, np.float32)  # int8: 1e8 / 127, int4: 1e8 / 7, both past 65504
    assert np.isinf(quantize.quantize_int4(weight, 32, np.float16).scales).all()
    assert np.isinf(quantize.quantize_int8(weight, 0, np.float16).scales).all()
    assert np.isfinite(quantize.quantize_int8(weight, 0).scales).all()


def _add_constant_model(values: np.ndarray) -> onnx.ModelProto:
    """y = x + c for a constant c of these values."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"], name="add_c")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(values.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(values.shape))],
        [numpy_helper.from_array(values.astype(np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_a_nan_constant_is_refused_an_infinite_mask_is_written(tmp_path):
    """A NaN is never meant, in any constant; -inf is (an attention mask), so it is written."""
    from ai_edge_litert.interpreter import Interpreter

    from difflite.core.finite import NonFiniteWeights

    mask = np.triu(np.full((4, 4), -np.inf, np.float32), k=1)
    path = tmp_path / "mask.tflite"
    write_tflite(ir.serde.deserialize_model(_add_constant_model(mask)), path=path)
    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(runner(x=x)["y"], x + mask)
    bias = np.ones((4, 4), np.float32)
    bias[2, 1] = np.nan
    with pytest.raises(NonFiniteWeights, match=r"constant '[^']*': 1 of its 16 values are NaN") as error:
        write_tflite(ir.serde.deserialize_model(_add_constant_model(bias)), path=tmp_path / "nan.tflite")
    assert "\n" not in str(error.value) and not (tmp_path / "nan.tflite").exists()
