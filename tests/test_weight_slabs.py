"""Weight slabs (custom_ops/delegate/opencl/weight_slabs.cc): the OpenCL backend sub-allocates the
weights that are not zero-copy from a few large buffers, and every kernel that reads one
(the GEMMs, CONV_2D's implicit GEMM, Winograd's filter and GEMM) takes where it starts.

Each case runs preset:tiny's converted UNet (fp32, int8 and int4 weights) on PoCL with the
weights copied (zero_copy=off), with slabs and without: the outputs must be equal to the bit,
since only where the weights lie differs, so a kernel that ignores its weight's or its scales'
start reads another weight and fails. The tiled kernels (a GPU's), half storage and the
tensor-core tiles (emulated) run the UNet; Winograd's weights (which tiny UNets do not choose)
run in a model of their own, on the flat kernels too (CPU-like devices, which pack the other
weights and so slab only Winograd's). Zero-copy weights never go into a slab.

OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import numpy as np
import pytest

from support import winograd_ref
from support.cli import convert_side_by_side
from support.numerics import nonzero, rel_err
from support.opencl_helpers import TOL, opencl_options, run_model
from support.quantized_helpers import QModel, dequantize, quantize

SIZE = 64
CONVERSIONS = {
    "fp32": ["--precision", "fp32"],
    "int8": ["--precision", "fp16", "--weights", "int8"],
    "int4": ["--precision", "fp16", "--weights", "int4"],
}
# name: (delegate options, DIFFLITE_TENSOR_CORES)
CONFIGS = {
    "tiled_fp32": ({"kernels": "tiled", "precision": "fp32"}, None),
    "tiled_fp16": ({"kernels": "tiled", "precision": "fp16"}, None),
    "tensor_cores": ({"kernels": "tiled", "precision": "fp16"}, "emulate"),
}


@pytest.fixture(scope="module")
def unets(tmp_path_factory):
    base = tmp_path_factory.mktemp("weight_slabs")
    out = {name: base / name for name in CONVERSIONS}
    convert_side_by_side({name: ["preset:tiny", *flags, "-o", out[name], "--height", SIZE, "--width", SIZE,
                                 "--components", "unet", "--json"]
                          for name, flags in CONVERSIONS.items()})
    return {name: folder / "unet.tflite" for name, folder in out.items()}


def feeds(path) -> list[np.ndarray]:
    """Seeded inputs of the model's own shapes and types (a timestep in the schedule's range)."""
    from ai_edge_litert.interpreter import Interpreter

    r = np.random.default_rng(7)
    out = []
    for d in Interpreter(model_path=str(path)).get_input_details():
        if np.issubdtype(d["dtype"], np.integer):
            out.append(np.full(d["shape"], 501, d["dtype"]))
        elif d["shape"].size <= 1:
            out.append(np.full(d["shape"], 501.0, d["dtype"]))
        else:
            out.append(r.standard_normal(d["shape"]).astype(d["dtype"]))
    return out


def run(path, lib, options, tensor_cores, monkeypatch):
    """(outputs, stats) of the model on the delegate, DIFFLITE_TENSOR_CORES as given."""
    if tensor_cores:
        monkeypatch.setenv("DIFFLITE_TENSOR_CORES", tensor_cores)
    else:
        monkeypatch.delenv("DIFFLITE_TENSOR_CORES", raising=False)
    monkeypatch.delenv("DIFFLITE_WEIGHT_SLABS", raising=False)
    monkeypatch.delenv("DIFFLITE_KERNELS", raising=False)
    return run_model(path, lib, feeds(path), opencl_options(**options), stats=True)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("weights", CONVERSIONS)
def test_slabs_read_the_same_weights(opencl_lib, unets, weights, config, monkeypatch):
    options, tensor_cores = CONFIGS[config]
    path = unets[weights]
    apart, apart_stats = run(path, opencl_lib, {**options, "zero_copy": "off", "weight_slabs": "off"},
                             tensor_cores, monkeypatch)
    slabbed, stats = run(path, opencl_lib, {**options, "zero_copy": "off"}, tensor_cores, monkeypatch)
    assert apart_stats["nodes_claimed"] == apart_stats["nodes_total"], apart_stats
    assert apart_stats["weight_slabs"] == 0 and apart_stats["weight_slab_bytes"] == 0, apart_stats
    assert stats["weight_slabs"] >= 1, stats
    # the slabs hold the weights of the GEMMs and convolutions, each piece aligned: all but the
    # biases and norm parameters (95-99 % of the weights here), and at most all of them
    assert stats["weights_bytes"] == apart_stats["weights_bytes"], (stats, apart_stats)
    assert 0.9 * stats["weights_bytes"] < stats["weight_slab_bytes"] <= 1.05 * stats["weights_bytes"], stats
    if tensor_cores:
        assert any(tile.endswith("m") for tile in stats["gemm_tiles"]), stats["gemm_tiles"]
    for got, want in zip(slabbed, apart):
        assert np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)


def test_zero_copy_weights_stay_out_of_slabs(opencl_lib, unets, monkeypatch):
    """On a device that shares memory with the host (PoCL), float weights in their storage type
    become buffers over the file's pages: the slabs leave them there and take only the rest."""
    path = unets["fp32"]
    options = {"kernels": "tiled", "precision": "fp32"}
    apart, apart_stats = run(path, opencl_lib, {**options, "weight_slabs": "off"}, None, monkeypatch)
    slabbed, stats = run(path, opencl_lib, options, None, monkeypatch)
    assert apart_stats["weights_zero_copy_bytes"] > 0.9 * apart_stats["weights_bytes"], apart_stats
    assert stats["weights_zero_copy_bytes"] == apart_stats["weights_zero_copy_bytes"], (stats, apart_stats)
    assert stats["weight_slab_bytes"] < 0.1 * stats["weights_bytes"], stats
    for got, want in zip(slabbed, apart):
        np.testing.assert_array_equal(got, want)


