"""Does NVIDIA's OpenCL compiler take inline PTX mma.sync (tensor cores)?

One warp multiplies A (16x16, half) by B (16x8, half) into C (16x8, float) with
mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, each lane loading its fragments
from global memory by the PTX ISA's fragment layout; the result is checked against
numpy. Run on the device machine after `source benchmarks/device_setup.sh`.
"""
import numpy as np
import pyopencl as cl

SOURCE = r"""
__kernel void mma_probe(__global const ushort* A, __global const ushort* B, __global float* C) {
  const int lane = get_local_id(0);
  const int g = lane >> 2, t = lane & 3;
  // A row-major [16][16]; B stored [n][k] (k contiguous, the "col" layout) [8][16].
  __global const uint* a32 = (__global const uint*)A;
  __global const uint* b32 = (__global const uint*)B;
  uint a0 = a32[(g * 16 + 2 * t) / 2], a1 = a32[((g + 8) * 16 + 2 * t) / 2];
  uint a2 = a32[(g * 16 + 2 * t + 8) / 2], a3 = a32[((g + 8) * 16 + 2 * t + 8) / 2];
  uint b0 = b32[(g * 16 + 2 * t) / 2], b1 = b32[(g * 16 + 2 * t + 8) / 2];
  float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  C[g * 8 + 2 * t] = d0;
  C[g * 8 + 2 * t + 1] = d1;
  C[(g + 8) * 8 + 2 * t] = d2;
  C[(g + 8) * 8 + 2 * t + 1] = d3;
}
"""


def main():
    for platform in cl.get_platforms():
        for device in platform.get_devices():
            print(platform.name, "|", device.name, "|", device.version)
            try:
                print("  compute capability", device.compute_capability_major_nv,
                      device.compute_capability_minor_nv)
            except Exception as e:  # noqa: BLE001 - a probe reports whatever it meets
                print("  no compute capability query:", e)
            ctx = cl.Context([device])
            queue = cl.CommandQueue(ctx)
            rng = np.random.default_rng(0)
            a = rng.standard_normal((16, 16)).astype(np.float16)
            b = rng.standard_normal((16, 8)).astype(np.float16)
            mf = cl.mem_flags
            a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a.view(np.uint16))
            bt = np.ascontiguousarray(b.T)
            b_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bt.view(np.uint16))
            c = np.zeros((16, 8), np.float32)
            c_buf = cl.Buffer(ctx, mf.WRITE_ONLY, c.nbytes)
            try:
                program = cl.Program(ctx, SOURCE).build()
            except Exception as e:  # noqa: BLE001
                print("  build failed:", str(e)[:2000])
                continue
            ptx = program.get_info(cl.program_info.BINARIES)[0].decode("latin-1")
            print("  ", " ".join(l for l in ptx.splitlines() if l.startswith((".version", ".target"))))
            program.mma_probe(queue, (32,), (32,), a_buf, b_buf, c_buf)
            cl.enqueue_copy(queue, c, c_buf)
            want = a.astype(np.float32) @ b.astype(np.float32)
            print("  max abs error", float(np.abs(c - want).max()), "max |C|", float(np.abs(want).max()))


if __name__ == "__main__":
    main()
