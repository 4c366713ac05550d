"""Benchmark: several `generate` processes at once on one output folder and one program cache
(issue 16, load).

A phone app may start a second picture while the first is still being made, and CI jobs share a
machine's cache folder. N processes start together on OUT with the same prompt and seed, sharing a
program cache folder that none of them has filled yet (so they compile, store and load the same
entries at the same time); then one more process runs alone on the cache they left. The figures:
every exit status, whether all pictures are identical (to each other and to the lone run's),
each process's wall time and peak RSS (its rusage), the cache's entries and any temporary files
left in it (the lone run must add none: everything it needs was stored), and difflite stats files
left in the temporary directory.

    python benchmarks/concurrent_generate.py out/tiny --processes 4 --backend opencl \\
        --save benchmarks/results/concurrent_generate_pocl_$(date +%Y-%m).json

Exit 0 when every run succeeded with identical pictures and nothing was left behind, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a photo of an astronaut riding a horse"
STATS_GLOB = "difflite-stats-*"


def start(out: Path, png: Path, args, env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "difflite", "generate", str(out), PROMPT, "-o", str(png),
               "--steps", str(args.steps), "--seed", "0", "--backend", args.backend, "--json"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def finish(process: subprocess.Popen, started: float) -> dict:
    """Waits for `process` (wait4: its own peak RSS); its exit status, wall time, peak RSS and
    the last line of its stderr."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = process.stdout.read(), process.stderr.read()
    process.stdout.close()
    process.stderr.close()
    lines = [line for line in stderr.splitlines() if line.strip()]
    row = {"returncode": process.returncode, "wall_s": round(time.perf_counter() - started, 2),
           "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "stderr_tail": lines[-1] if lines else ""}
    try:
        row["timings"] = json.loads(stdout)["timings"]
    except (ValueError, KeyError):
        pass
    return row


def run_together(out: Path, pngs: list[Path], args, env: dict) -> list[dict]:
    started = time.perf_counter()
    processes = [start(out, png, args, env) for png in pngs]
    return [finish(process, started) for process in processes]


def cache_contents(cache: Path) -> dict:
    """difflite's program cache folder (the driver may keep its own beside it: PoCL's kcache)."""
    files = [p for p in cache.rglob("*") if p.is_file()] if cache.is_dir() else []
    temporary = [str(p.relative_to(cache)) for p in files if ".tmp" in p.name or p.name.startswith(".")]
    return {"entries": len(files) - len(temporary), "temporary_files": temporary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="A converted output folder.")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--backend", default="opencl", choices=["cpu", "opencl"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.out / "manifest.json").is_file():
        parser.exit(2, f"concurrent_generate.py: {args.out}: not an output folder (no manifest.json)\n")
    if args.processes < 1:
        parser.exit(2, "concurrent_generate.py: --processes must be at least 1\n")
    with tempfile.TemporaryDirectory(prefix="difflite-concurrent-") as work:
        work = Path(work)
        temp = work / "tmp"
        temp.mkdir()
        # a fresh program cache for all of them, and a temporary directory of their own, whose
        # leftovers are theirs; PoCL's own compiled-kernel cache stays where it was, so that what
        # is fresh is difflite's cache, not the driver's
        default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        cache = work / "cache"
        env = {**os.environ, "DIFFLITE_PROGRAM_CACHE": str(cache), "TMPDIR": str(temp),
               "POCL_CACHE_DIR": os.environ.get("POCL_CACHE_DIR", str(default_cache / "pocl" / "kcache"))}
        pngs = [work / f"together_{i}.png" for i in range(args.processes)]
        together = run_together(args.out, pngs, args, env)
        cache_after_together = cache_contents(cache)
        alone = run_together(args.out, [work / "alone.png"], args, env)[0]
        pictures = [p.read_bytes() if p.is_file() else None for p in [*pngs, work / "alone.png"]]
        identical = None not in pictures and len(set(pictures)) == 1
        result = {
            "out": str(args.out), "backend": args.backend, "processes": args.processes, "steps": args.steps,
            "host": platform.node(), "date": time.strftime("%Y-%m-%d"),
            "together": together, "alone": alone, "pictures_identical": identical,
            "cache_after_together": cache_after_together, "cache_after_alone": cache_contents(cache),
            "stats_files_left": sorted(p.name for p in temp.glob(STATS_GLOB)),
        }
    # the lone run finds every program the others stored: it adds no entry
    ok = (all(row["returncode"] == 0 for row in [*together, alone]) and identical
          and result["cache_after_alone"] == result["cache_after_together"]
          and result["cache_after_together"]["entries"] > 0 and not result["cache_after_alone"]["temporary_files"]
          and not result["stats_files_left"])
    result["ok"] = ok
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
