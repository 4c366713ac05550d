"""Tile sweep of the per-work-item FlashAttention kernel (attn_flash) at SD 1.5's first-level
self-attention, on any OpenCL device (pyopencl, fp32 storage).

    python lab/gpu_flash_sweep.py [--lq 4096] [--heads 8] [--dim 40] [--n 1] [--runs 10] [--small|--quick]
                                         [--splits 1,2,4]

For each query block AT_BQ, key tile AT_BK, rescaling chunk AT_KC, rows per work-item AT_RQ and key
split count AT_SPLIT (that fit the device's local memory and work-group limit) it times attn_flash
(with --splits > 1: the split attn_flash plus attn_merge, first start to last end) with OpenCL events
(median of --runs, each run queued behind a user event so no host gap counts), checks the output
against the library's own plan (attention_opencl.cc, mirrored by launch.py: attention_plan, splits
included), and writes lab/results/gpu_flash_sweep_<device>.json (or $OUT/...) plus a markdown
table, fastest first. The library's choice is marked. Split counts run past the library's rule (at
least 256 keys a split) too: e.g. --small's 256 keys in 4 splits.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


from gpu_ablation import gated
from gpu_kernels_harness.launch import MERGE_WG, SPLIT_SLOT, AttentionPlan, Runner, attention_plan, ceil_div, round_up


def flash_launcher(r: Runner, plan: AttentionPlan, rq: int, bufs, shape):
    """A function enqueuing attn_flash with `plan`'s tiles (its splits: then attn_merge too) and AT_RQ = rq,
    as attention_opencl.cc launches them; it returns the events."""
    n, lq, heads, d = shape
    q, k, v, o = bufs
    opts = re.sub(r"-DAT_RQ=\d+", f"-DAT_RQ={rq}", plan.options(d, d))
    flash = r.kernel("attention", "attn_flash", opts)
    items = plan.bq // rq
    scale = np.float32(1.0 / math.sqrt(d))
    args = (np.int32(lq), np.int32(lq), np.int32(heads), scale, np.int32(0))
    grid = (ceil_div(lq, plan.bq) * items, heads * plan.splits, n)
    if plan.splits == 1:
        return lambda: [r.launch(flash, grid, (items, 1, 1), q, k, v, o, *args)]
    part = r.scratch(plan.split_bytes(n, lq, heads, d), SPLIT_SLOT)
    merge = r.kernel("attention", "attn_merge", opts)
    rows = n * lq * heads
    return lambda: [r.launch(flash, grid, (items, 1, 1), q, k, v, part, *args),
                    r.launch(merge, (round_up(rows * ceil_div(d, 4), MERGE_WG),), (MERGE_WG,), part, o,
                             np.int32(rows))]


def time_plan(r: Runner, plan: AttentionPlan, rq: int, bufs, shape, runs: int) -> float:
    """Median seconds of attn_flash (and attn_merge) with `plan`'s tiles and splits and AT_RQ = rq."""
    launch = flash_launcher(r, plan, rq, bufs, shape)
    gated(r.queue, launch)[-1].wait()  # warm-up (and the build)
    times = []
    for _ in range(runs):
        events = gated(r.queue, launch)
        events[-1].wait()
        times.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=40)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="a short sweep at 256 tokens (CPU OpenCL such as PoCL)")
    ap.add_argument("--quick", action="store_true", help="only 128/256 rows, 32/64 keys, chunks 4/8, 1/2 rows per item")
    ap.add_argument("--splits", default="1,2,4", help="key split counts to time (of 1, 2, 4; AT_SPLIT)")
    args = ap.parse_args()
    splits = tuple(s.strip() for s in args.splits.split(","))
    if any(s not in ("1", "2", "4") for s in splits):
        ap.error(f"--splits {args.splits}: a comma list of 1, 2, 4")
    splits = tuple(int(s) for s in splits)
    lq = 256 if args.small else args.lq
    r = Runner()
    d, heads, n = args.dim, args.heads, args.n
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, lq, heads * d)).astype(np.float32) for _ in range(3)]
    q, k, v = (r.upload(a) for a in arrays)
    shape = (n, lq, heads, d)
    default = attention_plan(d, d, "flash", r.local_mem, flat=False, kernel="flash", max_wg=r.max_wg,
                             shape=(n, lq, lq, heads), compute_units=r.compute_units)  # a GPU's rule
    ref = r.empty(arrays[0].shape)
    time_plan(r, default, default.rows_per_item(d, d), (q, k, v, ref), shape, 1)
    want = r.download(ref, arrays[0].shape)
    out = r.empty(arrays[0].shape)
    if args.small:
        grid = ((32, 64), (16, 32), (4, 8), (1, 2))
    elif args.quick:
        grid = ((128, 256), (32, 64), (4, 8), (1, 2))
    else:
        grid = ((32, 64, 128, 256), (16, 32, 64), (4, 8, 16), (1, 2, 4))
    library = (default.bq, default.bk, default.kc, default.rows_per_item(d, d), default.splits)
    rows = []
    for bq, bk, kc, rq, split in itertools.product(*grid, splits):
        plan = AttentionPlan("flash", bq=bq, bk=bk, kc=kc, splits=split)
        if bq % rq or bq // rq > r.max_wg or kc > bk or plan.local_bytes(d, d) > r.local_mem:
            continue
        seconds = time_plan(r, plan, rq, (q, k, v, out), shape, args.runs)
        err = float(np.abs(r.download(out, arrays[0].shape) - want).max() / np.abs(want).max())
        flops = 4.0 * n * heads * lq * lq * d
        rows.append({"bq": bq, "bk": bk, "kc": kc, "rq": rq, "splits": split, "ms": seconds * 1e3,
                     "tflops": flops / seconds / 1e12, "max_rel_diff": err,
                     "library_choice": (bq, bk, kc, rq, split) == library})
    rows.sort(key=lambda row: row["ms"])
    device = r.device.name.strip()
    result = {"device": device, "compute_units": r.compute_units, "lq": lq, "heads": heads, "dim": d, "n": n,
              "runs": args.runs, "library_splits": default.splits, "rows": rows}
    out_dir = Path(os.environ.get("OUT", ROOT / "lab" / "results"))
    tag = "".join(c if c.isalnum() else "_" for c in device).lower() + ("_small" if args.small else "")
    tag += f"_n{n}_d{d}" if (n, d) != (1, 40) else ""
    path = out_dir / f"gpu_flash_sweep_{tag}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{device}: attn_flash, {n}x{lq}x{lq}, {heads} heads x {d}, median of {args.runs}")
    print("| AT_BQ | AT_BK | AT_KC | AT_RQ | AT_SPLIT | ms | TFLOP/s | max rel diff |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        mark = " (library)" if row["library_choice"] else ""
        print(f"| {row['bq']} | {row['bk']} | {row['kc']} | {row['rq']} | {row['splits']}{mark} | {row['ms']:.3f} | "
              f"{row['tflops']:.1f} | {row['max_rel_diff']:.1e} |")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
