"""Benchmark: one model loaded, called once and freed, many times in one process (issue 16, load).

An app opens and closes models as its screens come and go; nothing may accumulate. Each cycle
makes a `difflite.runtime.component.Component` (interpreter and delegate), runs it once on zeros, closes it,
and reads the process's memory from /proc/self/status. The figure is the growth from the tenth
cycle (caches and allocator pools are warm by then) to the last; the target is 10%.

    python benchmarks/load_cycles.py out/sd15/text_encoder.tflite --backend opencl --cycles 200 \\
        --save benchmarks/results/load_cycles_pocl_$(date +%Y-%m).json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.core.procmem import resident_mb  # noqa: E402

TARGET_GROWTH = 0.10


def one_cycle(model: Path, backend: str, precision: str) -> None:
    from difflite.runtime.component import Component

    component = Component(model, backend=backend, precision=precision)
    feeds = {name: np.zeros(detail["shape"], detail["dtype"]) for name, detail in component.input_details.items()}
    component.runner(**feeds)
    component.close()


def run(model: Path, backend: str, precision: str, cycles: int) -> dict:
    rows = []
    started = time.perf_counter()
    for cycle in range(1, cycles + 1):
        one_cycle(model, backend, precision)
        rows.append({"cycle": cycle, **{k: round(v, 2) for k, v in resident_mb().items() if v is not None}})
    tenth, last = rows[min(9, len(rows) - 1)], rows[-1]
    growth = (last["rss"] - tenth["rss"]) / tenth["rss"]
    leftovers = sorted(p.name for p in Path(tempfile.gettempdir()).glob("difflite-stats-*")
                       if p.name.split("-")[2] == str(os.getpid()))
    return {"model": str(model), "backend": backend, "precision": precision, "cycles": cycles,
            "host": platform.node(), "date": time.strftime("%Y-%m-%d"),
            "seconds": round(time.perf_counter() - started, 2), "after_10th_mb": tenth["rss"],
            "after_last_mb": last["rss"], "growth": round(growth, 4), "target_growth": TARGET_GROWTH,
            "met": growth <= TARGET_GROWTH, "stats_files_left": leftovers, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a .tflite file")
    parser.add_argument("--backend", default="opencl", choices=["cpu", "opencl"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if args.cycles < 10:
        parser.error("--cycles must be at least 10 (growth is measured from the tenth)")
    result = run(args.model, args.backend, args.precision, args.cycles)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"| {args.model.name}, {args.backend}, {args.cycles} cycles | after the 10th | after the last | growth "
              f"(target {TARGET_GROWTH:.0%}) | seconds |")
        print("|---|---|---|---|---|")
        print(f"| RSS | {result['after_10th_mb']:.1f} MB | {result['after_last_mb']:.1f} MB | "
              f"{result['growth']:+.1%} | {result['seconds']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
