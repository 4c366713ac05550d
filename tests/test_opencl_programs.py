"""What the op library's OpenCL programs share across ops (the ops' own kernel tests:
tests/test_op_*.py):

* the Python plans of benchmarks/gpu_kernels_harness/launch.py mirror the C++ host code: every
  constant and rule of group_norm_opencl.cc, attention_opencl.cc, lora_opencl.cc and builtins/matmul's
  GEMM tile choice (gemm.cc, gemm.h) that the harness copies, and the 128x128 GEMM tile only where its
  kernel spills nothing;
* every ops/*/*.cl builds standalone with only the backend's base options (as the program cache
  builds it) on PoCL, and `#include "NAME.cl"` is expanded once per program;
* every program (ops, builtins, boundary conversions) compiles for half storage in each build
  variant with the clang PoCL uses (no fp16 device here: PoCL has no cl_khr_fp16).

No OpenCL (pyopencl missing, no ICD, no PoCL device) or no clang is a failure with the reason,
never a skip.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import ROOT


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


def harness_src(launch) -> str:
    return Path(launch.__file__).read_text()


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
    assert 'for (const char* k : {"wide", "flash", "partial", "recompute"})' in src  # DIFFLITE_ATTN_KERNEL
    assert set(launch.ATTN_KERNELS) == {"wide", "flash", "partial", "recompute"}
    # The partial softmax as GEMMs (InitGemm / RunGemm / GemmChunkRows; the harness's _attention_gemm).
    cc = ops / "attention" / "attention_opencl.cc"
    for name, value in (("kScoresBytes", launch.SCORES_BYTES), ("kChunkRowQuantum", launch.CHUNK_ROW_QUANTUM),
                        ("kScoresSlot", launch.SCORES_SLOT), ("kSoftmaxGroup", launch.SOFTMAX_GROUP),
                        ("kScatterGroup", launch.SCATTER_GROUP), ("kSplitSlot", launch.SPLIT_SLOT),
                        ("kGemmMinHead", launch.GEMM_MIN_HEAD)):
        assert _cxx_constant(cc, name) == value, name
    assert '(forced == "partial" || std::max(dk_, dv_) >= kGemmMinHead)' in src
    assert "constexpr int kOutSlot = kSplitSlot;" in src
    assert "if (forced != \"recompute\" && !ctx.PreferFlatKernels() &&" in src  # tiled devices only
    assert "gemm = not flat and kernel != \"recompute\"" in harness_src(launch)
    for line in ("qk.a_sm = h * dk_, qk.a_sk = 1, qk.b_sk = 1, qk.b_sn = h * dk_, qk.ldc = lk_;",
                 "qk.bdims = {n_, h};", "qk.a_bs = {lq_ * h * dk_, dk_};", "qk.b_bs = {lk_ * h * dk_, dk_};",
                 "qk.c_bs = rows * lk_;", "pv.a_sm = lk_, pv.a_sk = 1, pv.b_sk = h * dv_, pv.b_sn = 1;",
                 "pv.a_bs = {h * rows * lk_, rows * lk_};", "pv.b_bs = {lk_ * h * dv_, dv_};",
                 "pv.ldc = n_ == 1 ? h * dv_ : dv_;", "pv.c_bs = n_ == 1 ? dv_ : rows * dv_;",
                 "if (fit >= lq) return lq;",
                 "std::max<int64_t>(kChunkRowQuantum, fit / kChunkRowQuantum * kChunkRowQuantum);",
                 "builtin::GemmRows{m0, 0});", "builtin::GemmRows{0, m0});",
                 "{Arg(s), Arg(r), Arg(lk), Arg(m0c), Arg(scale), Arg(causal)}",
                 "{Arg(ob), Arg(o), Arg(r), Arg(lq), Arg(m0c), Arg(heads), Arg(dv)}"):
        assert line in src, line
    for line in ("a_sm=heads * dk, a_sk=1, b_sk=1, b_sn=heads * dk, ldc=lk,",
                 "bdims=(n, heads), a_bs=(lq * heads * dk, dk), b_bs=(lk * heads * dk, dk),",
                 "c_bs=rows * lk, a_row=m0)","ldc=heads * dv, c_bs=dv, c_row=m0, **pv)",
                 "pv = dict(a_sm=lk, a_sk=1, b_sk=heads * dv, b_sn=1, bdims=(n, heads),",
                 "a_bs=(heads * rows * lk, rows * lk), b_bs=(lk * heads * dv, dv))",
                 "ldc=dv, c_bs=rows * dv, **pv)",
                 "s, i32(rows), i32(lk), i32(m0),",
                 "ob, o, i32(rows), i32(lq), i32(m0), i32(heads), i32(dv)",
                 "rows = max(CHUNK_ROW_QUANTUM, fit // CHUNK_ROW_QUANTUM * CHUNK_ROW_QUANTUM)"):
        assert line in harness_src(launch), line
    # GemmChunkRows's rule, spot-checked: S of all rows fits; else multiples of 64 rows within the bound.
    assert launch.attention_chunk_rows(2, 8, 4096, 77, 2) == 4096
    assert launch.attention_chunk_rows(2, 8, 4096, 4096, 2) == 128
    assert launch.attention_chunk_rows(1, 1, 4096, 4096, 2) == 2048
    assert launch.attention_chunk_rows(1, 1, 150, 150, 4, 64 * 150 * 4) == 64
    assert launch.attention_chunk_rows(1, 1, 150, 150, 4, 10) == 64  # at least 64 rows
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
    # scratch, tested through the library in tests/test_op_winograd.py)
    assert "cl_mem u = in[1].mem;" in wino and "gemm_[tiles == band_ ? 0 : 1].Run(ctx, v, u, nullptr, m," in wino
    # Bands of whole tile rows (BandTiles; the harness's winograd_band_tiles, the compiler's
    # difflite.core.winograd.band_tiles) with the band's first tile t0 as the kernels' last argument.
    from difflite.core import winograd as wg

    wino_cc = ops / "winograd_conv3x3" / "winograd_conv3x3_opencl.cc"
    assert _cxx_constant(wino_cc, "kScratchBytes") == launch.WINOGRAD_SCRATCH_BYTES == wg.SCRATCH_BYTES
    for line in ("if (fit >= rows) return rows * tiles_w;", "const int64_t bands = CeilDiv(rows, std::max<int64_t>(fit, 1));",
                 "return CeilDiv(rows, bands) * tiles_w;",
                 "s.a_bs = {tiles * cin_};", "s.c_bs = tiles * cout_;",
                 "{Arg(in[0].mem), Arg(v), Arg(h), Arg(w), Arg(cin), Arg(th), Arg(tw), Arg(tb),",
                 "Arg(tw), Arg(tb), Arg(t0c)});"):
        assert line in wino, line
    for line in ("bands = ceil_div(rows, max(fit, 1))", "return ceil_div(rows, bands) * tw",
                 "x, vbuf, i32(h), i32(w), i32(cin), i32(th), i32(tw), i32(tb),",
                 "mbuf, bias, y, i32(h), i32(w), i32(cout), i32(th), i32(tw), i32(tb),",
                 "bdims=(36,), a_bs=(tb * cin,), b_bs=(cin * cout,), c_bs=tb * cout)"):
        assert line in harness_src(launch), line
    cl_src = (ops / "winograd_conv3x3" / "winograd_conv3x3.cl").read_text()
    assert cl_src.count("int tiles_w, int T, int t0) {") == 2 and cl_src.count("const int tg = t0 + t;") == 2
    for n, h, w, cin, cout, elem, bound in ((2, 13, 10, 24, 40, 4, 24192), (1, 1024, 1024, 256, 128, 2,
                                                                            wg.SCRATCH_BYTES), (1, 8, 8, 4, 4, 2, 1),
                                            (1, 512, 512, 128, 128, 2, wg.SCRATCH_BYTES)):
        assert launch.winograd_band_tiles(n, h, w, cin, cout, elem, bound) == wg.band_tiles(n, h, w, cin, cout, elem,
                                                                                            bound)
    # SDXL's VAE decoder at 1024 x 1024 (Cin 256, Cout 128, fp16): 256 tiles a row of 6.75 MiB of V + M, 9 rows a band
    assert wg.band_tiles(1, 1024, 1024, 256, 128, 2) == 9 * 256
    # SD 1.5's VAE decoder at 512 x 512, 128 -> 128 channels, fp16: 28 of its 128 rows fit; five bands of
    # 26 rows (the last 24), not four of 28 and a short 16
    assert wg.band_tiles(1, 512, 512, 128, 128, 2) == 26 * 128
    # LoRA: the two GEMMs as the harness's lora launches them (t = x DT into slot 0, out += t UT
    # accumulating), the factors balanced and transposed as StoreOnDevice stores them.
    src = (ops / "lora" / "lora_opencl.cc").read_text()
    assert _cxx_constant(ops / "lora" / "lora_opencl.cc", "kScratchSlot") == 0
    assert "d.a_sm = layer.k, d.a_sk = 1, d.b_sk = r, d.b_sn = 1, d.ldc = r;" in src
    assert "u.a_sm = r, u.a_sk = 1, u.b_sk = layer.n, u.b_sn = 1, u.ldc = layer.n;" in src
    assert "u.accumulate = true;" in src and "std::sqrt(u_max / d_max)" in src
    harness = Path(launch.__file__).read_text()
    assert "a_sm=k, a_sk=1, b_sk=r, b_sn=1, ldc=r)" in harness
    assert "a_sm=r, a_sk=1, b_sk=n, b_sn=1, ldc=n, accumulate=True)" in harness
    assert "np.sqrt(u_max / d_max)" in harness
    gemm_cc = (ROOT / "custom_ops" / "builtins" / "matmul" / "gemm.cc").read_text()
    assert "if (!e.empty() || !tile_.vec || s_.accumulate) return e;" in gemm_cc  # never split
    assert "if tile.vec and not accumulate else 1" in harness


def test_every_program_builds_with_base_options(runner, launch):
    """Each .cl builds standalone with only the backend's options (as the program cache does)."""
    import pyopencl as cl

    files = sorted((ROOT / "custom_ops" / "ops").glob("*/*.cl"))
    assert {f.stem for f in files} >= {"group_norm", "gelu", "geglu", "attention", "winograd_conv3x3"}
    for f in files:
        cl.Program(runner.ctx, launch.cl_source(f)).build(options=["-DDL_T=float", "-DDL_T4=float4"])


# ---------------------------------------------------------------------------
# Programs: include expansion, half storage


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
    for f in (f for f in sources if f.stem not in launch.INCLUDED_ONLY):
        src = _HALF_PRELUDE + launch.cl_source(f)
        for extra in launch.PROGRAM_VARIANTS.get(f.stem, ([],)):
            cmd = [clang, "-x", "cl", "-cl-std=CL1.2", "-target", "spir64", "-Xclang", "-finclude-default-header",
                   *_HALF_MODES[mode], "-DDL_T=half", "-DDL_T4=half4", *extra, "-fsyntax-only", "-"]
            p = subprocess.run(cmd, input=src, capture_output=True, text=True)
            assert p.returncode == 0, f"{f.name} {extra} does not compile for half storage ({mode}):\n{p.stderr[-2000:]}"
