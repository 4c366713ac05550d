"""Paper-style GPU ablation: each fused difflite kernel against the same computation as separate
unfused kernels, at Stable Diffusion 1.5 shapes, on any OpenCL device (pyopencl).

Cases (full size; --small divides them for a CPU OpenCL such as PoCL):
  GroupNorm+SiLU   [1,64,64,320] and [1,4096,1280], 32 groups (cooperative, one-kernel and split variants)
  GELU (erf)       4096 x 1280
  GEGLU            4096 x 640 -> 4096 x 320 and 4096 x 2560 -> 4096 x 1280
  self-attention   4096 x 4096, 8 heads x 40 (flash, wide and partial-softmax variants), at batch 1
                   and at the UNet's batch 2 (classifier-free guidance)
  cross-attention  4096 x 77, 8 heads x 40 (the same three)
  self-attention   1024 x 1024, 8 heads x 80 at batch 2 (SD 1.5's 32x32 level), and
  self-attention   4096 x 4096, 1 head x 512 (the VAE decoder's; wide and partial softmax) and
                   256 x 256, 8 heads x 160, batch 2 (the UNet's 16x16 level; wide, partial softmax,
                   flash where its tiles fit)
  Winograd F(4x4,3x3) vs the backend's direct 3x3 CONV_2D (conv.cl's implicit GEMM with the
  same vectorised tile, split-K where the backend would split) at 64x64x320 and 32x32x640, and
  at batch 2 at 16x16x1280 and 8x8x1280
plus a device-to-device copy bandwidth measurement.

Fused kernels: custom_ops/ops/*/*.cl through benchmarks/gpu_kernels_harness/launch.py (the same
launch plans as the C++ backend). Unfused: gpu_kernels_harness/unfused.cl (one kernel per graph
operator, full-size temporaries). Times: OpenCL profiling events, first kernel's start to last
kernel's end of one run (gaps between kernels on the device included; each run's kernels are
queued behind a user event released once all are enqueued, so the host's enqueue latency is not),
median of --runs after --warmup runs; "kernel-only" sums the kernels' own durations.
GB/s counts the bytes that must move (inputs + outputs, once), against two ceilings: the copy
bandwidth of 256 MB buffers, and the best copy of the case's own byte count ("same-size copy", a
float4 kernel or clEnqueueCopyBuffer, whichever is faster). "intermediate MB" is the unfused
form's temporaries. The fused and unfused outputs are compared (max |diff| / max |out|).

    python benchmarks/gpu_ablation.py [--small] [--runs N] [--warmup N] [--device SUBSTRING]

Writes benchmarks/results/gpu_ablation_<device>[_small].json and prints a markdown table.
Needs numpy and pyopencl only (fp32 storage).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import pyopencl as cl  # noqa: E402
from gpu_kernels_harness.launch import Runner, attention_plan, pick_context, round_up  # noqa: E402
from gpu_kernels_harness.unfused import Unfused  # noqa: E402

MB = 1024 * 1024


def winograd_u(w_oihw: np.ndarray) -> np.ndarray:
    """G g G^T as [36, Cin, Cout] (difflite/core/winograd.py's definition; imported when available)."""
    try:
        from difflite.core.winograd import transform_weights

        return transform_weights(w_oihw)
    except ImportError:  # standalone copy of the benchmark: the same matrices
        g = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                      [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
        u = np.einsum("ak,oikl,bl->abio", g, w_oihw.astype(np.float64), g)
        return np.ascontiguousarray(u.reshape(36, w_oihw.shape[1], w_oihw.shape[0]).astype(np.float32))


def device_time(events: list) -> float:
    for e in events:
        e.wait()
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


def kernel_time(events: list) -> float:
    """Sum of the kernels' own durations (no gaps between them)."""
    for e in events:
        e.wait()
    return sum(e.profile.end - e.profile.start for e in events) * 1e-9


def gated(queue, fn) -> list:
    """fn()'s kernels queued behind a user event that is released once all are enqueued, so that
    they run back to back as in a model (a Python enqueue takes longer than a small kernel)."""
    gate = cl.UserEvent(queue.context)
    cl.enqueue_marker(queue, wait_for=[gate])
    try:
        return fn()
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)


def measure(fn, runs: int, warmup: int, queue) -> tuple[float, int, float, list[float]]:
    """Median device seconds of fn() (which returns its events) from the first kernel's start to
    the last one's end, its kernel count, the median of the summed kernel durations, and each
    kernel's median duration."""
    n_kernels = 0
    for _ in range(warmup):
        n_kernels = len(gated(queue, fn))
    chain, kernels, each = [], [], []
    for _ in range(runs):
        ev = gated(queue, fn)
        chain.append(device_time(ev))
        kernels.append(kernel_time(ev))
        each.append([(e.profile.end - e.profile.start) * 1e-9 for e in ev])
    per_kernel = [statistics.median(k) for k in zip(*each)]
    return statistics.median(chain), n_kernels, statistics.median(kernels), per_kernel


def copy_bandwidth(r: Runner, nbytes: int, runs: int, warmup: int, u: Unfused | None = None) -> float:
    """Device-to-device copy of nbytes with clEnqueueCopyBuffer or, given `u`, also with unfused.cl's
    float4 copy kernel, whichever is faster: (read + write) bytes / s."""
    src = cl.Buffer(r.ctx, cl.mem_flags.READ_WRITE, nbytes)
    dst = cl.Buffer(r.ctx, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(r.queue, src, np.float32(1.0), 0, nbytes)
    copies = [lambda: [cl.enqueue_copy(r.queue, dst, src)]]
    if u is not None:
        n4, kernel = nbytes // 16, u.k("un_copy4")
        copies.append(lambda: [r.launch(kernel, (round_up(n4, 256),), (256,), src, dst, np.int32(n4))])
    return 2 * nbytes / min(measure(fn, runs, warmup, r.queue)[0] for fn in copies)


def same_size_copy_bandwidth(r: Runner, u: Unfused, moved: int, runs: int, warmup: int) -> float:
    """The best copy that moves `moved` bytes (half read, half written). At a few MB a copy is far
    from the large-buffer bandwidth (launch and ramp-up), so this is the fair ceiling for a kernel of
    that size."""
    return copy_bandwidth(r, max(16, moved // 2 // 16 * 16), runs, warmup, u)


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


# ---------------------------------------------------------------------------
# Cases: each returns (fused variants {label: fn}, unfused fn, output getter(s), facts)


def case_group_norm(r, u, shape, groups):
    rng = np.random.default_rng(0)
    c = shape[-1]
    x = rng.standard_normal(shape).astype(np.float32) + 0.5
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, c).astype(np.float32)
    xb, gb, bb = r.upload(x), r.upload(gamma), r.upload(beta)
    plans = ("coop", "one", "split")  # gn_coop, gn_one, or gn_stats_cols + gn_apply_cols
    outs = {p: r.empty(shape) for p in plans}
    yu = r.empty(shape)
    total = x.size
    auto = r.gn_default_plan(shape[0], groups, int(np.prod(shape[1:-1])), c // groups)
    labels = {p: f"{p}{' (auto)' if p == auto else ''}" for p in plans}
    return dict(
        fused={labels[p]: (lambda p=p: r.group_norm(xb, gb, bb, outs[p], shape, groups, 1e-5, True, plan=p))
               for p in plans},
        unfused=lambda: u.group_norm(xb, gb, bb, yu, shape, groups, 1e-5, True),
        out=({labels[p]: (lambda p=p: r.download(outs[p], shape)) for p in plans}, lambda: r.download(yu, shape)),
        bytes=4 * (2 * total + 2 * c), flops=None, temp_tag="group_norm")


def case_gelu(r, u, rows, d):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, d)) * 2).astype(np.float32)
    xb = r.upload(x)
    yf, yu = r.empty(x.shape), r.empty(x.shape)
    return dict(
        fused={"fused": lambda: r.gelu(xb, yf, x.size, "erf")},
        unfused=lambda: u.gelu(xb, yu, x.size),
        out=(lambda: r.download(yf, x.shape), lambda: r.download(yu, x.shape)),
        bytes=4 * 2 * x.size, flops=None, temp_tag="gelu")


def case_geglu(r, u, rows, d):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((rows, 2 * d)) * 2).astype(np.float32)
    xb = r.upload(x)
    yf, yu = r.empty((rows, d)), r.empty((rows, d))
    return dict(
        fused={"fused": lambda: r.geglu(xb, yf, rows, d, "erf")},
        unfused=lambda: u.geglu(xb, yu, rows, d),
        out=(lambda: r.download(yf, (rows, d)), lambda: r.download(yu, (rows, d))),
        bytes=4 * 3 * rows * d, flops=None, temp_tag="geglu")


