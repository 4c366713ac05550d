"""backend=opencl on whole models: the tiny preset converted by the real
`difflite convert` at 64x64, run through ai_edge_litert with
load_delegate(lib, {"backend": "opencl"}) on the machine's OpenCL device
(PoCL in CI), against the same files on TFLite's CPU kernels (XNNPACK).

* --no-fuse (builtins only): text_encoder, unet and vae_decoder each claimed
  whole (every node, one partition) and within 1e-4 of XNNPACK, relative to
  the output's max magnitude; the unet also with the tiled (GPU-style)
  kernels.
* fused (difflite.GroupNorm/Gelu/GeGLU/Attention custom ops, whose OpenCL
  sides live in custom_ops/ops/): the same, against backend=cpu (the op
  library's reference kernels + XNNPACK).
* fp16 (`--precision fp16` conversion, precision=fp16: half storage through
  vload_half on PoCL): each component, and the unet with the tiled kernels,
  within 1e-2 of backend=cpu; `difflite verify --backend opencl` passes.

OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from support.cli import run_difflite
from support.opencl_helpers import opencl_options, run_model

TOL = 1e-4
HALF_TOL = 1e-2  # relative to the output's max magnitude, half storage against float32
SIZE = ["--height", "64", "--width", "64"]
COMPONENTS = ["text_encoder", "unet", "vae_decoder"]


def difflite(*args) -> str:
    """Runs the CLI, which must exit 0; its stdout."""
    return run_difflite(*args, check=True).stdout


@pytest.fixture(scope="module")
def nofuse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("opencl") / "tiny_nofuse"
    difflite("convert", "preset:tiny", "-o", out, *SIZE, "--components", ",".join(COMPONENTS),
             "--no-fuse")
    return out


@pytest.fixture(scope="module")
def fused_fp16(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("opencl") / "tiny_fused_fp16"
    difflite("convert", "preset:tiny", "-o", out, *SIZE, "--components", ",".join(COMPONENTS),
             "--precision", "fp16")
    return out


@pytest.fixture(scope="module")
def fused(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("opencl") / "tiny_fused"
    difflite("convert", "preset:tiny", "-o", out, *SIZE, "--components", ",".join(COMPONENTS))
    return out


def model_info(path: Path):
    """(number of nodes, custom codes used, input feeds) of a .tflite file."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    ops = interp._get_ops_details()
    details = interp.get_tensor_details()
    vocab = 100
    for op in ops:
        if op["op_name"] == "GATHER":
            vocab = int(details[op["inputs"][0]]["shape"][0])
    r = np.random.default_rng(0)
    feeds = []
    for d in interp.get_input_details():
        if d["dtype"] == np.int32:
            feeds.append(r.integers(0, vocab, d["shape"]).astype(np.int32))
        else:
            feeds.append(r.standard_normal(d["shape"]).astype(np.float32))
    return len(ops), {op["op_name"] for op in ops}, feeds


def rel_errs(got, want):
    out = []
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert np.isfinite(g).all(), "non-finite output"
        w64 = w.astype(np.float64)
        out.append(float(np.abs(g.astype(np.float64) - w64).max() / np.abs(w64).max()))
    return out


def check_claimed_whole(stats, n_nodes):
    assert stats["nodes_claimed"] == n_nodes == stats["nodes_total"], stats
    assert stats["partitions"] == 1, stats


@pytest.mark.parametrize("component", COMPONENTS)
def test_nofuse_matches_xnnpack(opencl_lib, nofuse, component):
    path = nofuse / f"{component}.tflite"
    n_nodes, _, feeds = model_info(path)
    want, _ = run_model(path, opencl_lib, feeds, {"backend": "none"}, repeats=1)  # XNNPACK
    got, stats = run_model(path, opencl_lib, feeds, opencl_options(), stats=True)
    check_claimed_whole(stats, n_nodes)
    errs = rel_errs(got, want)
    assert max(errs) <= TOL, errs
    assert stats["weights_bytes"] > 0 and stats["arena_bytes"] > 0, stats


