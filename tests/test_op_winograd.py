"""difflite.WinogradConv3x3 (Winograd F(4x4, 3x3), stride 1, pad 1) against a direct float64 3x3
convolution (tests/support/winograd_ref.py), on the transformed weights ([36, Cin, Cout]) and on
the 3x3 filter itself ([Cout, 3, 3, Cin], transformed by the kernels):

* the reference: the Winograd algorithm in float64 equals the direct convolution;
* the CPU backend (TestCpuBackend): single-op .tflite models on ai_edge_litert and tensorflow's
  tf.lite; max |err| <= 1e-4 x max |ref|;
* the OpenCL kernels (custom_ops/ops/winograd_conv3x3/winograd_conv3x3.cl and builtins/matmul's
  GEMM with the tile a GPU gets) launched directly with pyopencl on PoCL; float32 storage (PoCL
  has no cl_khr_fp16), max |err| / max |ref| < 2e-5 (TOL);
* the same op through the library with backend=opencl (test_delegate_winograd*): both weight
  forms, flat and tiled kernels, split-K, and the scratch each asks for; < TOL.

Outputs are poisoned with NaN before every run; sizes are odd (partial tiles, channels not
multiples of 4 or 16). No OpenCL is a failure with the reason, never a skip
(tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from support import winograd_ref
from support.numerics import nonzero, rel_err, rng
from support.opencl_helpers import TOL, run_delegate
from support.oplib_helpers import check, run_tflite, single_op_model


# ---------------------------------------------------------------------------
# The reference: Winograd's algorithm in float64 (support/winograd_ref.py) is the direct convolution


def test_winograd_reference_matches_direct_conv():
    r = rng(6)
    x = r.standard_normal((2, 9, 11, 5))
    wt = r.standard_normal((7, 5, 3, 3))
    b = r.standard_normal(7)
    u64 = np.einsum("ak,oikl,bl->abio", winograd_ref.G, wt, winograd_ref.G).reshape(36, 5, 7)
    direct = winograd_ref.conv3x3_nhwc(x, wt, b)
    assert np.abs(winograd_ref.winograd_conv3x3_nhwc(x, u64, b) - direct).max() < 1e-10
    np.testing.assert_allclose(winograd_ref.transform_weights(wt), u64, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# The CPU backend


class TestCpuBackend:
    """backend=cpu, single-op models on both runtimes (`runtime`): max |err| <= 1e-4 x max |ref|
    (support.oplib_helpers.check). A class, as in the other ops' files (where the OpenCL kernel tests
    share these tests' names)."""

    @pytest.mark.parametrize("shape", [(2, 9, 11, 5, 7), (1, 8, 4, 3, 2), (1, 1, 3, 2, 5), (1, 13, 6, 17, 9)])
    def test_winograd_conv3x3(self, lib, runtime, tmp_path, shape):
        n, h, w, cin, cout = shape
        r = rng(5)
        x = nonzero(r, (n, h, w, cin))
        wt = nonzero(r, (cout, cin, 3, 3))
        bias = nonzero(r, (cout,))
        u = winograd_ref.transform_weights(wt)
        assert u.shape == (36, cin, cout) and u.dtype == np.float32
        p = single_op_model(tmp_path / "wino.tflite", "difflite.WinogradConv3x3",
                            {"tile": 4, "activation": "none"},
                            [("x", x, False), ("w", u, True), ("bias", bias, True)], (n, h, w, cout))
        (y,) = run_tflite(p, lib, [x], runtime)
        check(y, winograd_ref.conv3x3_nhwc(x, wt, bias))

    @pytest.mark.parametrize("w_const", [True, False], ids=["w_constant", "w_input"])
    @pytest.mark.parametrize("shape", [(2, 9, 11, 5, 7), (1, 8, 4, 3, 2), (1, 1, 3, 2, 5), (1, 13, 6, 17, 9),
                                       (1, 7, 10, 12, 16)])
    def test_winograd_conv3x3_filter_form(self, lib, runtime, tmp_path, shape, w_const):
        """w as the 3x3 filter itself ([Cout, 3, 3, Cin], OHWI like a CONV_2D filter): the kernel
        transforms it at run time; a model constant, or a graph input fed at run time."""
        n, h, w, cin, cout = shape
        r = rng(8 + cin)
        x = nonzero(r, (n, h, w, cin))
        wt = nonzero(r, (cout, cin, 3, 3))
        bias = nonzero(r, (cout,))
        ohwi = np.ascontiguousarray(wt.transpose(0, 2, 3, 1))
        p = single_op_model(tmp_path / "wino_filter.tflite", "difflite.WinogradConv3x3",
                            {"tile": 4, "activation": "none"},
                            [("x", x, False), ("w", ohwi, w_const), ("bias", bias, True)], (n, h, w, cout))
        (y,) = run_tflite(p, lib, [x] if w_const else [x, ohwi], runtime, repeats=2)
        check(y, winograd_ref.conv3x3_nhwc(x, wt, bias))


