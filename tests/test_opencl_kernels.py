"""OpenCL kernels of the five difflite ops (custom_ops/ops/*/*.cl), run directly with pyopencl on
PoCL (the CPU OpenCL device) against float64 NumPy references.

The launches go through benchmarks/gpu_kernels_harness/launch.py, whose plans (work-group sizes,
reduction splits, attention variant and tiles) mirror the C++ host code in
custom_ops/ops/<op>/<op>_opencl.cc. Storage is float32 (-DDL_T=float -DDL_T4=float4: PoCL has no
cl_khr_fp16). Every output buffer is poisoned with NaN before the run; sizes are odd (not multiples
of 4 or of the work-group and tile sizes).

Also here: the same ops through the library with backend=opencl (single-op .tflite models: the
C++ host code of the GPU side), and a compile check of every program for half storage with PoCL's
clang (no fp16 device here).

No OpenCL (pyopencl missing, no ICD, no PoCL device) is a failure with the reason, never a skip.
Set DIFFLITE_OPENCL_DEVICE to a platform/device name substring to run on another device, and
DIFFLITE_OPLIB to a prebuilt libdifflite_delegate.so to skip the (cached) CMake build.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from support import ROOT, winograd_ref
from support.numerics import attention_ref, gelu_ref, group_norm_ref, nonzero, rel_err

TOL = 2e-5  # max |err| / max |ref|


@pytest.fixture(scope="module")
def launch():
    try:
        import pyopencl  # noqa: F401
    except ImportError as e:  # a failure, not a skip
        pytest.fail(f"pyopencl is not importable ({e}); `pip install pyopencl` and "
                    "`apt-get install pocl-opencl-icd` to run the OpenCL kernel tests")
    from benchmarks.gpu_kernels_harness import launch as mod

    return mod


@pytest.fixture(scope="module")
def runner(launch):
    prefer = os.environ.get("DIFFLITE_OPENCL_DEVICE", "Portable Computing Language")
    try:
        ctx, dev = launch.pick_context(prefer=prefer)
    except Exception as e:  # no ICD loader, no platform, no PoCL
        pytest.fail(f"no OpenCL device matching {prefer!r} ({type(e).__name__}: {e}); "
                    "install pocl-opencl-icd (PoCL) or set DIFFLITE_OPENCL_DEVICE")
    return launch.Runner(ctx, dev)


# ---------------------------------------------------------------------------
# References (float64)


# ---------------------------------------------------------------------------
# GroupNorm


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
    assert (p.vw, p.lx, p.ly, p.gpw, p.xb, p.ys, p.ya) == (4, 40, 6, 4, 1, 64, 43)
    p = launch.gn_cols_plan(2, 32, 4096, 320, 132)  # cg = 10: float2 columns, 8 groups per block
    assert (p.vw, p.lx, p.ly, p.gpw, p.ys) == (2, 40, 6, 8, 64)
    p = launch.gn_cols_plan(2, 1, 4096, 1280, 132)  # LayerNorm-as-GroupNorm over 1280 channels
    assert (p.vw, p.lx, p.xb, p.partials) == (4, 160, 2, 64)
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
# Gelu, GeGLU


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
# Half storage without cl_khr_fp16 (-DDL_HALF_IO=1: vload_half / vstore_half, ops/common/dl_storage.cl),
# which PoCL can run: inputs and outputs in half, arithmetic in float. The reference runs on the
# half-rounded inputs; one rounding of the output to half is ~5e-4 of its magnitude.
HALF_TOL = 1.5e-3


@pytest.fixture(scope="module")
def half_runner(launch, runner):
    return launch.Runner(runner.ctx, runner.device, half_io=True)


def halved(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


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
# Attention

ATTN_CASES = [
    # n, lq, lk, heads, dk, dv
    (2, 37, 19, 3, 5, 6),
    (1, 70, 77, 2, 40, 40),
]


@pytest.mark.parametrize("variant", ["partial_softmax", "flash"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "x".join(map(str, c)))
def test_attention(runner, launch, case, causal, variant):
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(lq * lk + causal)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    assert launch.attention_plan(dk, dv, variant, runner.local_mem).variant == variant
    o = runner.empty((n, lq, heads * dv))
    runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv,
                     scale, causal, variant)
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


@pytest.mark.parametrize(
    "case,variant",
    [
        ((1, 33, 45, 1, 130, 150), "partial_softmax"),  # Dk and Dv streamed in 2 chunks each
        ((1, 29, 41, 2, 72, 20), "flash"),  # flash beyond the auto limit (a hint honoured)
        ((2, 65, 9, 1, 7, 3), "auto"),
    ],
    ids=["partial-chunked", "flash-wide", "auto"],
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_head_sizes(runner, launch, case, variant, causal):
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(dk + dv)
    q = nonzero(r, (n, lq, heads * dk), 0.5)
    k = nonzero(r, (n, lk, heads * dk), 0.5)
    v = nonzero(r, (n, lk, heads * dv))
    scale = 0.3
    plan = launch.attention_plan(dk, dv, variant, runner.local_mem)
    if variant == "partial_softmax":
        assert plan.dc < dk and plan.dvc < dv
    o = runner.empty((n, lq, heads * dv))
    runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv,
                     scale, causal, variant)
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


def _attention_rows(runner, launch, q, k, v, o, n, lq, lk, heads, dk, dv, scale, causal, plan, rq):
    """The harness's launch of `plan` with AT_RQ=rq query rows per work-item (work-groups of
    bq / rq work-items, each owning bq rows), as attention_opencl.cc launches it."""
    opts = f"{plan.options(dk, dv)} -DAT_RQ={rq}"
    i32, f32 = np.int32, np.float32
    wg = plan.bq // rq
    items = launch.ceil_div(lq, plan.bq) * wg
    if plan.variant == "flash":
        runner.launch(runner.kernel("attention", "attn_flash", opts), (items, heads, n), (wg, 1, 1),
                      q, k, v, o, i32(lq), i32(lk), i32(heads), f32(scale), i32(causal))
        return
    stats = runner.scratch(8 * n * heads * lq, 0)
    chunks = launch.ceil_div(dv, plan.dvc)
    runner.launch(runner.kernel("attention", "attn_rowstats", opts), (items, heads, n), (wg, 1, 1),
                  q, k, stats, i32(lq), i32(lk), i32(heads), i32(dk), f32(scale), i32(causal))
    runner.launch(runner.kernel("attention", "attn_output", opts), (items, heads * chunks, n), (wg, 1, 1),
                  q, k, v, stats, o, i32(lq), i32(lk), i32(heads), i32(dk), i32(dv), f32(scale), i32(causal))


@pytest.mark.parametrize(
    "case,variant,rq",
    [
        ((2, 77, 300, 2, 40, 40), "flash", 2),  # SD 1.5 head sizes, ragged Lq / Lk
        ((1, 300, 77, 2, 40, 40), "flash", 4),
        ((1, 77, 300, 1, 80, 80), "flash", 2),
        ((1, 300, 77, 1, 160, 160), "flash", 1),
        ((1, 45, 30, 2, 5, 6), "flash", 4),  # head sizes not multiples of 4
        ((2, 37, 19, 1, 7, 3), "flash", 2),
        ((2, 77, 300, 2, 40, 40), "partial_softmax", 2),
        ((1, 300, 77, 1, 80, 80), "partial_softmax", 4),
        ((1, 77, 300, 1, 160, 160), "partial_softmax", 2),
        ((1, 300, 77, 1, 512, 512), "partial_softmax", 2),  # VAE head: Dk and Dv chunked
        ((1, 77, 300, 1, 512, 512), "partial_softmax", 1),
        ((1, 33, 45, 1, 130, 150), "partial_softmax", 2),  # chunks not multiples of 4
        ((2, 37, 19, 3, 5, 6), "partial_softmax", 4),
    ],
    ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c),
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_rows_per_item(runner, launch, case, variant, rq, causal):
    """Several query rows per work-item (AT_RQ) and float4 tiles with SD head sizes."""
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(dk * 7 + lq + rq)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    plan = launch.attention_plan(dk, dv, variant, min(runner.local_mem, 48 * 1024),  # H100-sized tiles
                                 kernel=FORCE[variant])
    assert plan.variant == variant
    o = runner.empty((n, lq, heads * dv))
    _attention_rows(runner, launch, runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads,
                    dk, dv, scale, causal, plan, rq)
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


def test_attention_auto_plan(launch):
    """auto: flash for small heads when the K/V tiles fit in half of local memory; wide heads take
    attn_wide on GPUs (tiled kernels) and the partial softmax on CPU-like devices (flat kernels)."""
    kb48 = 48 * 1024
    assert launch.attention_plan(40, 40, "auto", kb48).variant == "flash"  # SD 1.5, 320 channels
    assert launch.attention_plan(64, 64, "auto", kb48).variant == "flash"  # SD 2.x
    assert launch.attention_plan(80, 80, "auto", kb48).variant == "wide"
    # Heads up to 80 whose attn_flash spills nothing (the H100: 0 bytes at 80, 8 at 96) take flash.
    assert launch.attention_plan(80, 80, "auto", kb48, flash_in_registers=True).variant == "flash"
    assert launch.attention_plan(64, 80, "flash", kb48, flash_in_registers=True).variant == "flash"
    assert launch.attention_plan(96, 96, "auto", kb48, flash_in_registers=True).variant == "wide"
    assert launch.attention_plan(80, 80, "partial_softmax", kb48, flash_in_registers=True).variant == \
        "partial_softmax"
    assert launch.attention_plan(80, 80, "auto", kb48, flat=True, flash_in_registers=True).variant == \
        "partial_softmax"
    assert launch.attention_plan(160, 160, "auto", kb48).variant == "wide"
    assert launch.attention_plan(512, 512, "auto", kb48).variant == "wide"  # VAE
    assert launch.attention_plan(64, 64, "auto", 16 * 1024).variant == "partial_softmax"
    assert launch.attention_plan(160, 160, "flash", kb48).variant == "wide"  # wide heads: FlashAttention-2
    assert launch.attention_plan(40, 96, "flash", kb48).variant == "wide"
    assert launch.attention_plan(160, 160, "partial_softmax", kb48).variant == "partial_softmax"
    for d in (80, 160, 512):  # flat kernels (PoCL): as before attn_wide
        assert launch.attention_plan(d, d, "auto", kb48, flat=True).variant == "partial_softmax"
    assert launch.attention_plan(160, 160, "flash", kb48, flat=True).variant == "flash"
    assert launch.attention_plan(40, 40, "auto", kb48, flat=True).variant == "flash"
    # DIFFLITE_ATTN_KERNEL forces a kernel whatever the hint and device, or fails.
    assert launch.attention_plan(40, 40, "flash", kb48, kernel="wide").variant == "wide"
    assert launch.attention_plan(512, 512, "auto", kb48, kernel="partial").variant == "partial_softmax"
    assert launch.attention_plan(160, 160, "partial_softmax", kb48, kernel="flash").variant == "flash"
    with pytest.raises(ValueError):
        launch.attention_plan(512, 512, "auto", kb48, kernel="flash")  # K/V tiles of 512-wide heads
    for mem in (kb48, 32 * 1024, 16 * 1024):
        for d in (40, 64, 80, 160, 512):
            for flat in (False, True):
                p = launch.attention_plan(d, d, "auto", mem, flat=flat)
                assert p.local_bytes(d, d) <= mem


FORCE = {"flash": "flash", "partial_softmax": "partial", "wide": "wide"}  # plan variant -> kernel=


def test_attention_wide_plan(launch):
    """attn_wide's tiles: the first ladder entry that fits local memory, the work-group limit and the
    accumulator budget; the work-item layouts tile the score and output blocks."""
    plan = launch.attention_plan(512, 512, "auto", 48 * 1024)  # the VAE's head on an H100
    assert plan == launch.AttentionPlan("wide", bq=32, bk=64, dc=64, nt=256, vk=16, sx=16, ox=32)
    assert plan.local_bytes(512, 512) == 41472 and plan.wide_block(512) == (4, 4)  # 64 accumulators
    assert launch.attention_plan(512, 512, "auto", 32 * 1024).dc == 32  # second entry: 25088 bytes
    assert launch.attention_plan(512, 512, "auto", 16 * 1024).nt == 64  # last entry
    assert launch.attention_plan(160, 160, "auto", 48 * 1024).wide_block(160) == (1, 5)  # 40 float4s, 8 items
    assert launch.attention_plan(512, 512, "auto", 48 * 1024, max_wg=128).nt == 128
    with pytest.raises(ValueError):
        launch.attention_plan(2048, 2048, "auto", 48 * 1024, kernel="wide")  # accumulators over budget
    for mem in (48 * 1024, 32 * 1024, 16 * 1024, 1 << 20):
        for dk, dv in ((40, 40), (64, 96), (70, 66), (160, 160), (512, 512), (1024, 1024)):
            for p in launch.wide_plans(dk, dv, mem):
                rows, cols = p.wide_block(dv)
                assert p.local_bytes(dk, dv) <= mem and 4 * rows * cols <= launch.WIDE_MAX_ACC
                assert p.nt % p.sx == 0 and p.bq % (p.nt // p.sx) == 0 and p.bk % p.sx == 0
                assert p.nt % p.ox == 0 and rows * (p.nt // p.ox) == p.bq and p.bk % p.vk == 0
                assert cols * p.ox >= -(-dv // 4) and p.dc % 4 == 0 and p.dc <= 64


def _attention_wide(runner, launch, q, k, v, o, n, lq, lk, heads, dk, dv, scale, causal, plan):
    """attn_wide with the given tiles (another device's ladder entry), as attention_opencl.cc launches it."""
    i32, f32 = np.int32, np.float32
    runner.launch(runner.kernel("attention", "attn_wide", plan.options(dk, dv)),
                  (launch.ceil_div(lq, plan.bq) * plan.nt, heads, n), (plan.nt, 1, 1),
                  q, k, v, o, i32(lq), i32(lk), i32(heads), f32(scale), i32(causal))


WIDE_CASES = [
    # n, lq, lk, heads, dk, dv: Lq and Lk not multiples of the blocks (32 rows, 64 keys)
    (2, 77, 100, 1, 40, 40),
    (2, 257, 77, 2, 40, 40),
    (2, 100, 257, 2, 160, 160),  # 5 key blocks: the running max is rescaled
    (2, 257, 100, 1, 160, 160),
    (2, 77, 257, 1, 512, 512),  # the VAE's head width
    (2, 100, 77, 2, 512, 512),
    (2, 77, 100, 2, 64, 96),  # Dk != Dv
    (2, 45, 70, 3, 70, 66),  # head sizes not multiples of 4
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "x".join(map(str, c)))
def test_attention_wide(runner, launch, case, causal):
    """attn_wide through the harness (kernel="wide", DIFFLITE_ATTN_KERNEL's mirror)."""
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(lq * lk + dk + causal)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    assert launch.attention_plan(dk, dv, "auto", runner.local_mem, kernel="wide").variant == "wide"
    o = runner.empty((n, lq, heads * dv))
    runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv, scale,
                     causal, kernel="wide")
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