ATTN_KERNEL = {"flash": "flash", "partial_softmax": "partial", "wide": "wide"}  # label -> forced kernel


def case_attention(r, u, lq, lk, heads, dh, n=1, variants=("flash", "partial_softmax")):
    """Each kernel in `variants` forced (Runner.attention's kernel=, DIFFLITE_ATTN_KERNEL in the
    library); flash is left out where its tiles do not fit local memory."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((n, lq, heads * dh)).astype(np.float32)
    k = rng.standard_normal((n, lk, heads * dh)).astype(np.float32)
    v = rng.standard_normal((n, lk, heads * dh)).astype(np.float32)
    qb, kb, vb = r.upload(q), r.upload(k), r.upload(v)
    scale = 1.0 / math.sqrt(dh)
    shape = (n, lq, heads * dh)
    plan = {}
    for lab in variants:
        try:
            plan[lab] = attention_plan(dh, dh, "auto", r.local_mem, flat=r.flat, kernel=ATTN_KERNEL[lab],
                                       max_wg=r.max_wg)
        except ValueError:  # flash with a head too wide for local memory
            continue
    outs = {lab: r.empty(shape) for lab in plan}
    yu = r.empty(shape)
    auto = attention_plan(dh, dh, "auto", r.local_mem, flat=r.flat, max_wg=r.max_wg,
                          flash_in_registers=r.flash_in_registers(dh, dh))
    labels = {lab: f"{lab}{' (auto)' if p == auto else ''}" for lab, p in plan.items()}
    fused = {
        labels[lab]: (lambda lab=lab: r.attention(qb, kb, vb, outs[lab], n, lq, lk, heads, dh, dh, scale, False,
                                                  kernel=ATTN_KERNEL[lab]))
        for lab in plan
    }
    getters = {labels[lab]: (lambda lab=lab: r.download(outs[lab], shape)) for lab in plan}
    return dict(
        fused=fused, unfused=lambda: u.attention(qb, kb, vb, yu, n, lq, lk, heads, dh, dh, scale),
        out=(getters, lambda: r.download(yu, shape)),
        bytes=4 * (q.size + k.size + v.size + q.size), flops=2.0 * n * heads * lq * lk * (2 * dh),
        temp_tag="attention")


def case_winograd(r, u, hw, cin, cout, n=1):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, hw, hw, cin)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3)) / math.sqrt(9 * cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    xb, ub, bb = r.upload(x), r.upload(winograd_u(w)), r.upload(bias)
    wb = r.upload(np.ascontiguousarray(w.transpose(0, 2, 3, 1)))  # OHWI, as TFLite stores it
    shape = (n, hw, hw, cout)
    yf, yu = r.empty(shape), r.empty(shape)
    scratch = r.winograd_scratch_bytes(n, hw, hw, cin, cout)
    return dict(
        fused={"winograd": lambda: r.winograd(xb, ub, bb, yf, n, hw, hw, cin, cout)},
        unfused=lambda: r.conv3x3(xb, wb, bb, yu, n, hw, hw, cin, cout),
        out=(lambda: r.download(yf, shape), lambda: r.download(yu, shape)),
        bytes=4 * (x.size + w.size + cout + n * hw * hw * cout), flops=2.0 * n * hw * hw * cin * cout * 9,
        temp_tag=None, fused_scratch=scratch, baseline_name="direct 3x3")


ATTN_WIDE_VARIANTS = ("wide", "partial_softmax", "flash")


def cases(small: bool):
    f = 4 if small else 1  # spatial side divisor
    L = 4096 // (f * f)  # tokens
    s = 64 // f
    c1 = 320 // (5 if small else 1)
    c2 = 1280 // (10 if small else 1)
    return [
        (f"GroupNorm+SiLU 1x{s}x{s}x{c1}, 32 groups", case_group_norm, ((1, s, s, c1), 32)),
        (f"GroupNorm+SiLU 1x{L}x{c2}, 32 groups", case_group_norm, ((1, L, c2), 32)),
        (f"GELU erf {L}x{c2}", case_gelu, (L, c2)),
        (f"GEGLU {L}x{2 * c1} -> {L}x{c1}", case_geglu, (L, c1)),
        (f"GEGLU {L}x{2 * c2} -> {L}x{c2}", case_geglu, (L, c2)),
        (f"self-attention {L}x{L}, 8x40", case_attention, (L, L, 8, 40, 1, ("flash", "wide", "partial_softmax"))),
        (f"self-attention {L}x{L}, 8x40, batch 2", case_attention, (L, L, 8, 40, 2, ("flash", "partial_softmax"))),
        (f"cross-attention {L}x77, 8x40", case_attention, (L, 77, 8, 40, 1, ("flash", "wide", "partial_softmax"))),
        (f"self-attention {L}x{L}, 1x512 (VAE)", case_attention, (L, L, 1, 512, 1, ATTN_WIDE_VARIANTS)),
        (f"self-attention {L // 4}x{L // 4}, 8x80", case_attention, (L // 4, L // 4, 8, 80, 2, ATTN_WIDE_VARIANTS)),
        (f"self-attention {256 // f}x{256 // f}, 8x160", case_attention,
         (256 // f, 256 // f, 8, 160, 2, ATTN_WIDE_VARIANTS)),
        (f"Winograd 3x3 {s}x{s}x{c1}", case_winograd, (s, c1, c1)),
        (f"Winograd 3x3 {s // 2}x{s // 2}x{2 * c1}", case_winograd, (s // 2, 2 * c1, 2 * c1)),
        # The UNet's two smallest levels at batch 2: 32 and 8 tiles, under the 32 tiles per image that
        # TFLite's GPU delegate (and the device profiles' winograd.min_tiles) require.
        (f"Winograd 3x3 {s // 4}x{s // 4}x{4 * c1}, batch 2", case_winograd, (s // 4, 4 * c1, 4 * c1, 2)),
        (f"Winograd 3x3 {s // 8}x{s // 8}x{4 * c1}, batch 2", case_winograd, (s // 8, 4 * c1, 4 * c1, 2)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="reduced shapes (CPU OpenCL such as PoCL)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per case (default 20, --small 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 3, --small 1)")
    ap.add_argument("--device", default=None, help="platform/device name substring (default: first GPU)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/...)")
    ap.add_argument("--cases", default="", help="only the cases whose name contains this text (e.g. attention)")
    args = ap.parse_args(argv)
    runs = args.runs or (3 if args.small else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)

    ctx, dev = pick_context(args.device)
    r = Runner(ctx, dev)
    copy_bytes = (16 if args.small else 256) * MB
    copy_bw = copy_bandwidth(r, copy_bytes, runs, warmup)

    rows = []
    same_size_copy: dict[int, float] = {}
    for name, make, params in cases(args.small):
        if args.cases.lower() not in name.lower():
            continue
        u = Unfused(r)
        spec = make(r, u, *params)
        t_un, k_un, tk_un, _ = measure(spec["unfused"], runs, warmup, r.queue)
        out_f, out_u = spec["out"]
        ref = out_u()
        temp_bytes = u.temp_bytes.get(spec["temp_tag"], 0) if spec["temp_tag"] else 0
        moved = spec["bytes"]
        if moved not in same_size_copy:
            same_size_copy[moved] = same_size_copy_bandwidth(r, u, moved, runs, warmup)
        for label, fn in spec["fused"].items():
            t_f, k_f, tk_f, each_f = measure(fn, runs, warmup, r.queue)
            got = out_f[label]() if isinstance(out_f, dict) else out_f()
            gbs = spec["bytes"] / t_f / 1e9
            row = {
                "case": name, "fused": label, "baseline": spec.get("baseline_name", "unfused"),
                "fused_ms": t_f * 1e3, "unfused_ms": t_un * 1e3, "speedup": t_un / t_f,
                "fused_kernel_ms": tk_f * 1e3, "unfused_kernel_ms": tk_un * 1e3,
                "fused_each_kernel_ms": [t * 1e3 for t in each_f],
                "kernel_speedup": tk_un / tk_f,
                "fused_kernels": k_f, "unfused_kernels": k_un,
                "bytes_moved": spec["bytes"], "fused_gbs": gbs, "unfused_gbs": spec["bytes"] / t_un / 1e9,
                "fraction_of_copy_bw": gbs * 1e9 / copy_bw,
                "same_size_copy_gbs": same_size_copy[moved] / 1e9,
                "fraction_of_same_size_copy": gbs * 1e9 / same_size_copy[moved],
                "unfused_intermediate_bytes": temp_bytes,
                "fused_scratch_bytes": spec.get("fused_scratch", 0),
                "max_rel_diff": rel_diff(got, ref),
            }
            if spec["flops"]:
                row["fused_gflops"] = spec["flops"] / t_f / 1e9
                row["unfused_gflops"] = spec["flops"] / t_un / 1e9
            rows.append(row)
        del u, spec

    info = {
        "device": dev.name.strip(), "vendor": dev.vendor.strip(), "platform": dev.platform.name.strip(),
        "driver": dev.driver_version, "compute_units": r.compute_units, "local_mem_bytes": r.local_mem,
        "small": args.small, "runs": runs, "warmup": warmup, "storage": "float32",
        "copy_bytes": copy_bytes, "copy_bandwidth_gbs": copy_bw / 1e9,
        "python": platform.python_version(), "pyopencl": cl.VERSION_TEXT,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": rows,
    }
    slug = re.sub(r"[^A-Za-z0-9]+", "_", dev.name.strip()).strip("_").lower()
    out = args.out or RESULTS / f"gpu_ablation_{slug}{'_small' if args.small else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=2) + "\n")

    print(f"device: {info['device']} ({info['platform']}), copy bandwidth {copy_bw / 1e9:.1f} GB/s "
          f"({copy_bytes // MB} MB buffers), median of {runs} runs after {warmup} warm-up, fp32\n")
    print("| case | fused kernel | fused ms (kernels) | baseline ms (kernels) | speedup | kernel-only ms "
          "fused / baseline (speedup) | fused GB/s | of copy BW | of a same-size copy | baseline GB/s "
          "| baseline intermediates MB | GFLOP/s fused / baseline | max rel diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        fl = (f"{x['fused_gflops']:.1f} / {x['unfused_gflops']:.1f}" if "fused_gflops" in x else "")
        inter = x["unfused_intermediate_bytes"] / MB
        if x["fused_scratch_bytes"]:
            inter_s = f"0 (Winograd scratch {x['fused_scratch_bytes'] / MB:.1f})"
        else:
            inter_s = f"{inter:.1f}"
        print(f"| {x['case']} | {x['fused']} | {x['fused_ms']:.3f} ({x['fused_kernels']}) | "
              f"{x['unfused_ms']:.3f} ({x['unfused_kernels']}, {x['baseline']}) | {x['speedup']:.2f}x | "
              f"{x['fused_kernel_ms']:.3f} / {x['unfused_kernel_ms']:.3f} ({x['kernel_speedup']:.2f}x) | "
              f"{x['fused_gbs']:.1f} | {100 * x['fraction_of_copy_bw']:.0f}% | "
              f"{100 * x['fraction_of_same_size_copy']:.0f}% of {x['same_size_copy_gbs']:.0f} | {x['unfused_gbs']:.1f} | "
              f"{inter_s} | {fl} | {x['max_rel_diff']:.1e} |")
    print(f"\nwrote {out}")
    bad = [x for x in rows if not x["max_rel_diff"] < 1e-3]
    if bad:
        print("fused and baseline outputs disagree: " + ", ".join(f"{x['case']} [{x['fused']}]" for x in bad),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
