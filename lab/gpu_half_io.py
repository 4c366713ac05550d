"""Half storage without cl_khr_fp16 (-DDL_HALF_IO=1: vload_half / vstore_half, ops/common/dl_storage.cl)
against float storage, side by side in one run, for the kernels converted so far (Gelu, GeGLU, GroupNorm
with each plan), at SD 1.5 shapes; each output checked against NumPy on the half-rounded inputs.

    python lab/gpu_half_io.py [--runs 20] [--small]

Writes lab/results/gpu_half_io_<device>.json (or $OUT/...) and prints a markdown table.
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
from gpu_kernels_harness.launch import Runner  # noqa: E402

# (label, kind, shape, groups or GEGLU's D)
CASES = [("GELU 2x4096x1280", "gelu", (2, 4096, 1280), 0), ("GEGLU 2x4096x2560 -> 1280", "geglu", (8192, 2560), 1280),
         ("GroupNorm+SiLU 2x4096x320", "group_norm", (2, 4096, 320), 32),
         ("GroupNorm+SiLU 1x4096x1280", "group_norm", (1, 4096, 1280), 32),
         ("LayerNorm 8192x320", "group_norm", (8192, 1, 320), 1)]
SMALL = [("GELU small", "gelu", (3, 5, 7), 0), ("GEGLU small", "geglu", (7, 26), 13),
         ("GroupNorm small", "group_norm", (1, 24, 20, 40), 4), ("LayerNorm small", "group_norm", (37, 1, 320), 1)]


def gelu_ref(x):
    from math import erf
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def group_norm_ref(x, gamma, beta, groups):
    n, c = x.shape[0], x.shape[-1]
    g = x.astype(np.float64).reshape(n, -1, groups, c // groups)
    y = (g - g.mean(axis=(1, 3), keepdims=True)) / np.sqrt(g.var(axis=(1, 3), keepdims=True) + 1e-5)
    y = y.reshape(x.shape) * gamma + beta
    return y / (1.0 + np.exp(-y))


def case_fn(r: Runner, kind: str, shape, extra: int, x: np.ndarray, params):
    """(launch function, output getter) for one case on runner r."""
    xb = r.upload(x)
    if kind == "gelu":
        y = r.empty(shape)
        return (lambda: r.gelu(xb, y, x.size, "erf")), (lambda: r.download(y, shape))
    if kind == "geglu":
        out = (shape[0], extra)
        y = r.empty(out)
        return (lambda: r.geglu(xb, y, shape[0], extra, "erf")), (lambda: r.download(y, out))
    gb, bb = r.upload(params[0]), r.upload(params[1])
    y = r.empty(shape)
    return (lambda: r.group_norm(xb, gb, bb, y, shape, extra, 1e-5, True)), (lambda: r.download(y, shape))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU OpenCL such as PoCL)")
    args = ap.parse_args()
    full = Runner()
    half = Runner(full.ctx, full.device, half_io=True)
    rows = []
    for label, kind, shape, extra in SMALL if args.small else CASES:
        rng = np.random.default_rng(0)
        x = (rng.standard_normal(shape) + 0.5).astype(np.float16).astype(np.float32)
        c = shape[-1]
        params = [rng.uniform(0.5, 1.5, c).astype(np.float16).astype(np.float32),
                  rng.uniform(-0.5, 0.5, c).astype(np.float16).astype(np.float32)]
        if kind == "gelu":
            ref = gelu_ref(x)
        elif kind == "geglu":
            ref = x[:, :extra].astype(np.float64) * gelu_ref(x[:, extra:])
        else:
            ref = group_norm_ref(x, params[0], params[1], extra)
        row = {"case": label}
        for name, r in (("float", full), ("half_io", half)):
            fn, get = case_fn(r, kind, shape, extra, x, params)
            row[f"{name}_us"] = measure(fn, args.runs, 3, r.queue)[0] * 1e6
            row[f"{name}_rel_err"] = float(np.abs(get() - ref).max() / np.abs(ref).max())
        row["speedup"] = row["float_us"] / row["half_io_us"]
        rows.append(row)
    device = full.device.name.strip()
    print(f"\n{device}: half storage (vload_half) against float storage, one run")
    print("| case | float us | half us | speedup | rel err float / half |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['float_us']:.1f} | {row['half_io_us']:.1f} | {row['speedup']:.2f}x | "
              f"{row['float_rel_err']:.1e} / {row['half_io_rel_err']:.1e} |")
    write_result("gpu_half_io", device, {"device": device, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