@pytest.mark.parametrize("entry", [0, 1, 2, 3])
@pytest.mark.parametrize("case", [(2, 100, 257, 2, 160, 160), (2, 77, 100, 2, 64, 96), (1, 70, 130, 1, 512, 512)],
                         ids=lambda c: "x".join(map(str, c)))
def test_attention_wide_ladder(runner, launch, case, entry):
    """Every attn_wide ladder entry (the tiles of 48, 32 and 16 KB devices), causal."""
    n, lq, lk, heads, dk, dv = case
    plans = launch.wide_plans(dk, dv, 1 << 20)
    assert len(plans) == len(launch.WIDE_LADDER)
    r = np.random.default_rng(entry + dv)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    o = runner.empty((n, lq, heads * dv))
    _attention_wide(runner, launch, runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads,
                    dk, dv, scale, True, plans[entry])
    ref = attention_ref(q, k, v, heads, scale, True)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


def qkv_inputs(r, n, lq, lk, heads, dk, dv):
    """Random q [n, lq, heads*dk], k [n, lk, heads*dk] (scale 1.5) and v [n, lk, heads*dv], no zeros."""
    return (nonzero(r, (n, lq, heads * dk), 1.5), nonzero(r, (n, lk, heads * dk), 1.5),
            nonzero(r, (n, lk, heads * dv)))


