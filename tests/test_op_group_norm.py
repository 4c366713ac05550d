"""difflite.GroupNorm, and LayerNorm as GroupNorm (one group: [N, 1, C] rows, the rows plan),
against the float64 reference (support.numerics.group_norm_ref) on every path of the op library:

* the CPU backend (TestCpuBackend): single-op .tflite models on ai_edge_litert and tensorflow's
  tf.lite; max |err| <= 1e-4 x max |ref|;
* the OpenCL kernels (custom_ops/ops/group_norm/group_norm.cl) launched directly with pyopencl on
  PoCL through benchmarks/gpu_kernels_harness/launch.py, whose plans (split, one-kernel,
  cooperative, rows) mirror group_norm_opencl.cc and are checked here at real shapes; float32
  storage (-DDL_T=float: PoCL has no cl_khr_fp16), max |err| / max |ref| < 2e-5 (TOL); half
  storage through vload_half (half_runner) < 1.5e-3 (HALF_TOL);
* the same op through the library with backend=opencl (test_delegate_*), < TOL.

Outputs are poisoned with NaN before every run; sizes are odd (not multiples of 4 or of the
work-group sizes) and mean offsets large (a naive sum-of-squares variance would lose them). No
OpenCL is a failure with the reason, never a skip (tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from support.numerics import group_norm_ref, nonzero, rel_err, rng
from support.opencl_helpers import HALF_TOL, TOL, halved, run_delegate
from support.oplib_helpers import check, run_tflite, single_op_model


# ---------------------------------------------------------------------------
# The CPU backend


class TestCpuBackend:
    """backend=cpu, single-op models on both runtimes (`runtime`): max |err| <= 1e-4 x max |ref|
    (support.oplib_helpers.check). A class of its own: the OpenCL kernel tests below share names."""

    @pytest.mark.parametrize("activation", ["none", "silu"])
    @pytest.mark.parametrize("shape", [(2, 5, 7, 24), (2, 35, 24)])
    def test_group_norm(self, lib, runtime, tmp_path, activation, shape):
        r = rng(1)
        x = nonzero(r, shape, scale=3.0, offset=0.7)  # non-zero mean per group
        c = shape[-1]
        gamma = nonzero(r, (c,), 1.5)
        beta = nonzero(r, (c,))
        opts = {"groups": 8, "epsilon": 1e-5, "activation": activation}
        p = single_op_model(tmp_path / "gn.tflite", "difflite.GroupNorm", opts,
                            [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape)
        (y,) = run_tflite(p, lib, [x], runtime)
        check(y, group_norm_ref(x, gamma, beta, 8, 1e-5, activation))


# ---------------------------------------------------------------------------
# The OpenCL kernels, launched directly (pyopencl on PoCL, float32 storage)


# The split plan (gn_stats_cols + gn_apply_cols) on column blocks: (shape, groups, silu, ys, mean
# offset, expected (vw, lx, gpw, xb)); ys None takes the planned count for this device.
GN_SPLIT_CASES = [
    ((2, 5, 7, 24), 8, True, None, 0.5, (1, 24, 8, 1)),  # cg = 3: scalar columns, all groups in one block
    ((2, 5, 7, 24), 8, False, 1, 0.5, (1, 24, 8, 1)),  # one partial per group
    ((1, 48, 45, 40), 4, True, None, 3.0, (2, 20, 4, 1)),  # cg = 10: float2 columns, several partials
    ((1, 48, 45, 40), 4, True, 7, 50.0, (2, 20, 4, 1)),  # uneven rows per partial, large mean offset
    ((2, 13, 30), 5, True, 3, -2.0, (2, 15, 5, 1)),  # [N, L, C], C % 4 != 0
    ((1, 3, 300), 1, False, None, 1.0, (4, 75, 1, 1)),  # one group (LayerNorm), fewer rows than GN_LY
    ((2, 7, 2080), 2, True, 3, 1.0, (4, 130, 1, 2)),  # a group wider than the work-group: 2 shares
    ((3, 5, 7, 24), 8, True, 2, 0.5, (1, 24, 8, 1)),  # three samples
    ((4, 2, 3, 128), 128, True, None, 1.0, (1, 32, 32, 1)),  # cg = 1: 32 groups per block, 4 blocks
    ((1, 64, 64, 80), 8, True, None, 100.0, (2, 40, 8, 1)),  # float2 vs float4 hazard: cg = 10
]


@pytest.mark.parametrize("shape,groups,silu,ys,offset,layout", GN_SPLIT_CASES)
def test_group_norm(runner, launch, shape, groups, silu, ys, offset, layout):
    r = np.random.default_rng(sum(shape) + groups)
    c = shape[-1]
    x = nonzero(r, shape, 2.0, offset)
    gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
    y = runner.empty(shape)
    spatial = int(np.prod(shape[1:-1]))
    cp = launch.gn_cols_plan(shape[0], groups, spatial, c, runner.compute_units, min(256, runner.max_wg), ys)
    assert (cp.vw, cp.lx, cp.gpw, cp.xb) == layout
    if shape == (1, 48, 45, 40) and ys is None:
        assert cp.partials > 1, "this case must exercise merging partials"
    ev = runner.group_norm(runner.upload(x), runner.upload(gamma), runner.upload(beta), y, shape, groups,
                           1e-5, silu, ys, plan="split")
    assert len(ev) == 2
    ref = group_norm_ref(x, gamma, beta, groups, 1e-5, "silu" if silu else "none")
    assert rel_err(runner.download(y, shape), ref) < TOL


def test_group_norm_split_plan(launch):
    """PlanCols at SD 1.5 shapes on the H100 (132 compute units) and a 12-unit phone GPU."""
    p = launch.gn_cols_plan(1, 32, 4096, 1280, 132)  # [1, 64x64, 1280]: cg = 40
    assert (p.vw, p.lx, p.ly, p.gpw, p.xb, p.ys, p.ya) == (4, 40, 6, 4, 1, 66, 43)  # 4 x 132 / 8 blocks
    p = launch.gn_cols_plan(2, 32, 4096, 320, 132)  # cg = 10: float2 columns, 8 groups per block
    assert (p.vw, p.lx, p.ly, p.gpw, p.ys) == (2, 40, 6, 8, 66)
    p = launch.gn_cols_plan(2, 1, 4096, 1280, 132)  # LayerNorm-as-GroupNorm over 1280 channels
    assert (p.vw, p.lx, p.xb, p.partials) == (4, 160, 2, 256)  # at the cap: 128 row blocks x 2
    p = launch.gn_cols_plan(1, 32, 64, 1280, 12)  # 8x8: few rows, every work-item still walks 8
    assert p.ys == 1 and p.ly == 6


# The one-kernel plan (gn_one): channels per group 1, 3, 10, 40 (load widths 1, 1, 2, 4), mean
# offset 100 (a naive sum-of-squares variance would lose it), groups smaller than a work-group and
# groups of several unrolled rounds with a partial last one.
GN_ONE_CASES = [
    ((2, 3, 16), 16, (64, 1)),  # [N, L, C], cg = 1: 3 elements per group, most work-items idle
    ((2, 5, 7, 24), 8, (64, 1)),  # cg = 3
    ((2, 37, 30), 10, (64, 1)),  # [N, L, C], cg = 3, C % 4 != 0
    ((2, 48, 45, 40), 4, (1024, 2)),  # cg = 10: float2 loads, 2.6 rounds of 4 x 1024 loads
    ((2, 31, 50), 5, (64, 2)),  # [N, L, C], cg = 10, C % 4 != 0
    ((2, 33, 31, 80), 2, (1024, 4)),  # cg = 40: float4 loads, 2.5 rounds
    ((2, 9, 120), 3, (64, 4)),  # [N, L, C], cg = 40
]


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape,groups,plan", GN_ONE_CASES)
def test_group_norm_one_kernel(runner, launch, shape, groups, plan, silu):
    r = np.random.default_rng(sum(shape) + groups + silu)
    c = shape[-1]
    x = nonzero(r, shape, 2.0, 100.0)
    gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
    group_elems = int(np.prod(shape[1:-1])) * c // groups
    assert launch.gn_one_shape(group_elems, c // groups, runner.max_wg) == plan
    y = runner.empty(shape)
    ev = runner.group_norm(runner.upload(x), runner.upload(gamma), runner.upload(beta), y, shape, groups,
                           1e-5, silu, plan="one")
    assert len(ev) == 1
    ref = group_norm_ref(x, gamma, beta, groups, 1e-5, "silu" if silu else "none")
    assert rel_err(runner.download(y, shape), ref) < TOL


# The cooperative plan (gn_coop): column blocks of whole groups in float4 columns where the block spans
# whole 32-byte sectors (a vector's lanes may belong to two groups), K work-groups a (sample, block),
# each walking a slice of rows in chunks of `items` rows a work-item and exchanging per-group partial
# sums. (shape, groups, work-group limit, compute units (2 work-groups each), floats a work-item,
# expected (vw, lx, ly, gpw, items, k, rows, chunks)).
GN_COOP_CASES = [
    ((2, 48, 45, 40), 4, 128, 4, 32, (4, 10, 12, 4, 8, 4, 540, 6)),  # cg = 10 in float4s: lanes of 2 groups
    ((2, 48, 45, 40), 4, 128, 12, 8, (4, 10, 12, 4, 2, 12, 180, 8)),  # 12 slices of 8 chunks
    ((2, 48, 45, 40), 4, 64, 40, 4, (4, 10, 6, 4, 1, 40, 54, 9)),  # 40 slices x 4 groups: 3 partials an item
    ((2, 48, 45, 40), 4, 32, 200, 4, (4, 10, 3, 4, 1, 60, 36, 12)),  # capped at 8 partials a work-item
    ((2, 33, 31, 80), 2, 128, 24, 32, (4, 10, 12, 1, 8, 12, 86, 1)),  # cg = 40: a group a block, last slice 77
    ((2, 33, 31, 80), 2, 64, 6, 8, (4, 10, 6, 1, 2, 3, 341, 29)),  # 29 chunks, the last part-filled
    ((2, 37, 30), 10, 128, 1, 32, (1, 30, 4, 10, 10, 1, 37, 1)),  # cg = 3, 30 channels: scalar, no exchange
    ((1, 8, 8, 24), 8, 32, 3, 1, (4, 6, 5, 8, 1, 6, 11, 3)),  # cg = 3 in float4s, last slice 9 rows
    ((1, 8, 8, 24), 8, 32, 28, 1, (4, 6, 5, 8, 1, 22, 3, 1)),  # 176 partials: 6 per work-item
    ((2, 5, 7, 24), 8, 128, 40, 4, (4, 6, 21, 8, 1, 35, 1, 1)),  # 280 partials: 3 per work-item
    ((2, 13, 30), 5, 128, 10, 8, (2, 15, 8, 5, 1, 7, 2, 1)),  # no whole-sector block: float2 (cg = 6)
    ((1, 9, 12), 4, 32, 8, 4, (1, 12, 2, 4, 1, 9, 1, 1)),  # no whole-sector block: scalar (cg = 3)
    ((6, 300, 1), 1, 128, 12, 2, (1, 1, 128, 1, 1, 4, 75, 1)),  # LayerNorm as GroupNorm: a column of rows
    ((64, 1, 320), 1, 128, 12, 32, (4, 80, 1, 1, 1, 1, 1, 1)),  # LayerNorm [M, 1, C]: a row a work-group
    ((1, 64, 64, 320), 32, 128, 132, 32, (4, 10, 12, 4, 6, 33, 125, 2)),  # SD 1.5 64x64x320
]


@pytest.mark.parametrize("spin_limit", [0, 16384])
@pytest.mark.parametrize("shape,groups,limit,cus,floats,layout", GN_COOP_CASES)
def test_group_norm_coop(runner, launch, shape, groups, limit, cus, floats, layout, spin_limit):
    """Both ways to a group's sums agree with NumPy: waiting for the siblings' partials (on PoCL, whose
    work-groups run in turn, the last of a block finds them all) and computing them (spin_limit 0:
    every work-group reads every slice). Mean offset 100: a naive sum of squares would lose it."""
    r = np.random.default_rng(sum(shape) + groups + limit)
    c = shape[-1]
    spatial = int(np.prod(shape[1:-1]))
    plan = launch.gn_coop_plan(shape[0], groups, spatial, c // groups, limit, cus, floats, per_cu=2)
    assert (plan.vw, plan.lx, plan.ly, plan.gpw, plan.items, plan.k, plan.rows, plan.chunks) == layout
    gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
    y = runner.empty(shape)
    gb, bb = runner.upload(gamma), runner.upload(beta)
    for silu in (True, False):  # launches 1 and 2 on the same words: the second must not take the first's
        x = nonzero(r, shape, 2.0, 100.0)
        ev = runner.group_norm(runner.upload(x), gb, bb, y, shape, groups, 1e-5, silu, coop=plan,
                               spin_limit=spin_limit)
        assert len(ev) == 1
        assert rel_err(runner.download(y, shape), group_norm_ref(x, gamma, beta, groups, 1e-5, "silu" if silu else "none")) < TOL


def test_group_norm_coop_wide_group(runner, launch):
    """A group wider than the work-group limit (600 channels: 150 float4 columns > 128) has no cooperative
    plan; the library runs the one-kernel plan instead (InitCoop's fallback)."""
    assert launch.gn_coop_plan(1, 1, 3, 600, min(launch.COOP_GROUP, runner.max_wg), runner.compute_units).chunks \
        == launch.NO_COOP
    r = np.random.default_rng(3)
    shape = (1, 3, 600)
    x, gamma, beta = nonzero(r, shape, 2.0, 1.0), nonzero(r, (600,), 1.5), nonzero(r, (600,), 0.5)
    y = runner.empty(shape)
    runner.group_norm(runner.upload(x), runner.upload(gamma), runner.upload(beta), y, shape, 1, 1e-5, False,
                      plan="coop")
    assert rel_err(runner.download(y, shape), group_norm_ref(x, gamma, beta, 1, 1e-5, "none")) < TOL


def test_group_norm_coop_plan(launch):
    """PlanCoop on the H100 (132 compute units, 3 work-groups each, at most 128 work-items): blocks of
    the fewest whole groups that span whole 32-byte sectors (in float4 columns), slices to fill the
    device, then chunks of at most 32 floats a work-item."""
    lim = launch.COOP_GROUP
    p = launch.gn_coop_plan(1, 32, 4096, 10, lim, 132)  # [1, 64x64, 320]: 4 groups of 10 (160 B) a block
    assert (p.vw, p.lx, p.ly, p.gpw, p.k, p.rows, p.chunks) == (4, 10, 12, 4, 50, 82, 1)
    p = launch.gn_coop_plan(1, 32, 4096, 40, lim, 132)  # [1, 64x64, 1280]: a group of 40 (160 B) a block
    assert (p.vw, p.lx, p.ly, p.gpw, p.k, p.rows, p.chunks) == (4, 10, 12, 1, 13, 316, 4)
    p = launch.gn_coop_plan(8192, 1, 320, 1, lim, 132)  # LayerNorm [8192, 320]: a row a work-group
    assert (p.lx, p.ly, p.k, p.items, p.chunks) == (1, 128, 1, 3, 1)
    p = launch.gn_coop_plan(2, 32, 4096, 40, lim, 12)  # a phone: a group a work-group, 43 chunks
    assert (p.k, p.chunks) == (1, 43)


# The rows plan (gn_rows): LayerNorms as GroupNorm ([N, 1, C], one group), several rows a work-group.
# (shape, work-group limit, expected (lx, ly, rv)).
GN_ROWS_CASES = [
    ((37, 1, 320), 128, (32, 4, 3)),  # the UNet's 320 channels: 80 float4s, the last work-group 1 row
    ((5, 1, 36), 128, (16, 5, 1)),  # 9 float4s: 16 items a row, 5 rows (all there are)
    ((3, 1, 1280), 128, (32, 3, 10)),  # 320 float4s: 10 an item
    ((9, 1, 768), 64, (32, 2, 6)),  # the text encoder's 768 channels under a 64-item limit
    ((7, 1, 8), 4, (2, 2, 1)),  # a tiny limit: 2 items a row, 2 rows
]


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape,limit,layout", GN_ROWS_CASES)
def test_group_norm_rows(runner, launch, shape, limit, layout, silu):
    """gn_rows against NumPy: rows split over a power of two of work-items, the last work-group part
    filled (its extra rows load the last row and store nothing), float4 columns past a row's end. Mean
    offset 100: a naive sum of squares would lose it."""
    r = np.random.default_rng(shape[0] * shape[-1] + limit)
    c = shape[-1]
    plan = launch.gn_rows_plan(shape[0], 1, 1, c, limit)
    assert (plan.lx, plan.ly, plan.rv) == layout
    x = nonzero(r, shape, 2.0, 100.0)
    gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
    y = runner.empty(shape)
    ev = runner.group_norm(runner.upload(x), runner.upload(gamma), runner.upload(beta), y, shape, 1, 1e-5, silu,
                           rows=plan)
    assert len(ev) == 1
    assert rel_err(runner.download(y, shape), group_norm_ref(x, gamma, beta, 1, 1e-5, "silu" if silu else "none")) < TOL


def test_group_norm_rows_plan(launch):
    """PlanRows has a plan for LayerNorms only: one group, one position a sample, C % 4 == 0, rows of at
    most 32 x 16 float4s."""
    assert launch.gn_rows_plan(8192, 1, 1, 320, 128) == launch.RowsPlan(32, 4, 3)  # UNet [8192, 320]
    assert launch.gn_rows_plan(2, 1, 1, 2048, 128).rv == 16
    for args in ((2, 1, 1, 2052), (2, 2, 1, 320), (2, 1, 4, 320), (2, 1, 1, 322)):
        assert launch.gn_rows_plan(*args, 128).rv == 0, args


def test_group_norm_plan(launch):
    """PickPlan: GPUs take the cooperative plan while a slice is at most 8 chunks; beyond, the one-kernel
    plan when its work-groups fill the device or its groups are small (a second kernel costs more than
    the idle compute units), else the split plan; CPU-like devices (PoCL) the split plan."""
    assert launch.gn_plan(False, 1, 2, 32, 4096 * 40, compute_units=12) == "coop"
    assert launch.gn_plan(False, 8, 1, 32, 4096 * 160, compute_units=132) == "coop"
    assert launch.gn_plan(False, 9, 2, 32, 4096 * 160, compute_units=12) == "one"  # fills a phone
    assert launch.gn_plan(False, 20, 1, 32, 262144 * 4, compute_units=132) == "split"  # VAE 512x512x128
    assert launch.gn_plan(False, 20, 1, 32, 60000, compute_units=132) == "one"  # small groups
    assert launch.gn_plan(True, 1, 2, 32, 16, compute_units=2) == "split"  # CPU-like devices (PoCL)
    assert launch.gn_plan(False, 1, 8192, 1, 320, compute_units=132, rows=True) == "rows"  # LayerNorms
    assert launch.gn_plan(True, 1, 8192, 1, 320, compute_units=2, rows=True) == "split"
    # The chunks PickPlan sees at SD 1.5 shapes on the H100: the UNet's at most 8, the VAE's beyond
    # from 64x64x... on.
    h100 = [launch.gn_coop_plan(n, 32, s, c // 32, launch.COOP_GROUP, 132).chunks
            for n, s, c in ((2, 4096, 320), (2, 4096, 640), (1, 4096, 1280), (2, 1024, 1280), (1, 4096, 512))]
    assert max(h100) <= 8, h100
    vae = [launch.gn_coop_plan(1, 32, s, c // 32, launch.COOP_GROUP, 132).chunks
           for s, c in ((65536, 256), (262144, 128))]
    assert min(vae) > 8, vae


# ---------------------------------------------------------------------------
# Half storage without cl_khr_fp16 (half_runner: vload_half / vstore_half), within HALF_TOL


@pytest.mark.parametrize("plan,shape,groups", [
    ("coop", (1, 24, 20, 40), 4),  # float4 lanes of two groups
    ("one", (2, 48, 45, 40), 4),  # float2 loads
    ("one", (2, 37, 30), 10),  # scalar loads, C % 4 != 0
    ("split", (2, 33, 31, 80), 2),
    ("rows", (37, 1, 320), 1),  # a LayerNorm
])
def test_half_io_group_norm(half_runner, plan, shape, groups):
    r = np.random.default_rng(sum(shape) + groups)
    c = shape[-1]
    x = halved(nonzero(r, shape, 2.0, 10.0))
    gamma, beta = halved(nonzero(r, (c,), 1.5)), halved(nonzero(r, (c,), 0.5))
    y = half_runner.empty(shape)
    half_runner.group_norm(half_runner.upload(x), half_runner.upload(gamma), half_runner.upload(beta), y, shape,
                           groups, 1e-5, True, plan=plan)
    assert rel_err(half_runner.download(y, shape), group_norm_ref(x, gamma, beta, groups, 1e-5, "silu")) < HALF_TOL


# ---------------------------------------------------------------------------
# The op through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


def test_delegate_group_norm(tmp_path, opencl_lib):
    r = np.random.default_rng(11)
    for shape, groups, act in (((2, 5, 7, 24), 8, "silu"), ((1, 48, 45, 40), 4, "none"), ((2, 13, 30), 5, "silu")):
        c = shape[-1]
        x = nonzero(r, shape, 2.0, 1.0)
        gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
        out, _ = run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
                               {"groups": groups, "epsilon": 1e-5, "activation": act},
                               [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape, [x])
        assert rel_err(out, group_norm_ref(x, gamma, beta, groups, 1e-5, act)) < TOL, shape


@pytest.mark.parametrize("plan", ["rows", None])
def test_delegate_layer_norm_rows(tmp_path, opencl_lib, monkeypatch, plan):
    """LayerNorms as GroupNorm ([N, 1, C], one group) take the rows plan on GPUs (kernels=tiled) or when
    forced; no scratch, no memory of its own. C = 36: 9 float4s a row."""
    if plan is None:
        monkeypatch.delenv("DIFFLITE_GN_PLAN", raising=False)
    else:
        monkeypatch.setenv("DIFFLITE_GN_PLAN", plan)
    r = np.random.default_rng(17)
    for shape, act in (((37, 1, 320), "none"), ((5, 1, 36), "silu")):
        c = shape[-1]
        x = nonzero(r, shape, 2.0, 100.0)
        gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
        out, stats = run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
                                   {"groups": 1, "epsilon": 1e-5, "activation": act},
                                   [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape, [x],
                                   stats=True, kernels="tiled" if plan is None else "auto")
        assert rel_err(out, group_norm_ref(x, gamma, beta, 1, 1e-5, act)) < TOL, (shape, plan)
        assert stats["scratch_bytes"] == 0 and stats["weights_bytes"] == 2 * 4 * c, (shape, plan, stats)  # gamma, beta


@pytest.mark.parametrize("plan", ["one", "split", "coop", None])
def test_delegate_group_norm_plans(tmp_path, opencl_lib, monkeypatch, plan):
    """DIFFLITE_GN_PLAN forces a plan; unset, kernels=tiled (as on GPUs) picks the cooperative plan.
    The split plan is the one that asks for scratch (its statistics; coop keeps its partial sums in a
    buffer of its own, which must outlive a launch)."""
    if plan is None:
        monkeypatch.delenv("DIFFLITE_GN_PLAN", raising=False)
    else:
        monkeypatch.setenv("DIFFLITE_GN_PLAN", plan)
    r = np.random.default_rng(15)
    for (shape, groups, _), act in zip(GN_ONE_CASES, ["silu", "none"] * 4):
        c = shape[-1]
        x = nonzero(r, shape, 2.0, 100.0)
        gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
        out, stats = run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
                                   {"groups": groups, "epsilon": 1e-5, "activation": act},
                                   [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape, [x],
                                   stats=True, kernels="tiled" if plan is None else "auto")
        assert rel_err(out, group_norm_ref(x, gamma, beta, groups, 1e-5, act)) < TOL, (shape, plan)
        assert (stats["scratch_bytes"] > 0) == (plan == "split"), (shape, plan, stats)


def test_delegate_group_norm_coop_memory(tmp_path, opencl_lib, monkeypatch):
    """gn_coop's partial-sum words (two 8-byte words per (sample, group, slice)) are device memory the op
    holds for its lifetime: reported with the weights, not as scratch."""
    r = np.random.default_rng(16)
    shape, groups = (2, 48, 45, 40), 4
    x = nonzero(r, shape, 2.0, 100.0)
    gamma, beta = nonzero(r, (40,), 1.5), nonzero(r, (40,), 0.5)
    weights = {}
    for plan in ("one", "coop"):
        monkeypatch.setenv("DIFFLITE_GN_PLAN", plan)
        out, stats = run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
                                   {"groups": groups, "epsilon": 1e-5, "activation": "silu"},
                                   [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape, [x],
                                   stats=True)
        assert rel_err(out, group_norm_ref(x, gamma, beta, groups, 1e-5, "silu")) < TOL, plan
        assert stats["scratch_bytes"] == 0, (plan, stats)
        weights[plan] = stats["weights_bytes"]
    extra = weights["coop"] - weights["one"]
    assert extra > 0 and extra % (16 * 2 * groups) == 0, weights
