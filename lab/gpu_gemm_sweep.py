"""GEMM tiles at the SD 1.5 UNet's (batch 2) projection, convolution and Winograd shapes, on any OpenCL device
(pyopencl, fp32 or --half storage): the library's default tile against forced ones (DIFFLITE_GEMM_TILE's
TMxTNxTKxWMxWN[v]), each through the backend's own launch (split-K where the library would split),
checked against NumPy. The vectorised kernels' register tile is WM rows by WN / 4 float4 column
groups (common/vec_tile.cl).

    python lab/gpu_gemm_sweep.py [--runs 10] [--small] [--tiles 64x64x16x4x4v,128x128x16x8x8v]
    python lab/gpu_gemm_sweep.py --registers   # each tile's kernels: spills, work-group limit
    python lab/gpu_gemm_sweep.py --half        # half storage (vload_half), float arithmetic

Writes lab/results/gpu_gemm_sweep_<device>.json (or $OUT/...) and prints a markdown table:
milliseconds, TFLOP/s and the speedup over the default tile, per shape.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_kernels_harness, gpu_ablation
sys.path.insert(0, str(ROOT / "lab"))  # bench_out

from bench_out import write_result  # noqa: E402
from gpu_ablation import measure  # noqa: E402
from gpu_kernels_harness.launch import GemmTile, Runner  # noqa: E402

# (label, M, N, K): FULLY_CONNECTED at batch 2 (rows = 2 x tokens); the 3x3 convolutions as
# (label, N, H, W, Cin, Cout) run conv.cl's implicit GEMM.
FC_SHAPES = [("GEGLU in, 64x64", 8192, 2560, 320), ("GEGLU in, 16x16", 512, 10240, 1280),
             ("FF out, 32x32", 2048, 640, 2560), ("q/k/v/out, 64x64", 8192, 320, 320),
             ("proj, 32x32", 2048, 640, 640)]
CONV_SHAPES = [("conv3x3 8x8x1280", 2, 8, 8, 1280, 1280), ("conv3x3 16x16x1280", 2, 16, 16, 1280, 1280)]
# (label, T, Cin, Cout): the 36 Winograd GEMMs M[p] = V[p] U[p], V [36][T][Cin] (k-major) and
# U [36][Cin][Cout] (n-major), at a UNet level and a VAE level.
WINO_SHAPES = [("wino 2x64x64x320", 512, 320, 320), ("wino 1x128x128x512 (VAE)", 1024, 512, 512)]
SMALL_WINO = [("small wino", 20, 12, 16)]
QUADS = None  # (A, B) from --quads; None: as the library decides
SMALL_FC = [("small fc", 150, 270, 37)]
SMALL_CONV = [("small conv", 1, 9, 10, 19, 36)]
TILES = ["64x64x16x4x4v", "128x128x16x8x8v", "128x128x8x8x8v", "128x64x16x8x8v", "64x128x16x8x8v",
         "64x64x16x8x8v", "128x64x16x8x4v"]


def parse_tile(text: str) -> GemmTile:
    vec = text.endswith("v")
    tm, tn, tk, wm, wn = (int(t) for t in text.rstrip("v").split("x"))
    return GemmTile(tm, tn, tk, wm, wn, vec)


def time_fc(r: Runner, shape, tiles, runs: int) -> list[dict]:
    _, m, n, k = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)  # FULLY_CONNECTED weights [N][K]
    want = a @ w.T
    ab, wb, c = r.upload(a), r.upload(w), r.empty((m, n))
    rows = []
    for label, tile in tiles:
        fn = lambda tile=tile: r.gemm(ab, wb, c, m, n, k, k, 1, 1, k, n, tile=tile, quads=QUADS)  # noqa: E731
        rows.append(row(r, label, fn, 2.0 * m * n * k, runs, lambda: r.download(c, (m, n)), want))
    return rows


def time_wino(r: Runner, shape, tiles, runs: int) -> list[dict]:
    _, t, cin, cout = shape
    rng = np.random.default_rng(0)
    v = rng.standard_normal((36, t, cin)).astype(np.float32)
    u = (rng.standard_normal((36, cin, cout)) / np.sqrt(cin)).astype(np.float32)
    want = np.matmul(v, u)
    vb, ub, mb = r.upload(v), r.upload(u), r.empty((36, t, cout))
    rows = []
    for label, tile in tiles:
        fn = lambda tile=tile: r.gemm(vb, ub, mb, t, cout, cin, a_sm=cin, a_sk=1, b_sk=cout,  # noqa: E731
                                      b_sn=1, ldc=cout, bdims=(36,), a_bs=(t * cin,),
                                      b_bs=(cin * cout,), c_bs=t * cout, tile=tile, quads=QUADS)
        rows.append(row(r, label, fn, 2.0 * 36 * t * cin * cout, runs, lambda: r.download(mb, (36, t, cout)),
                        want))
    return rows


def time_conv(r: Runner, shape, tiles, runs: int) -> list[dict]:
    _, n, h, w, cin, cout = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, w, cin)).astype(np.float32)
    wt = (rng.standard_normal((cout, 3, 3, cin)) / np.sqrt(9 * cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.stack([xp[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=3)
    want = cols.reshape(n * h * w, 9 * cin) @ wt.reshape(cout, 9 * cin).T + bias
    xb, wb, bb, y = r.upload(x), r.upload(wt), r.upload(bias), r.empty((n, h, w, cout))
    rows = []
    for label, tile in tiles:
        if tile is not None and tile.threads % tile.tk:
            continue  # conv.cl needs NT % TK == 0
        fn = lambda tile=tile: r.conv3x3(xb, wb, bb, y, n, h, w, cin, cout, tile=tile)  # noqa: E731
        rows.append(row(r, label, fn, 2.0 * n * h * w * cout * 9 * cin, runs,
                        lambda: r.download(y, (n * h * w, cout)), want))
    return rows


def row(r: Runner, label: str, fn, flops: float, runs: int, get, want) -> dict:
    try:
        chain = measure(fn, runs, 2, r.queue)[0]
    except Exception as e:  # a tile the device cannot build or run
        return {"tile": label, "error": str(e).splitlines()[0]}
    err = float(np.abs(get() - want).max() / np.abs(want).max())
    return {"tile": label, "ms": chain * 1e3, "tflops": flops / chain / 1e12, "max_rel_diff": err}


def report_registers(r: Runner, tiles) -> None:
    """Per tile, the GEMM kernel (both operand layouts of FULLY_CONNECTED: A and B k-major) and the 3x3
    conv kernel: CL_KERNEL_PRIVATE_MEM_SIZE (bytes a work-item spills) and CL_KERNEL_WORK_GROUP_SIZE."""
    import pyopencl as cl

    from gpu_kernels_harness.launch import CONV_CL, GEMM_CL

    info = cl.kernel_work_group_info
    print("| tile | kernel | private bytes | work-group limit | items |")
    print("|---|---|---|---|---|")
    for label, tile in tiles:
        if tile is None:
            continue
        opts = {"gemm": tile.options(True, True), "conv2d": tile.options(True, False).split(" -DA_KMAJOR")[0]}
        for name, path in (("gemm", GEMM_CL), ("conv2d", CONV_CL)):
            try:
                k = r._cached_kernel(path, name, opts[name])
            except Exception as e:  # noqa: BLE001 - a tile this device cannot build
                print(f"| {label} | {name} | build failed: {str(e).splitlines()[0]} | | |")
                continue
            print(f"| {label} | {name} | {k.get_work_group_info(info.PRIVATE_MEM_SIZE, r.device)} | "
                  f"{k.get_work_group_info(info.WORK_GROUP_SIZE, r.device)} | {tile.threads} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU OpenCL such as PoCL)")
    ap.add_argument("--tiles", default=",".join(TILES), help="comma-separated TMxTNxTKxWMxWN[v] tiles")
    ap.add_argument("--registers", action="store_true", help="only report each tile's spills and work-group limit")
    ap.add_argument("--half", action="store_true",
                    help="half storage through vload_half / vstore_half (-DDL_HALF_IO=1), float arithmetic")
    ap.add_argument("--quads", choices=("auto", "ab", "a", "b", "none"), default="auto",
                    help="which operands may be staged in quads (A_QUADS / B_QUADS) where their layout "
                         "allows; auto: as the library decides")
    args = ap.parse_args()
    global QUADS
    QUADS = None if args.quads == "auto" else ("a" in args.quads, "b" in args.quads)
    r = Runner(half_io=args.half)
    tiles = [("default", None)] + [(t, parse_tile(t)) for t in args.tiles.split(",")]
    tiles = [(label, t) for label, t in tiles if t is None or t.threads <= r.max_wg]
    if args.registers:
        report_registers(r, tiles)
        return 0
    results = []
    for shape in SMALL_FC if args.small else FC_SHAPES:
        results.append({"shape": shape[0], "mnk": list(shape[1:]), "rows": time_fc(r, shape, tiles, args.runs)})
    for shape in SMALL_CONV if args.small else CONV_SHAPES:
        results.append({"shape": shape[0], "nhwcc": list(shape[1:]), "rows": time_conv(r, shape, tiles, args.runs)})
    for shape in SMALL_WINO if args.small else WINO_SHAPES:
        results.append({"shape": shape[0], "t_cin_cout": list(shape[1:]), "rows": time_wino(r, shape, tiles, args.runs)})
    device = r.device.name.strip()
    print(f"\n{device}: GEMM tiles (ms, TFLOP/s, speedup over the default tile)")
    print("| shape | " + " | ".join(label for label, _ in tiles) + " |")
    print("|---" * (len(tiles) + 1) + "|")
    for res in results:
        by = {row["tile"]: row for row in res["rows"]}
        base = by.get("default", {}).get("ms")
        cells = []
        for label, _ in tiles:
            rw = by.get(label)
            if rw is None or "ms" not in rw:
                cells.append("-" if rw is None else "error")
                continue
            bad = " WRONG" if rw["max_rel_diff"] > (1e-2 if args.half else 1e-3) else ""
            cells.append(f"{rw['ms']:.3f} ({rw['tflops']:.1f}, {base / rw['ms']:.2f}x){bad}")
        print(f"| {res['shape']} | " + " | ".join(cells) + " |")
    write_result("gpu_gemm_sweep", device, {"device": device, "storage": "half" if args.half else "float",
                                            "tiles": [label for label, _ in tiles], "results": results},
                 suffix=("_half" if args.half else "") + ("" if args.quads == "auto" else f"_quads_{args.quads}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