def large_logit_inputs(r, n, lq, lk, heads, dk, dv):
    """q, k, v whose logits reach ~300 in a few rows (exp overflows float32 past ~88, so a softmax that
    does not subtract the running max returns inf/NaN) and ~30 in others."""
    q = nonzero(r, (n, lq, heads * dk))
    k = nonzero(r, (n, lk, heads * dk))
    v = nonzero(r, (n, lk, heads * dv))
    q[:, 5] *= 300.0
    q[:, lq // 2] *= 30.0
    q[:, lq - 1] *= -200.0
    return q, k, v


@pytest.mark.parametrize("kernel", ["wide", "flash", "partial"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", [(2, 77, 257, 2, 40, 40), (2, 100, 77, 1, 160, 160), (2, 77, 100, 1, 512, 512)],
                         ids=lambda c: "x".join(map(str, c)))
def test_attention_large_logits(runner, launch, case, causal, kernel):
    """Every kernel keeps a running max: rows with huge logits stay finite and exact. Where a forced
    flash kernel's smallest key tile does not fit the device's local memory (512-wide heads in the
    H100's 48 KB; PoCL has more), it is refused, as the library refuses the node."""
    n, lq, lk, heads, dk, dv = case
    q, k, v = large_logit_inputs(np.random.default_rng(dk), n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    s = np.einsum("nid,njd->nij", q[..., :dk].astype(np.float64), k[..., :dk]) * scale
    assert np.abs(s).max() > 150  # the test's premise
    o = runner.empty((n, lq, heads * dv))
    smallest_flash = launch.AttentionPlan("flash", bq=launch.FLASH_ROWS, bk=16, kc=8)
    if kernel == "flash" and smallest_flash.local_bytes(dk, dv) > runner.local_mem:
        with pytest.raises(ValueError, match="attn_flash does not fit"):
            runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv,
                             scale, causal, kernel=kernel)
        return
    runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv, scale,
                     causal, kernel=kernel)
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL


# Split keys (attn_flash with AT_SPLIT + attn_merge). H100 numbers: 132 compute units, 48 KB of local
# memory, work-groups of up to 1024.
H100 = {"local_mem_bytes": 48 * 1024, "max_wg": 1024, "compute_units": 132}


def test_attention_split_plan(launch):
    """The split rule (attention_opencl.cc: PickSplits, mirrored by attention_plan): SD 1.5's 4096 x 4096,
    8 x 40 self-attention launches 16384 work-items at batch 1 (too few for 132 compute units: splits
    in 2, 32768 items) and 32768 at batch 2 (kept whole)."""
    def plan(dk=40, variant="auto", shape=(1, 4096, 4096, 8), causal=False, flat=False, **kw):
        mem, wg, cus = H100["local_mem_bytes"], H100["max_wg"], H100["compute_units"]
        return launch.attention_plan(dk, dk, variant, mem, flat=flat, max_wg=wg, shape=shape, causal=causal,
                                     compute_units=cus, **kw)

    p = plan()
    assert (p.variant, p.bq, p.work_group(40, 40)) == ("flash", 256, 128)  # 16 x 8 x 128 = 16384 items
    assert p.splits == 2 and 16384 * 2 <= 132 * launch.SPLIT_ITEMS_PER_CU < 16384 * 4
    assert p.options(40, 40).endswith(" -DAT_RQ=2 -DAT_SPLIT=2")
    assert p.split_bytes(1, 4096, 8, 40) == 4 * 2 * 4096 * 8 * 42
    assert plan(shape=(2, 4096, 4096, 8)).splits == 1  # 32768 items: split, they would exceed the target
    assert plan(shape=(1, 1024, 4096, 8)).splits == 4  # 4096 items: 4 splits of 1024 keys
    assert plan(shape=(1, 1024, 1023, 8)).splits == 2  # fewer than 4 x 256 keys
    assert plan(shape=(1, 4096, 511, 8)).splits == 1  # fewer than 2 x 256 keys
    assert plan(shape=(1, 4096, 77, 8)).splits == 1  # cross-attention
    assert plan(causal=True).splits == 1
    assert plan(flat=True).splits == 1  # CPU-like devices split only when forced
    assert plan(dk=64, shape=(1, 9216, 9216, 5)).splits == 1  # SD 2.x at 768: 46080 items (AT_RQ=1)
    assert plan(dk=80).variant == "wide" and plan(dk=80).splits == 1  # wide heads never split
    assert plan(variant="partial_softmax").splits == 1
    # DIFFLITE_ATTN_SPLITS: forced on any device, still never causal and clamped to 256 keys a split.
    assert plan(splits=4).splits == 4 and plan(splits=1).splits == 1
    assert plan(shape=(2, 4096, 4096, 8), splits=2, flat=True).splits == 2
    assert plan(shape=(1, 64, 1000, 1), splits=4).splits == 2
    assert plan(shape=(1, 64, 300, 1), splits=4).splits == 1
    assert plan(splits=4, causal=True).splits == 1
    assert plan(dk=80, splits=4).splits == 1 and plan(variant="partial_softmax", splits=2).splits == 1
    for bad in (3, 8, 0):
        with pytest.raises(ValueError):
            plan(splits=bad)
    assert launch.attention_plan(40, 40, "auto", 48 * 1024).splits == 1  # no shape: no split


def test_attention_split_plan_mirrors_cxx(launch):
    src = (ROOT / "custom_ops" / "ops" / "attention" / "attention_opencl.cc").read_text()
    for name, value in (("kSplitItemsPerCu", launch.SPLIT_ITEMS_PER_CU), ("kMinSplitKeys", launch.MIN_SPLIT_KEYS),
                        ("kMaxSplits", launch.MAX_SPLITS), ("kSplitSlot", launch.SPLIT_SLOT),
                        ("kMergeGroup", launch.MERGE_WG)):
        m = re.search(rf"\b{name}\s*=\s*(\d+)", src)
        assert m and int(m.group(1)) == value, name
    assert 'for (const char* k : {"1", "2", "4"})' in src and launch.ATTN_SPLITS == (1, 2, 4)
    assert "while (most > 1 && s.lk < static_cast<int64_t>(kMinSplitKeys) * most) most /= 2;" in src
    assert "while (splits > 1 && s.items * splits > target) splits /= 2;" in src
    assert "(sizeof(cl_float2) + storage_bytes_ * static_cast<size_t>(dv_))" in src  # SplitBytes


def _poison_scratch(runner, nbytes: int, slot: int) -> None:
    import pyopencl as cl

    cl.enqueue_copy(runner.queue, runner.scratch(nbytes, slot), np.full(max(1, nbytes // 4), np.nan, np.float32))


def _attention_split_case(runner, launch, case, causal, seed, splits=None, plan=None, inputs=None):
    """Harness attention with forced `splits` (or a given plan), scratch poisoned; (rel err, events)."""
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(seed)
    if inputs is None:
        q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    else:
        q, k, v = inputs
    scale = 1.0 / math.sqrt(dk)
    _poison_scratch(runner, 4 * 4 * n * lq * heads * (dv + 2), launch.SPLIT_SLOT)
    o = runner.empty((n, lq, heads * dv))
    events = runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv,
                              scale, causal, "flash", splits=splits, plan=plan)
    ref = attention_ref(q, k, v, heads, scale, causal)
    return rel_err(runner.download(o, ref.shape), ref), events


SPLIT_CASES = [
    # n, lq, lk, heads, dk, dv, forced splits -> splits the rule keeps
    ((1, 70, 1027, 2, 40, 40), 4, 4),  # 256/257 keys a split, tiles of 64 straddling the splits
    ((2, 37, 601, 3, 5, 6), 2, 2),  # odd key count, head sizes not multiples of 4
    ((2, 300, 777, 2, 40, 40), 2, 2),  # two row blocks of 256
    ((1, 45, 1100, 1, 64, 24), 4, 4),  # Dk != Dv
    ((1, 70, 1000, 2, 40, 40), 4, 2),  # 250 keys a split: clamped to 2
    ((2, 37, 300, 3, 5, 6), 2, 1),  # 150 keys a split: refused, the unsplit kernel runs
]


@pytest.mark.parametrize("case,forced,want", SPLIT_CASES, ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple)
                         else str(c))
def test_attention_split(runner, launch, case, forced, want):
    """Forced splits (DIFFLITE_ATTN_SPLITS's mirror) match NumPy; the clamp leaves 256 keys a split."""
    n, lq, lk, heads, dk, dv = case
    plan = launch.attention_plan(dk, dv, "flash", runner.local_mem, flat=True, max_wg=runner.max_wg,
                                 shape=(n, lq, lk, heads), compute_units=runner.compute_units, splits=forced)
    assert plan.variant == "flash" and plan.splits == want
    err, events = _attention_split_case(runner, launch, case, False, lk + forced, splits=forced)
    assert err < TOL
    assert len(events) == (2 if want > 1 else 1)  # attn_flash (+ attn_merge)


@pytest.mark.parametrize("splits", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", [(2, 45, 3, 2, 40, 40), (1, 70, 130, 2, 5, 6), (2, 77, 257, 1, 40, 40)],
                         ids=lambda c: "x".join(map(str, c)))
def test_attention_split_kernel(runner, launch, case, causal, splits):
    """The split kernel and attn_merge as launched with any split count, past the rule: splits with no
    key (Lk = 3: l = 0, left out of the merge), few keys, and causal rows whose later splits see none."""
    _, lq, _, _, dk, dv = case
    base = launch.attention_plan(dk, dv, "flash", runner.local_mem, flat=True, kernel="flash", max_wg=runner.max_wg)
    plan = launch.replace(base, splits=splits)
    err, events = _attention_split_case(runner, launch, case, causal, lq + splits, plan=plan)
    assert err < TOL and len(events) == 2


@pytest.mark.parametrize("splits", [2, 4])
def test_attention_split_large_logits(runner, launch, splits):
    """The merge rescales each split by exp2(m_s - M): rows whose logits reach ~300 stay finite and exact."""
    case = (2, 77, 1100, 2, 40, 40)
    q, k, v = large_logit_inputs(np.random.default_rng(splits), *case)
    err, events = _attention_split_case(runner, launch, case, False, 0, splits=splits, inputs=(q, k, v))
    assert err < TOL and len(events) == 2


# ---------------------------------------------------------------------------
# Winograd F(4x4, 3x3)


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
# The Python plans mirror the C++ host code


def _cxx_constant(path: Path, name: str) -> int:
    m = re.search(rf"\b{name}\s*=\s*(\d+)", path.read_text())
    assert m, f"{name} not found in {path}"
    return int(m.group(1))


def test_large_tile_only_unspilled(runner, launch):
    """A GEMM of 2^30 multiply-adds gets the 128x128 tile only where its kernel spills nothing
    (PickTile): PoCL reports private memory for every kernel, so it gets the 64x64 tile; where the
    report is 0 (the H100) the 128x128 one."""
    big = launch.LARGE_TILE_MACS
    assert launch.gemm_tiles(1024, 1024, big)[0] == launch.GemmTile(128, 128, 16, 8, 8, True, True)
    kernel, tile = runner.gemm_kernel(1024, 1024, True, True, macs=big)
    spills = runner.private_bytes(runner._cached_kernel(launch.GEMM_CL, "gemm",
                                                        launch.gemm_tiles(1024, 1024, big)[0].options(True, True)))
    assert (tile.tm, tile.wm) == ((64, 4) if spills else (128, 8)), (spills, tile)


def test_plans_mirror_cxx(launch):
    ops = ROOT / "custom_ops" / "ops"
    gn = (ops / "group_norm" / "group_norm_opencl.cc").read_text()
    assert "CeilDiv(4 * std::max<int64_t>(1, cus), blocks)" in gn  # PlanCols: fill the device 4x
    assert "if (cgv * d >= kColsMinWidth) break;" in gn and "cgv % p.xb != 0 || cgv / p.xb > limit" in gn
    for name, value in (("kOneGroup", launch.GN_ONE_WG), ("kOneMinGroup", launch.GN_ONE_MIN_WG),
                        ("kOneUnroll", launch.GN_UNROLL), ("kColsGroup", launch.COLS_GROUP),
                        ("kColsMinWidth", launch.COLS_MIN_WIDTH), ("kStatsRows", launch.STATS_ROWS),
                        ("kApplyRows", launch.APPLY_ROWS), ("kMaxPartials", launch.MAX_PARTIALS),
                        ("kCoopGroup", launch.COOP_GROUP), ("kCoopMaxFloats", launch.COOP_MAX_FLOATS),
                        ("kCoopSpinLimit", launch.COOP_SPIN_LIMIT), ("kCoopGroupsPerCu", launch.COOP_GROUPS_PER_CU),
                        ("kCoopMaxChunks", launch.COOP_MAX_CHUNKS), ("kCoopMaxGather", launch.COOP_MAX_GATHER),
                        ("kRowsGroup", launch.ROWS_GROUP), ("kRowsWidth", launch.ROWS_WIDTH),
                        ("kRowsMaxVectors", launch.ROWS_MAX_VECTORS)):
        assert _cxx_constant(ops / "group_norm" / "group_norm_opencl.cc", name) == value, name
    assert "if (coop_chunks <= kCoopMaxChunks) return Plan::kCoop;" in gn  # PickPlan
    assert "  if (flat) return Plan::kSplit;\n  if (rows) return Plan::kRows;\n" in gn  # PickPlan
    assert "if (groups != 1 || spatial != 1 || c % 4 != 0) return p;" in gn  # PlanRows
    assert "while (p.lx < cv && p.lx * 2 <= std::min(kRowsWidth, limit)) p.lx *= 2;" in gn
    assert "if (CeilDiv(cv, p.lx) > kRowsMaxVectors) return p;" in gn
    assert "n * groups >= static_cast<int64_t>(cus) || group_elems <= kOneMaxGroupElems ? Plan::kOne" in gn
    assert _cxx_constant(ops / "group_norm" / "group_norm_opencl.cc", "kOneMaxGroupElems") == \
        launch.ONE_MAX_GROUP_ELEMS
    assert "std::min<int64_t>({want, spatial, std::max(1, kCoopMaxGather * p.lx * p.ly / p.gpw)})" in gn  # PlanCoop
    assert '" -DGN_PARTS=" + std::to_string(gpw * k)' in gn  # CoopPlan::Options
    assert "(d * cg) % sector_elems == 0" in gn  # CoopBlock
    assert "* kOneUnroll * vw_ > group_elems" in gn  # InitOne
    assert _cxx_constant(ops / "attention" / "attention_opencl.cc", "kFlashMaxHead") == launch.FLASH_MAX_HEAD
    assert _cxx_constant(ops / "attention" / "attention_opencl.cc", "kFlashItemMaxHead") == \
        launch.FLASH_ITEM_MAX_HEAD
    src = (ops / "attention" / "attention_opencl.cc").read_text()
    ladder = "{" + ", ".join("{" + ", ".join(map(str, t)) + "}" for t in launch.PARTIAL_LADDER) + "}"
    assert ladder in src, f"PlanPartial's ladder differs from {ladder}"
    assert "Chunk(dk, o[3])" in src and "Chunk(dv, o[0])" in src
    assert "bq = 64, bk = 32, kc = 8" in src  # Plan's defaults (the "auto" flash local-memory check)
    assert _cxx_constant(ops / "attention" / "attention_opencl.cc", "kFlashRows") == launch.FLASH_ROWS
    assert "for (int bk : {64, 32, 16})" in src  # PlanFlash's key tiles
    wide = "{" + ", ".join("{" + ", ".join(map(str, t)) + "}" for t in launch.WIDE_LADDER) + "}"
    assert f"kWideLadder[4][5] = {wide};" in src, f"kWideLadder differs from {wide}"
    assert _cxx_constant(ops / "attention" / "attention_opencl.cc", "kWideMaxAcc") == launch.WIDE_MAX_ACC
    assert "w.dc = Round4(Chunk(dk, o[3]));" in src and "sx = nt / (bq < 16 ? bq : 16);" in src  # PlanWide
    assert "pad < best_pad || (pad == best_pad && side < best_side)" in src  # PickWideLayout
    assert 'for (const char* k : {"wide", "flash", "partial"})' in src  # DIFFLITE_ATTN_KERNEL values
    assert set(launch.ATTN_KERNELS) == {"wide", "flash", "partial"}
    # Winograd's GEMM: builtin::Gemm with gemm.cc's tile candidates.
    gemm = (ROOT / "custom_ops" / "builtins" / "matmul" / "gemm.cc").read_text()
    wanted = ["if (macs >= kLargeTileMacs && m > 64 && n > 64) configs.push_back({128, 128, 16, 8, 8, true, true});",
              "if (m > 32 && n > 32) configs.push_back({64, 64, 16, 4, 4, true});",
              "const int64_t macs = static_cast<int64_t>(batches_) * s_.m * s_.n * s_.k;"]
    wanted += [
              "configs.push_back({32, 32, 16, 4, 4, true});", "configs.push_back({16, 16, 16, 2, 2});"]
    assert all(line in gemm for line in wanted)
    assert "if (c.unspilled_only && KernelPrivateBytes(ctx, k) != 0) {" in \
        (ROOT / "custom_ops" / "builtins" / "matmul" / "gemm.h").read_text()  # PickTile
    assert _cxx_constant(ROOT / "custom_ops" / "builtins" / "matmul" / "gemm.h", "kLargeTileMacs") == \
        launch.LARGE_TILE_MACS
    big = launch.LARGE_TILE_MACS
    assert [launch.gemm_tiles(65, 65, big)[0], launch.gemm_tiles(64, 65, big)[0], launch.gemm_tiles(33, 33, big - 1)[0],
            *launch.gemm_tiles(32, 33, big)] == [
        launch.GemmTile(128, 128, 16, 8, 8, True, True), launch.GemmTile(64, 64, 16, 4, 4, True),
        launch.GemmTile(64, 64, 16, 4, 4, True), launch.GemmTile(32, 32, 16, 4, 4, True),
        launch.GemmTile(16, 16, 16, 2, 2, False)]
    wino = (ops / "winograd_conv3x3" / "winograd_conv3x3_opencl.cc").read_text()
    # the harness runs the transformed form: U is the op's input 1 (the filter form's is wino_filter's
    # scratch, tested through the library below)
    assert "cl_mem u = in[1].mem;" in wino and "gemm_.Run(ctx, v, u, nullptr, m," in wino


def test_every_program_builds_with_base_options(runner, launch):
    """Each .cl builds standalone with only the backend's options (as the program cache does)."""
    import pyopencl as cl

    files = sorted((ROOT / "custom_ops" / "ops").glob("*/*.cl"))
    assert {f.stem for f in files} >= {"group_norm", "gelu", "geglu", "attention", "winograd_conv3x3"}
    for f in files:
        cl.Program(runner.ctx, launch.cl_source(f)).build(options=["-DDL_T=float", "-DDL_T4=float4"])


# ---------------------------------------------------------------------------
# The same ops through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


def _run_delegate(tmp_path, lib, code, attrs, inputs, out_shape, feeds, stats=False, kernels="auto", profile=0,
                  **extra):
    import gc

    from support.oplib_helpers import run_tflite, single_op_model

    path = single_op_model(tmp_path / "op.tflite", code, attrs, inputs, out_shape)
    options = {"backend": "opencl", "kernels": kernels, **extra}
    if profile:
        options["profile"] = str(profile)
    stats_path = tmp_path / "stats.json"
    if stats:
        options["stats_path"] = str(stats_path)
    (out,) = run_tflite(path, lib, feeds, options=options)
    gc.collect()  # the interpreter and its delegate go (the backend writes stats_path then)
    if not stats:
        return out, None
    import json

    assert stats_path.exists(), "backend=opencl wrote no stats_path file"
    return out, json.loads(stats_path.read_text())


def test_delegate_group_norm(tmp_path, opencl_lib):
    r = np.random.default_rng(11)
    for shape, groups, act in (((2, 5, 7, 24), 8, "silu"), ((1, 48, 45, 40), 4, "none"), ((2, 13, 30), 5, "silu")):
        c = shape[-1]
        x = nonzero(r, shape, 2.0, 1.0)
        gamma, beta = nonzero(r, (c,), 1.5), nonzero(r, (c,), 0.5)
        out, _ = _run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
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
        out, stats = _run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
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
        out, stats = _run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
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
        out, stats = _run_delegate(tmp_path, opencl_lib, "difflite.GroupNorm",
                                   {"groups": groups, "epsilon": 1e-5, "activation": "silu"},
                                   [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], shape, [x],
                                   stats=True)
        assert rel_err(out, group_norm_ref(x, gamma, beta, groups, 1e-5, "silu")) < TOL, plan
        assert stats["scratch_bytes"] == 0, (plan, stats)
        weights[plan] = stats["weights_bytes"]
    extra = weights["coop"] - weights["one"]
    assert extra > 0 and extra % (16 * 2 * groups) == 0, weights


def test_delegate_gelu_geglu(tmp_path, opencl_lib):
    r = np.random.default_rng(12)
    x = nonzero(r, (3, 5, 67), 4.0)
    for mode in ("erf", "tanh", "sigmoid"):
        out, _ = _run_delegate(tmp_path, opencl_lib, "difflite.Gelu", {"approximate": mode}, [("x", x, False)],
                               x.shape, [x])
        assert rel_err(out, gelu_ref(x, mode)) < TOL, mode
    x = nonzero(r, (7, 26), 3.0)
    out, _ = _run_delegate(tmp_path, opencl_lib, "difflite.GeGLU", {"approximate": "tanh"}, [("x", x, False)],
                           (7, 13), [x])
    assert rel_err(out, x[:, :13].astype(np.float64) * gelu_ref(x[:, 13:], "tanh")) < TOL


@pytest.mark.parametrize("variant", ["auto", "flash", "partial_softmax"])
def test_delegate_attention(tmp_path, opencl_lib, variant):
    r = np.random.default_rng(13)
    n, lq, lk, heads, dk, dv = 2, 37, 19, 3, 5, 6
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    for causal in (False, True):
        out, stats = _run_delegate(
            tmp_path, opencl_lib, "difflite.Attention", {"heads": heads, "scale": 0.4, "causal": causal,
                                                    "variant": variant},
            [("q", q, False), ("k", k, False), ("v", v, False)], (n, lq, heads * dv), [q, k, v], stats=True)
        assert rel_err(out, attention_ref(q, k, v, heads, 0.4, causal)) < TOL, causal
        assert stats.get("nodes_claimed") == 1, stats
        # Only the partial softmax asks for scratch (the [N,H,Lq] row statistics); auto picks flash here.
        want_scratch = 8 * n * heads * lq if variant == "partial_softmax" else 0
        assert stats.get("scratch_bytes") == want_scratch, stats


def _delegate_attention(tmp_path, lib, q, k, v, heads, scale, causal, variant="auto", kernels="auto", **extra):
    """One difflite.Attention through the library: (output, stats, the attention kernels that ran)."""
    n, lq = q.shape[:2]
    dv = v.shape[2] // heads
    out, stats = _run_delegate(
        tmp_path, lib, "difflite.Attention", {"heads": heads, "scale": scale, "causal": causal, "variant": variant},
        [("q", q, False), ("k", k, False), ("v", v, False)], (n, lq, heads * dv), [q, k, v], stats=True,
        kernels=kernels, profile=2, **extra)
    assert stats.get("nodes_claimed") == 1, stats
    ran = {key.rsplit(" ", 1)[-1] for key in stats["profile_ms_per_invoke"] if key.startswith("difflite.Attention")}
    return out, stats, ran


HALF_TOL = 5e-3  # half storage of q, k, v and o (and half products with half arithmetic)


RAN = {("flash", ""): {"attention.flash"}, ("flash", "2"): {"attention.flash_split", "attention.merge"},
       ("partial", ""): {"attention.rowstats", "attention.output"}, ("wide", ""): {"attention.wide"}}


@pytest.mark.parametrize("kernel,splits", sorted(RAN))
def test_delegate_attention_fp16(tmp_path, opencl_lib, monkeypatch, kernel, splits):
    """Attention at precision=fp16 (SD's head size 40), every kernel. On a device with cl_khr_fp16
    attn_flash and the partial softmax multiply in half (math=auto): their output then differs
    from math=fp32's. The fp16 lane (tests/test_fp16_device.py) runs this on such a device."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", kernel)
    monkeypatch.setenv("DIFFLITE_ATTN_SPLITS", splits)
    n, lq, lk, heads, dk, dv = 2, 77, 520, 2, 40, 40  # 2 splits of >= 256 keys
    q, k, v = qkv_inputs(np.random.default_rng(lq + len(kernel)), n, lq, lk, heads, dk, dv)
    want = attention_ref(*(x.astype(np.float16).astype(np.float32) for x in (q, k, v)), heads, 0.3, False)
    outs = {}
    for math in ("fp32", "auto"):
        out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, False,
                                              precision="fp16", math=math)
        assert stats["storage"] == "float16", stats
        assert ran == RAN[kernel, splits], ran
        assert rel_err(out, want) < HALF_TOL, (math, rel_err(out, want))
        if splits:  # float32 twins of the inputs and output, and the split partials: each row's
            # (max, sum) in float, the partial row in half
            staging = 4 * (q.size + k.size + v.size + out.size)
            assert stats["scratch_bytes"] == staging + int(splits) * n * lq * heads * (8 + 2 * dv), stats
        outs[math] = (out, stats["arithmetic"])
    expected = os.environ.get("DIFFLITE_EXPECT_ARITHMETIC")
    if expected:
        assert outs["auto"][1] == expected, outs["auto"][1]
    if outs["auto"][1] == "float16" and kernel != "wide":  # attn_wide computes in float
        assert not np.array_equal(outs["auto"][0], outs["fp32"][0]), f"{kernel} ran float arithmetic"
    elif outs["auto"][1] == "float32":
        assert np.array_equal(outs["auto"][0], outs["fp32"][0]), "float arithmetic either way"


@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda c: "x".join(map(str, c)))
def test_delegate_attention_wide(tmp_path, opencl_lib, monkeypatch, case):
    """DIFFLITE_ATTN_KERNEL=wide forces attn_wide (on PoCL too): the C++ plan and launch, no scratch."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "wide")
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(lq + lk + dv)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    for causal in (False, True):
        out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, causal)
        assert rel_err(out, attention_ref(q, k, v, heads, 0.3, causal)) < TOL, causal
        assert ran == {"attention.wide"} and stats.get("scratch_bytes") == 0, (ran, stats)
    q, k, v = large_logit_inputs(r, n, lq, lk, heads, dk, dv)
    out, _, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 1.0 / math.sqrt(dk), True)
    assert rel_err(out, attention_ref(q, k, v, heads, 1.0 / math.sqrt(dk), True)) < TOL
    assert ran == {"attention.wide"}


