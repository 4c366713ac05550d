"""Accuracy of half arithmetic (-DDL_FP16_MATH) against float arithmetic, both on half storage, on
an OpenCL device with cl_khr_fp16: FULLY_CONNECTED at growing K and the two attention kernels
phones run (attn_flash and the partial softmax, SD's head size 40), each with the delegate's
math=auto and math=fp32, against float64 on the same half-rounded inputs.

    scripts/fetch_fp16_opencl.sh
    python lab/fp16_arith_error.py [--vendors ~/.cache/difflite/intel-cpu-opencl-2026.2.0/vendors]

--vendors points OCL_ICD_VENDORS at that folder (Intel's CPU OpenCL, which has cl_khr_fp16); the
runtime emulates half there, so this measures rounding, not speed. Prints a table and writes
lab/results/fp16_arith_error_host_<yyyy-mm>.json (or $OUT/...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENDORS = Path.home() / ".cache" / "difflite" / "intel-cpu-opencl-2026.2.0" / "vendors"


def half(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def errors(got: np.ndarray, want: np.ndarray) -> dict:
    e = np.abs(got.astype(np.float64) - want)
    return {"rel_rms": float(np.sqrt((e ** 2).mean() / (want ** 2).mean())),
            "rel_max": float(e.max() / np.abs(want).max())}


def attention_ref(q, k, v, heads, scale):
    n, lq, _ = q.shape
    lk, dk, dv = k.shape[1], q.shape[2] // heads, v.shape[2] // heads
    s = np.einsum("nihd,njhd->nhij", q.reshape(n, lq, heads, dk), k.reshape(n, lk, heads, dk)) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("nhij,njhd->nihd", p, v.reshape(n, lk, heads, dv)).reshape(n, lq, heads * dv)


def run(lib: Path, tmp: Path, model: Path, feeds, math: str) -> tuple[np.ndarray, str]:
    from support.oplib_helpers import run_tflite

    stats = tmp / "stats.json"
    (out,) = run_tflite(model, lib, feeds, options={"backend": "opencl", "kernels": "tiled", "precision": "fp16",
                                                    "math": math, "stats_path": str(stats)})
    import gc

    gc.collect()  # the delegate writes its stats when it goes
    return out, json.loads(stats.read_text())["arithmetic"]


def fully_connected_rows(lib: Path, tmp: Path) -> list[dict]:
    from support.opencl_helpers import OpModel

    r = np.random.default_rng(0)
    rows = []
    for k in (320, 2880, 11520):
        x = r.standard_normal((256, k)).astype(np.float32)
        w = (r.standard_normal((320, k)) / np.sqrt(k)).astype(np.float32)
        m = OpModel()
        xi, y = m.activation("x", x.shape), m.activation("y", (256, 320))
        m.builtin("FULLY_CONNECTED", [xi, m.constant("w", w), -1], [y])
        path = m.save(tmp / f"fc{k}.tflite", [xi], [y])
        want = half(x) @ half(w).T
        for math in ("fp32", "auto"):
            got, arithmetic = run(lib, tmp, path, [x], math)
            rows.append({"case": f"FULLY_CONNECTED 256x{k} x {k}x320", "arithmetic": arithmetic, **errors(got, want)})
    return rows


def attention_rows(lib: Path, tmp: Path) -> list[dict]:
    from support.oplib_helpers import single_op_model

    rows = []
    heads, d, scale = 2, 40, 0.3
    for kernel in ("flash", "partial"):
        os.environ["DIFFLITE_ATTN_KERNEL"] = kernel
        for lq, lk in ((4096, 77), (1024, 1024)):
            r = np.random.default_rng(1)
            q, k, v = (r.uniform(-1.5, 1.5, (1, n, heads * d)).astype(np.float32) for n in (lq, lk, lk))
            path = single_op_model(tmp / "attn.tflite", "difflite.Attention",
                                   {"heads": heads, "scale": scale, "causal": False, "variant": "auto"},
                                   [("q", q, False), ("k", k, False), ("v", v, False)], (1, lq, heads * d))
            want = attention_ref(half(q), half(k), half(v), heads, scale)
            for math in ("fp32", "auto"):
                got, arithmetic = run(lib, tmp, path, [q, k, v], math)
                rows.append({"case": f"attention {kernel} {lq}x{lk}, {heads}x{d}", "arithmetic": arithmetic,
                             **errors(got, want)})
    os.environ.pop("DIFFLITE_ATTN_KERNEL")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vendors", type=Path, default=DEFAULT_VENDORS,
                        help="OCL_ICD_VENDORS folder of a device with cl_khr_fp16 (empty: keep the environment's)")
    args = parser.parse_args()
    if str(args.vendors):
        os.environ["OCL_ICD_VENDORS"] = str(args.vendors.expanduser())
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from support.oplib_helpers import build_oplib

    lib = build_oplib()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        rows = fully_connected_rows(lib, tmp) + attention_rows(lib, tmp)
    print("| case | arithmetic | relative RMS error | relative max error |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['arithmetic']} | {row['rel_rms']:.3g} | {row['rel_max']:.3g} |")
    out_dir = Path(os.environ.get("OUT", ROOT / "lab" / "results"))
    (out_dir / f"fp16_arith_error_host_{time.strftime('%Y-%m')}.json").write_text(json.dumps({"vendors": str(args.vendors), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
