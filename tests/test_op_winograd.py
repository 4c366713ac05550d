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
  forms, flat and tiled kernels, split-K, and the scratch each asks for; < TOL;
* bands of whole tile rows (test_*winograd_bands*): DIFFLITE_WINOGRAD_SCRATCH_BYTES lowered so that
  a small conv takes several bands, the last shorter, one crossing from sample 0 into sample 1;
  both forms, float32 and float16 storage: the reference (< TOL; fp16: the PSNR bar of
  difflite.verify), the very output of the unbanded run, the banded scratch; a bad value refuses
  the node; the harness's banded launches (Runner.winograd) too.

Outputs are poisoned with NaN before every run; sizes are odd (partial tiles, channels not
multiples of 4 or 16). No OpenCL is a failure with the reason, never a skip
(tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert launch.winograd_band_tiles(n, h, w, cin, cout, 4) == t  # one band: V + M fit the default bound
    _, tile = runner.gemm_kernel(t, cout, a_kmajor=True, b_kmajor=False, macs=36 * t * cout * cin)
    assert tile == launch.gemm_tiles(t, cout, 36 * t * cout * cin)[0]  # PoCL runs the tile a GPU gets


# ---------------------------------------------------------------------------
# The op through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


def _conv_inputs(r, n, h, w, cin, cout, form):
    """x, the 3x3 filter, the bias and the op's weight input: U (form "transformed") or the filter
    itself as OHWI (form "filter", which the kernels transform)."""
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, cin, 3, 3), 0.5)
    bias = nonzero(r, (cout,))
    weight = winograd_ref.transform_weights(wt) if form == "transformed" else np.ascontiguousarray(
        wt.transpose(0, 2, 3, 1))
    return x, wt, bias, weight


def _delegate_winograd(tmp_path, oplib, r, n, h, w, cin, cout, kernels, form="transformed"):
    """One WinogradConv3x3 through the delegate, checked against a direct 3x3 conv; its stats."""
    x, wt, bias, weight = _conv_inputs(r, n, h, w, cin, cout, form)
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


# ---------------------------------------------------------------------------
# Bands of whole tile rows (winograd_conv3x3_opencl.cc: BandTiles; V + M of a band within
# DIFFLITE_WINOGRAD_SCRATCH_BYTES, default 64 MiB)

# n = 2, 13 x 10: 4 x 3 tiles a sample, 8 tile rows, T = 24. A bound of 3.5 tile rows' V + M gives
# bands of 3 rows (9 tiles): 9, 9 and a last, shorter one of 6; the second runs rows 3-5, from
# sample 0 into sample 1.
BAND_CASE = (2, 13, 10, 24, 40)
BAND_TILES = 9


