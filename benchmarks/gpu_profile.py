"""Per-op GPU time of one converted component on backend=opencl (the delegate's profile option:
OpenCL event timestamps summed per op type, or with --detail per op, shapes and kernel; read
from the delegate's stats_path file).

    python benchmarks/gpu_profile.py OUT unet [--runs 5] [--detail] [--precision fp16] [--json FILE]

Prints a table (ms per invoke and share per op type) and the wall time per invoke; with --json
writes both. Event profiling serialises the queue a little, so the wall time here is slightly
above an unprofiled run's.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def random_feeds(entry: dict, rng) -> dict:
    feeds = {}
    for spec in entry["inputs"]:
        shape = spec["shape"]
        if spec["dtype"].startswith("int"):
            feeds[spec["name"]] = rng.integers(0, 400, shape).astype(spec["dtype"])
        else:
            feeds[spec["name"]] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def profile(folder: Path, component: str, runs: int, detail: bool = False, precision: str = "fp32",
            loras: tuple[str, ...] = ()) -> dict:
    """Runs the component and returns the delegate's stats (stats_path) plus wall times."""
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    from difflite.folder.manifest import read_manifest
    from difflite.runtime.component import find_oplib

    entry = read_manifest(folder)["components"][component]
    stats_path = Path(tempfile.mkstemp(prefix="difflite-profile-", suffix=".json")[1])
    delegate = load_delegate(str(find_oplib()), {"backend": "opencl", "profile": "2" if detail else "1",
                                                 "precision": precision, "stats_path": str(stats_path)})
    interpreter = Interpreter(model_path=str(folder / entry["file"]), experimental_delegates=[delegate])
    if loras:  # before the signature runner, which holds the interpreter's tensors
        set_loras(folder, component, interpreter, delegate, loras)
    runner = interpreter.get_signature_runner("serving_default")
    feeds = random_feeds(entry, np.random.default_rng(0))
    runner(**feeds)  # warm-up: first-use allocations
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        runner(**feeds)
        walls.append(time.perf_counter() - start)
    stats = json.loads(stats_path.read_text())
    del runner, interpreter, delegate
    gc.collect()
    stats_path.unlink()
    ops = {name: round(ms, 4) for name, ms in stats["profile_ms_per_invoke"].items()}
    memory = {key: stats[key] for key in ("arena_bytes", "scratch_bytes", "scratch_held_bytes",
                                          "scratch_lent_bytes", "weights_bytes", "storage")}
    # which OpenCL platform and kernels ran: two ICDs on one machine (NVIDIA's, PoCL's) give the same
    # device name, so a profile says which one it timed
    ran_on = {key: stats.get(key) for key in ("platform", "device", "arithmetic", "tensor_cores", "gemm_tiles")}
    return {"component": component, "invokes": stats["invokes"], "kernel_ms": round(sum(ops.values()), 3),
            "wall_ms_median": round(float(np.median(walls)) * 1e3, 2), "ran_on": ran_on, "memory": memory,
            "ops_ms": ops}


def set_loras(folder: Path, component: str, interpreter, delegate, loras: tuple[str, ...]) -> None:
    """Run-time LoRA files (FILE[:SCALE]) set on the prepared model's difflite.LoRA slots."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.component import find_oplib
    from difflite.runtime.lora_factors import set_factors
    from difflite.runtime.loras import plan_for_folder

    interpreter.allocate_tensors()
    plan = plan_for_folder(OutputFolder.read(folder), loras)
    for slot, (down, up) in plan.take(component).items():
        set_factors(find_oplib(), delegate, slot, down, up)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("component")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--detail", action="store_true",
                        help="per node shape and kernel (profile=2) instead of per op type")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                        help="the delegate's precision (fp16: half storage)")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                        help="a run-time LoRA set on the model's slots first (repeatable)")
    args = parser.parse_args()
    result = profile(args.folder, args.component, args.runs, args.detail, args.precision, tuple(args.lora))
    result["precision"] = args.precision
    total = result["kernel_ms"]
    print(f"{args.component}: {result['wall_ms_median']} ms wall per invoke, {total:.2f} ms in kernels "
          f"({result['invokes']} profiled invokes incl. warm-up); device memory {result['memory']}; "
          f"ran on {result['ran_on']}")
    print("| op | ms per invoke | share |")
    print("|---|---|---|")
    for name, ms in sorted(result["ops_ms"].items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {ms:.2f} | {100 * ms / total:.1f}% |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
