"""Benchmark: 8-bit and 4-bit weights against fp16 and fp32 storage (issue 21).

One model converted several ways (`--work` keeps them): the reference at fp32 weights, and at
`--precision fp16` with `--weights float` (fp16 storage), `int8` and `int4` (extra `convert`
flags for every conversion with `--convert-args`, e.g. a size). For each:

- weight bytes per component and in total (report.json), and MB per storage width;
- quality against the fp32 files: each component's output SNR on seeded random inputs, and the
  picture's PSNR after `--steps` guided steps of the same scheduler, prompt and seed;
- memory and speed, each component in a fresh process (`difflite bench --components C`, via
  runtime_memory.py): load, steady call, peak RSS, device MB; `generate --low-memory` peak.

    python benchmarks/quantization.py --model preset:sd15 --work /tmp/quant --backend opencl \\
        --save benchmarks/results/quantization_h100_$(date +%Y-%m).json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
CLI = [sys.executable, "-m", "difflite"]
COMPONENTS = ("text_encoder", "unet", "vae_decoder")
PROMPT = "a photo of an astronaut riding a horse on mars"
# (precision, --weights, further convert flags); "-w0": a Winograd budget of 0 (no float transformed
# filters: fp16 then has no Winograd, int8 / int4 keep the filter form, which needs none; their
# default since the filter form); "-vae0": budget 0 in the VAE decoder only (decoded once a picture)
SETTINGS = {"fp32": ("fp32", "float", []), "fp16": ("fp16", "float", []),
            "fp16-w0": ("fp16", "float", ["--winograd-budget-mb", "0"]), "int8": ("fp16", "int8", []),
            "int4": ("fp16", "int4", []), "int8-w0": ("fp16", "int8", ["--winograd-budget-mb", "0"]),
            "int8-w50": ("fp16", "int8", ["--winograd-budget-mb", "50"]),
            "int8-w25": ("fp16", "int8", ["--winograd-budget-mb", "25"]),
            # the UNet alone gets a small budget (the VAE decoder runs once a picture)
            "int8-u50v0": ("fp16", "int8", ["--winograd-budget-mb", "unet=50,vae_decoder=0"]),
            "int4-u25v0": ("fp16", "int4", ["--winograd-budget-mb", "unet=25,vae_decoder=0"]),
            "int4-w0": ("fp16", "int4", ["--winograd-budget-mb", "0"]),
            "int8-vae0": ("fp16", "int8", ["--winograd-budget-mb", "vae_decoder=0"]),
            "int4-vae0": ("fp16", "int4", ["--winograd-budget-mb", "vae_decoder=0"])}


def convert_all(model: str, folders: dict, extra: list[str], recipes: dict | None = None) -> dict:
    """Every missing conversion (separate processes: a lent GPU host has the cores), at once,
    except that a "-w0" / "-w50" int4 setting waits for plain int4 where that is converted too and
    reuses its recipe (the recipe does not depend on Winograd, and the int4 sweep is the slow
    part); `recipes` ({width: weights_recipe.json}) given, every setting of that width reuses it
    instead. Seconds each took."""
    recipes = recipes or {}
    started = time.perf_counter()
    missing = [setting for setting, out in folders.items() if not (out / "manifest.json").is_file()]
    later = [s for s in missing if s.startswith("int4-") and "int4" in folders and "int4" not in recipes]
    seconds = {setting: 0.0 for setting in folders}
    for batch in ([s for s in missing if s not in later], later):
        # the host's cores shared out: torch's default (every core each) oversubscribes them, and
        # the recipes' many small forward runs then crawl (SD 1.5's text encoder recipe: 263 s, not 25)
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, len(batch))))}
        children = {}
        for setting in batch:
            out = folders[setting]
            precision, weights, flags = SETTINGS[setting]
            reuse = ["--weights-recipe", str(folders["int4"])] if setting in later else []
            if weights in recipes:
                reuse = ["--weights-recipe", str(recipes[weights])]
            command = [*CLI, "convert", model, "-o", str(out), "--batch", "2", "--precision", precision,
                       "--weights", weights, *flags, *reuse, *extra]
            log = open(out.parent / f"convert_{setting}.log", "w")
            children[setting] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
        for setting, (child, log) in children.items():
            if child.wait() != 0:
                raise SystemExit(f"convert {setting} failed: see {log.name}")
            log.close()
            seconds[setting] = round(time.perf_counter() - started, 1)
    return seconds


def weight_sizes(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    sizes = {}
    for name, component in report["components"].items():
        widths = component.get("weight_widths", {})
        sizes[name] = {"weights_mb": component["weights_mb"], "saved_mb": widths.get("saved_mb"),
                       "by_width": widths.get("by_width")}
    sizes["total_mb"] = round(sum(c["weights_mb"] for c in sizes.values()), 1)
    return sizes


def db(signal: np.ndarray, error: np.ndarray) -> float:
    noise = float(np.sum(error.astype(np.float64) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(float(np.sum(signal.astype(np.float64) ** 2)) / noise)


def component_snr(reference: Path, out: Path, backend: str, seeds: int) -> dict:
    """Each component's output SNR against the reference folder's, on the same random inputs."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.bench import random_feeds, vocab_size
    from difflite.runtime.component import Component

    ref_folder, folder = OutputFolder.read(reference), OutputFolder.read(out)
    result = {}
    for name in COMPONENTS:
        entry = folder.components[name]
        ref = Component(ref_folder.components[name], backend=backend, precision=ref_folder.precision)
        got = Component(entry, backend=backend, precision=folder.precision)
        values = []
        for seed in range(seeds):
            stored = random_feeds(entry, np.random.default_rng(seed), vocab_size(out))  # NHWC where stored so
            layouts = {spec.name: spec.layout for spec in entry.inputs}
            feeds = {k: v.transpose(0, 3, 1, 2) if layouts[k] == "NHWC" else v for k, v in stored.items()}
            a, b = ref(**feeds), got(**feeds)
            values += [db(a[k], a[k] - b[k]) for k in a]
        ref.close()
        got.close()
        result[name] = round(min(values), 2)
    return result


