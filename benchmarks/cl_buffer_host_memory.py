"""What an OpenCL driver holds in host memory, and on the GPU, per device buffer, by the buffer's size.

The weight slabs (custom_ops/delegate/opencl/weight_slabs.cc) took the int4 SDXL picture's host
peak from 489 to 350 MiB on an H200, which GPU-side rounding alone does not explain. Here one
process makes buffers as the weight upload does (read-only, then a blocking write from pageable
host memory) in batches of one size, reading its own resident memory (/proc/self/status VmRSS)
and its GPU memory (nvidia-smi) after each batch: many small buffers (biases, norm parameters,
scales), many just over 1 MiB (the weights without slabs), and one large buffer of the same bytes
(a slab). The deltas per buffer say whether the constants that still get a buffer each cost host
memory.

    source benchmarks/device_setup.sh && python benchmarks/cl_buffer_host_memory.py [--save FILE]
    python benchmarks/cl_buffer_host_memory.py   # without a GPU: the first device (PoCL)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from difflite.core.procmem import nvidia_smi_mb  # noqa: E402

# (label, buffers, bytes each): kept alive to the end, so each row adds to the one before
BATCHES = [
    ("4 KiB", 1000, 4 << 10),
    ("64 KiB", 1000, 64 << 10),
    ("1.06 MiB", 400, 1088 << 10),
    ("one of 425 MiB", 1, 400 * (1088 << 10)),
]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reading() -> dict:
    time.sleep(0.5)  # nvidia-smi's own poll
    gpu = nvidia_smi_mb()
    return {"host_mib": round(rss_mib(), 1), "gpu_mib": gpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    every = [d for p in cl.get_platforms() for d in p.get_devices()]
    # a GPU first; else the first device (PoCL: its buffers are host memory, a phone's stand-in)
    devices = [d for d in every if d.type & cl.device_type.GPU] or every
    if not devices:
        parser.error("no OpenCL device here")
    context = cl.Context(devices[:1])
    queue = cl.CommandQueue(context)
    rows = [{"step": "context", **reading()}]
    kept = []
    for label, count, size in BATCHES:
        host = np.ones(size // 4, np.float32)
        for _ in range(count):
            buffer = cl.Buffer(context, cl.mem_flags.READ_ONLY, size)
            cl.enqueue_copy(queue, buffer, host, is_blocking=True)
            kept.append(buffer)
        del host
        queue.finish()
        before = rows[-1]
        now = reading()
        step = {"step": f"+ {count} x {label}", "buffers": count, "asked_mib": round(count * size / 2**20, 1), **now}
        step["host_kib_per_buffer"] = round((now["host_mib"] - before["host_mib"]) * 1024 / count, 1)
        if now["gpu_mib"] is not None and before["gpu_mib"] is not None:
            step["gpu_kib_per_buffer"] = round((now["gpu_mib"] - before["gpu_mib"]) * 1024 / count, 1)
        rows.append(step)
    data = {"device": devices[0].name, "driver": devices[0].driver_version, "rows": rows}
    if args.save:
        args.save.write_text(json.dumps(data, indent=1) + "\n")
    print("| step | asked, MiB | host RSS, MiB | GPU, MiB | host KiB a buffer | GPU KiB a buffer |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r.get('asked_mib', '')} | {r['host_mib']} | {r['gpu_mib']} "
              f"| {r.get('host_kib_per_buffer', '')} | {r.get('gpu_kib_per_buffer', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
