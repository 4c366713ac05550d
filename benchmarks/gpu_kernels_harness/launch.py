"""Run the OpenCL kernels of the six difflite ops (custom_ops/ops/*/*.cl) with pyopencl.

The launch plans here (work-group sizes, tile parameters, reduction splits, the attention variant
that "auto" picks, scratch sizes) mirror the host code of the GPU side in
custom_ops/ops/<op>/<op>_opencl.cc; keep the two in step. Winograd's 36 GEMMs run the shared tiled
GEMM of the builtins (custom_ops/builtins/matmul/gemm.cl) as builtin::Gemm launches it on a GPU
(gemm.cc), on every device here. Used by the ops' tests, tests/test_op_*.py, and
tests/test_opencl_programs.py (PoCL) and by benchmarks/gpu_ablation.py (any OpenCL device).

Storage is float32 here (-DDL_T=float -DDL_T4=float4, as PoCL has no cl_khr_fp16), or with
Runner(half_io=True) half through vload_half / vstore_half (-DDL_HALF_IO=1, ops/common/dl_storage.cl;
no cl_khr_fp16 needed), as the library runs precision=fp16 on such devices.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyopencl as cl
from pyopencl import cltypes

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "custom_ops" / "ops"
GEMM_CL = REPO / "custom_ops" / "builtins" / "matmul" / "gemm.cl"
CONV_CL = REPO / "custom_ops" / "builtins" / "conv" / "conv.cl"
SPLIT_K_MAX, SPLIT_K_MIN_DEPTH = 16, 256  # gemm.h: kMaxSplitK, kMinSplitKDepth
INCLUDE = re.compile(r'^[ \t]*#include "(\w+)\.cl"[ \t]*$')


def cl_source(path: Path, seen: set[str] | None = None) -> str:
    """A .cl file's text as the op library builds it: each `#include "NAME.cl"` line replaced by
    custom_ops' NAME.cl (once per program; runtime.cc: ExpandIncludes)."""
    path = Path(path)
    seen = {path.stem} if seen is None else seen
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = INCLUDE.match(line)
        if match is None:
            lines.append(line)
            continue
        name = match.group(1)
        if name in seen:
            continue
        seen.add(name)
        found = sorted((REPO / "custom_ops").rglob(f"{name}.cl"))
        if len(found) != 1:
            raise FileNotFoundError(f"{path.name}:{number}: #include \"{name}.cl\" matches {len(found)} files")
        lines += ["#line 1", cl_source(found[0], seen).rstrip("\n"), f"#line {number + 1}"]
    return "\n".join(lines) + "\n"
BASE_OPTIONS = "-DDL_T=float -DDL_T4=float4"
HALF_IO_OPTIONS = "-DDL_T=half -DDL_T4=half4 -DDL_HALF_IO=1"

GELU_MODES = {"erf": 0, "tanh": 1, "sigmoid": 2}

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, g: int) -> int:
    return ceil_div(n, g) * g


# ---------------------------------------------------------------------------
# Launch plans (same numbers as the C++ side).

COLS_GROUP = 256  # kColsGroup: the split plan's largest work-group
COLS_MIN_WIDTH = 32  # kColsMinWidth
STATS_ROWS = 8  # kStatsRows
APPLY_ROWS = 16  # kApplyRows
MAX_PARTIALS = 256  # kMaxPartials


def gn_vector_width(cg: int) -> int:
    """OneVectorWidth: 4 or 2 channels per load where they divide the channels per group."""
    return 4 if cg % 4 == 0 else 2 if cg % 2 == 0 else 1


@dataclass(frozen=True)
class ColsPlan:
    """The split plan's shape (ColsPlan in group_norm_opencl.cc)."""
    vw: int
    cv: int
    lx: int
    ly: int
    gpw: int
    xb: int
    ys: int
    ya: int

    @property
    def partials(self) -> int:
        return self.ys * self.xb

    def options(self) -> str:
        return f"-DGN_VW={self.vw} -DGN_LX={self.lx} -DGN_LY={self.ly} -DGN_GPW={self.gpw}"


