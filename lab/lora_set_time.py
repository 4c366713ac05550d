"""Probe: how long one difflite_lora_set takes (the library's share of a LoRA switch) for SD 1.5's
slot shapes at rank 32, on the op library's OpenCL backend: a model of one difflite.LoRA op per
shape, its factors set `--sets` times (alternating two sets), median milliseconds a set, and the
UNet's sum over its 192 slots.

    python lab/lora_set_time.py [--lib PATH] [--precision fp16] [--sets 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from test_op_lora import Loaded, lora_only_model  # noqa: E402

from difflite.runtime.component import find_oplib  # noqa: E402

# (K, N, slots in the UNet) at rank 32; rows do not matter to a set
SHAPES = [(320, 320, 35), (768, 320, 10), (320, 2560, 5), (1280, 320, 5), (640, 640, 35), (768, 640, 10),
          (640, 5120, 5), (2560, 640, 5), (1280, 1280, 42), (768, 1280, 12), (1280, 10240, 6), (5120, 1280, 6)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", type=Path, default=None)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--sets", type=int, default=20)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    lib = args.lib or find_oplib()
    rng = np.random.default_rng(0)
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for k, n, count in SHAPES:
            path = lora_only_model(Path(tmp) / f"{k}x{n}.tflite", (2, n), (2, k), slot=0)
            loaded = Loaded(path, lib, options={"backend": "opencl", "precision": args.precision})
            sets = [((rng.standard_normal((args.rank, k)) * 0.01).astype(np.float32),
                     (rng.standard_normal((n, args.rank)) * 0.001).astype(np.float32)) for _ in range(2)]
            times = []
            for i in range(args.sets):
                start = time.perf_counter()
                loaded.set(0, *sets[i % 2])
                times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            total += ms * count
            print(f"{k} -> {n}: {ms:.3f} ms a set ({min(times) * 1e3:.3f}-{max(times) * 1e3:.3f})")
    print(f"UNet (192 slots): {total:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
