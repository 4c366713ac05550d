"""difflite.Attention against the float64 reference (support.numerics.attention_ref) on every
path of the op library:

* the CPU backend (TestCpuBackend): single-op .tflite models on ai_edge_litert and tensorflow's
  tf.lite, odd sizes, several key and row blocks, large logits; max |err| <= 1e-4 x max |ref|;
* the OpenCL kernels (custom_ops/ops/attention/attention.cl: the partial softmax, attn_flash and
  its key splits with attn_merge, attn_wide) launched directly with pyopencl on PoCL through
  benchmarks/gpu_kernels_harness/launch.py, whose attention_plan (variant, tiles, rows per
  work-item, splits) mirrors attention_opencl.cc (the split rule's constants checked here, the
  others in tests/test_opencl_programs.py); float32 storage (PoCL has no cl_khr_fp16), max |err| /
  max |ref| < 2e-5 (TOL); logits up to ~300, where a softmax without the running max overflows;
* the same op through the library with backend=opencl (test_delegate_attention*): the kernel the
  C++ plan picks (DIFFLITE_ATTN_KERNEL, DIFFLITE_ATTN_SPLITS, refusals of bad values), its
  scratch, precision=fp16 (< 5e-3 against the half-rounded inputs' reference, HALF_TOL below).

Outputs and scratch are poisoned with NaN before every run; sizes are odd (Lq, Lk and head sizes
not multiples of 4 or of the tiles). No OpenCL is a failure with the reason, never a skip
(tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from support import ROOT
from support.numerics import attention_ref, nonzero, rel_err, rng
from support.opencl_helpers import TOL, run_delegate
from support.oplib_helpers import check, run_tflite, single_op_model


# ---------------------------------------------------------------------------
# The CPU backend


ATTENTION_CASES = {
    # name: (N, Lq, Lk, heads, Dk, Dv, causal, logit scale)
    "odd": (2, 37, 19, 3, 5, 6, False, 1.0),
    "odd_causal": (2, 37, 19, 3, 5, 6, True, 1.0),
    # several key blocks (online-softmax rescaling), several row blocks
    "long": (1, 70, 150, 2, 8, 7, False, 1.0),
    "long_causal": (1, 150, 150, 2, 8, 7, True, 1.0),
    # large logits (|s| up to ~100): needs the max-subtracted softmax
    "large_logits": (1, 33, 90, 1, 4, 3, False, 12.0),
}


class TestCpuBackend:
    """backend=cpu, single-op models on both runtimes (`runtime`): max |err| <= 1e-4 x max |ref|
    (support.oplib_helpers.check). A class of its own: the OpenCL kernel tests below share names."""

    @pytest.mark.parametrize("case", list(ATTENTION_CASES))
    def test_attention(self, lib, runtime, tmp_path, case):
        n, lq, lk, heads, dk, dv, causal, mag = ATTENTION_CASES[case]
        r = rng(4)
        q = nonzero(r, (n, lq, heads * dk), mag)
        k = nonzero(r, (n, lk, heads * dk), mag)
        v = nonzero(r, (n, lk, heads * dv))
        scale = 1.0 / math.sqrt(dk)
        opts = {"heads": heads, "scale": scale, "causal": causal, "variant": "flash"}
        p = single_op_model(tmp_path / "attn.tflite", "difflite.Attention", opts,
                            [("q", q, False), ("k", k, False), ("v", v, False)], (n, lq, heads * dv))
        (y,) = run_tflite(p, lib, [q, k, v], runtime)
        check(y, attention_ref(q, k, v, heads, scale, causal))


# ---------------------------------------------------------------------------
# The OpenCL kernels, launched directly (pyopencl on PoCL, float32 storage)


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
                                 kernel="recompute" if variant == "partial_softmax" else FORCE[variant])
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
# The op through the library (libdifflite_delegate.so, backend=opencl): the C++ host code of
# custom_ops/ops/<op>/<op>_opencl.cc (plans, argument order, scratch) on PoCL. A node the OpenCL
# backend refused would stay with TFLite, which cannot run a difflite op: the run would fail.


@pytest.mark.parametrize("variant", ["auto", "flash", "partial_softmax"])
def test_delegate_attention(tmp_path, opencl_lib, variant):
    r = np.random.default_rng(13)
    n, lq, lk, heads, dk, dv = 2, 37, 19, 3, 5, 6
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    for causal in (False, True):
        out, stats = run_delegate(
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
    out, stats = run_delegate(
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
    (None, 80, 80, "partial_softmax", "tiled", "gemm"),  # the partial softmax as GEMMs
    (None, 40, 40, "partial_softmax", "tiled", "partial"),  # a narrow head: recomputed (kGemmMinHead)
    (None, 40, 40, "auto", "tiled", "flash"),
    (None, 80, 80, "auto", "auto", "partial"),  # PoCL (flat kernels): as before attn_wide
    (None, 80, 80, "flash", "auto", "flash"),
    ("flash", 80, 80, "partial_softmax", "tiled", "flash"),
    ("partial", 40, 40, "flash", "tiled", "gemm"),
    ("recompute", 40, 40, "partial_softmax", "tiled", "partial"),  # the recompute kernels
    ("recompute", 80, 80, "partial_softmax", "auto", "partial"),
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
    kind = "gemm" if plan.gemm else FORCE[plan.variant]
    if runner.flat:
        assert kind == want
    want = kind
    n, lq, lk, heads = 2, 37, 70, 2
    r = np.random.default_rng(dk + dv)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    out, stats, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, True, variant, kernels)
    assert rel_err(out, attention_ref(q, k, v, heads, 0.3, True)) < TOL
    labels = {"wide": {"attention.wide"}, "flash": {"attention.flash"},
              "partial": {"attention.rowstats", "attention.output"},
              "gemm": {"attention.scores", "attention.softmax", "attention.pv", "attention.scatter"}}  # n = 2
    assert ran == labels[want], (ran, stats)
    scratch = {"partial": 8 * n * heads * lq, "gemm": runner.attention_gemm_scratch(n, lq, lk, heads, dk, dv)}
    assert stats.get("scratch_bytes") == scratch.get(want, 0), stats


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


@pytest.mark.parametrize("tile", ["128x16x2", "32x8x4", "64x32x1"])
def test_delegate_attention_partial_tile_env(tmp_path, opencl_lib, monkeypatch, tile):
    """DIFFLITE_ATTN_PARTIAL_TILE=BQxBKxRQ sets the recompute kernels' tile in the library (an A/B
    knob): the rows, keys and rows per work-item given still compute attention, causal too."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "recompute")
    monkeypatch.setenv("DIFFLITE_ATTN_PARTIAL_TILE", tile)
    n, lq, lk, heads, dk, dv = 2, 150, 77, 2, 40, 40  # ragged against every tile
    q, k, v = qkv_inputs(np.random.default_rng(len(tile)), n, lq, lk, heads, dk, dv)
    for causal in (False, True):
        out, _, ran = _delegate_attention(tmp_path, opencl_lib, q, k, v, heads, 0.3, causal, "partial_softmax")
        assert rel_err(out, attention_ref(q, k, v, heads, 0.3, causal)) < TOL, causal
        assert ran == {"attention.rowstats", "attention.output"}, ran


@pytest.mark.parametrize("value", ["64x32", "64x32x3", "0x32x1", "64,32,1", "64x32x1x", "4096x1024x1"])
def test_delegate_attention_bad_partial_tile_env(tmp_path, opencl_lib, monkeypatch, value):
    """A malformed DIFFLITE_ATTN_PARTIAL_TILE, or one whose tiles exceed local memory, refuses the
    node."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "recompute")
    monkeypatch.setenv("DIFFLITE_ATTN_PARTIAL_TILE", value)
    q = nonzero(np.random.default_rng(0), (1, 5, 8))
    with pytest.raises(RuntimeError, match="unresolved custom op: difflite.Attention") as failure:
        _delegate_attention(tmp_path, opencl_lib, q, q, q, 1, 0.3, False, "partial_softmax")
    assert "(difflite.Attention) cannot run on the OpenCL backend" in str(failure.value)
    assert "DIFFLITE_ATTN_PARTIAL_TILE" in str(failure.value)