def gn_cols_plan(n: int, groups: int, spatial: int, c: int, compute_units: int,
                 limit: int = COLS_GROUP, ys: int | None = None) -> ColsPlan:
    """PlanCols; `ys` overrides the statistics pass's work-groups down the rows (tests)."""
    cg = c // groups
    vw = gn_vector_width(cg)
    cgv = cg // vw
    gpw, xb = 1, 1
    if cgv <= limit:
        gpw = groups_per_block(cgv, groups, limit)
        lx = cgv * gpw
    else:
        xb = 2
        while cgv % xb or cgv // xb > limit:
            xb += 1
        lx = cgv // xb
    ly = min(max(1, min(COLS_GROUP, limit) // lx), spatial)
    blocks = (c // vw // lx) * n
    want = ceil_div(4 * max(1, compute_units), blocks)
    by_rows = max(1, spatial // (ly * STATS_ROWS))
    if ys is None:
        ys = max(1, min(want, by_rows, MAX_PARTIALS // xb))
    ya = max(1, ceil_div(spatial, ly * APPLY_ROWS))
    return ColsPlan(vw, c // vw, lx, ly, gpw, xb, ys, ya)


GN_ONE_WG = 1024  # largest gn_one work-group (kOneGroup)
GN_ONE_MIN_WG = 64  # kOneMinGroup
GN_UNROLL = 4  # loads in flight per gn_one work-item (kOneUnroll)


COOP_GROUP = 128  # kCoopGroup: gn_coop's largest work-group
COOP_MAX_FLOATS = 32  # kCoopMaxFloats: floats of x a gn_coop work-item holds
COOP_GROUPS_PER_CU = 3  # kCoopGroupsPerCu
COOP_SPIN_LIMIT = 16384  # kCoopSpinLimit
COOP_MAX_GATHER = 8  # kCoopMaxGather
COOP_MAX_CHUNKS = 8  # kCoopMaxChunks
ONE_MAX_GROUP_ELEMS = 65536  # kOneMaxGroupElems
ROWS_GROUP = 128  # kRowsGroup: gn_rows's work-group
ROWS_WIDTH = 32  # kRowsWidth: gn_rows's work-items a row (at most)
ROWS_MAX_VECTORS = 16  # kRowsMaxVectors: float4s of a row a gn_rows work-item holds


NO_COOP = 1 << 30  # kNoCoop


def power_of_two_group(cap: int, device_max: int) -> int:
    """PowerOfTwoGroup: the largest power of two <= min(cap, device_max) (device_max 0: no limit)."""
    wg = 1
    while wg * 2 <= cap and (device_max == 0 or wg * 2 <= device_max):
        wg *= 2
    return wg


def groups_per_block(cgv: int, groups: int, limit: int) -> int:
    """GroupsPerBlock: the fewest whole groups whose columns reach COLS_MIN_WIDTH within `limit`."""
    gpw = 1
    for d in range(1, groups + 1):
        if cgv * d > limit:
            break
        if groups % d == 0:
            gpw = d
            if cgv * d >= COLS_MIN_WIDTH:
                break
    return gpw


@dataclass(frozen=True)
class CoopPlan:
    """gn_coop's shape (CoopPlan in group_norm_opencl.cc): column blocks of gpw groups (lx vector columns)
    by ly rows, k slices of `rows` rows a block, `chunks` chunks of `items` rows a work-item."""
    vw: int
    lx: int
    ly: int
    gpw: int
    items: int
    k: int
    rows: int
    chunks: int

    def options(self) -> str:
        return (f"-DGN_COOP=1 -DGN_VW={self.vw} -DGN_LX={self.lx} -DGN_LY={self.ly} -DGN_GPW={self.gpw} "
                f"-DGN_ITEMS={self.items} -DGN_PARTS={self.gpw * self.k}")


def coop_block(cg: int, groups: int, limit: int, sector_elems: int = 8) -> tuple[int, int, int]:
    """CoopBlock: (gpw, vw, lx): the fewest whole groups whose row stretch is whole 32-byte sectors in
    float4 columns within `limit` columns, else groups_per_block's in gn_vector_width(cg) columns."""
    for d in range(1, groups + 1):
        if d * cg > 4 * limit:
            break
        if groups % d == 0 and (d * cg) % sector_elems == 0:
            return d, 4, d * cg // 4
    vw = gn_vector_width(cg)
    gpw = groups_per_block(cg // vw, groups, limit)
    return gpw, vw, gpw * cg // vw


def gn_coop_plan(n: int, groups: int, spatial: int, cg: int, limit: int, compute_units: int,
                 max_floats: int = COOP_MAX_FLOATS, per_cu: int = COOP_GROUPS_PER_CU) -> CoopPlan:
    """PlanCoop (fp32 storage: 8 elements a sector): work-groups of at most `limit`; blocks (coop_block);
    slices for per_cu work-groups a compute unit (at most one a row, COOP_MAX_GATHER * lx * ly / gpw a
    block), then the fewest chunks a slice with at most max_floats floats a work-item, evened out. chunks
    NO_COOP: a group wider than the work-group."""
    if cg // gn_vector_width(cg) > limit:
        return CoopPlan(gn_vector_width(cg), 1, 1, 1, 1, 1, 1, NO_COOP)
    gpw, vw, lx = coop_block(cg, groups, limit)
    ly = min(max(1, limit // lx), spatial)
    k = max(1, min(ceil_div(max(compute_units, 1) * per_cu, n * (groups // gpw)), spatial,
                       max(1, COOP_MAX_GATHER * lx * ly // gpw)))
    rows = ceil_div(spatial, k)
    per_item = ceil_div(rows, ly)
    chunks = ceil_div(per_item, max(1, max_floats // vw))
    return CoopPlan(vw, lx, ly, gpw, ceil_div(per_item, chunks), ceil_div(spatial, rows), rows, chunks)


@dataclass(frozen=True)
class RowsPlan:
    """gn_rows's shape (RowsPlan in group_norm_opencl.cc): lx work-items a row, rv float4s each, ly rows a
    work-group; rv 0: no rows plan."""
    lx: int = 1
    ly: int = 1
    rv: int = 0

    def options(self) -> str:
        return f"-DGN_VW=4 -DGN_LX={self.lx} -DGN_LY={self.ly} -DGN_RV={self.rv}"


def gn_rows_plan(n: int, groups: int, spatial: int, c: int, limit: int) -> RowsPlan:
    """PlanRows: LayerNorms only (one group, one position a sample, C % 4 == 0): the smallest power of
    two work-items a row that covers its float4s (at most ROWS_WIDTH and `limit`), at most
    ROWS_MAX_VECTORS float4s each, limit // lx rows a work-group (at most n)."""
    if groups != 1 or spatial != 1 or c % 4:
        return RowsPlan()
    cv, lx = c // 4, 1
    while lx < cv and lx * 2 <= min(ROWS_WIDTH, limit):
        lx *= 2
    if ceil_div(cv, lx) > ROWS_MAX_VECTORS:
        return RowsPlan()
    return RowsPlan(lx, max(1, min(limit // lx, n)), ceil_div(cv, lx))


def gn_plan(flat: bool, coop_chunks: int, n: int, groups: int, group_elems: int, compute_units: int,
            rows: bool = False) -> str:
    """"rows" (gn_rows) for LayerNorms with a rows plan (`rows`) on GPUs, else "coop" (gn_coop: one
    kernel, K work-groups a (sample, block) exchanging partial sums) while a slice is at most
    COOP_MAX_CHUNKS chunks, else "one" (gn_one: a work-group per (sample,
    group)) when those fill the device or groups are small, else "split" (gn_stats_cols +
    gn_apply_cols), which CPU-like devices always take: PickPlan in group_norm_opencl.cc (without its
    DIFFLITE_GN_PLAN override)."""
    if flat:
        return "split"
    if rows:
        return "rows"
    if coop_chunks <= COOP_MAX_CHUNKS:
        return "coop"
    return "one" if n * groups >= compute_units or group_elems <= ONE_MAX_GROUP_ELEMS else "split"


def gn_one_shape(group_elems: int, cg: int, max_wg: int) -> tuple[int, int]:
    """(work-group size before the kernel's own limit, load width GN_VW) of gn_one (InitOne)."""
    vw = gn_vector_width(cg)
    wg = power_of_two_group(GN_ONE_WG, max_wg)
    while wg > GN_ONE_MIN_WG and wg * GN_UNROLL * vw > group_elems:
        wg //= 2
    return wg, vw


@dataclass(frozen=True)
class AttentionPlan:
    variant: str  # "flash" | "partial_softmax" | "wide"
    bq: int
    bk: int
    kc: int = 0  # flash
    dc: int = 0  # partial, wide
    dvc: int = 0  # partial
    nt: int = 0  # wide: work-items per work-group
    vk: int = 0  # wide: keys per staged V chunk
    sx: int = 0  # wide: work-items along the keys of the score tile
    ox: int = 0  # wide: work-items along the float4 columns of the output
    splits: int = 1  # flash: key ranges per row block and head (AT_SPLIT; attn_merge combines them)
    gemm: bool = False  # partial_softmax as GEMMs (S = q k^T, attn_softmax_rows, O = P v; tiled devices)

    def work_group(self, dk: int, dv: int) -> int:
        """Work-items per work-group (each work-group owns bq query rows)."""
        return self.nt if self.variant == "wide" else self.bq // self.rows_per_item(dk, dv)

    def wide_block(self, dv: int) -> tuple[int, int]:
        """attn_wide's output rows and float4 columns per work-item (AT_OR, AT_OC)."""
        return self.bq // (self.nt // self.ox), ceil_div(ceil_div(dv, 4), self.ox)

    def rows_per_item(self, dk: int, dv: int) -> int:
        """AT_RQ: 2 query rows per work-item for flash when both rows' q and accumulator fit in
        ROW_REGS floats, else 1 (attention_opencl.cc: Plan::PickRows)."""
        fits = 2 * (round_up(dk, 4) + round_up(dv, 4)) <= ROW_REGS
        return 2 if self.variant == "flash" and self.bq % 2 == 0 and fits else 1

    def options(self, dk: int, dv: int) -> str:
        rows = f" -DAT_RQ={self.rows_per_item(dk, dv)}"
        if self.variant == "wide":
            return (f"-DAT_DK={dk} -DAT_DV={dv} -DAT_BQ={self.bq} -DAT_BK={self.bk} -DAT_DC={self.dc} "
                    f"-DAT_NT={self.nt} -DAT_VK={self.vk} -DAT_SX={self.sx} -DAT_OX={self.ox}")
        if self.variant == "flash":
            split = f" -DAT_SPLIT={self.splits}" if self.splits > 1 else ""
            return f"-DAT_DK={dk} -DAT_DV={dv} -DAT_BQ={self.bq} -DAT_BK={self.bk} -DAT_KC={self.kc}" + rows + split
        return f"-DAT_BQ={self.bq} -DAT_BK={self.bk} -DAT_DC={self.dc} -DAT_DVC={self.dvc}" + rows

    def split_bytes(self, n: int, lq: int, heads: int, dv: int, elem: int = 4) -> int:
        """Scratch of a split flash launch (AttentionGpu::SplitBytes): per split and (n, query, head),
        a float (max, sum) and a partial row of `elem`-byte storage elements."""
        return self.splits * n * lq * heads * (8 + elem * dv) if self.splits > 1 else 0

    def local_bytes(self, dk: int, dv: int) -> int:
        if self.variant == "flash":
            return 4 * self.bk * (round_up(dk, 4) + round_up(dv, 4))
        if self.variant == "wide":  # attn_wide's AT_SMEM4 float4s, then Ss, Ms Ls Cs
            dc4 = self.dc // 4
            qs, ks = self.bq * (dc4 + 1), self.bk * (dc4 + 1)
            vs = self.vk * self.wide_block(dv)[1] * self.ox
            voff = qs if dk <= self.dc else 0
            return 16 * max(qs + ks, voff + vs) + 4 * self.bq * (self.bk + 1) + 12 * self.bq
        dc, dvc = round_up(self.dc, 4), round_up(self.dvc, 4)
        return 4 * (self.bq * (dc + 4) + self.bk * dc + self.bk * dvc + self.bq * (self.bk + 1))


def _chunk(d: int, cap: int) -> int:
    """Split d into the fewest chunks of at most cap; the chunk size."""
    return ceil_div(d, ceil_div(d, cap))


FLASH_MAX_HEAD = 64
FLASH_ITEM_MAX_HEAD = 80  # kFlashItemMaxHead: flash past FLASH_MAX_HEAD when attn_flash does not spill
FLASH_ROWS = 256  # kFlashRows: attn_flash's query rows per work-group
ROW_REGS = 160
# Partial-softmax tiles, the first that fits local memory:
# (Dv chunk cap, rows per work-group, keys per tile, Dk chunk cap).
PARTIAL_LADDER = ((128, 64, 32, 64), (64, 64, 32, 64), (64, 32, 32, 64), (32, 32, 16, 32))  # register budget: q row + accumulator (+ scores) per work-item


# attn_wide tiles, the first that fits local memory, the device's work-group limit and WIDE_MAX_ACC
# accumulator floats per work-item: (rows per work-group, keys per block, work-items, Dk chunk cap,
# V keys per chunk).
WIDE_LADDER = ((32, 64, 256, 64, 16), (32, 64, 256, 32, 8), (16, 32, 128, 32, 8), (16, 32, 64, 16, 4))
WIDE_MAX_ACC = 128
# DIFFLITE_ATTN_KERNEL: "partial" is the partial softmax as the device runs it (GEMMs with tiled
# kernels), "recompute" its recompute kernels (attn_rowstats + attn_output) on any device.
ATTN_KERNELS = {"wide": "wide", "flash": "flash", "partial": "partial_softmax", "recompute": "partial_softmax"}
# The partial softmax as GEMMs (attention_opencl.cc: InitGemm, RunGemm, GemmChunkRows).
SCORES_BYTES = 16777216  # kScoresBytes: bound on S's scratch (a chunk's N x H x rows x Lk elements)
CHUNK_ROW_QUANTUM = 64  # kChunkRowQuantum
GEMM_MIN_HEAD = 64  # kGemmMinHead: narrower heads keep the recompute kernels unless kernel="partial"
SCORES_SLOT = 4  # kScoresSlot: S's scratch slot (O' at N > 1: SPLIT_SLOT)
SOFTMAX_GROUP = 128  # kSoftmaxGroup: attn_softmax_rows' work-items per row (AT_SMW), halved to fit
SCATTER_GROUP = 64  # kScatterGroup
# Split keys (attn_flash with AT_SPLIT + attn_merge; attention_opencl.cc: PickSplits).
SPLIT_ITEMS_PER_CU = 256  # kSplitItemsPerCu: work-items per compute unit that fill a GPU
MIN_SPLIT_KEYS = 256  # kMinSplitKeys
MAX_SPLITS = 4  # kMaxSplits
ATTN_SPLITS = (1, 2, 4)  # DIFFLITE_ATTN_SPLITS values
# Build variants per program (defines past the defaults), as the runtime's plans pick them: what
# the half-storage compile test and benchmarks/gpu_build_check.py build. Variants with -DMMA=1
# need half storage (needs_half_storage).
_MMA = ["-DVEC=1", "-DMMA=1", "-DMMA_EMULATE=1", "-DTM=128", "-DTN=128", "-DTK=16", "-DWM=8", "-DWN=8"]
PROGRAM_VARIANTS = {
    "attention": ([], ["-DAT_DK=40", "-DAT_DV=24"],  # flash
                  ["-DAT_DK=40", "-DAT_DV=24", "-DAT_RQ=2", "-DAT_SPLIT=2"],  # split flash + merge
                  ["-DAT_DK=7", "-DAT_DV=6", "-DAT_SPLIT=4"],
                  ["-DAT_DK=40", "-DAT_DV=24", "-DAT_BQ=32", "-DAT_BK=64", "-DAT_DC=40",  # wide
                   "-DAT_NT=256", "-DAT_VK=16", "-DAT_SX=16", "-DAT_OX=8"],
                  ["-DAT_DK=70", "-DAT_DV=66", "-DAT_BQ=16", "-DAT_BK=32", "-DAT_DC=36",
                   "-DAT_NT=64", "-DAT_VK=4", "-DAT_SX=4", "-DAT_OX=16"]),
    "group_norm": ([], ["-DGN_VW=2"], ["-DGN_VW=4"],  # gn_one's load widths
                   ["-DGN_COOP=1", "-DGN_VW=4", "-DGN_LX=10", "-DGN_LY=12", "-DGN_GPW=4",
                    "-DGN_ITEMS=7"],  # gn_coop at 64x64x320
                   ["-DGN_VW=4", "-DGN_LX=32", "-DGN_LY=4", "-DGN_RV=3"]),  # gn_rows at 320
    "gemm": ([], ["-DVEC=1"], ["-DVEC=1", "-DTM=128", "-DTN=128", "-DWM=8", "-DWN=8"], ["-DSK_M=2"],
             ["-DGEMM_ACC=1"], ["-DVEC=1", "-DGEMM_ACC=1"], ["-DSK_M=2", "-DGEMM_ACC=1"],
             # the tensor-core tiles (gemm_mma.cl), with the instruction emulated (the PTX is NVIDIA's
             # only): both B layouts, quads and elements, a quantized B, accumulation
             [*_MMA, "-DB_KMAJOR=1", "-DA_QUADS=1", "-DB_QUADS=1"], [*_MMA, "-DB_KMAJOR=0", "-DB_QUADS=1"],
             [*_MMA, "-DA_KMAJOR=0", "-DB_KMAJOR=0", "-DTM=64", "-DTN=64", "-DTK=32"],
             [*_MMA, "-DB_KMAJOR=1", "-DDL_WQ=4", "-DGEMM_ACC=1"]),
    "conv": ([], ["-DVEC=1"], ["-DVEC=1", "-DTM=128", "-DTN=128", "-DWM=8", "-DWN=8"],
             # the tensor-core implicit GEMM (common/mma_tile.cl), emulated: float16 and quantized
             # filters, elements and quads, the 32-deep tile
             _MMA, [*_MMA, "-DDL_WQ=8", "-DWQ_QUADS=1"], [*_MMA, "-DDL_WQ=4"], [*_MMA, "-DTK=32"],
             ["-DNW_N=3", "-DNW_L=16", "-DNW_G=4", "-DNW_ALIGNED=1"],  # conv2d_narrow
             ["-DNW_N=7", "-DNW_PX=2", "-DNW_L=1", "-DNW_G=64"], ["-DNW_N=8", "-DNW_PX=1", "-DNW_L=32", "-DNW_G=2"]),
}


# Sources that are part of another program (#included there and built with its variants), never
# a program of their own.
INCLUDED_ONLY = {"gemm_mma", "mma_tile"}


def needs_half_storage(variant: list[str]) -> bool:
    """Whether a PROGRAM_VARIANTS entry builds only for half storage (the tensor-core tiles)."""
    return "-DMMA=1" in variant


SPLIT_SLOT = 1  # kSplitSlot: scratch slot of the partials
MERGE_WG = 64  # kMergeGroup: attn_merge's work-group


def attention_splits(items: int, lk: int, causal: bool, compute_units: int, *, flat: bool = False,
                     forced: int | None = None) -> int:
    """Key splits of a flash launch of `items` work-items (attention_opencl.cc: PickSplits): never
    causal; at most MAX_SPLITS and each split keeps MIN_SPLIT_KEYS keys; forced (DIFFLITE_ATTN_SPLITS)
    is clamped to that on any device; otherwise 1 on flat (CPU-like) devices, and on GPUs the most
    splits that keep items * splits within compute_units * SPLIT_ITEMS_PER_CU."""
    if forced is not None and forced not in ATTN_SPLITS:
        raise ValueError(f"DIFFLITE_ATTN_SPLITS={forced}: expected 1, 2 or 4")
    if causal:
        return 1
    most = MAX_SPLITS
    while most > 1 and lk < MIN_SPLIT_KEYS * most:
        most //= 2
    if forced:
        return min(forced, most)
    if flat:
        return 1
    splits = most
    while splits > 1 and items * splits > compute_units * SPLIT_ITEMS_PER_CU:
        splits //= 2
    return splits


def attention_chunk_rows(n: int, heads: int, lq: int, lk: int, elem: int, bound: int = SCORES_BYTES) -> int:
    """Query rows per chunk of the GEMM path (attention_opencl.cc: GemmChunkRows): all of lq where S of
    all rows (n * heads * lk elements of `elem` bytes a row) fits `bound`; else the most rows within
    it that are a multiple of CHUNK_ROW_QUANTUM, at least one quantum."""
    fit = bound // max(n * heads * lk * elem, 1)
    if fit >= lq:
        return lq
    rows = max(CHUNK_ROW_QUANTUM, fit // CHUNK_ROW_QUANTUM * CHUNK_ROW_QUANTUM)
    return lq if rows >= lq else rows


def wide_plans(dk: int, dv: int, local_mem_bytes: int, max_wg: int = 0) -> list[AttentionPlan]:
    """attn_wide's ladder entries that fit, in order (attention_opencl.cc: PlanWide, PickWideLayout);
    the C++ side takes the first that also builds with its work-group size."""
    plans = []
    for bq, bk, nt, dc_cap, vk in WIDE_LADDER:
        sx = nt // min(bq, 16)  # score tile: min(bq, 16) rows x sx keys of work-items
        # output: ox float4 columns x nt / ox rows of work-items; the fewest padded columns, then the
        # squarest register block
        outs = [(ceil_div(ceil_div(dv, 4), x) * x, max(ceil_div(ceil_div(dv, 4), x), bq * x // nt), x)
                for x in (2**i for i in range(nt.bit_length())) if bq * x >= nt]
        ox = min(outs)[2]
        plan = AttentionPlan("wide", bq=bq, bk=bk, dc=round_up(_chunk(dk, dc_cap), 4), nt=nt, vk=vk, sx=sx, ox=ox)
        rows, cols = plan.wide_block(dv)
        if (max_wg and nt > max_wg) or plan.local_bytes(dk, dv) > local_mem_bytes or 4 * rows * cols > WIDE_MAX_ACC:
            continue
        plans.append(plan)
    return plans


def attention_plan(dk: int, dv: int, variant: str, local_mem_bytes: int, *, flat: bool = False,
                   kernel: str | None = None, max_wg: int = 0, shape: tuple[int, int, int, int] | None = None,
                   causal: bool = False, compute_units: int = 0, splits: int | None = None,
                   flash_in_registers: bool = False) -> AttentionPlan:
    """The kernel variant and tiles (attention_opencl.cc: AttentionGpu::Init). `variant` is a hint:
    "partial_softmax" keeps the partial softmax; a wide head (Dk or Dv > FLASH_MAX_HEAD) with "auto"
    or "flash" takes attn_wide on devices with tiled kernels (GPUs; flat=False), except heads up to
    FLASH_ITEM_MAX_HEAD when `flash_in_registers` (attn_flash compiles for them with nothing spilled:
    Runner.flash_in_registers, FlashInRegisters in C++), which take attn_flash; otherwise a flash
    request whose tiles do not fit local memory falls back to the partial softmax. `kernel`
    ("wide" | "flash" | "partial", DIFFLITE_ATTN_KERNEL) forces a kernel; ValueError if it does not
    fit. max_wg: the device's work-group limit (0: none). With `shape` (n, lq, lk, heads) a flash
    plan also gets its key splits (attention_splits, on a device of `compute_units`; `splits`:
    DIFFLITE_ATTN_SPLITS); without, splits stay 1."""
    plan = _attention_tiles(dk, dv, variant, local_mem_bytes, flat, kernel, max_wg, flash_in_registers)
    if shape is None or plan.variant != "flash":
        if splits is not None and splits not in ATTN_SPLITS:
            raise ValueError(f"DIFFLITE_ATTN_SPLITS={splits}: expected 1, 2 or 4")
        return plan
    n, lq, lk, heads = shape
    items = ceil_div(lq, plan.bq) * plan.work_group(dk, dv) * heads * n  # the unsplit launch
    return replace(plan, splits=attention_splits(items, lk, causal, compute_units, flat=flat, forced=splits))


def _attention_tiles(dk: int, dv: int, variant: str, local_mem_bytes: int, flat: bool, kernel: str | None,
                     max_wg: int, flash_in_registers: bool) -> AttentionPlan:
    """attention_plan without the key splits."""
    forced = ATTN_KERNELS[kernel] if kernel else None
    # the partial softmax as GEMMs (InitGemm): wide enough heads, or forced
    gemm = not flat and kernel != "recompute" and (kernel == "partial" or max(dk, dv) >= GEMM_MIN_HEAD)
    wide_head = dk > FLASH_MAX_HEAD or dv > FLASH_MAX_HEAD
    hinted = forced is None and variant != "partial_softmax" and not flat
    item_head = (hinted and wide_head and flash_in_registers and dk <= FLASH_ITEM_MAX_HEAD
                 and dv <= FLASH_ITEM_MAX_HEAD)
    want_wide = forced == "wide" or (hinted and wide_head and not item_head)
    if want_wide:
        wide = wide_plans(dk, dv, local_mem_bytes, max_wg)
        if wide:
            return wide[0]
        if forced:
            raise ValueError(f"attention: no attn_wide tiles fit head sizes {dk}/{dv}")
    want_flash = forced == "flash" or (forced is None and not want_wide and (variant == "flash" or item_head or (
        variant == "auto" and not wide_head
        and AttentionPlan("flash", bq=64, bk=32, kc=8).local_bytes(dk, dv) <= local_mem_bytes // 2)))
    if want_flash:  # PlanFlash
        for bk in (64, 32, 16):
            flash = AttentionPlan("flash", bq=FLASH_ROWS, bk=bk, kc=8)
            if flash.local_bytes(dk, dv) <= local_mem_bytes:
                while flash.bq > 32 and max_wg and flash.work_group(dk, dv) > max_wg:
                    flash = AttentionPlan("flash", bq=flash.bq // 2, bk=bk, kc=8)
                return flash
        if forced:
            raise ValueError(f"attention: attn_flash does not fit head sizes {dk}/{dv}")
    if gemm:  # no local-memory tiles of its own
        return AttentionPlan("partial_softmax", bq=0, bk=0, gemm=True)
    for dvc_cap, bq, bk, dc_cap in PARTIAL_LADDER:
        plan = AttentionPlan("partial_softmax", bq=bq, bk=bk, dc=_chunk(dk, dc_cap), dvc=_chunk(dv, dvc_cap))
        if plan.local_bytes(dk, dv) <= local_mem_bytes:
            return plan
    raise ValueError("attention: tiles exceed local memory")


@dataclass(frozen=True)
class GemmTile:
    """A tile of gemm.cl's tiled kernel (gemm.h: TileConfig)."""
    tm: int
    tn: int
    tk: int
    wm: int
    wn: int
    vec: bool
    unspilled_only: bool = False  # TileConfig::unspilled_only: only where the kernel spills nothing

    @property
    def threads(self) -> int:
        return (self.tm // self.wm) * (self.tn // self.wn)

    def options(self, a_kmajor: bool, b_kmajor: bool, a_quads: bool = False, b_quads: bool = False) -> str:
        """TileConfig::Options() plus the operand layouts and quad staging, as Gemm::Init builds the
        kernel."""
        vec = " -DVEC=1" if self.vec else ""
        quads = "".join(f" -D{op}_QUADS=1" for op, on in (("A", a_quads), ("B", b_quads)) if on and self.vec)
        return (f"-DTM={self.tm} -DTN={self.tn} -DTK={self.tk} -DWM={self.wm} -DWN={self.wn}{vec}"
                f" -DA_KMAJOR={int(a_kmajor)} -DB_KMAJOR={int(b_kmajor)}{quads}")


def stages_in_quads(extent: int, other: int, batch_strides) -> bool:
    """gemm.cc: StagesInQuads."""
    return extent % 4 == 0 and other % 4 == 0 and all(b % 4 == 0 for b in batch_strides)


LARGE_TILE_MACS = 1 << 30  # gemm.h: kLargeTileMacs


def gemm_tiles(m: int, n: int, macs: int = 0) -> list[GemmTile]:
    """gemm.cc: TileCandidates (without DIFFLITE_GEMM_TILE) for m x n outputs a batch and `macs`
    multiply-adds in all, best first."""
    tiles = [GemmTile(128, 128, 16, 8, 8, True, True)] if macs >= LARGE_TILE_MACS and m > 64 and n > 64 else []
    tiles += [GemmTile(64, 64, 16, 4, 4, True)] if m > 32 and n > 32 else []
    return tiles + [GemmTile(32, 32, 16, 4, 4, True), GemmTile(16, 16, 16, 2, 2, False)]


def split_k(compute_units: int, work_groups: int, k: int) -> int:
    """gemm.cc: ChooseSplitK (without DIFFLITE_SPLIT_K): K splits for a GEMM of `work_groups`
    output tiles."""
    target = 2 * compute_units
    if work_groups >= target:
        return 1
    return max(1, min(ceil_div(target, work_groups), k // SPLIT_K_MIN_DEPTH, SPLIT_K_MAX))


WINOGRAD_SCRATCH_BYTES = 67108864  # kScratchBytes: bound on a band's V + M (DIFFLITE_WINOGRAD_SCRATCH_BYTES)


def winograd_tiles(n: int, h: int, w: int) -> tuple[int, int, int]:
    th, tw = ceil_div(h, 4), ceil_div(w, 4)
    return th, tw, n * th * tw


def winograd_band_tiles(n: int, h: int, w: int, cin: int, cout: int, elem: int,
                        bound: int = WINOGRAD_SCRATCH_BYTES) -> int:
    """Tiles per band (winograd_conv3x3_opencl.cc: BandTiles): all of T where V + M of all tiles
    (36 (cin + cout) elements of `elem` bytes a tile) fit `bound`; else the fewest bands of whole
    tile rows (tiles_w tiles each, rows counted across n * tiles_h) within it, at least one row a
    band, the rows shared evenly."""
    th, tw, _ = winograd_tiles(n, h, w)
    rows = n * th
    fit = bound // (36 * tw * (cin + cout) * elem)
    if fit >= rows:
        return rows * tw
    bands = ceil_div(rows, max(fit, 1))
    return ceil_div(rows, bands) * tw


# ---------------------------------------------------------------------------
# Runner


class Runner:
    """Holds a context/queue (profiling on), builds programs once, allocates scratch."""

    def __init__(self, ctx: cl.Context | None = None, device: cl.Device | None = None, half_io: bool = False):
        """half_io: activations and weights stored as half (HALF_IO_OPTIONS; upload, empty and download
        convert)."""
        self.base_options = HALF_IO_OPTIONS if half_io else BASE_OPTIONS
        self.storage = np.float16 if half_io else np.float32
        if ctx is None:
            ctx, device = pick_context()
        self.ctx = ctx
        self.device = device or ctx.devices[0]
        self.queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.compute_units = int(self.device.max_compute_units)
        self.local_mem = int(self.device.local_mem_size)
        self.max_wg = int(self.device.max_work_group_size)
        self.flat = not self.device.type & cl.device_type.GPU  # kernels=auto: tiled kernels on GPUs only
        self._programs: dict[tuple[str, str], cl.Program] = {}
        self._scratch: dict[int, cl.Buffer] = {}
        self._kernels: dict[tuple[str, str, str], cl.Kernel] = {}
        self._gn_partials: dict[tuple, tuple[cl.Buffer, int]] = {}

    # -- programs and buffers
    def program(self, path: Path, options: str = "") -> cl.Program:
        key = (str(path), options)
        if key not in self._programs:
            src = cl_source(path)
            self._programs[key] = cl.Program(self.ctx, src).build(options=f"{self.base_options} {options}".split())
        return self._programs[key]

    def op_program(self, op: str, options: str = "") -> cl.Program:
        return self.program(OPS / op / f"{op}.cl", options)

    def kernel(self, op: str, name: str, options: str = "") -> cl.Kernel:
        key = (op, name, options)
        if key not in self._kernels:
            self._kernels[key] = cl.Kernel(self.op_program(op, options), name)
        return self._kernels[key]

    def private_bytes(self, kernel: cl.Kernel) -> int:
        """CL_KERNEL_PRIVATE_MEM_SIZE (gpu_api.h: KernelPrivateBytes): on NVIDIA the bytes a work-item
        spills; PoCL reports 1024 for every kernel."""
        return kernel.get_work_group_info(cl.kernel_work_group_info.PRIVATE_MEM_SIZE, self.device)

    def max_work_group(self, kernel: cl.Kernel) -> int:
        """CL_KERNEL_WORK_GROUP_SIZE: the largest work-group this kernel (as built) accepts."""
        return kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device)

    def gemm_kernel(self, m: int, n: int, a_kmajor: bool, b_kmajor: bool,
                    macs: int = 0, quads: tuple[bool, bool] = (False, False),
                    extra: str = "") -> tuple[cl.Kernel, GemmTile]:
        """gemm.cl's tiled `gemm` with the first candidate tile the device runs (gemm.h: PickTile);
        `extra`: more build options (-DGEMM_ACC=1)."""
        for tile in gemm_tiles(m, n, macs):
            if tile.threads > self.max_wg:
                continue
            k = self._cached_kernel(GEMM_CL, "gemm", tile.options(a_kmajor, b_kmajor, *quads) + extra)
            if tile.unspilled_only and self.private_bytes(k) != 0:
                continue
            if self.max_work_group(k) >= tile.threads:
                return k, tile
        raise RuntimeError(f"no GEMM tile fits the device for {m}x{n}")

    def scratch(self, nbytes: int, slot: int) -> cl.Buffer:
        buf = self._scratch.get(slot)
        if buf is None or buf.size < nbytes:
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(4, nbytes))
            self._scratch[slot] = buf
        return buf

    def upload(self, a: np.ndarray) -> cl.Buffer:
        a = np.ascontiguousarray(a, dtype=self.storage)
        return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)

    def empty(self, shape, poison: bool = True) -> cl.Buffer:
        nbytes = np.dtype(self.storage).itemsize * int(np.prod(shape))
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(4, nbytes))
        if poison:
            cl.enqueue_copy(self.queue, buf, np.full(int(np.prod(shape)), np.nan, self.storage))
        return buf

    def download(self, buf: cl.Buffer, shape) -> np.ndarray:
        out = np.empty(shape, self.storage)
        cl.enqueue_copy(self.queue, out, buf)
        self.queue.finish()
        return out.astype(np.float32)

    def launch(self, kernel: cl.Kernel, global_size, local_size, *args) -> cl.Event:
        kernel.set_args(*args)
        return cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, local_size)

    # -- ops (each returns the list of events it enqueued)
    def group_norm(self, x, gamma, beta, y, shape, groups: int, eps: float, silu: bool,
                   ys: int | None = None, plan: str | None = None, coop: CoopPlan | None = None,
                   spin_limit: int = COOP_SPIN_LIMIT, rows: RowsPlan | None = None) -> list[cl.Event]:
        """plan: "rows" | "coop" | "one" | "split" | None (the C++ default for this device; "split" when
        `ys`, the statistics pass's work-groups down the rows, is given; "coop" when `coop`, a gn_coop
        shape, is; "rows" when `rows`, a gn_rows shape, is)."""
        n, c = int(shape[0]), int(shape[-1])
        spatial = int(np.prod(shape[1:-1]))
        cg = c // groups
        if plan is None:
            plan = "split" if ys is not None else "coop" if coop is not None else "rows" if rows is not None \
                else self.gn_default_plan(n, groups, spatial, cg)
        if rows is None and plan == "rows":
            rows = self.gn_rows_shape(n, groups, spatial, c)
            if rows.rv == 0:
                plan = "coop"  # InitRows's fallback
        if plan == "rows":
            return [self._group_norm_rows(x, gamma, beta, y, n, c, eps, silu, rows)]
        if coop is None and plan == "coop":
            coop = self.gn_coop_shape(n, groups, spatial, cg)
            if coop.chunks == NO_COOP:
                plan = "one"  # InitCoop's fallback
        if plan == "coop":
            return [self._group_norm_coop(x, gamma, beta, y, n, spatial, c, cg, groups, eps, silu, coop, spin_limit)]
        if plan == "one":
            return [self._group_norm_one(x, gamma, beta, y, n, spatial, c, cg, groups, eps, silu)]
        limit = min(COLS_GROUP, self.max_wg)
        while True:  # InitCols
            cp = gn_cols_plan(n, groups, spatial, c, self.compute_units, limit, ys)
            ks = self.kernel("group_norm", "gn_stats_cols", cp.options())
            ka = self.kernel("group_norm", "gn_apply_cols", cp.options())
            accepted = min(self.max_work_group(k)
                           for k in (ks, ka))
            if accepted >= cp.lx * cp.ly or limit == 1:
                break
            limit = max(1, min(limit // 2, accepted))
        partial = self.scratch(16 * n * groups * cp.partials, 0)
        i32 = np.int32
        local = (cp.lx, cp.ly, 1)
        return [self.launch(ks, (cp.cv, cp.ly * cp.ys, n), local, x, partial, i32(spatial), i32(c), i32(cg),
                            i32(groups), i32(cp.xb)),
                self.launch(ka, (cp.cv, cp.ly * cp.ya, n), local, x, partial, gamma, beta, y, i32(spatial), i32(c),
                            i32(cg), i32(groups), i32(cp.xb), i32(cp.partials), i32(1 if silu else 0),
                            np.float32(eps))]

    def gn_one_kernel(self, group_elems: int, cg: int) -> tuple[cl.Kernel, int]:
        """gn_one and its work-group size: halved until the kernel accepts it (InitOne)."""
        wg, vw = gn_one_shape(group_elems, cg, self.max_wg)
        while True:
            k = self.kernel("group_norm", "gn_one", f"-DGN_WG={wg} -DGN_VW={vw} -DGN_UNROLL={GN_UNROLL}")
            if self.max_work_group(k) >= wg or wg == 1:
                return k, wg
            wg //= 2

    def _group_norm_one(self, x, gamma, beta, y, n, spatial, c, cg, groups, eps, silu) -> cl.Event:
        k, wg = self.gn_one_kernel(spatial * cg, cg)
        i32 = np.int32
        return self.launch(k, (wg * groups, n), (wg, 1), x, gamma, beta, y, i32(spatial), i32(c), i32(cg),
                           i32(1 if silu else 0), np.float32(eps))

    def gn_default_plan(self, n: int, groups: int, spatial: int, cg: int) -> str:
        """The library's GroupNorm plan on this device (PickPlan, as GroupNormGpu::Init calls it)."""
        chunks = gn_coop_plan(n, groups, spatial, cg, min(COOP_GROUP, self.max_wg), self.compute_units).chunks
        rows = gn_rows_plan(n, groups, spatial, groups * cg, min(ROWS_GROUP, self.max_wg)).rv > 0
        return gn_plan(self.flat, chunks, n, groups, spatial * cg, self.compute_units, rows)

    def _accepted_plan(self, kernel: str, cap: int, plan_of, planned):
        """plan_of(limit) for the largest work-group limit (from min(cap, the device's)) whose plan
        `kernel` accepts, lowered to the kernel's own limit while it does not (InitRows, InitCoop); a plan
        for which planned(plan) is false is returned as it is (no plan)."""
        limit = min(cap, self.max_wg)
        while True:
            plan = plan_of(limit)
            if not planned(plan):
                return plan
            kmax = self.max_work_group(self.kernel("group_norm", kernel, plan.options()))
            if kmax >= plan.lx * plan.ly:
                return plan
            limit = kmax

    def gn_rows_shape(self, n: int, groups: int, spatial: int, c: int) -> RowsPlan:
        """InitRows's plan (rv 0: the library runs "coop" instead)."""
        return self._accepted_plan("gn_rows", ROWS_GROUP, lambda limit: gn_rows_plan(n, groups, spatial, c, limit),
                                   lambda plan: plan.rv > 0)

    def _group_norm_rows(self, x, gamma, beta, y, n, c, eps, silu, plan: RowsPlan) -> cl.Event:
        return self.launch(self.kernel("group_norm", "gn_rows", plan.options()),
                           (plan.lx, plan.ly * ceil_div(n, plan.ly)), (plan.lx, plan.ly), x, gamma, beta, y,
                           np.int32(n), np.int32(c), np.int32(1 if silu else 0), np.float32(eps))

    def gn_coop_shape(self, n: int, groups: int, spatial: int, cg: int) -> CoopPlan:
        """InitCoop's plan (chunks NO_COOP: the library runs "one" instead)."""
        return self._accepted_plan("gn_coop", COOP_GROUP,
                                   lambda limit: gn_coop_plan(n, groups, spatial, cg, limit, self.compute_units),
                                   lambda plan: plan.chunks != NO_COOP)

    def _group_norm_coop(self, x, gamma, beta, y, n, spatial, c, cg, groups, eps, silu, plan: CoopPlan,
                         spin_limit: int) -> cl.Event:
        """gn_coop with this Runner's partial-sum words for (n, spatial, c, groups, plan): zeroed once,
        then launch number L tags its words L (RunCoop)."""
        key = (n, spatial, c, groups, plan)
        partial, launches = self._gn_partials.get(key) or (
            cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                      hostbuf=np.zeros(2 * n * groups * plan.k, np.uint64)), 0)
        self._gn_partials[key] = (partial, launches + 1)
        i32 = np.int32
        tag = np.uint32(launches % 0xFFFFFFFF + 1)
        return self.launch(self.kernel("group_norm", "gn_coop", plan.options()),
                           (plan.lx * plan.k * (groups // plan.gpw), plan.ly, n), (plan.lx, plan.ly, 1),
                           x, gamma, beta, y, partial, i32(spatial), i32(c), i32(cg),
                           i32(groups), i32(plan.k), i32(plan.rows), i32(1 if silu else 0), np.float32(eps),
                           tag, i32(spin_limit))

    def gelu(self, x, y, count: int, approximate: str = "erf") -> list[cl.Event]:
        items = ceil_div(count, 4)
        return [self.launch(self.kernel("gelu", "gelu"), (round_up(items, 256),), (256,), x, y,
                            np.int32(count), np.int32(GELU_MODES[approximate]))]

    def geglu(self, x, y, rows: int, d: int, approximate: str = "erf") -> list[cl.Event]:
        items = rows * ceil_div(d, 4)
        return [self.launch(self.kernel("geglu", "geglu"), (round_up(items, 256),), (256,), x, y,
                            np.int32(rows), np.int32(d), np.int32(GELU_MODES[approximate]))]

    def lora_factors(self, down: np.ndarray, up: np.ndarray) -> tuple[cl.Buffer, cl.Buffer]:
        """D [r, K] and U [N, r] as StoreOnDevice holds them: DT = D^T [K, r] and UT = U^T [r, N] in the
        storage type, balanced (D s, U / s with s = sqrt(max|U| / max|D|))."""
        d_max, u_max = float(np.abs(down).max()), float(np.abs(up).max())
        s = np.sqrt(u_max / d_max) if d_max > 0 and u_max > 0 else 1.0
        return self.upload(np.asarray(down, np.float32).T * s), self.upload(np.asarray(up, np.float32).T / s)

    def lora(self, x, y, out, dt, ut, m: int, k: int, n: int, r: int) -> list[cl.Event]:
        """out = y + (x D^T) U^T over m rows (LoraGpu::Run): t = x DT into scratch slot 0, then
        out += t UT (the accumulating GEMM); out starts as y (copied unless one buffer)."""
        events = []
        if out is not y:
            events.append(cl.enqueue_copy(self.queue, out, y))
        t = self.scratch(np.dtype(self.storage).itemsize * m * r, 0)
        events += self.gemm(x, dt, t, m, r, k, a_sm=k, a_sk=1, b_sk=r, b_sn=1, ldc=r)
        events += self.gemm(t, ut, out, m, n, r, a_sm=r, a_sk=1, b_sk=n, b_sn=1, ldc=n, accumulate=True)
        return events

    def flash_in_registers(self, dk: int, dv: int) -> bool:
        """FlashInRegisters: attn_flash with its plan's tiles builds for heads of at most
        FLASH_ITEM_MAX_HEAD, accepts its work-group and spills nothing (CL_KERNEL_PRIVATE_MEM_SIZE 0)."""
        if dk > FLASH_ITEM_MAX_HEAD or dv > FLASH_ITEM_MAX_HEAD:
            return False
        try:
            plan = _attention_tiles(dk, dv, "flash", self.local_mem, True, "flash", self.max_wg, False)
            k = self.kernel("attention", "attn_flash", plan.options(dk, dv))
        except (ValueError, cl.Error):
            return False
        return (k.get_work_group_info(cl.kernel_work_group_info.PRIVATE_MEM_SIZE, self.device) == 0
                and self.max_work_group(k) >= plan.work_group(dk, dv))

    def attention(self, q, k, v, o, n: int, lq: int, lk: int, heads: int, dk: int, dv: int,
                  scale: float, causal: bool, variant: str = "auto", kernel: str | None = None,
                  splits: int | None = None, plan: AttentionPlan | None = None,
                  scores_bytes: int | None = None) -> list[cl.Event]:
        """variant: the op's hint; kernel: "wide" | "flash" | "partial" | "recompute" forces one
        (DIFFLITE_ATTN_KERNEL); splits: 1 | 2 | 4 forces flash's key splits (DIFFLITE_ATTN_SPLITS,
        clamped as the library does); plan: launch these tiles as given instead (no rule applied; e.g.
        splits with too few keys); scores_bytes: the GEMM path's bound on S (DIFFLITE_ATTN_SCORES_BYTES)."""
        if plan is None:
            plan = attention_plan(dk, dv, variant, self.local_mem, flat=self.flat, kernel=kernel, max_wg=self.max_wg,
                                  shape=(n, lq, lk, heads), causal=causal, compute_units=self.compute_units,
                                  splits=splits, flash_in_registers=self.flash_in_registers(dk, dv))
        if plan.gemm:
            return self._attention_gemm(q, k, v, o, n, lq, lk, heads, dk, dv, scale, causal,
                                        scores_bytes or SCORES_BYTES)
        opts = plan.options(dk, dv)
        i32, f32 = np.int32, np.float32
        items = plan.work_group(dk, dv)  # a work-group owns bq rows
        rows = ceil_div(lq, plan.bq) * items
        if plan.splits > 1:
            return self._attention_split(plan, q, k, v, o, n, lq, lk, heads, dk, dv, scale, causal)
        if plan.variant in ("flash", "wide"):
            name = f"attn_{plan.variant}"
            return [self.launch(self.kernel("attention", name, opts), (rows, heads, n), (items, 1, 1),
                                q, k, v, o, i32(lq), i32(lk), i32(heads), f32(scale), i32(causal))]
        stats = self.scratch(8 * n * heads * lq, 0)
        chunks = ceil_div(dv, plan.dvc)
        e1 = self.launch(self.kernel("attention", "attn_rowstats", opts), (rows, heads, n), (items, 1, 1),
                         q, k, stats, i32(lq), i32(lk), i32(heads), i32(dk), f32(scale), i32(causal))
        e2 = self.launch(self.kernel("attention", "attn_output", opts), (rows, heads * chunks, n),
                         (items, 1, 1), q, k, v, stats, o, i32(lq), i32(lk), i32(heads), i32(dk), i32(dv),
                         f32(scale), i32(causal))
        return [e1, e2]

    def softmax_group(self) -> int:
        """attn_softmax_rows' work-items per row: SOFTMAX_GROUP, halved until the kernel takes it."""
        smw = SOFTMAX_GROUP
        while smw > 1 and self.max_work_group(self.kernel("attention", "attn_softmax_rows", f"-DAT_SMW={smw}")) < smw:
            smw //= 2
        return smw

    def attention_gemm_scratch(self, n: int, lq: int, lk: int, heads: int, dk: int, dv: int,
                               scores_bytes: int = SCORES_BYTES) -> int:
        """AttentionGpu::ScratchSlotBytes summed over the slots, on the GEMM path: S and (N > 1) O' of
        a full chunk, plus the largest split-K partials of its GEMMs (the tile PickTile takes here,
        split_k)."""
        es = np.dtype(self.storage).itemsize
        rows_c = attention_chunk_rows(n, heads, lq, lk, es, scores_bytes)
        split = 0
        for rows in {rows_c, lq % rows_c or rows_c}:
            for m, nn, k, a_kmajor, b_kmajor in ((rows, lk, dk, True, True), (rows, dv, lk, True, False)):
                macs = n * heads * m * nn * k
                _, tile = self.gemm_kernel(m, nn, a_kmajor, b_kmajor, macs)
                tiles = ceil_div(m, tile.tm) * ceil_div(nn, tile.tn) * n * heads
                s = split_k(self.compute_units, tiles, k) if tile.vec else 1
                split = max(split, s * n * heads * m * nn * es if s > 1 else 0)
        return n * heads * rows_c * (lk + (dv if n > 1 else 0)) * es + split

    def _attention_gemm(self, q, k, v, o, n: int, lq: int, lk: int, heads: int, dk: int, dv: int,
                        scale: float, causal: bool, scores_bytes: int) -> list[cl.Event]:
        """The partial softmax as GEMMs (AttentionGpu::RunGemm), chunk by chunk of query rows:
        S [n][h][rows][lk] = q k^T (scratch SCORES_SLOT), attn_softmax_rows in place, then O = P v into
        o (n = 1: from the chunk's first row) or into O' [n][h][rows][dv] (SPLIT_SLOT) and
        attn_scatter_rows; q's chunk is read from its first row too (no sub-buffers)."""
        es = np.dtype(self.storage).itemsize
        i32, f32 = np.int32, np.float32
        rows_c = attention_chunk_rows(n, heads, lq, lk, es, scores_bytes)
        s = self.scratch(n * heads * rows_c * lk * es, SCORES_SLOT)
        ob = self.scratch(n * heads * rows_c * dv * es, SPLIT_SLOT) if n > 1 else None
        smw = self.softmax_group()
        softmax = self.kernel("attention", "attn_softmax_rows", f"-DAT_SMW={smw}")
        events = []
        for m0 in range(0, lq, rows_c):
            rows = min(rows_c, lq - m0)
            events += self.gemm(q, k, s, rows, lk, dk, a_sm=heads * dk, a_sk=1, b_sk=1, b_sn=heads * dk, ldc=lk,
                                bdims=(n, heads), a_bs=(lq * heads * dk, dk), b_bs=(lk * heads * dk, dk),
                                c_bs=rows * lk, a_row=m0)
            events.append(self.launch(softmax, (smw, n * heads * rows), (smw, 1), s, i32(rows), i32(lk), i32(m0),
                                      f32(scale), i32(causal)))
            pv = dict(a_sm=lk, a_sk=1, b_sk=heads * dv, b_sn=1, bdims=(n, heads),
                      a_bs=(heads * rows * lk, rows * lk), b_bs=(lk * heads * dv, dv))
            if n == 1:
                events += self.gemm(s, v, o, rows, dv, lk, ldc=heads * dv, c_bs=dv, c_row=m0, **pv)
                continue
            events += self.gemm(s, v, ob, rows, dv, lk, ldc=dv, c_bs=rows * dv, **pv)
            events.append(self.launch(self.kernel("attention", "attn_scatter_rows"),
                                      (round_up(rows * heads * dv, SCATTER_GROUP), n), (SCATTER_GROUP, 1),
                                      ob, o, i32(rows), i32(lq), i32(m0), i32(heads), i32(dv)))
        return events

    def _attention_split(self, plan: AttentionPlan, q, k, v, o, n: int, lq: int, lk: int, heads: int, dk: int,
                         dv: int, scale: float, causal: bool) -> list[cl.Event]:
        """Split attn_flash into partials (scratch slot SPLIT_SLOT), then attn_merge into o
        (AttentionGpu::RunSplit)."""
        opts = plan.options(dk, dv)
        i32, f32 = np.int32, np.float32
        wg = plan.work_group(dk, dv)
        part = self.scratch(plan.split_bytes(n, lq, heads, dv), SPLIT_SLOT)
        grid = (ceil_div(lq, plan.bq) * wg, heads * plan.splits, n)  # dimension 1: head * splits + split
        e1 = self.launch(self.kernel("attention", "attn_flash", opts), grid, (wg, 1, 1), q, k, v, part, i32(lq),
                         i32(lk), i32(heads), f32(scale), i32(causal))
        rows = n * lq * heads
        e2 = self.launch(self.kernel("attention", "attn_merge", opts), (round_up(rows * ceil_div(dv, 4), MERGE_WG),),
                         (MERGE_WG,), part, o, i32(rows))
        return [e1, e2]

    def winograd_scratch_bytes(self, n, h, w, cin, cout, elem: int | None = None,
                               bound: int = WINOGRAD_SCRATCH_BYTES) -> int:
        """A full band's V and M (WinogradGpu::ScratchSlotBytes of slots 0 and 1: without U and the
        GEMMs' own), in bytes of `elem` (the storage type's where None)."""
        elem = elem or np.dtype(self.storage).itemsize
        tb = winograd_band_tiles(n, h, w, cin, cout, elem, bound)
        return 36 * tb * (cin + cout) * elem

    def winograd(self, x, u, bias, y, n: int, h: int, w: int, cin: int, cout: int,
                 scratch_bytes: int = WINOGRAD_SCRATCH_BYTES) -> list[cl.Event]:
        """WinogradGpu::Run of the transformed form, band by band of whole tile rows (tiles t0 ..
        t0 + tb - 1; winograd_band_tiles under `scratch_bytes`): wino_input into V [36][tb][cin]
        (scratch slot 0), the 36 GEMMs into M [36][tb][cout] (slot 1), wino_output into y."""
        th, tw, t = winograd_tiles(n, h, w)
        es = np.dtype(self.storage).itemsize
        band = winograd_band_tiles(n, h, w, cin, cout, es, scratch_bytes)
        vbuf = self.scratch(es * 36 * band * cin, 0)
        mbuf = self.scratch(es * 36 * band * cout, 1)
        i32 = np.int32
        events = []
        for t0 in range(0, t, band):
            tb = min(band, t - t0)
            events.append(self.launch(self.kernel("winograd_conv3x3", "wino_input"), (round_up(tb * cin, 128),),
                                      (128,), x, vbuf, i32(h), i32(w), i32(cin), i32(th), i32(tw), i32(tb),
                                      i32(t0)))
            # M[p] (tb x Cout) = V[p] (tb x Cin) * U[p] (Cin x Cout) for the 36 p.
            events += self.gemm(vbuf, u, mbuf, tb, cout, cin, a_sm=cin, a_sk=1, b_sk=cout, b_sn=1, ldc=cout,
                                bdims=(36,), a_bs=(tb * cin,), b_bs=(cin * cout,), c_bs=tb * cout)
            events.append(self.launch(self.kernel("winograd_conv3x3", "wino_output"), (round_up(tb * cout, 128),),
                                      (128,), mbuf, bias, y, i32(h), i32(w), i32(cout), i32(th), i32(tw), i32(tb),
                                      i32(t0)))
        return events

    def gemm(self, a, b, c, m: int, n: int, k: int, a_sm: int, a_sk: int, b_sk: int, b_sn: int, ldc: int,
             bdims=(), a_bs=(), b_bs=(), c_bs: int = 0, bias=None, tile: GemmTile | None = None,
             quads: tuple[bool, bool] | None = None, accumulate: bool = False, a_row: int = 0,
             c_row: int = 0) -> list[cl.Event]:
        """The backend's tiled GEMM as gemm.cc's Gemm::Init / Run launch it on a GPU (tile, operand
        layouts, split-K): C[b][m][n] = A(b,m,k) B(b,k,n) (+ bias) (+ C[b][m][n] where `accumulate`:
        GemmShape::accumulate, never split) with element strides. `tile` forces a tile
        (DIFFLITE_GEMM_TILE); `quads` (A, B) turns quad staging off where False. `a_row` / `c_row`:
        A's and C's first row (gemm.h: GemmRows; each a multiple of 4 elements in)."""
        extra = " -DGEMM_ACC=1" if accumulate else ""
        a_kmajor, b_kmajor = a_sk == 1, b_sk == 1 and b_sn != 1
        # gemm.cc: no quads with half storage and B n-major
        allowed = quads or ((True, True) if self.storage != np.float16 or b_kmajor else (False, False))
        quads = (allowed[0] and (stages_in_quads(k, a_sm, a_bs) if a_kmajor
                                 else a_sm == 1 and stages_in_quads(m, a_sk, a_bs)),
                 allowed[1] and (stages_in_quads(k, b_sn, b_bs) if b_kmajor
                                 else b_sn == 1 and stages_in_quads(n, b_sk, b_bs)))
        if tile is None:
            macs = (int(np.prod(bdims)) if bdims else 1) * m * n * k
            kernel, tile = self.gemm_kernel(m, n, a_kmajor, b_kmajor, macs, quads, extra)
        else:
            kernel = self._cached_kernel(GEMM_CL, "gemm", tile.options(a_kmajor, b_kmajor, *quads) + extra)
        batches = int(np.prod(bdims)) if bdims else 1
        tiles = ceil_div(m, tile.tm) * ceil_div(n, tile.tn) * batches
        splits = split_k(self.compute_units, tiles, k) if tile.vec and not accumulate else 1
        pad = 4 - len(bdims)  # right-aligned, innermost in .w; unused slots 1 / stride 0
        int4, i32 = cltypes.make_int4, np.int32
        out = self.scratch(4 * splits * batches * m * n, 2) if splits > 1 else c
        local = (tile.tn // tile.wn, tile.tm // tile.wm, 1)
        events = [self.launch(kernel, (ceil_div(n, tile.tn) * local[0], ceil_div(m, tile.tm) * local[1],
                                       batches * splits), local,
                              a, b, bias, out, i32(m), i32(n), i32(k), i32(a_sm), i32(a_sk), i32(b_sk), i32(b_sn),
                              i32(n if splits > 1 else ldc), int4(*([1] * pad), *bdims),
                              int4(*([0] * pad), *a_bs), int4(*([0] * pad), *b_bs),
                              i32(m * n if splits > 1 else c_bs), i32(bias is not None and splits == 1),
                              i32(a_row * a_sm), i32(0 if splits > 1 else c_row * ldc), i32(0))]
        if splits > 1:
            events.append(self._splitk_sum(out, bias, c, m, n, ldc, c_bs, batches, splits, c_row * ldc))
        return events

    def _cached_kernel(self, path: Path, name: str, opts: str) -> cl.Kernel:
        key = (str(path), name, opts)
        if key not in self._kernels:
            self._kernels[key] = cl.Kernel(self.program(path, opts), name)
        return self._kernels[key]

    def _splitk_sum(self, partials, bias, c, m: int, n: int, ldc: int, c_bs: int, batches: int,
                    splits: int, c_base: int = 0) -> cl.Event:
        """gemm.cl's splitk_sum (gemm.cc: SplitKSum::Run)."""
        i32 = np.int32
        return self.launch(self._cached_kernel(GEMM_CL, "splitk_sum", ""), (round_up(n, 64), m, batches),
                           (64, 1, 1), partials, bias, c, i32(m), i32(n), i32(ldc), i32(c_bs), i32(splits),
                           i32(bias is not None), i32(c_base))

    def conv3x3(self, x, w_ohwi, bias, y, n: int, h: int, w: int, cin: int, cout: int,
                tile: GemmTile | None = None) -> list[cl.Event]:
        """The backend's direct 3x3 / stride 1 / pad 1 CONV_2D (conv.cc: CreateConv2d's tiled path,
        conv.cl's implicit GEMM, split-K and splitk_sum where it applies): the baseline Winograd
        must beat. `tile` forces a tile (DIFFLITE_GEMM_TILE)."""
        m, k = n * h * w, 9 * cin

        def options(t: GemmTile) -> str:
            return f"-DTM={t.tm} -DTN={t.tn} -DTK={t.tk} -DWM={t.wm} -DWN={t.wn}" + (" -DVEC=1" if t.vec else "")

        if tile is None:  # PickTile
            tile = next(t for t in gemm_tiles(m, cout, m * cout * k)
                        if t.threads <= self.max_wg and t.threads % t.tk == 0 and not (
                            t.unspilled_only and self.private_bytes(self._cached_kernel(CONV_CL, "conv2d", options(t)))))
        tiles = ceil_div(m, tile.tm) * ceil_div(cout, tile.tn)
        splits = split_k(self.compute_units, tiles, k) if tile.vec else 1
        opts = options(tile)
        kernel = self._cached_kernel(CONV_CL, "conv2d", opts)
        i32, int4 = np.int32, cltypes.make_int4
        out = self.scratch(4 * splits * m * cout, 2) if splits > 1 else y
        local = (tile.tn // tile.wn, tile.tm // tile.wm, 1)
        events = [self.launch(kernel, (ceil_div(cout, tile.tn) * local[0], ceil_div(m, tile.tm) * local[1], splits),
                              local, x, w_ohwi, bias, out, i32(m), i32(cout), i32(k), int4(h, w, cin, h),
                              int4(w, 3, 1, 1), int4(1, 1, 1, 1), i32(splits == 1), i32(0))]
        if splits > 1:
            events.append(self._splitk_sum(out, bias, y, m, cout, cout, m * cout, 1, splits))
        return events


def pick_context(prefer: str | None = None) -> tuple[cl.Context, cl.Device]:
    """The first OpenCL device (a GPU first, unless `prefer` names a platform substring)."""
    platforms = cl.get_platforms()  # raises when no ICD is installed
    devices = []
    for p in platforms:
        for d in p.get_devices():
            devices.append((p, d))
    if not devices:
        raise RuntimeError("no OpenCL device found")
    if prefer:
        chosen = [pd for pd in devices if prefer.lower() in (pd[0].name + " " + pd[1].name).lower()]
        if not chosen:
            raise RuntimeError(f"no OpenCL device matching {prefer!r}: " + ", ".join(d.name for _, d in devices))
        devices = chosen
    gpus = [pd for pd in devices if pd[1].type & cl.device_type.GPU]
    p, d = (gpus or devices)[0]
    return cl.Context([d]), d


def event_seconds(events: list[cl.Event]) -> float:
    """Device time from the first event's start to the last event's end."""
    for e in events:
        e.wait()
    return (events[-1].profile.end - events[0].profile.start) * 1e-9