@pytest.mark.parametrize("env,dk,dv,variant,kernels,want", [
    (None, 80, 80, "auto", "tiled", "wide"),  # a wide head on a GPU-style device
    (None, 40, 96, "flash", "tiled", "wide"),
    (None, 80, 80, "partial_softmax", "tiled", "partial"),
    (None, 40, 40, "auto", "tiled", "flash"),
    (None, 80, 80, "auto", "auto", "partial"),  # PoCL (flat kernels): as before attn_wide
    (None, 80, 80, "flash", "auto", "flash"),
    ("flash", 80, 80, "partial_softmax", "tiled", "flash"),
    ("partial", 40, 40, "flash", "tiled", "partial"),
    ("wide", 40, 40, "partial_softmax", "auto", "wide"),
])
def test_delegate_attention_plan(tmp_path, opencl_lib, runner, launch, monkeypatch, env, dk, dv, variant, kernels, want):
    """The kernel the library picks (attention_opencl.cc's rule, DIFFLITE_ATTN_KERNEL) is the one the
    harness's attention_plan picks, and computes the same function. `want` is PoCL's (CI's) pick; on a
    GPU (benchmarks/device_opencl_tests.sh) its local memory and registers may pick another, which the
    library must then run."""
    if env is None:
        monkeypatch.delenv("DIFFLITE_ATTN_KERNEL", raising=False)
    else:
        monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", env)
    plan = launch.attention_plan(dk, dv, variant, runner.local_mem, flat=kernels == "auto" and runner.flat,
                                 kernel=env, max_wg=runner.max_wg,  # kernels=auto is flat on a CPU device
                                 flash_in_registers=runner.flash_in_registers(dk, dv))
    if runner.flat:
        assert FORCE[plan.variant] == want
    want = FORCE[plan.variant]
    n, lq, lk, heads = 2, 37, 70, 2
    r = np.random.default_rng(dk + dv)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, True, variant, kernels)
    assert rel_err(out, attention_ref(q, k, v, heads, 0.3, True)) < TOL
    labels = {"wide": {"attention.wide"}, "flash": {"attention.flash"},
              "partial": {"attention.rowstats", "attention.output"}}
    assert ran == labels[want], (ran, stats)
    assert stats.get("scratch_bytes") == (8 * n * heads * lq if want == "partial" else 0), stats


