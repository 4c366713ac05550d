"""difflite.Gelu and difflite.GeGLU (approximate erf, tanh and sigmoid) against the float64
references (support.numerics.gelu_ref, geglu_ref) on every path of the op library:

* the CPU backend (TestCpuBackend): single-op .tflite models on ai_edge_litert and tensorflow's
  tf.lite; max |err| <= 1e-4 x max |ref|;
* the OpenCL kernels (custom_ops/ops/gelu/gelu.cl, ops/geglu/geglu.cl) launched directly with
  pyopencl on PoCL (benchmarks/gpu_kernels_harness/launch.py); float32 storage (PoCL has no
  cl_khr_fp16), max |err| / max |ref| < 2e-5 (TOL); half storage through vload_half (half_runner)
  < 1.5e-3 (HALF_TOL);
* the same ops through the library with backend=opencl (test_delegate_gelu_geglu), < TOL.

Outputs are poisoned with NaN before every run; sizes are odd (float4 groups and a tail, rows
whose float4 loads start off a multiple of 4). No OpenCL is a failure with the reason, never a
skip (tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from support.numerics import geglu_ref, gelu_ref, nonzero, rel_err, rng
from support.opencl_helpers import HALF_TOL, TOL, halved, run_delegate
from support.oplib_helpers import check, run_tflite, single_op_model


# ---------------------------------------------------------------------------
# The CPU backend


class TestCpuBackend:
    """backend=cpu, single-op models on both runtimes (`runtime`): max |err| <= 1e-4 x max |ref|
    (support.oplib_helpers.check). A class of its own: the OpenCL kernel tests below share names."""

    @pytest.mark.parametrize("approximate", ["erf", "tanh", "sigmoid"])
    def test_gelu(self, lib, runtime, tmp_path, approximate):
        x = nonzero(rng(2), (3, 7, 13), scale=4.0)
        p = single_op_model(tmp_path / "gelu.tflite", "difflite.Gelu", {"approximate": approximate},
                            [("x", x, False)], x.shape)
        (y,) = run_tflite(p, lib, [x], runtime)
        check(y, gelu_ref(x, approximate))

    @pytest.mark.parametrize("approximate", ["erf", "tanh", "sigmoid"])
    def test_geglu(self, lib, runtime, tmp_path, approximate):
        x = nonzero(rng(3), (2, 5, 26), scale=3.0)
        p = single_op_model(tmp_path / "geglu.tflite", "difflite.GeGLU", {"approximate": approximate},
                            [("x", x, False)], (2, 5, 13))
        (y,) = run_tflite(p, lib, [x], runtime)
        check(y, geglu_ref(x, approximate))


# ---------------------------------------------------------------------------
# The OpenCL kernels, launched directly (pyopencl on PoCL, float32 storage)


@pytest.mark.parametrize("mode", ["erf", "tanh", "sigmoid"])
@pytest.mark.parametrize("shape", [(1003,), (2, 3, 5, 7)])
def test_gelu(runner, mode, shape):
    r = np.random.default_rng(len(shape))
    x = nonzero(r, shape, 4.0)
    y = runner.empty(shape)
    runner.gelu(runner.upload(x), y, x.size, mode)
    assert rel_err(runner.download(y, shape), gelu_ref(x, mode)) < TOL


@pytest.mark.parametrize("mode", ["erf", "tanh", "sigmoid"])
@pytest.mark.parametrize("lead,d", [((7,), 13), ((2, 5), 16), ((3,), 1)])
def test_geglu(runner, mode, lead, d):
    r = np.random.default_rng(d)
    x = nonzero(r, lead + (2 * d,), 3.0)
    rows = int(np.prod(lead))
    y = runner.empty(lead + (d,))
    runner.geglu(runner.upload(x), y, rows, d, mode)
    ref = x[..., :d].astype(np.float64) * gelu_ref(x[..., d:], mode)
    assert rel_err(runner.download(y, lead + (d,)), ref) < TOL


# ---------------------------------------------------------------------------
# Half storage without cl_khr_fp16 (half_runner: vload_half / vstore_half), within HALF_TOL


@pytest.mark.parametrize("mode", ["erf", "tanh"])
def test_half_io_gelu_geglu(half_runner, mode):
    r = np.random.default_rng(21)
    x = halved(nonzero(r, (3, 5, 7), 4.0))  # 105 elements: float4 groups and a tail
    y = half_runner.empty(x.shape)
    half_runner.gelu(half_runner.upload(x), y, x.size, mode)
    assert rel_err(half_runner.download(y, x.shape), gelu_ref(x, mode)) < HALF_TOL
    d = 13  # rows of 2 x 13: vload_half4 at offsets that are not multiples of 4
    x = halved(nonzero(r, (7, 2 * d), 3.0))
    y = half_runner.empty((7, d))
    half_runner.geglu(half_runner.upload(x), y, 7, d, mode)
    ref = x[:, :d].astype(np.float64) * gelu_ref(x[:, d:], mode)
    assert rel_err(half_runner.download(y, (7, d)), ref) < HALF_TOL


# ---------------------------------------------------------------------------
# The op through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


def test_delegate_gelu_geglu(tmp_path, opencl_lib):
    r = np.random.default_rng(12)
    x = nonzero(r, (3, 5, 67), 4.0)
    for mode in ("erf", "tanh", "sigmoid"):
        out, _ = run_delegate(tmp_path, opencl_lib, "difflite.Gelu", {"approximate": mode}, [("x", x, False)],
                               x.shape, [x])
        assert rel_err(out, gelu_ref(x, mode)) < TOL, mode
    x = nonzero(r, (7, 26), 3.0)
    out, _ = run_delegate(tmp_path, opencl_lib, "difflite.GeGLU", {"approximate": "tanh"}, [("x", x, False)],
                           (7, 13), [x])
    assert rel_err(out, x[:, :13].astype(np.float64) * gelu_ref(x[:, 13:], "tanh")) < TOL
