"""Benchmark: `generate --backend opencl` on PoCL with every cache empty (cold) and then again on
the caches the first left (warm), with difflite's program cache (the default) and without it
(DIFFLITE_PROGRAM_CACHE=off).

PoCL keeps each program it compiles (its kcache); asking it for a program's binary, which difflite's
cache stores, makes it compile every kernel once more, for any work-group size; a stored binary then
loads faster than PoCL rebuilds the program from its own cache. Each pair of runs gets an empty
PoCL cache and, with the cache, an empty DIFFLITE_PROGRAM_CACHE folder; the variants alternate.
Figures: the process's wall time and peak RSS, `generate --json`'s load time, and the kernels
PoCL compiled (the shared objects in its cache after the run).

    python benchmarks/pocl_cold_start.py OUT --runs 3 --save benchmarks/results/pocl_cold_start_$(date +%F).json
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

from headline import ROOT, measure_command, summary

VARIANTS = ("difflite_cache", "off")
PHASES = ("cold", "warm")


def run_pair(out: Path, variant: str, steps: int) -> dict:
    """A cold run on empty caches, then a warm one on what it left."""
    with tempfile.TemporaryDirectory(prefix="difflite-cold-") as work:
        work = Path(work)
        env = dict(os.environ, POCL_CACHE_DIR=str(work / "pocl"),
                   DIFFLITE_PROGRAM_CACHE=str(work / "difflite") if variant == "difflite_cache" else "off")
        command = [sys.executable, "-m", "difflite", "generate", str(out), "a lighthouse", "-o", str(work / "p.png"),
                   "--steps", str(steps), "--backend", "opencl", "--json"]
        pair = {}
        for phase in PHASES:
            run = measure_command(command, env=env, cwd=ROOT, timeout=1800)
            if run.returncode != 0:
                raise SystemExit(f"pocl_cold_start.py: {variant} {phase} failed ({run.returncode}): {run.stderr[-2000:]}")
            pair[phase] = {"wall_s": run.wall_s, "peak_rss_mb": run.peak_rss_mb,
                           "load_s": json.loads(run.stdout)["timings"]["load"],
                           "kernels_compiled": sum(1 for _ in (work / "pocl").rglob("*.so")),
                           "program_cache_entries": len(list((work / "difflite").glob("*.clbin")))}
        return pair


def table(result: dict) -> str:
    rows = [f"| `generate --backend opencl`, {result['steps']} steps (PoCL, {result['host']}, {result['cpus']} CPUs, "
            f"{result['date']}, {result['runs']} runs) | wall, s | load, s | peak RSS, MiB | kernels in PoCL's cache |",
            "|---|---|---|---|---|"]
    for phase in PHASES:
        for variant in VARIANTS:
            v = result[variant][phase]
            cells = [f"{v[k]['median']:.1f} ({v[k]['min']:.1f}-{v[k]['max']:.1f})"
                     for k in ("wall_s", "load_s", "peak_rss_mb", "kernels_compiled")]
            rows.append(f"| {phase}, {variant} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="A converted output folder.")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args(argv)
    if not (args.out / "manifest.json").is_file():
        parser.exit(2, f"pocl_cold_start.py: {args.out}: not an output folder (no manifest.json)\n")
    if args.runs < 1:
        parser.exit(2, "pocl_cold_start.py: --runs must be at least 1\n")
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.runs):
        for variant in VARIANTS:
            runs[variant].append(run_pair(args.out, variant, args.steps))
    result = {"out": str(args.out), "steps": args.steps, "runs": args.runs, "host": platform.node(),
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "raw": runs}
    for variant, pairs in runs.items():
        result[variant] = {phase: {key: summary([pair[phase][key] for pair in pairs]) for key in pairs[0][phase]}
                           for phase in PHASES}
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
