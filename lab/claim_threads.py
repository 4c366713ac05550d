"""Benchmark: what a cold start spends compiling programs, by thread count and op library.

Loads a model through the OpenCL backend in a fresh process per (op library, thread count), each
with empty program caches (difflite's, PoCL's, NVIDIA's), and reports the claim time (which is
where the programs compile) against the build time summed over the threads: a sum far above the
claim time with no drop in the claim time means the driver serialises clBuildProgram. With
several op libraries (--oplibs, e.g. a baseline build beside the current one) the rows compare
them side by side; each row keeps the slowest program builds.

    python lab/claim_threads.py OUT/unet.tflite --threads 1,4,16 [--oplibs A.so,B.so] [--save x.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
from ai_edge_litert.interpreter import Interpreter, load_delegate
model, lib, threads, stats = sys.argv[1:5]
start = time.perf_counter()
delegate = load_delegate(lib, {"backend": "opencl", "precision": "fp16", "num_threads": threads,
                               "stats_path": stats})
Interpreter(model_path=model, experimental_delegates=[delegate]).allocate_tensors()
print(time.perf_counter() - start)
"""


def cold_load(model: Path, lib: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "XDG_CACHE_HOME": f"{folder}/xdg", "POCL_CACHE_DIR": f"{folder}/pocl",
               "CUDA_CACHE_PATH": f"{folder}/cuda"}
        stats = Path(folder) / "stats.json"
        done = subprocess.run([sys.executable, "-c", CHILD, str(model), lib, str(threads), str(stats)], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        report = json.loads(stats.read_text())
    builds = sorted(report.get("program_builds", []), key=lambda b: -b["seconds"])
    return {"oplib": Path(lib).name, "threads": threads, "load_s": float(done.stdout.split()[-1]),
            "claim_s": report["claim_seconds"], "build_s_summed": report["build_seconds"],
            "programs": report["programs_compiled"], "device": report["device"], "slowest_builds": builds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--threads", default="1,4,16")
    parser.add_argument("--oplibs", help="comma-separated op libraries (default: the one difflite finds)")
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from difflite.runtime.component import find_oplib

    libs = args.oplibs.split(",") if args.oplibs else [str(find_oplib())]
    rows = [cold_load(args.model, lib, int(t)) for lib in libs for t in args.threads.split(",")]
    if args.save:
        args.save.write_text(json.dumps(rows, indent=1))
    print(f"{rows[0]['device']}, {args.model}\n")
    print("| op library | claim threads | load s | claim s | build s summed | programs |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['oplib']} | {r['threads']} | {r['load_s']:.2f} | {r['claim_s']:.2f} | "
              f"{r['build_s_summed']:.1f} | {r['programs']} |")
    for r in rows:
        slow = ", ".join(f"{b['program']}:{b['kernel']} {b['seconds']:.2f}" for b in r["slowest_builds"][:6])
        if slow:
            print(f"slowest builds, {r['oplib']} x {r['threads']}: {slow}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
