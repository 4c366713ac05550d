"""The op library's memory plan of one model without running it: load FILE.tflite with the OpenCL
backend, prepare it (claim, plan, upload) and print the stats' memory figures in MiB, or the
whole report with --all. Each ENV=VALUE argument is set before the library loads, so one command
compares plans: e.g. the scratch lent and apart.

  python benchmarks/plan_stats.py OUT/unet.tflite --precision fp16 DIFFLITE_LEND_SCRATCH=off

No device time is spent on kernels beyond their builds, so it runs on PoCL on a 2-core host for
SDXL's full-size files (programs come from the disk cache after the first run)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20
FIGURES = ("arena_bytes", "arena_tensors_bytes", "scratch_bytes", "scratch_lent_bytes",
           "scratch_held_bytes", "weights_bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("env", nargs="*", help="ENV=VALUE set before the op library loads")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp16")
    parser.add_argument("--all", action="store_true", help="print the whole stats report")
    args = parser.parse_args()
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"{item!r}: expected ENV=VALUE")
        os.environ[name] = value
    from ai_edge_litert.interpreter import Interpreter

    from difflite.runtime.component import delegate_for

    with tempfile.TemporaryDirectory() as tmp:
        stats_path = Path(tmp) / "stats.json"
        delegate = delegate_for("opencl", args.precision, stats_path)
        interpreter = Interpreter(model_path=str(args.model), experimental_delegates=[delegate])
        interpreter.allocate_tensors()
        stats = json.loads(stats_path.read_text())
    if args.all:
        json.dump(stats, sys.stdout, indent=1)
        return
    figures = {k.replace("_bytes", "_mib"): round(stats[k] / MIB, 1) for k in FIGURES if k in stats}
    figures["scratch_largest_op"] = stats.get("scratch_largest_op", "")
    print(json.dumps({"model": str(args.model), "env": args.env, **figures}))


if __name__ == "__main__":
    main()