def test_delegate_attention_bad_kernel_env(tmp_path, opencl_lib, monkeypatch):
    """An unknown DIFFLITE_ATTN_KERNEL refuses the node; TFLite cannot run it, so loading fails
    with the node's reason."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "fastest")
    q = nonzero(np.random.default_rng(0), (1, 5, 8))
    with pytest.raises(RuntimeError, match="unresolved custom op: difflite.Attention") as failure:
        _delegate_attention(tmp_path, opencl_lib, q, q, q, 1, 0.3, False)
    assert "(difflite.Attention) cannot run on the OpenCL backend" in str(failure.value)


SPLIT_LABELS = {"attention.flash_split", "attention.merge"}


@pytest.mark.parametrize("case,forced,want", SPLIT_CASES + [((1, 70, 1027, 2, 40, 40), 1, 1)],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_delegate_attention_split(tmp_path, opencl_lib, monkeypatch, case, forced, want):
    """DIFFLITE_ATTN_SPLITS forces flash's key splits in the library (on PoCL too): the C++ plan (the
    256-keys clamp as attention_plan has it), launch, merge and scratch; causal never splits."""
    monkeypatch.setenv("DIFFLITE_ATTN_SPLITS", str(forced))
    monkeypatch.delenv("DIFFLITE_ATTN_KERNEL", raising=False)
    n, lq, lk, heads, dk, dv = case
    r = np.random.default_rng(lk + dv + forced)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    for causal in (False, True):
        out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, causal, "flash")
        assert rel_err(out, attention_ref(q, k, v, heads, 0.3, causal)) < TOL, causal
        splits = 1 if causal else want
        assert ran == (SPLIT_LABELS if splits > 1 else {"attention.flash"}), (causal, ran)
        assert stats.get("scratch_bytes") == (4 * splits * n * lq * heads * (dv + 2) if splits > 1 else 0), stats


def test_delegate_attention_split_only_flash(tmp_path, opencl_lib, monkeypatch):
    """Forced splits leave the partial softmax and attn_wide alone."""
    monkeypatch.setenv("DIFFLITE_ATTN_SPLITS", "4")
    n, lq, lk, heads, dk, dv = 1, 37, 1100, 2, 40, 40
    r = np.random.default_rng(21)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    for kernel, labels in (("partial", {"attention.rowstats", "attention.output"}), ("wide", {"attention.wide"})):
        monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", kernel)
        out, _, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, False)
        assert rel_err(out, attention_ref(q, k, v, heads, 0.3, False)) < TOL, kernel
        assert ran == labels, (kernel, ran)


@pytest.mark.parametrize("case", [(1, 70, 1027, 1, 40, 40), (1, 70, 1027, 4, 40, 40), (2, 300, 600, 2, 40, 40),
                                  (1, 70, 300, 1, 40, 40)], ids=lambda c: "x".join(map(str, c)))
def test_delegate_attention_split_auto(tmp_path, opencl_lib, runner, launch, monkeypatch, case):
    """Unforced, kernels=tiled (the GPUs' rule) on PoCL's compute units: the library splits as
    attention_plan says (a launch of one 128-item work-group splits on any device), and is exact."""
    monkeypatch.delenv("DIFFLITE_ATTN_SPLITS", raising=False)
    monkeypatch.delenv("DIFFLITE_ATTN_KERNEL", raising=False)
    n, lq, lk, heads, dk, dv = case
    plan = launch.attention_plan(dk, dv, "auto", runner.local_mem, max_wg=runner.max_wg, shape=(n, lq, lk, heads),
                                 compute_units=runner.compute_units)
    assert plan.variant == "flash"
    if case == (1, 70, 1027, 1, 40, 40):
        assert plan.splits > 1  # the premise: this test sees a split
    r = np.random.default_rng(lk + heads)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, False, "auto", "tiled")
    assert rel_err(out, attention_ref(q, k, v, heads, 0.3, False)) < TOL
    assert ran == (SPLIT_LABELS if plan.splits > 1 else {"attention.flash"}), (plan.splits, ran)
    assert stats.get("scratch_bytes") == plan.split_bytes(n, lq, heads, dv), (plan.splits, stats)


@pytest.mark.parametrize("value", ["3", "two", "8"])
def test_delegate_attention_bad_splits_env(tmp_path, opencl_lib, monkeypatch, value):
    """DIFFLITE_ATTN_SPLITS other than 1, 2, 4 refuses the node, whatever kernel it would run."""
    monkeypatch.setenv("DIFFLITE_ATTN_SPLITS", value)
    monkeypatch.delenv("DIFFLITE_ATTN_KERNEL", raising=False)
    q = nonzero(np.random.default_rng(0), (1, 5, 8))
    with pytest.raises(RuntimeError, match="unresolved custom op: difflite.Attention") as failure:
        _delegate_attention(tmp_path, opencl_lib, q, q, q, 1, 0.3, False, "partial_softmax")
    assert "(difflite.Attention) cannot run on the OpenCL backend" in str(failure.value)


def _delegate_winograd(tmp_path, oplib, r, n, h, w, cin, cout, kernels, form="transformed"):
    """One WinogradConv3x3 through the delegate, checked against a direct 3x3 conv; its stats.
    form "filter": the op's weight is the 3x3 filter itself (OHWI), which the kernels transform."""
    x = nonzero(r, (n, h, w, cin))
    wt = nonzero(r, (cout, cin, 3, 3), 0.5)
    bias = nonzero(r, (cout,))
    weight = winograd_ref.transform_weights(wt) if form == "transformed" else np.ascontiguousarray(
        wt.transpose(0, 2, 3, 1))
    out, stats = _run_delegate(tmp_path, oplib, "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
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


def test_include_is_expanded_once(launch, tmp_path):
    """`#include "NAME.cl"` pulls in custom_ops' NAME.cl once per program (as runtime.cc does);
    GELU and GeGLU share gelu_math.cl that way."""
    for op in ("gelu", "geglu"):
        text = launch.cl_source(launch.OPS / op / f"{op}.cl")
        assert not any(line.lstrip().startswith("#include") for line in text.splitlines())
        assert text.count("inline float dl_gelu(") == 1
    twice = tmp_path / "twice.cl"
    twice.write_text('#include "gelu_math.cl"\n#include "gelu_math.cl"\nint after;\n')
    text = launch.cl_source(twice)
    assert text.count("inline float4 dl_gelu4(") == 1 and text.rstrip().endswith("int after;")
    missing = tmp_path / "missing.cl"
    missing.write_text('#include "no_such_file.cl"\n')
    with pytest.raises(FileNotFoundError, match="no_such_file"):
        launch.cl_source(missing)


# Half storage as the runtime builds it: with cl_khr_fp16 (-DDL_FP16=1 and the prelude enabling
# the extension; also with half multiply-adds, -DDL_FP16_MATH=1, the default there) and without
# it (-DDL_HALF_IO=1, the extension switched off: any direct half access or half cast is an
# error, as on PoCL and NVIDIA).
_HALF_MODES = {
    "cl_khr_fp16": ["-Xclang", "-cl-ext=+cl_khr_fp16", "-DDL_FP16=1"],
    "cl_khr_fp16+math": ["-Xclang", "-cl-ext=+cl_khr_fp16", "-DDL_FP16=1", "-DDL_FP16_MATH=1"],
    "vload_half": ["-Xclang", "-cl-ext=-cl_khr_fp16", "-DDL_HALF_IO=1"],
}
_HALF_PRELUDE = "#ifdef DL_FP16\n#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n#endif\n#line 1\n"


@pytest.mark.parametrize("mode", sorted(_HALF_MODES))
def test_programs_compile_for_half_storage(launch, mode):
    """Half storage of every program (ops, builtins, boundary conversions) in each build variant,
    compiled with the clang that PoCL itself uses (Debian's pocl-opencl-icd depends on it). The
    op tests also run them: vload_half on PoCL, cl_khr_fp16 on Intel's CPU OpenCL (the fp16
    lane, tests/test_fp16_device.py)."""
    import shutil
    import subprocess

    clang = shutil.which("clang-15") or shutil.which("clang")
    assert clang, "no clang on PATH (installed with pocl-opencl-icd) to compile the kernels for half storage"
    root = ROOT / "custom_ops"
    sources = [*sorted((root / "ops").glob("*/*.cl")), *sorted((root / "builtins").glob("*/*.cl")),
               root / "delegate" / "opencl" / "convert.cl"]
    for f in sources:
        src = _HALF_PRELUDE + launch.cl_source(f)
        for extra in launch.PROGRAM_VARIANTS.get(f.stem, ([],)):
            cmd = [clang, "-x", "cl", "-cl-std=CL1.2", "-target", "spir64", "-Xclang", "-finclude-default-header",
                   *_HALF_MODES[mode], "-DDL_T=half", "-DDL_T4=half4", *extra, "-fsyntax-only", "-"]
            p = subprocess.run(cmd, input=src, capture_output=True, text=True)
            assert p.returncode == 0, f"{f.name} {extra} does not compile for half storage ({mode}):\n{p.stderr[-2000:]}"
