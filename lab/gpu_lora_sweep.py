"""Probe: difflite.LoRA's kernels (custom_ops/ops/lora/lora.cl, through the harness's Runner.lora)
at the SD 1.5 UNet's slot shapes (batch 2, 512x512, rank 32, half storage): the plan the op picks
on this device (lora_plan: rows per item and row slots of lora_down and lora_up), with --plans
also every rows-per-item pair at the device's row slots, against a naive two-kernel candidate
written here (t = x D^T into a float scratch, then out = y + t U^T, an item per (row, 4 ranks) and
per (row, 4 columns)) and a copy of y (the bytes the op must move). Prints microseconds per slot
shape (and lora.cl's error against float64) and the UNet's sum (192 slots).

    python lab/gpu_lora_sweep.py [--rank 32] [--runs 20] [--small] [--plans]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_kernels_harness.launch import Runner, cl_source  # noqa: E402

# (K, N, M, slots in the UNet): per transformer level 7 C->C layers, to_k/to_v from the text
# (768 -> C over 2 x 77 rows), ff.net.0.proj C -> 8C, ff.net.2 4C -> C
LEVELS = [(320, 8192, 5), (640, 2048, 5), (1280, 512, 5), (1280, 128, 1)]


def shapes(small: bool):
    out = []
    for c, m, count in (LEVELS[-2:] if small else LEVELS):
        out += [(c, c, m, 7 * count), (768, c, 154, 2 * count), (c, 8 * c, m, count), (4 * c, c, m, count)]
    return out


TWO_KERNELS = r"""
#include "dl_storage.cl"
// A candidate t = x D^T reading D [R][K] (k contiguous) instead of D^T: a work-group of 8 rank
// quads x 32 lanes along k takes 4 rows; every load of x and D is coalesced along k; the lanes'
// sums are added in local memory. Global size (ceil(M / 4) * 256), local 256; R a multiple of 32.
__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void lora_down_rk(__global const DL_T* x, __global const float* d, __global float* t, int M, int K, int R) {
  __local float red[32 * 129];
  const int lid = get_local_id(0), l = lid % 32, q = lid / 32;
  const int m0 = get_group_id(0) * 4;
  float4 acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = (float4)(0.0f);
  for (int k = l; k < K; k += 32) {
    const float4 dv = (float4)(d[(4 * q) * K + k], d[(4 * q + 1) * K + k], d[(4 * q + 2) * K + k],
                               d[(4 * q + 3) * K + k]);
    for (int i = 0; i < 4; ++i) acc[i] += DL_LOAD(x, min(m0 + i, M - 1) * K + k) * dv;
  }
  for (int i = 0; i < 4; ++i) vstore4(acc[i], 0, red + l * 129 + i * 32 + 4 * q);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < 128) {
    float sum = 0.0f;
    for (int e = 0; e < 32; ++e) sum += red[e * 129 + lid];
    const int m = m0 + lid / 32;
    if (m < M) t[m * R + lid % 32] = sum;
  }
}
// t[m][j..j+3] = x[m] . DT[:, j..j+3]; an item per (row, 4 ranks), rows on dimension 1
__kernel void lora_down(__global const DL_T* x, __global const float4* dt4, __global float4* t4,
                        int M, int K, int R4) {
  const int j = get_global_id(0), m = get_global_id(1);
  if (j >= R4 || m >= M) return;
  float4 acc = (float4)(0.0f);
  for (int k = 0; k < K; ++k) acc += DL_LOAD(x, m * K + k) * dt4[k * R4 + j];
  t4[m * R4 + j] = acc;
}
// out[m][n..n+3] = y[m][n..n+3] + t[m] . UT[:, n..n+3]; an item per (row, 4 columns)
__kernel void lora_up(__global const DL_T* y, __global DL_T* out, __global const float* t,
                      __global const float4* ut4, int M, int N4, int R) {
  const int n = get_global_id(0), m = get_global_id(1);
  if (n >= N4 || m >= M) return;
  float4 acc = (float4)(0.0f);
  for (int j = 0; j < R; ++j) acc += t[m * R + j] * ut4[j * N4 + n];
  const int e = m * N4 * 4 + n * 4;
  DL_STORE(out, e, DL_LOAD(y, e) + acc.x);
  DL_STORE(out, e + 1, DL_LOAD(y, e + 1) + acc.y);
  DL_STORE(out, e + 2, DL_LOAD(y, e + 2) + acc.z);
  DL_STORE(out, e + 3, DL_LOAD(y, e + 3) + acc.w);
}
"""


def seconds(events) -> float:
    for e in events:
        e.wait()
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


def timed(fn, runs: int) -> float:
    for _ in range(3):
        seconds(fn())
    return float(np.median([seconds(fn()) for _ in range(runs)]))


def each_kernel(fn, runs: int) -> list[float]:
    """Median seconds of each event's own kernel (start to end), the gaps between them left out."""
    for _ in range(3):
        seconds(fn())
    samples = []
    for _ in range(runs):
        events = fn()
        for e in events:
            e.wait()
        samples.append([(e.profile.end - e.profile.start) * 1e-9 for e in events])
    return [float(np.median(column)) for column in zip(*samples)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="the two smallest levels only (PoCL)")
    parser.add_argument("--plans", action="store_true", help="also every (rows per item) pair of the kernels")
    args = parser.parse_args()
    r = Runner(half_io=True)
    print(f"device: {r.device.name}; rank {args.rank}; half storage")
    common = cl_source(ROOT / "custom_ops" / "ops" / "common" / "dl_storage.cl")
    program = cl.Program(r.ctx, common + TWO_KERNELS.replace('#include "dl_storage.cl"', "")).build(
        options=r.base_options.split())
    down_k, up_k = cl.Kernel(program, "lora_down"), cl.Kernel(program, "lora_up")
    down_rk = cl.Kernel(program, "lora_down_rk")
    rng = np.random.default_rng(0)
    totals = {}
    rows = []
    rank = args.rank
    for k, n, m, count in shapes(args.small):
        x = r.upload(rng.standard_normal((m, k)).astype(np.float32))
        y = r.upload(rng.standard_normal((m, n)).astype(np.float32))
        out = r.empty((m, n))
        down = (rng.standard_normal((rank, k)) / np.sqrt(k)).astype(np.float32)
        up = (rng.standard_normal((n, rank)) * 0.1).astype(np.float32)
        dt, ut = r.lora_factors(down, up)  # as the op stores them: D [R][K], U^T
        dt_t = cl.Buffer(r.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=np.ascontiguousarray(down.T, np.float32))  # D^T for the candidates below
        t = cl.Buffer(r.ctx, cl.mem_flags.READ_WRITE, m * rank * 4)
        row = {"shape": f"{m}x{k}->{n} x{count}"}
        picked = r.lora_plan(m, n)
        plans = {"lora.cl": picked}
        if args.plans:
            for dr in (1, 2, 4, 8):
                for ur in (1, 2, 4, 8):
                    plans[f"dr{dr} ur{ur}"] = (dr, picked[1], ur, picked[3])
        for label, plan in plans.items():
            row[label] = timed(lambda: r.lora(x, y, out, dt, ut, m, k, n, rank, plan), args.runs)
        row["plan"] = "dr{} ds{} ur{} us{}".format(*picked)
        own = each_kernel(lambda: r.lora(x, y, out, dt, ut, m, k, n, rank, picked), args.runs)
        row["lora_down own"], row["lora_up own"] = own[0], own[-1]
        want = (r.download(y, (m, n)).astype(np.float64) +
                (r.download(x, (m, k)).astype(np.float64) @ down.T) @ up.T)
        r.lora(x, y, out, dt, ut, m, k, n, rank, picked)
        row["err"] = float(np.abs(r.download(out, (m, n)) - want).max() / np.abs(want).max())

        def two_kernels():
            i32 = np.int32
            e1 = r.launch(down_k, (((rank // 4) + 7) // 8 * 8, (m + 31) // 32 * 32), (8, 32), x, dt_t, t, i32(m),
                          i32(k), i32(rank // 4))
            e2 = r.launch(up_k, (((n // 4) + 63) // 64 * 64, (m + 3) // 4 * 4), (64, 4), y, out, t, ut, i32(m),
                          i32(n // 4), i32(rank))
            return [e1, e2]

        row["two kernels"] = timed(two_kernels, args.runs)
        row["two kernels err"] = float(np.abs(r.download(out, (m, n)) - want).max() / np.abs(want).max())
        if rank == 32:
            d_rk = cl.Buffer(r.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                             hostbuf=np.ascontiguousarray(down, np.float32))  # D [R][K], float
            row["down_rk own"] = each_kernel(lambda: [r.launch(down_rk, ((m + 3) // 4 * 256,), (256,), x, d_rk, t,
                                                               np.int32(m), np.int32(k), np.int32(rank))], args.runs)[0]
            got = np.empty((m, rank), np.float32)
            cl.enqueue_copy(r.queue, got, t)
            r.queue.finish()
            want_t = r.download(x, (m, k)).astype(np.float64) @ down.T.astype(np.float64)
            row["down_rk err"] = float(np.abs(got - want_t).max() / np.abs(want_t).max())
        row["copy y"] = timed(lambda: [cl.enqueue_copy(r.queue, out, y)], args.runs)
        rows.append(row)
        for key, value in row.items():
            if isinstance(value, float) and "err" not in key:
                totals[key] = totals.get(key, 0.0) + value * count
    for row in rows:
        print(row["shape"] + ": " + ", ".join(f"{key} {value * 1e6:.1f} us" if isinstance(value, float) and
                                               "err" not in key else f"{key} {value}"
                                               for key, value in row.items() if key != "shape"))
    print("UNet sum (ms): " + ", ".join(f"{key} {value * 1e3:.2f}" for key, value in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
