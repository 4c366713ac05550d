"""The partial softmax's two forms against FlashAttention at SD 1.5's attention shapes, on any OpenCL
device (pyopencl, through benchmarks/gpu_kernels_harness/launch.py's Runner).

    python lab/gpu_attention_partial.py [--runs 20] [--half] [--scores-mb 16,64] [--quick] [--json FILE]

For each shape it times, with OpenCL events (median of --runs, each run queued behind a user event
so no host gap counts; first kernel start to last kernel end):

  recompute  attn_rowstats + attn_output (q k^T recomputed per row; DIFFLITE_ATTN_KERNEL=recompute,
             and what flat devices run);
  gemm       the partial softmax as GEMMs (attention_opencl.cc's GEMM path: S = q k^T by the tiled
             GEMM into scratch, attn_softmax_rows, O = P v, chunk by chunk of query rows under the
             bound on S: one column per --scores-mb value, the library's kScoresBytes first);
  flash      what variant "auto" / "flash" takes on this device (attn_flash with its key splits, or
             attn_wide for heads past 64), i.e. the profiles with FlashAttention.

Shapes (N x Lq x Lk, heads x head size): the VAE decoder's 1x4096x4096 1x512; the UNet at batch 2
(classifier-free guidance): 2x4096x4096 8x40, 2x1024x1024 8x80, 2x256x256 8x160 and the
cross-attention 2x4096x77 8x40. --quick runs small shapes (a smoke test on a CPU device).
Each variant's output is compared with the recompute kernels' (max |diff| / max |ref|, printed).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_ablation import gated  # noqa: E402
from gpu_kernels_harness.launch import (SCORES_BYTES, Runner, attention_chunk_rows, attention_plan,  # noqa: E402
                                        ceil_div)

SHAPES = [  # name, (n, lq, lk, heads, d)
    ("vae 1x4096x4096 1x512", (1, 4096, 4096, 1, 512)),
    ("unet 2x4096x4096 8x40", (2, 4096, 4096, 8, 40)),
    ("unet 2x1024x1024 8x80", (2, 1024, 1024, 8, 80)),
    ("unet 2x256x256 8x160", (2, 256, 256, 8, 160)),
    ("cross 2x4096x77 8x40", (2, 4096, 77, 8, 40)),
]
QUICK = [
    ("vae-like 1x256x256 1x512", (1, 256, 256, 1, 512)),
    ("unet-like 2x256x256 8x40", (2, 256, 256, 8, 40)),
    ("cross-like 2x256x77 8x40", (2, 256, 77, 8, 40)),
]


def median_seconds(r: Runner, fn, runs: int) -> float:
    gated(r.queue, fn)[-1].wait()  # warm-up (and the builds)
    times = []
    for _ in range(runs):
        events = gated(r.queue, fn)
        events[-1].wait()
        times.append((events[-1].profile.end - events[0].profile.start) * 1e-9)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--half", action="store_true", help="half storage (vload_half / vstore_half)")
    ap.add_argument("--scores-mb", default="16,64",
                    help="bounds on S's scratch for the gemm column(s), MiB; the first should be the library's")
    ap.add_argument("--quick", action="store_true", help="small shapes (CPU devices)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    bounds = [int(float(x) * (1 << 20)) for x in args.scores_mb.split(",") if x]
    if bounds and bounds[0] != SCORES_BYTES:
        print(f"note: the library's bound is {SCORES_BYTES >> 20} MiB")
    r = Runner(half_io=args.half)
    es = np.dtype(r.storage).itemsize
    print(f"{r.device.name.strip()} ({r.compute_units} compute units, {r.local_mem} B local), "
          f"{'half' if args.half else 'float'} storage, median of {args.runs}")
    rng = np.random.default_rng(0)
    rows = []
    for name, (n, lq, lk, heads, d) in (QUICK if args.quick else SHAPES):
        q = r.upload(rng.standard_normal((n, lq, heads * d)).astype(np.float32))
        k = r.upload(rng.standard_normal((n, lk, heads * d)).astype(np.float32))
        v = r.upload(rng.standard_normal((n, lk, heads * d)).astype(np.float32))
        scale = 1.0 / math.sqrt(d)
        shape = (n, lq, heads * d)
        outs, times, notes = {}, {}, {}

        def run(label, plan, bound=None):
            o = r.empty(shape, poison=False)
            fn = lambda: r.attention(q, k, v, o, n, lq, lk, heads, d, d, scale, False, plan=plan,  # noqa: E731
                                     scores_bytes=bound)
            times[label] = median_seconds(r, fn, args.runs)
            outs[label] = r.download(o, shape)

        run("recompute", attention_plan(d, d, "partial_softmax", r.local_mem, kernel="recompute", max_wg=r.max_wg))
        gemm_plan = attention_plan(d, d, "partial_softmax", r.local_mem, flat=False, max_wg=r.max_wg)
        for bound in bounds:
            label = f"gemm {bound / (1 << 20):g}MiB"
            run(label, gemm_plan, bound)
            chunk = attention_chunk_rows(n, heads, lq, lk, es, bound)
            notes[label] = f"{ceil_div(lq, chunk)} chunk(s) of {chunk} rows"
        flash = attention_plan(d, d, "auto", r.local_mem, flat=False, max_wg=r.max_wg, shape=(n, lq, lk, heads),
                               compute_units=r.compute_units, flash_in_registers=r.flash_in_registers(d, d))
        if flash.variant == "partial_softmax":  # no flash tiles fit: what "flash" asks for
            flash = attention_plan(d, d, "flash", r.local_mem, flat=False, max_wg=r.max_wg, shape=(n, lq, lk, heads),
                                   compute_units=r.compute_units, flash_in_registers=r.flash_in_registers(d, d))
        flash_label = f"{flash.variant}" + (f" x{flash.splits}" if flash.splits > 1 else "")
        if flash.variant != "partial_softmax":
            run(flash_label, flash)
        ref = outs["recompute"]
        scale_ref = float(np.abs(ref).max()) or 1.0
        err = {label: float(np.abs(out - ref).max()) / scale_ref for label, out in outs.items()}
        rows.append({"shape": name, "ms": {label: t * 1e3 for label, t in times.items()}, "rel_diff": err,
                     "notes": notes, "gflop": 4.0 * n * heads * lq * lk * d / 1e9})
        cells = "  ".join(f"{label} {t * 1e3:8.3f} ms" for label, t in times.items())
        print(f"{name:28s} {cells}")
        for label in times:
            extra = f" ({notes[label]})" if label in notes else ""
            speed = times["recompute"] / times[label]
            print(f"    {label:14s} {times[label] * 1e3:8.3f} ms  x{speed:5.2f} vs recompute  "
                  f"{rows[-1]['gflop'] / times[label] / 1e3:7.2f} TFLOP/s  diff {err[label]:.1e}{extra}")
    print()
    labels = sorted({label for row in rows for label in row["ms"]}, key=lambda s: (s[0] != "r", s[0] != "g", s))
    print("| shape | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for row in rows:
        print(f"| {row['shape']} | " + " | ".join(f"{row['ms'][x]:.3f}" if x in row["ms"] else "-" for x in labels)
              + " |")
    if args.json:
        args.json.write_text(json.dumps({"device": r.device.name.strip(), "half": args.half, "runs": args.runs,
                                         "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
