"""Probe: difflite.LoRA's two GEMMs (lora_opencl.cc: t = x D^T, then out += t U^T through the
backend's tiled GEMM with its accumulating epilogue; the harness's Runner.lora) at the SD 1.5
UNet's slot shapes (batch 2, 512x512, half storage), each kernel timed on its own (event start to
end), against a copy of y (the bytes the op must at least move). Prints microseconds per slot shape
(and the error against float64) and the UNet's sum over its 192 slots.

    python lab/gpu_lora_sweep.py [--rank 32] [--runs 20] [--small]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_kernels_harness.launch import Runner  # noqa: E402

# (C, M, transformers): per transformer level 7 C->C layers, to_k/to_v from the text
# (768 -> C over 2 x 77 rows), ff.net.0.proj C -> 8C, ff.net.2 4C -> C
LEVELS = [(320, 8192, 5), (640, 2048, 5), (1280, 512, 5), (1280, 128, 1)]


def shapes(small: bool) -> list[tuple[int, int, int, int]]:
    """(K, N, M, slots in the UNet) of every slot shape."""
    out = []
    for c, m, count in (LEVELS[-2:] if small else LEVELS):
        out += [(c, c, m, 7 * count), (768, c, 154, 2 * count), (c, 8 * c, m, count), (4 * c, c, m, count)]
    return out


def each_kernel(fn, runs: int) -> list[float]:
    """Median seconds of each event's own kernel (start to end), the gaps between them left out."""
    for _ in range(3):
        cl.wait_for_events(fn())
    samples = []
    for _ in range(runs):
        events = fn()
        cl.wait_for_events(events)
        samples.append([(e.profile.end - e.profile.start) * 1e-9 for e in events])
    return [float(np.median(column)) for column in zip(*samples)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="the two smallest levels only (PoCL)")
    args = parser.parse_args()
    r = Runner(half_io=True)
    print(f"device: {r.device.name}; rank {args.rank}; half storage")
    rng = np.random.default_rng(0)
    totals: dict[str, float] = {}
    rank = args.rank
    for k, n, m, count in shapes(args.small):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = rng.standard_normal((m, n)).astype(np.float32)
        down = (rng.standard_normal((rank, k)) / np.sqrt(k)).astype(np.float32)
        up = (rng.standard_normal((n, rank)) * 0.1).astype(np.float32)
        xb, yb, out = r.upload(x), r.upload(y), r.empty((m, n))
        dt, ut = r.lora_factors(down, up)
        kernels = each_kernel(lambda: r.lora(xb, out, out, dt, ut, m, k, n, rank), args.runs)
        row = {"down": sum(kernels[:-1]), "up": kernels[-1],
               "copy y": each_kernel(lambda: [cl.enqueue_copy(r.queue, out, yb)], args.runs)[0]}
        cl.enqueue_copy(r.queue, out, yb)
        r.lora(xb, out, out, dt, ut, m, k, n, rank)
        want = y.astype(np.float64) + (x.astype(np.float64) @ down.T) @ up.T
        err = float(np.abs(r.download(out, (m, n)) - want).max() / np.abs(want).max())
        print(f"{m}x{k}->{n} x{count}: " + ", ".join(f"{key} {v * 1e6:.1f} us" for key, v in row.items()) +
              f", err {err:.1e}")
        for key, value in row.items():
            totals[key] = totals.get(key, 0.0) + value * count
    print("UNet sum (ms): " + ", ".join(f"{key} {value * 1e3:.2f}" for key, value in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