def test_the_environment_turns_slabs_off(opencl_lib, unets, monkeypatch):
    """DIFFLITE_WEIGHT_SLABS=off does what weight_slabs=off does, for benchmarks run without code."""
    path = unets["int8"]
    monkeypatch.setenv("DIFFLITE_WEIGHT_SLABS", "off")
    _, stats = run_model(path, opencl_lib, feeds(path),
                         opencl_options(kernels="tiled", precision="fp16", zero_copy="off"), stats=True)
    assert stats["weight_slabs"] == 0, stats
    monkeypatch.setenv("DIFFLITE_WEIGHT_SLABS", "sometimes")
    with pytest.raises(ValueError, match="DIFFLITE_WEIGHT_SLABS"):
        run_model(path, opencl_lib, feeds(path), opencl_options(kernels="tiled"), stats=True)


def two_winograd_convs(path, form: str, r):
    """x -> WinogradConv3x3 -> WinogradConv3x3: the second weight lies after the first in a slab.
    form: "transformed" (U [36, Cin, Cout], read by the GEMM), "filter" (OHWI, transformed by
    wino_filter at every call) or "filter_int8" (per output channel, read quantized). Returns the
    model's path, x and the float64 reference."""
    n, h, w, c = 1, 9, 11, 6
    x = nonzero(r, (n, h, w, c))
    m = QModel()
    xi = m.activation("x", x.shape)
    cur, want = xi, x.astype(np.float64)
    for i in range(2):
        wt = nonzero(r, (c, c, 3, 3), 0.5)
        bias = nonzero(r, (c,))
        ohwi = np.ascontiguousarray(wt.transpose(0, 2, 3, 1))
        if form == "filter_int8":
            q, scale = quantize(ohwi, 0, 8)
            ohwi = dequantize(q, scale, np.zeros(scale.size), 0)
            wt = ohwi.transpose(0, 3, 1, 2)
            weight = m.int8_weight(f"w{i}", q, scale, axis=0)
        elif form == "filter":
            weight = m.constant(f"w{i}", ohwi.astype(np.float32))
        else:
            weight = m.constant(f"w{i}", winograd_ref.transform_weights(wt).astype(np.float32))
        out = m.activation(f"y{i}", (n, h, w, c))
        m.custom("difflite.WinogradConv3x3", [cur, weight, m.constant(f"b{i}", bias.astype(np.float32))],
                 [out], {"tile": 4, "activation": "none"})
        cur, want = out, winograd_ref.conv3x3_nhwc(want, wt, bias)
    return m.save(path, [xi], [cur]), x, want


@pytest.mark.parametrize("kernels", ["flat", "tiled"])
@pytest.mark.parametrize("form", ["transformed", "filter", "filter_int8"])
def test_winograd_reads_its_weight_in_a_slab(opencl_lib, tmp_path, form, kernels, monkeypatch):
    """Winograd's weight is read at its offset by the GEMM (transformed form) or by wino_filter
    (filter forms, float and int8 with its scales), on the flat kernels too, which pack no
    Winograd weight."""
    path, x, want = two_winograd_convs(tmp_path / "wino.tflite", form, np.random.default_rng(3))
    monkeypatch.delenv("DIFFLITE_WEIGHT_SLABS", raising=False)
    options = opencl_options(kernels=kernels, precision="fp32", zero_copy="off")
    (apart,), apart_stats = run_model(path, opencl_lib, [x], {**options, "weight_slabs": "off"}, stats=True)
    (slabbed,), stats = run_model(path, opencl_lib, [x], options, stats=True)
    assert stats["nodes_claimed"] == stats["nodes_total"], stats
    assert apart_stats["weight_slabs"] == 0 and stats["weight_slabs"] == 1, (apart_stats, stats)
    assert rel_err(slabbed, want) < TOL
    np.testing.assert_array_equal(slabbed, apart)
