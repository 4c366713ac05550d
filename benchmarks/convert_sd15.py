"""Benchmark: convert preset:sd15 (fp16 weights, UNet batch 2, 512x512) on this machine.

Runs the real `difflite convert` in a child process, records wall time per stage (from
report.json) and the child's peak RSS, checks that each component loads in ai-edge-litert and
runs once, and writes benchmarks/results/convert_sd15_<machine>_<yyyy-mm>.json (--machine, default
host) plus a table.

Targets: <= 300 s wall, <= 10 GB peak RSS, unet.tflite < 2 GiB, every component runs.

    python benchmarks/convert_sd15.py [--out DIR] [--keep] [--extra-args "..."]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGET_SECONDS = 300
TARGET_RSS_GB = 10
TARGET_UNET_BYTES = 2 * 1024**3


def run_once(folder: Path) -> dict:
    """Load each component in ai-edge-litert and run it once on random inputs."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.component import Component

    rng = np.random.default_rng(0)
    runs = {}
    for name, entry in OutputFolder.read(folder).components.items():
        start = time.perf_counter()
        component = Component(entry)
        loaded = time.perf_counter()
        feeds = {}
        for spec in entry.inputs:
            shape = spec.shape
            if spec.layout == "NHWC":
                shape = [shape[0], shape[3], shape[1], shape[2]]
            if spec.dtype.startswith("int"):
                feeds[spec.name] = rng.integers(0, 400, shape)
            else:
                feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
        outputs = component(**feeds)
        finite = all(bool(np.isfinite(v).all()) for v in outputs.values())
        runs[name] = {"load_s": round(loaded - start, 2), "run_s": round(time.perf_counter() - loaded, 2),
                      "finite": finite}
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the converted folder")
    parser.add_argument("--extra-args", default="", help="more `difflite convert` arguments")
    parser.add_argument("--machine", default="host", help="the machine's name in the result file's name")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="difflite-sd15-")) / "sd15"
    command = [sys.executable, "-m", "difflite", "convert", "preset:sd15", "-o", str(out),
               "--precision", "fp16", "--batch", "2", "--height", "512", "--width", "512",
               *shlex.split(args.extra_args)]
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT)
    wall = time.perf_counter() - start
    peak_rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
    result = {"command": " ".join(command[1:]), "machine": f"{platform.node()} {platform.machine()}",
              "returncode": completed.returncode, "wall_s": round(wall, 1), "peak_rss_gb": round(peak_rss_gb, 2)}
    if completed.returncode == 0:
        report = json.loads((out / "report.json").read_text())
        # ru_maxrss of the child only covers its last stage (it resets VmHWM per stage).
        peak_rss_gb = max(peak_rss_gb, report["peak_rss_mb"] / 1024)
        result["peak_rss_gb"] = round(peak_rss_gb, 2)
        result["stages"] = {name: r["stages"] for name, r in report["components"].items()}
        result["stages"]["pipeline"] = report["pipeline"]
        result["bytes"] = {p.name: p.stat().st_size for p in sorted(out.glob("*.tflite"))}
        result["runs"] = run_once(out)
    unet_bytes = result.get("bytes", {}).get("unet.tflite", 1 << 62)
    result["targets"] = {
        "wall_s<=300": wall <= TARGET_SECONDS, "peak_rss_gb<=10": peak_rss_gb <= TARGET_RSS_GB,
        "unet<2GiB": unet_bytes < TARGET_UNET_BYTES,
        "all_components_run": bool(result.get("runs")) and all(r["finite"] for r in result["runs"].values()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"convert_sd15_{args.machine}_{time.strftime('%Y-%m')}.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    if not args.keep and args.out is None:
        shutil.rmtree(out.parent, ignore_errors=True)
    return 0 if all(result["targets"].values()) else 1


def print_table(result: dict) -> None:
    print("\n| stage | seconds | peak RSS MB |\n|---|---|---|")
    for name, stages in result.get("stages", {}).items():
        for stage, s in stages.items():
            print(f"| {name} {stage} | {s['seconds']:.1f} | {s['peak_rss_mb']:.0f} |")
    print(f"\nwall {result['wall_s']} s, peak RSS {result['peak_rss_gb']} GB")
    for name, size in result.get("bytes", {}).items():
        print(f"{name}: {size / 1024**2:.0f} MiB")
    for name, run in result.get("runs", {}).items():
        print(f"{name}: load {run['load_s']} s, run {run['run_s']} s, finite {run['finite']}")
    print("targets:", ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in result["targets"].items()))


if __name__ == "__main__":
    sys.exit(main())
