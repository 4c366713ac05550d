"""Benchmark: what the CPU backend holds for a converted folder's weights (issue 21).

For each component of OUT, in a fresh process (`difflite.runtime.component.Component`, backend cpu, as
`verify` and `generate` load it): VmRSS / VmHWM from /proc/self/status after the imports, after
loading, after one call and after the timed calls, against the file's bytes: its weight bytes,
the quantized weights' stored bytes and what those weights take as float32. The growth of the
peak over the imports is what the model costs the process. Per call: wall ms and CPU ms (every
thread's, time.process_time), medians of --runs calls after a first one.

    python benchmarks/cpu_weight_memory.py /tmp/q8 --runs 5 --json
    DIFFLITE_OPLIB=/path/to/other.so python benchmarks/cpu_weight_memory.py OUT   # another build
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def status_mb() -> dict:
    from difflite.core.procmem import read_status

    s = read_status()
    return {"rss": s.get("VmRSS"), "hwm": s.get("VmHWM"), "anon": s.get("RssAnon"), "file": s.get("RssFile")}


def file_weights(path: Path) -> dict:
    """The file's weight bytes (MiB), the quantized constants' stored bytes and elements."""
    import numpy as np

    from difflite.folder.reader import read_tflite

    summary = read_tflite(path)
    quantized = [t for t in summary.tensors if t.constant and t.dtype in ("int8", "int4")]
    elements = sum(int(np.prod(t.shape)) for t in quantized)
    return {"file_mb": summary.file_bytes / MIB, "weight_mb": summary.weight_bytes / MIB,
            "quantized_mb": sum(t.nbytes for t in quantized) / MIB,
            "quantized_as_float32_mb": 4 * elements / MIB, "nodes": len(summary.ops)}


def child(out: Path, name: str, runs: int, threads: int | None) -> dict:
    import numpy as np

    from difflite.runtime.bench import random_feeds, vocab_size
    from difflite.runtime.component import Component

    from difflite.folder.output_folder import OutputFolder

    entry = OutputFolder.read(out).components[name]
    path = entry.path
    result = {"component": name, **file_weights(path), "imported": status_mb()}
    start = time.perf_counter()
    comp = Component(entry, backend="cpu", threads=threads)
    result["load_s"] = time.perf_counter() - start
    result["loaded"] = status_mb()
    feeds = random_feeds(entry, np.random.default_rng(0), vocab_size(out))
    start = time.perf_counter()
    comp.runner(**feeds)
    result["first_call_ms"] = 1e3 * (time.perf_counter() - start)
    result["first_call"] = status_mb()
    times, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        comp.runner(**feeds)
        times.append(1e3 * (time.perf_counter() - start))
        cpu.append(1e3 * (time.process_time() - start_cpu))  # every thread's CPU time
    result["median_ms"] = statistics.median(times) if times else None
    result["min_ms"] = min(times) if times else None
    result["median_cpu_ms"] = statistics.median(cpu) if cpu else None
    result["after_runs"] = status_mb()
    result["growth_mb"] = result["after_runs"]["hwm"] - result["imported"]["rss"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--components", default="")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.out, args.child, args.runs, args.threads)))
        return
    manifest = json.loads((args.out / "manifest.json").read_text())
    names = [n for n in (args.components.split(",") if args.components else manifest["components"]) if n]
    results = []
    for name in names:
        cmd = [sys.executable, __file__, str(args.out), "--child", name, "--runs", str(args.runs)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        run = subprocess.run(cmd, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if run.returncode != 0:
            sys.exit(f"{name}: exit {run.returncode}\n{run.stderr[-3000:]}")
        results.append(json.loads(run.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'component':<13} {'weights':>8} {'q-bytes':>8} {'q-as-f32':>8} {'imported':>8} {'loaded':>8} "
          f"{'1st call':>8} {'peak':>8} {'growth':>8} {'load s':>6} {'ms':>8} {'cpu ms':>8}")
    for r in results:
        print(f"{r['component']:<13} {r['weight_mb']:8.1f} {r['quantized_mb']:8.1f} "
              f"{r['quantized_as_float32_mb']:8.1f} {r['imported']['rss']:8.1f} {r['loaded']['rss']:8.1f} "
              f"{r['first_call']['rss']:8.1f} {r['after_runs']['hwm']:8.1f} {r['growth_mb']:8.1f} "
              f"{r['load_s']:6.2f} {r['median_ms'] or 0:8.2f} {r['median_cpu_ms'] or 0:8.2f}")


if __name__ == "__main__":
    main()
