"""What an NVIDIA OpenCL driver holds per program built, per byte of a kernel's private (local)
memory and per buffer: one process builds and launches N distinct trivial programs, then kernels
with a private array, then allocates many small buffers, reading its own GPU memory (nvidia-smi)
after each. gpu_memory_parts.py
names what is left of a component's GPU memory after its buffers; this says what that rest is made of.

    source benchmarks/device_setup.sh && python benchmarks/cl_driver_memory.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from difflite.core.procmem import nvidia_smi_mb  # noqa: E402

TRIVIAL = "__kernel void k(__global float *x) { x[get_global_id(0)] += VALUE; }"
PRIVATE = """__kernel void p(__global float *x, int n) {
  float a[WORDS];
  for (int i = 0; i < WORDS; ++i) a[i] = x[(get_global_id(0) + i) % n];
  x[get_global_id(0)] = a[(int)x[0] % WORDS];
}"""


def used() -> float:
    time.sleep(0.5)
    return nvidia_smi_mb()


def main() -> int:
    devices = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU]
    context = cl.Context(devices[:1])
    queue = cl.CommandQueue(context)
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4 << 20)
    cl.enqueue_fill_buffer(queue, buffer, np.float32(0), 0, 4 << 20)
    queue.finish()
    rows = {"context": used()}
    kept = []
    for count in (1, 10, 40, 80):
        while len(kept) < count:
            program = cl.Program(context, TRIVIAL).build(options=[f"-DVALUE={len(kept) + 1}.0f"])
            program.k(queue, (1 << 20,), None, buffer)
            kept.append(program)
        queue.finish()
        rows[f"{count} programs"] = used()
    for words in (256, 1024, 4096):
        program = cl.Program(context, PRIVATE).build(options=[f"-DWORDS={words}"])
        program.p(queue, (1 << 20,), None, buffer, np.int32(1 << 20))
        queue.finish()
        kept.append(program)
        rows[f"+ a kernel with {words * 4} B private"] = used()
    for size_kib, count in ((4, 200), (1088, 200)):  # a page's worth, and just over 1 MiB each
        for _ in range(count):
            buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, size_kib << 10)
            cl.enqueue_fill_buffer(queue, buffer, np.float32(0), 0, size_kib << 10)
            kept.append(buffer)
        queue.finish()
        rows[f"+ {count} buffers of {size_kib} KiB ({count * size_kib / 1024:.1f} MiB)"] = used()
    print(json.dumps({"device": devices[0].name, "gpu_mib": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
