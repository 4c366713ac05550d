"""Probe: the multiply-add rate stock LiteRT's GPU engine reaches on chained FULLY_CONNECTEDs (issue
36, item 2: what LiteRT's fp16 engine is made of).

Whether LiteRT's fp16 engine (ML Drift over WebGPU / Vulkan) runs on a GPU's matrix units decides
what its fp16 columns measure: NVIDIA's H200 does ~67 TFLOP/s of float FMAs, ~134 of packed half
ones and several hundred on its tensor cores. A rate above packed half's can only come from the
tensor cores. Each shape is DEPTH chained FULLY_CONNECTEDs y = x W^T (x [M, K], W [N, K], then
N x N; constant, seeded) written with difflite's own TFLite builder; the time of depth 9 less that
of depth 1 is the added layers' compute alone; LiteRT at fp32 (enforce_f32) and fp16, timed as
gpu_peer.py times it (queued runs up to one read, the inputs written once). difflite's own GEMM
rates come from its kernel profile (benchmarks/gpu_profile.py): a TFLite invoke copies the float32
input and output each call, which at these sizes would time the copies, not the GEMM.

    source benchmarks/device_setup.sh
    python benchmarks/litert_gemm_rate.py [--shapes 4096x4096x4096x1,4096x4096x4096x9] [--runs 20]

Writes $OUT/litert_gemm_rate.json (or benchmarks/results/) and prints a table.
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_peer import LITERT_PRECISIONS, time_litert_gpu  # noqa: E402

from difflite.compiler.tflite.builder import ModelBuilder  # noqa: E402


def fc_model(folder: Path, m: int, k: int, n: int, depth: int) -> Path:
    """A .tflite of `depth` chained FULLY_CONNECTEDs: [m, k] x [n, k]^T, then [m, n] x [n, n]^T
    (seeded weights). The input and output are the same for every depth, so the difference of two
    depths' times is the added layers' compute, whatever moving x and y costs."""
    rng = np.random.default_rng([m, k, n])
    builder = ModelBuilder()
    x = builder.tensor("x", (m, k), np.float32)
    y = x
    for layer in range(depth):
        width = k if layer == 0 else n
        weight = builder.constant(f"w{layer}", (rng.standard_normal((n, width)) / np.sqrt(width)).astype(np.float32))
        out = builder.tensor(f"y{layer}", (m, n), np.float32)
        builder.op("FULLY_CONNECTED", [y, weight, -1], [out])
        y = out
    builder.inputs.append(("x", x))
    builder.outputs.append(("y", y))
    path = folder / f"fc_{m}x{k}x{n}_d{depth}.tflite"
    path.write_bytes(bytes(builder.serialize()))
    return path


def flops(m: int, k: int, n: int, depth: int) -> float:
    return 2.0 * m * n * (k + (depth - 1) * n)


def tflops(work: float, ms: float) -> float:
    return round(work / (ms * 1e-3) / 1e12, 1)


def added_layers_rate(shapes: dict) -> dict:
    """Per pair of depths of one MxKxN, the rate of the layers the deeper model adds (its time less
    the shallower one's), printed as table rows."""
    by_shape: dict = {}
    for shape in shapes:
        m, k, n, depth = (int(v) for v in shape.split("x"))
        by_shape.setdefault((m, k, n), []).append(depth)
    added = {}
    for (m, k, n), depths in by_shape.items():
        low, high = min(depths), max(depths)
        if low == high:
            continue
        for engine in (f"litert_gpu_{label}" for label in LITERT_PRECISIONS):
            a, b = shapes[f"{m}x{k}x{n}x{low}"].get(engine, {}), shapes[f"{m}x{k}x{n}x{high}"].get(engine, {})
            if "median_ms" in a and "median_ms" in b and b["median_ms"] > a["median_ms"]:
                ms = b["median_ms"] - a["median_ms"]
                work = flops(m, k, n, high) - flops(m, k, n, low)
                added[f"{m}x{k}x{n} {engine}"] = {"ms_per_layer": round(ms / (high - low), 3),
                                                  "tflops": tflops(work, ms)}
                print(f"| {m}x{k}x{n}, depth {low} -> {high} | {engine} | {ms / (high - low):.3f} a layer | "
                      f"{tflops(work, ms)} |", flush=True)
    return added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="4096x4096x4096x1,4096x4096x4096x9,4096x320x2560x1,4096x320x2560x9",
                        help="comma-separated MxKxNxDEPTH (DEPTH chained layers, the later ones N x N)")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"gpu": os.environ.get("DIFFLITE_DEVICE_NAME"), "date": time.strftime("%Y-%m-%d"), "shapes": {}}
    print("| MxKxNxDEPTH | engine | median ms | TFLOP/s |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for shape in args.shapes.split(","):
            m, k, n, depth = (int(v) for v in shape.split("x"))
            path = fc_model(Path(work), m, k, n, depth)
            rows = {}
            for precision, enforce_f32 in LITERT_PRECISIONS.items():
                label = f"litert_gpu_{precision}"
                try:
                    timed = time_litert_gpu(path, args.runs, enforce_f32)
                    rows[label] = {**timed, "tflops": tflops(flops(m, k, n, depth), timed["median_ms"])}
                    print(f"| {shape} | {label} | {timed['median_ms']} | {rows[label]['tflops']} |", flush=True)
                except Exception as exc:  # keep the other engines when one fails
                    rows[label] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    print(f"| {shape} | {label} | {rows[label]['error'][:100]} | |", flush=True)
            result["shapes"][shape] = rows
            (out_dir / "litert_gemm_rate.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    result["shapes"]["added_layers"] = added_layers_rate(result["shapes"])
    (out_dir / "litert_gemm_rate.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    sys.stdout.flush()
    os._exit(0)  # as gpu_peer: skip the interpreters' teardown


if __name__ == "__main__":
    main()