def picture(out: Path, backend: str, steps: int) -> np.ndarray:
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(out, backend=backend) as pipe:
        return pipe(PROMPT, steps=steps, seed=0, guidance=7.5, scheduler="euler").image


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--settings", default="fp16,int8,int4",
                        help=f"Compared against fp32, from {', '.join(SETTINGS)}.")
    parser.add_argument("--convert-args", default="", help="Extra convert flags for every conversion.")
    parser.add_argument("--recipe", action="append", default=[], metavar="WIDTH=FILE",
                        help="Reuse a recipe for every setting of that width (int8=..., int4=...): no sweep.")
    parser.add_argument("--backend", default="opencl", choices=["cpu", "opencl"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5, help="Timed calls per component (fresh process each).")
    parser.add_argument("--skip", default="", help="Comma-separated parts to skip: quality,picture,memory.")
    parser.add_argument("--only-convert", action="store_true",
                        help="Convert every setting (fp32 too) and record the weights, nothing else: for a "
                             "machine whose calls are time-limited, the parts then run in later calls on --work.")
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    compared = [s for s in args.settings.split(",") if s and s != "fp32"]
    # the fp32 files are the quality reference: converted only where quality is measured
    settings = compared if {"quality", "picture"} <= skip and not args.only_convert else ["fp32", *compared]
    folders = {s: args.work / s for s in settings}
    args.work.mkdir(parents=True, exist_ok=True)
    recipes = dict(spec.split("=", 1) for spec in args.recipe)
    convert_s = convert_all(args.model, folders, args.convert_args.split(), recipes)
    result = {"model": args.model, "backend": args.backend, "host": platform.node(), "date": time.strftime("%Y-%m-%d"),
              "convert_args": args.convert_args, "recipes": recipes, "convert_s": convert_s,
              "weights": {s: weight_sizes(folders[s]) for s in settings}, "quality": {}, "runtime": {}}
    def save() -> None:  # after every part: a run cut short keeps what it measured
        if args.save:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_text(json.dumps(result, indent=2, default=str) + "\n")

    save()
    if args.only_convert:
        return
    if "quality" not in skip:
        result["quality"] = {s: component_snr(folders["fp32"], folders[s], args.backend, args.seeds)
                             for s in settings if s != "fp32"}
        save()
    if "picture" not in skip:
        reference = picture(folders["fp32"], args.backend, args.steps)
        for s in compared:
            result["quality"].setdefault(s, {})["picture_psnr_db"] = round(
                psnr(picture(folders[s], args.backend, args.steps), reference), 2)
        save()
    if "memory" not in skip and args.backend == "opencl":
        from runtime_memory import bench_component, run_generate

        caches = args.work / "caches"
        for s in settings:
            rows = {name: bench_component(folders[s], name, caches, args.runs) for name in COMPONENTS}
            rows["generate_low_memory"] = run_generate(folders[s], caches, 2, PROMPT, low_memory=True)
            result["runtime"][s] = rows
            save()
    print_table(result, settings)


def print_table(result: dict, settings: list[str]) -> None:
    print(f"| {result['model']} | " + " | ".join(settings) + " |")
    print("|---" * (len(settings) + 1) + "|")
    for name in (*COMPONENTS, "total"):
        key = "total_mb" if name == "total" else name
        cells = [result["weights"][s][key] if name == "total" else result["weights"][s][key]["weights_mb"]
                 for s in settings]
        print(f"| weights MB, {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    for name in (*COMPONENTS, "picture_psnr_db"):
        cells = [result["quality"].get(s, {}).get(name, "-") for s in settings]
        label = "picture PSNR dB" if name == "picture_psnr_db" else f"SNR dB, {name}"
        print(f"| {label} | " + " | ".join(str(c) for c in cells) + " |")
    for name in COMPONENTS:
        cells = [result["runtime"].get(s, {}).get(name, {}) for s in settings]
        print(f"| {name} median ms / peak RSS MB / device MB | " + " | ".join(
            f"{c.get('median_ms', 0):.1f} / {c.get('peak_rss_mb') or 0:.0f} / "
            f"{(c.get('device_mb') or {}).get('total_mb') or 0:.0f}" if c else "-" for c in cells) + " |")
    cells = [result["runtime"].get(s, {}).get("generate_low_memory", {}) for s in settings]
    print("| generate --low-memory peak RSS MB | " + " | ".join(
        f"{c.get('peak_rss_mb') or 0:.0f}" if c else "-" for c in cells) + " |")


if __name__ == "__main__":
    main()