def test_nofuse_unet_with_tiled_kernels(opencl_lib, nofuse):
    """The unet with the local-memory kernels GPUs get (kernels=tiled)."""
    path = nofuse / "unet.tflite"
    n_nodes, _, feeds = model_info(path)
    want, _ = run_model(path, opencl_lib, feeds, {"backend": "none"}, repeats=1)
    got, stats = run_model(path, opencl_lib, feeds, opencl_options(kernels="tiled"), stats=True,
                           repeats=1)
    check_claimed_whole(stats, n_nodes)
    assert stats["kernels"] == "tiled", stats
    errs = rel_errs(got, want)
    assert max(errs) <= TOL, errs


@pytest.mark.parametrize("component", COMPONENTS)
def test_fused_matches_cpu_backend(opencl_lib, fused, component):
    path = fused / f"{component}.tflite"
    n_nodes, op_names, feeds = model_info(path)
    want, _ = run_model(path, opencl_lib, feeds, {"backend": "cpu"}, repeats=1)
    got, stats = run_model(path, opencl_lib, feeds, opencl_options(), stats=True)
    check_claimed_whole(stats, n_nodes)
    errs = rel_errs(got, want)
    assert max(errs) <= TOL, errs


@pytest.mark.parametrize("component", COMPONENTS)
def test_fused_fp16_storage_matches_cpu_backend(opencl_lib, fused_fp16, component):
    """precision=fp16: every activation in half storage (vload_half / vstore_half where
    the device has no cl_khr_fp16, as PoCL), the same fp16-weight file on backend=cpu."""
    path = fused_fp16 / f"{component}.tflite"
    n_nodes, _, feeds = model_info(path)
    want, _ = run_model(path, opencl_lib, feeds, {"backend": "cpu"}, repeats=1)
    got, stats = run_model(path, opencl_lib, feeds, opencl_options(precision="fp16"), stats=True)
    check_claimed_whole(stats, n_nodes)
    assert stats["storage"] == "float16", stats
    errs = rel_errs(got, want)
    assert max(errs) <= HALF_TOL, errs


def test_fused_fp16_unet_with_tiled_kernels(opencl_lib, fused_fp16):
    """The fused unet in half storage with the kernels GPUs get (kernels=tiled: the tiled GEMMs
    with quad staging and raw prefetch, Winograd, flash attention), against backend=cpu."""
    path = fused_fp16 / "unet.tflite"
    n_nodes, _, feeds = model_info(path)
    want, _ = run_model(path, opencl_lib, feeds, {"backend": "cpu"}, repeats=1)
    got, stats = run_model(path, opencl_lib, feeds, opencl_options(precision="fp16", kernels="tiled"),
                           stats=True, repeats=1)
    check_claimed_whole(stats, n_nodes)
    assert stats["storage"] == "float16" and stats["kernels"] == "tiled", stats
    errs = rel_errs(got, want)
    assert max(errs) <= HALF_TOL, errs


def test_verify_cli_runs_fp16_conversion_in_half_storage(opencl_lib, fused_fp16):
    """`difflite verify OUT --backend opencl` on an fp16 conversion: the delegate stores
    activations as half (the manifest's precision) and every component meets the fp16
    tolerance against PyTorch."""
    report = json.loads(difflite("verify", fused_fp16, "--backend", "opencl", "--seeds", "0",
                                 "--json"))
    assert report["passed"], report["checks"]
    assert {c["component"] for c in report["checks"]} == set(COMPONENTS), report
    expected = os.environ.get("DIFFLITE_EXPECT_ARITHMETIC")  # the fp16 lane: float16
    for name in COMPONENTS:
        assert report["gpu_memory"][name]["storage"] == "float16", report["gpu_memory"]
        if expected:
            assert report["gpu_memory"][name]["arithmetic"] == expected, report["gpu_memory"]