def _row_bytes(n, h, w, cin, cout, elem):
    """V + M of one tile row: 36 (Cin + Cout) elements a tile, ceil(W/4) tiles."""
    return 36 * -(-w // 4) * (cin + cout) * elem


def _banded_run(tmp_path, lib, monkeypatch, form, precision, kernels, bound):
    """The BAND_CASE conv through the delegate with DIFFLITE_WINOGRAD_SCRATCH_BYTES=`bound` (None:
    unset): (output, stats, float64 reference, x). Nothing lent (DIFFLITE_LEND_SCRATCH=off): the band
    rule itself, no band fitted to idle buffers (tests/test_lend_scratch.py)."""
    monkeypatch.setenv("DIFFLITE_LEND_SCRATCH", "off")
    if bound is None:
        monkeypatch.delenv("DIFFLITE_WINOGRAD_SCRATCH_BYTES", raising=False)
    else:
        monkeypatch.setenv("DIFFLITE_WINOGRAD_SCRATCH_BYTES", str(bound))
    n, h, w, cin, cout = BAND_CASE
    x, wt, bias, weight = _conv_inputs(np.random.default_rng(17), n, h, w, cin, cout, form)
    out, stats = run_delegate(tmp_path, lib, "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
                              [("x", x, False), ("w", weight, True), ("bias", bias, True)], (n, h, w, cout), [x],
                              stats=True, kernels=kernels, precision=precision)
    assert stats.get("nodes_claimed") == 1, stats
    return out, stats, winograd_ref.conv3x3_nhwc(x, wt, bias), x


def _scratch(tiles, form, elem, staging):
    """WinogradGpu::ScratchBytes for the BAND_CASE (the GEMMs need none here): a band's V and M,
    U in the filter form; plus the backend's float32 staging of x and y at fp16."""
    _, _, _, cin, cout = BAND_CASE
    return elem * 36 * (tiles * (cin + cout) + (cin * cout if form == "filter" else 0)) + staging


@pytest.mark.parametrize("kernels", ["auto", "tiled"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("form", ["transformed", "filter"])
def test_delegate_winograd_bands(tmp_path, opencl_lib, monkeypatch, launch, form, precision, kernels):
    from difflite.core import winograd as wg
    from difflite.verify import FP16_MIN_PSNR_DB

    n, h, w, cin, cout = BAND_CASE
    elem = 2 if precision == "fp16" else 4
    bound = _row_bytes(*BAND_CASE, elem) * 7 // 2
    # the rule, as the harness and the compiler's estimate mirror it
    assert launch.winograd_band_tiles(n, h, w, cin, cout, elem, bound) == BAND_TILES
    assert wg.band_tiles(n, h, w, cin, cout, elem, bound) == BAND_TILES
    assert wg.band_tiles(n, h, w, cin, cout, elem) == launch.winograd_band_tiles(n, h, w, cin, cout, elem) == 24
    out, stats, ref, x = _banded_run(tmp_path, opencl_lib, monkeypatch, form, precision, kernels, bound)
    staging = 4 * (x.size + ref.size) if precision == "fp16" else 0  # the float32 input and output, converted
    if precision == "fp32":
        assert stats["storage"] == "float32", stats
        assert rel_err(out, ref) < TOL
    else:
        assert stats["storage"] == "float16", stats
        rmse = float(np.sqrt(np.mean((out.astype(np.float64) - ref) ** 2)))
        assert 20 * np.log10(np.abs(ref).max() / rmse) >= FP16_MIN_PSNR_DB
    assert stats["scratch_bytes"] == _scratch(BAND_TILES, form, elem, staging), stats
    # The default bound: one band of all 24 tiles, the scratch as before bands, the very same output
    # (the same kernels and summation order per tile). Tensor cores off: their tiles are chosen
    # by a GEMM's rows, the tiles of a band or of the whole image.
    monkeypatch.setenv("DIFFLITE_TENSOR_CORES", "off")
    out, _, _, _ = _banded_run(tmp_path, opencl_lib, monkeypatch, form, precision, kernels, bound)
    whole, stats_whole, _, _ = _banded_run(tmp_path, opencl_lib, monkeypatch, form, precision, kernels, None)
    assert stats_whole["scratch_bytes"] == _scratch(24, form, elem, staging) > stats["scratch_bytes"], stats_whole
    np.testing.assert_array_equal(out, whole)


def test_delegate_winograd_band_of_one_row(tmp_path, opencl_lib, monkeypatch):
    """A bound below one tile row's V + M still runs a row a band (8 bands, none shorter)."""
    out, stats, ref, _ = _banded_run(tmp_path, opencl_lib, monkeypatch, "filter", "fp32", "tiled", 1)
    assert rel_err(out, ref) < TOL
    assert stats["scratch_bytes"] == _scratch(3, "filter", 4, 0), stats


@pytest.mark.parametrize("value", ["lots", "0", "-4096", "4096x", "1e9", " "])
def test_delegate_winograd_bad_scratch_bytes(tmp_path, opencl_lib, monkeypatch, value):
    monkeypatch.setenv("DIFFLITE_WINOGRAD_SCRATCH_BYTES", value)
    x = nonzero(np.random.default_rng(0), (1, 5, 6, 3))
    u = winograd_ref.transform_weights(nonzero(np.random.default_rng(1), (4, 3, 3, 3)))
    with pytest.raises(RuntimeError, match=f"DIFFLITE_WINOGRAD_SCRATCH_BYTES={value}: expected a positive integer"):
        run_delegate(tmp_path, opencl_lib, "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
                     [("x", x, False), ("w", u, True), ("bias", np.ones(4, np.float32), True)], (1, 5, 6, 4), [x])


BAND_CHILD = """
import os
import sys
import numpy as np
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_op_winograd import _banded_run
import pytest
out, _, ref, _ = _banded_run(Path({work!r}), Path({lib!r}), pytest.MonkeyPatch(), "transformed", "fp32", "auto",
                             os.environ["DIFFLITE_WINOGRAD_SCRATCH_BYTES"])
np.save({work!r} + "/out.npy", out)
np.save({work!r} + "/ref.npy", ref)
"""


def test_delegate_winograd_bands_make_no_sub_buffer(tmp_path, opencl_lib):
    """The bands' kernels and GEMMs read and write V and M from their start and take the band's
    first tile as an argument: the driver trace (DIFFLITE_CL_TRACE=1, in a child process) shows
    three bands of wino_input / GEMM / wino_output and no clCreateSubBuffer."""
    bound = _row_bytes(*BAND_CASE, 4) * 7 // 2
    env = {**os.environ, "DIFFLITE_CL_TRACE": "1", "DIFFLITE_WINOGRAD_SCRATCH_BYTES": str(bound)}
    code = BAND_CHILD.format(tests=str(Path(__file__).parent), work=str(tmp_path), lib=str(opencl_lib))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    trace = [line.split() for line in run.stderr.splitlines() if line.startswith("difflite-cl: ")]
    launches = [t[2] for t in trace if t[1] == "launch"]
    assert launches.count("wino_input") == launches.count("wino_output") == 3, launches
    assert sum(name.startswith("gemm") for name in launches) >= 3, launches
    assert [t for t in trace if t[1] == "sub"] == []
    assert rel_err(np.load(tmp_path / "out.npy"), np.load(tmp_path / "ref.npy")) < TOL


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_winograd_bands(request, launch, half):
    """The harness's Runner.winograd under a lowered bound: three bands (9, 9, 6 tiles) give the
    output of one band exactly; float32 against the reference within TOL."""
    runner = request.getfixturevalue("half_runner" if half else "runner")
    n, h, w, cin, cout = BAND_CASE
    elem = 2 if half else 4
    r = np.random.default_rng(19)
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, cin, 3, 3), 0.5)
    bias = nonzero(r, (cout,))
    args = runner.upload(x), runner.upload(winograd_ref.transform_weights(wt)), runner.upload(bias)
    bound = _row_bytes(*BAND_CASE, elem) * 7 // 2
    y, y1 = runner.empty((n, h, w, cout)), runner.empty((n, h, w, cout))
    events = runner.winograd(*args, y, n, h, w, cin, cout, scratch_bytes=bound)
    one = runner.winograd(*args, y1, n, h, w, cin, cout)
    assert len(events) == 3 * len(one) and len(one) >= 3
    assert runner.winograd_scratch_bytes(n, h, w, cin, cout, bound=bound) == 36 * BAND_TILES * (cin + cout) * elem
    got = runner.download(y, (n, h, w, cout))
    np.testing.assert_array_equal(got, runner.download(y1, (n, h, w, cout)))
    if not half:
        assert rel_err(got, winograd_ref.conv3x3_nhwc(x, wt, bias)) < TOL
