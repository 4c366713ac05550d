"""Benchmark: `--no-fuse` files on stock LiteRT's GPU accelerator against PyTorch (issue 20 item 3,
issue 21 item 1: every width a stock app may ship).

For each setting (precision and weight width) the model is converted with `--no-fuse` and every
component verified with `difflite verify --backend litert-gpu`: fully accelerated or not, the
error against PyTorch and the bar `verify` applied. One conversion exports each component; the
others reuse the export (`--export-cache`, a temporary folder unless DIFFLITE_EXPORT_CACHE is set).

    python benchmarks/litert_gpu_verify.py [--model preset:tiny --height 64 --width 96]
        [--settings fp32,fp16,int8,int4] [--components text_encoder,unet,...]
        [--recipe int8=FILE --recipe int4=FILE] [--save FILE.json]

A setting is fp32 or fp16 (float weights at that precision), or int8 / int4 (fp16 storage).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"fp32": ("fp32", "float"), "fp16": ("fp16", "float"), "int8": ("fp16", "int8"),
            "int4": ("fp16", "int4")}


def difflite(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "difflite", *args], capture_output=True, text=True, env=env)


def convert(model: str, setting: str, out: Path, size: list[str], components: str | None, env: dict,
            recipe: str | None = None) -> dict:
    precision, weights = SETTINGS[setting]
    args = ["convert", model, "-o", str(out), "--no-fuse", "--precision", precision, "--weights", weights, *size]
    if recipe:
        args += ["--weights-recipe", recipe]
    if components:
        args += ["--components", components]
    start = time.perf_counter()
    result = difflite(*args, env=env)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"}
    manifest = json.loads((out / "manifest.json").read_text())
    sizes = {name: entry["bytes"] for name, entry in manifest["components"].items()}
    return {"seconds": round(seconds, 1), "file_bytes": sizes}


def verify(out: Path, seeds: str, env: dict) -> dict:
    result = difflite("verify", str(out), "--backend", "litert-gpu", "--seeds", seeds, "--json", env=env)
    if result.returncode not in (0, 1):
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"}
    return json.loads(result.stdout)


def summarize(verified: dict) -> dict[str, dict]:
    """Per component: fully accelerated, passed on every seed, the worst error."""
    rows: dict[str, dict] = {}
    for check in verified["checks"]:
        run = verified["gpu_memory"].get(check["component"], {}).get("litert_gpu", {})
        row = rows.setdefault(check["component"], {"fully_accelerated": bool(run.get("fully_accelerated")),
                                                   "accelerator": run.get("accelerator"), "passed": True,
                                                   "psnr_db": None, "snr_db": None, "relative_error": 0.0})
        row["passed"] &= bool(check["passed"])
        row["relative_error"] = max(row["relative_error"], check["relative_error"])
        for key in ("psnr_db", "snr_db"):
            row[key] = check[key] if row[key] is None else min(row[key], check[key])
        row["tolerance"] = check["tolerance"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:tiny")
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--settings", default="fp32,fp16,int8,int4")
    parser.add_argument("--components", default=None)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--recipe", action="append", default=[], metavar="SETTING=FILE",
                        help="the weight recipe a setting converts with (e.g. SD 1.5's in benchmarks/results/recipes)")
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    recipes = dict(item.split("=", 1) for item in args.recipe)
    size = [*(["--height", str(args.height)] if args.height else []), *(["--width", str(args.width)] if args.width else [])]
    env = {**os.environ}
    work = Path(tempfile.mkdtemp(prefix="litert-gpu-verify-"))
    env.setdefault("DIFFLITE_EXPORT_CACHE", str(work / "exports"))
    results = {"model": args.model, "size": size, "settings": {}}
    for setting in args.settings.split(","):
        out = work / setting
        entry = convert(args.model, setting, out, size, args.components, env, recipes.get(setting))
        if "error" not in entry:
            verified = verify(out, args.seeds, env)
            entry.update({"error": verified["error"]} if "error" in verified else
                         {"components": summarize(verified), "passed": verified["passed"]})
        results["settings"][setting] = entry
        print(f"{setting}: {json.dumps(entry)}", flush=True)
    print(f"\n{args.model} --no-fuse on stock LiteRT's GPU accelerator")
    print("| setting | component | MiB | fully accelerated | passed | PSNR dB | SNR dB | rel err | bar |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setting, entry in results["settings"].items():
        if "error" in entry:
            print(f"| {setting} | (all) | | | | | | | {entry['error']} |")
            continue
        for name, row in entry["components"].items():
            mib = entry["file_bytes"].get(name, 0) / 2**20
            print(f"| {setting} | {name} | {mib:.1f} | {'yes' if row['fully_accelerated'] else 'no'} | "
                  f"{'yes' if row['passed'] else 'NO'} | {row['psnr_db']:.1f} | {row['snr_db']:.1f} | "
                  f"{row['relative_error']:.2e} | {row['tolerance']} |")
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
