"""Sweep of GroupNorm's plans at SD 1.5 GroupNorm shapes, on any OpenCL device (pyopencl, fp32
storage): the split plan (gn_stats_cols + gn_apply_cols) over the statistics pass's work-groups down
the rows (ys, hence partials per group), the cooperative plan (gn_coop) over its work-group limit,
work-groups per compute unit (hence slices per block) and registers per work-item (hence chunks per
slice), its fallback (spin_limit 0), the one-kernel plan (gn_one), the rows plan (gn_rows, LayerNorms:
--groups 1 with shapes Nx1xC) and a copy of the same bytes.

    python lab/gpu_gn_sweep.py [--runs 20] [--small]

Each configuration runs through benchmarks/gpu_kernels_harness/launch.py (the library's kernels and
launch shapes, `ys` overridden), queued behind a user event (no host gaps), median of --runs; it
checks the output against the library's own plan. Writes lab/results/gpu_gn_sweep_<device>.json
(or $OUT/...) and prints a markdown table per shape; the library's choice is marked.
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
from gpu_ablation import measure, same_size_copy_bandwidth  # noqa: E402
from gpu_kernels_harness.launch import MAX_PARTIALS, NO_COOP, Runner, gn_cols_plan, gn_coop_plan  # noqa: E402
from gpu_kernels_harness.unfused import Unfused  # noqa: E402

# (N, H*W, C): the ablation's two shapes, then the SD 1.5 UNet's GroupNorms at batch 2.
SHAPES = [(1, 4096, 320), (1, 4096, 1280), (2, 4096, 320), (2, 4096, 640), (2, 1024, 640), (2, 1024, 1280),
          (2, 256, 1280), (2, 256, 2560), (2, 64, 1280)]
SMALL_SHAPES = [(1, 256, 64), (2, 64, 128)]
# --vae: the SD 1.5 VAE decoder's GroupNorms (batch 1, 512x512 out); only the library's own shapes of
# each plan (coop's costs a read of every slice per work-group at spin_limit 0, skipped).
VAE_SHAPES = [(1, 4096, 512), (1, 16384, 512), (1, 65536, 256), (1, 65536, 512), (1, 262144, 128),
              (1, 262144, 256)]
GROUPS = 32


def sweep_shape(r: Runner, u: Unfused, shape, runs: int, grid: bool = True, groups: int = GROUPS) -> dict:
    n, spatial, c = shape
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, c).astype(np.float32)
    xb, gb, bb = r.upload(x), r.upload(gamma), r.upload(beta)
    y = r.empty(shape)
    library = gn_cols_plan(n, groups, spatial, c, r.compute_units, min(256, r.max_wg))

    def run(**kw):
        return lambda: r.group_norm(xb, gb, bb, y, shape, groups, 1e-5, True, **kw)

    run(plan="split")()
    want = r.download(y, shape)
    moved = 4 * 2 * x.size
    rows = []
    candidates = sorted({ys for ys in (1, 2, 4, 8, 16, 32, 64, 128) if ys <= max(1, MAX_PARTIALS // library.xb)}
                        | {library.ys})
    coop_default = r.gn_coop_shape(n, groups, spatial, c // groups)
    coops = [] if grid or coop_default.chunks == NO_COOP else [
        (f"coop (library shape: k={coop_default.k} items={coop_default.items} chunks={coop_default.chunks})",
         coop_default)]
    for limit in (64, 128, 256) if grid else ():
        for per_cu in (1, 2, 3, 4):
            for floats in (16, 32, 64):
                plan = gn_coop_plan(n, groups, spatial, c // groups, limit, r.compute_units, floats, per_cu)
                if limit > r.max_wg or plan.chunks == NO_COOP or plan in [p for _, p in coops]:
                    continue
                if r.max_work_group(r.kernel("group_norm", "gn_coop", plan.options())) < plan.lx * plan.ly:
                    continue  # too many registers for this work-group
                coops.append((f"coop limit={limit} per_cu={per_cu} floats={floats}: {plan.lx}x{plan.ly} k={plan.k} "
                              f"items={plan.items} chunks={plan.chunks}", plan))
    if not grid:
        candidates = [library.ys]
    configs = [("one", run(plan="one"))] + [(f"split ys={ys}", run(ys=ys)) for ys in candidates] + \
        [(label, run(plan="coop", coop=plan)) for label, plan in coops]
    rows_plan = r.gn_rows_shape(n, groups, spatial, c)
    if rows_plan.rv:
        configs.append((f"rows {rows_plan.lx}x{rows_plan.ly} rv={rows_plan.rv}", run(plan="rows", rows=rows_plan)))
    if grid and coop_default.chunks != NO_COOP:
        configs.append(("coop (library shape) spin_limit=0", run(plan="coop", coop=coop_default, spin_limit=0)))
    chosen = r.gn_default_plan(n, groups, spatial, c // groups)
    if chosen == "rows":
        library_label = f"rows {rows_plan.lx}x{rows_plan.ly} rv={rows_plan.rv}"
    elif chosen == "coop":
        library_label = next(label for label, plan in coops if plan == coop_default)
    else:
        library_label = "one" if chosen == "one" else f"split ys={library.ys}"
    for label, fn in configs:
        chain, _, kernels, each = measure(fn, runs, 3, r.queue)
        err = float(np.abs(r.download(y, shape) - want).max() / np.abs(want).max())
        rows.append({"config": label, "chain_ms": chain * 1e3, "kernel_ms": kernels * 1e3,
                     "each_kernel_ms": [t * 1e3 for t in each], "gbs": moved / chain / 1e9, "max_rel_diff": err,
                     "library_choice": label == library_label})
    copy = same_size_copy_bandwidth(r, u, moved, runs, 3)
    for row in rows:
        row["of_same_size_copy"] = row["gbs"] * 1e9 / copy
    return {"shape": list(shape), "groups": groups, "plan": library.__dict__,
            "coop_plan": coop_default.__dict__, "same_size_copy_gbs": copy / 1e9,
            "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU OpenCL such as PoCL)")
    ap.add_argument("--vae", action="store_true", help="the VAE decoder's shapes, library plans only")
    ap.add_argument("--shapes", default=None, help="comma-separated NxSxC shapes instead (e.g. 1x4096x320)")
    ap.add_argument("--groups", type=int, default=GROUPS,
                    help="groups (default 32; 1 with --shapes 8192x1x320: the UNet's LayerNorm as GroupNorm)")
    args = ap.parse_args()
    r = Runner()
    u = Unfused(r)
    shapes = SMALL_SHAPES if args.small else VAE_SHAPES if args.vae else SHAPES
    if args.shapes:
        shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    results = [sweep_shape(r, u, s, args.runs, grid=not args.vae, groups=args.groups) for s in shapes]
    device = r.device.name.strip()
    for res in results:
        print(f"\n{device}: GroupNorm+SiLU {res['shape']}, {res['groups']} groups, plan {res['plan']}, "
              f"same-size copy {res['same_size_copy_gbs']:.0f} GB/s")
        print("| config | chain us | kernels us | each kernel us | GB/s | of same-size copy | max rel diff |")
        print("|---|---|---|---|---|---|---|")
        for row in res["rows"]:
            mark = " (library)" if row["library_choice"] else ""
            each = " + ".join(f"{t * 1e3:.1f}" for t in row["each_kernel_ms"])
            print(f"| {row['config']}{mark} | {row['chain_ms'] * 1e3:.1f} | {row['kernel_ms'] * 1e3:.1f} | {each} | "
                  f"{row['gbs']:.0f} | {100 * row['of_same_size_copy']:.0f}% | {row['max_rel_diff']:.1e} |")
    write_result("gpu_gn_sweep", device, {"device": device, "compute_units": r.compute_units, "runs": args.runs,
                                          "results": results}, "_small" if args.small else "_vae" if args.vae else "")
    bad = [(res["shape"], row["config"]) for res in results for row in res["rows"] if not row["max_rel_diff"] < 1e-4]
    if bad:
        print(f"outputs disagree with the library's plan: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