# ---------------------------------------------------------------------------
# The OpenCL kernels, launched directly (pyopencl on PoCL, float32 storage)


# The GEMM is builtins/matmul's gemm.cl with the tile a GPU gets: 32x32 (T or Cout <= 32) or 64x64
# (T = 98: two row blocks; Cin and Cout not multiples of 16).
@pytest.mark.parametrize("n,h,w,cin,cout", [(1, 9, 11, 5, 7), (2, 13, 6, 33, 17), (1, 4, 3, 70, 66),
                                            (1, 10, 10, 24, 40), (2, 27, 26, 24, 40)])
def test_winograd(runner, launch, n, h, w, cin, cout):
    r = np.random.default_rng(h * w + cin)
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, cin, 3, 3), 0.5)
    bias = nonzero(r, (cout,))
    u = winograd_ref.transform_weights(wt)
    y = runner.empty((n, h, w, cout))
    runner.winograd(runner.upload(x), runner.upload(u), runner.upload(bias), y, n, h, w, cin, cout)
    ref = winograd_ref.conv3x3_nhwc(x, wt, bias)
    assert rel_err(runner.download(y, ref.shape), ref) < TOL
    t = launch.winograd_tiles(n, h, w)[2]
    _, tile = runner.gemm_kernel(t, cout, a_kmajor=True, b_kmajor=False, macs=36 * t * cout * cin)
    assert tile == launch.gemm_tiles(t, cout, 36 * t * cout * cin)[0]  # PoCL runs the tile a GPU gets


# ---------------------------------------------------------------------------
# The op through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


def _delegate_winograd(tmp_path, oplib, r, n, h, w, cin, cout, kernels, form="transformed"):
    """One WinogradConv3x3 through the delegate, checked against a direct 3x3 conv; its stats.
    form "filter": the op's weight is the 3x3 filter itself (OHWI), which the kernels transform."""
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, cin, 3, 3), 0.5)
    bias = nonzero(r, (cout,))
    weight = winograd_ref.transform_weights(wt) if form == "transformed" else np.ascontiguousarray(
        wt.transpose(0, 2, 3, 1))
    out, stats = run_delegate(tmp_path, oplib, "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
                               [("x", x, False), ("w", weight, True), ("bias", bias, True)], (n, h, w, cout), [x],
                               stats=True, kernels=kernels)
    assert rel_err(out, winograd_ref.conv3x3_nhwc(x, wt, bias)) < TOL, (n, h, w, cin, cout)
    return stats


@pytest.mark.parametrize("kernels", ["auto", "tiled"])  # PoCL: flat gemm_rows; tiled: the GPUs' GEMM
def test_delegate_winograd(tmp_path, opencl_lib, runner, kernels):
    r = np.random.default_rng(14)
    # T = 9 and 98 tiles with Cin = 24, Cout = 40: partial 32x32 / 64x64 GEMM tiles and K slices.
    for n, h, w, cin, cout in ((1, 9, 11, 5, 7), (2, 13, 6, 33, 17), (1, 10, 10, 24, 40), (2, 27, 26, 24, 40)):
        stats = _delegate_winograd(tmp_path, opencl_lib, r, n, h, w, cin, cout, kernels)
        t = n * -(-h // 4) * -(-w // 4)
        assert stats.get("nodes_claimed") == 1, stats
        assert stats.get("kernels") == ("flat" if kernels == "auto" and runner.flat else "tiled"), stats
        assert stats.get("scratch_bytes") == 4 * 36 * t * (cin + cout), stats  # V and M; the GEMM needs none


@pytest.mark.parametrize("kernels", ["auto", "tiled"])
def test_delegate_winograd_filter_form(tmp_path, opencl_lib, runner, kernels):
    """The filter form: wino_filter writes U into scratch at every call, which the GEMM reads; the
    scratch is V, M and U (no weight of the op's own)."""
    r = np.random.default_rng(16)
    for n, h, w, cin, cout in ((1, 9, 11, 5, 7), (2, 13, 6, 33, 17), (1, 10, 10, 24, 40)):
        stats = _delegate_winograd(tmp_path, opencl_lib, r, n, h, w, cin, cout, kernels, form="filter")
        t = n * -(-h // 4) * -(-w // 4)
        assert stats.get("nodes_claimed") == 1, stats
        assert stats.get("scratch_bytes") == 4 * 36 * (t * (cin + cout) + cin * cout), stats


def test_delegate_winograd_split_k(tmp_path, opencl_lib, monkeypatch):
    """The GPUs' GEMM with split-K forced: its partial planes (scratch slot 2) leave V and M alone."""
    monkeypatch.setenv("DIFFLITE_SPLIT_K", "3")
    n, h, w, cin, cout = 2, 27, 26, 70, 40
    stats = _delegate_winograd(tmp_path, opencl_lib, np.random.default_rng(15), n, h, w, cin, cout, "tiled")
    t = n * 7 * 7
    assert stats.get("scratch_bytes") == 4 * 36 * t * (cin + cout + 3 * cout), stats  # V, M, 3 partial planes
