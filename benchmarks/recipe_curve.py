"""Benchmark: weight MB against quality along an int4 mix recipe's steps (issue 21).

A recipe (difflite/compiler/weight_recipe.py) records each layer's error at int4 and at int8, relative to
the component's output, measured on its probes. Its choice promotes layers from int4 to int8 by
error saved per extra byte; step k of that order is the mix with the first k layers at int8. Each
step's size and predicted SNR (the layers' errors add) come from the recipe file alone, for every
k. `--convert` converts the model at a few steps of one component (the other components at their
recipe), and measures what the file holds and the picture's PSNR against the fp32 files after the
same 20 guided steps (quantization.py's picture()).

    python benchmarks/recipe_curve.py --recipe benchmarks/results/recipes/sd15_int4.json \\
        --component unet --steps 0,30,60,90,recipe --convert --work /tmp/curve \\
        --save benchmarks/results/recipe_curve_h100_$(date +%Y-%m).json
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from difflite.compiler import weight_recipe  # noqa: E402

CLI = [sys.executable, "-m", "difflite"]
LOW, HIGH = "int4", "int8"


def power(db_value: float | None) -> float:
    return 0.0 if db_value is None else 10 ** (db_value / 10)


def order(recipe: dict, precision: str = "fp16") -> list[dict]:
    """The free layers (those with a choice) in the order the recipe's choice promotes them:
    error saved per extra byte, most first."""
    block = recipe.get("block", 32)

    def gain(layer: dict) -> float:
        extra = (weight_recipe.stored_bytes(layer["shape"], HIGH, block, precision)
                 - weight_recipe.stored_bytes(layer["shape"], LOW, block, precision))
        return (power(layer[f"{LOW}_error_db"]) - power(layer[f"{HIGH}_error_db"])) / max(extra, 1)

    free = [layer for layer in recipe["layers"] if "fixed" not in layer]
    return sorted(free, key=lambda layer: (-gain(layer), layer["name"]))


def curve(recipe: dict, precision: str = "fp16") -> list[dict]:
    """Per step k = 0 .. all: int8 layers, MiB of the recipe's layers, predicted SNR (dB)."""
    if recipe.get("width", LOW) != LOW:
        raise SystemExit(f"{recipe['component']}: an {recipe.get('width')} recipe; the curve is for int4 mixes")
    block = recipe.get("block", 32)
    fixed = [layer for layer in recipe["layers"] if "fixed" in layer]
    promoted = order(recipe, precision)
    size = (sum(weight_recipe.stored_bytes(layer["shape"], HIGH, block, precision) for layer in fixed)
            + sum(weight_recipe.stored_bytes(layer["shape"], LOW, block, precision) for layer in promoted))
    error = (sum(power(layer[f"{HIGH}_error_db"]) for layer in fixed)
             + sum(power(layer[f"{LOW}_error_db"]) for layer in promoted))
    rows = []
    for k in range(len(promoted) + 1):
        rows.append({"k": k, "int8_layers": len(fixed) + k, "mib": round(size / 2**20, 2),
                     "predicted_snr_db": round(-10 * math.log10(error), 2) if error > 0 else None})
        if k < len(promoted):
            layer = promoted[k]
            size += (weight_recipe.stored_bytes(layer["shape"], HIGH, block, precision)
                     - weight_recipe.stored_bytes(layer["shape"], LOW, block, precision))
            error += power(layer[f"{HIGH}_error_db"]) - power(layer[f"{LOW}_error_db"])
    return rows


def recipe_step(recipe: dict) -> int:
    """The k whose mix the recipe itself chose (its int8 layers are the first k of the order
    exactly where its choice needed no pruning)."""
    return sum(layer["width"] == HIGH for layer in recipe["layers"] if "fixed" not in layer)


def truncated(recipe: dict, k: int, precision: str = "fp16") -> dict:
    """The recipe with the first k layers of its order at int8 and the other free layers int4."""
    promoted = {layer["name"] for layer in order(recipe, precision)[:k]}
    step = copy.deepcopy(recipe)
    for layer in step["layers"]:
        if "fixed" not in layer:
            layer["width"] = HIGH if layer["name"] in promoted else LOW
    step["note"] = f"recipe_curve.py: step {k} of the recipe's order"
    return step


def parse_steps(text: str, recipe: dict) -> list[int]:
    last = len(order(recipe))
    steps = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        k = recipe_step(recipe) if part == "recipe" else last if part == "all" else int(part)
        if not 0 <= k <= last:
            raise SystemExit(f"--steps: {part} is not a step from 0 to {last}")
        steps.append(k)
    return sorted(set(steps))


def convert_steps(model: str, work: Path, recipes: dict, component: str, steps: list[int],
                  extra: list[str]) -> dict[int, Path]:
    """The model converted at each step (and at fp32, the reference), in parallel."""
    folders = {"fp32": work / "fp32", **{k: work / f"step{k}" for k in steps}}
    jobs = [key for key, out in folders.items() if not (out / "manifest.json").is_file()]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, len(jobs))))}
    children = {}
    for key in jobs:
        out = folders[key]
        command = [*CLI, "convert", model, "-o", str(out), "--batch", "2", *extra]
        if key == "fp32":
            command += ["--precision", "fp32"]
        else:
            doc = weight_recipe.file_document({**recipes, component: truncated(recipes[component], key)})
            path = work / f"recipe_step{key}.json"
            path.write_text(json.dumps(doc))
            command += ["--precision", "fp16", "--weights", "int4", "--weights-recipe", str(path)]
        log = open(work / f"convert_{key}.log", "w")
        children[key] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log)
    for key, (child, log) in children.items():
        if child.wait() != 0:
            raise SystemExit(f"convert {key} failed: see {log.name}")
        log.close()
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, required=True,
                        help="An int4 mix's weights_recipe.json (or a conversion's folder / manifest).")
    parser.add_argument("--component", default="unet", help="The component whose steps --convert converts.")
    parser.add_argument("--steps", default="0,recipe,all",
                        help="Steps to convert: numbers, 'recipe' (the recipe's own) and 'all' (every layer int8).")
    parser.add_argument("--convert", action="store_true", help="Convert the steps and measure the picture.")
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--work", type=Path, default=Path("/tmp/recipe_curve"))
    parser.add_argument("--convert-args", default="", help="Extra convert flags for every conversion.")
    parser.add_argument("--backend", default="opencl", choices=["cpu", "opencl"])
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    recipes = weight_recipe.read(args.recipe)
    if args.component not in recipes:
        raise SystemExit(f"--component {args.component}: the recipe has {', '.join(recipes)}")
    result = {"recipe": str(args.recipe), "model": args.model, "date": time.strftime("%Y-%m-%d"),
              "curves": {name: curve(recipe) for name, recipe in recipes.items()},
              "recipe_steps": {name: recipe_step(recipe) for name, recipe in recipes.items()},
              "pictures": {}}
    for name, rows in result["curves"].items():
        marks = sorted({0, result["recipe_steps"][name], len(rows) - 1, *range(0, len(rows), max(1, len(rows) // 8))})
        print(f"{name}: step / int8 layers / MiB / predicted SNR dB")
        for k in marks:
            row = rows[k]
            mark = "  <- the recipe" if k == result["recipe_steps"][name] else ""
            print(f"  {row['k']:4d} {row['int8_layers']:4d} {row['mib']:9.1f} {row['predicted_snr_db']}{mark}")
    if args.convert:
        from quantization import picture, psnr, weight_sizes

        steps = parse_steps(args.steps, recipes[args.component])
        args.work.mkdir(parents=True, exist_ok=True)
        folders = convert_steps(args.model, args.work, recipes, args.component, steps, args.convert_args.split())
        reference = picture(folders["fp32"], args.backend, 20)
        for k in steps:
            sizes = weight_sizes(folders[k])
            result["pictures"][k] = {
                "k": k, "component_mib": sizes[args.component]["weights_mb"], "total_mib": sizes["total_mb"],
                "predicted_snr_db": result["curves"][args.component][k]["predicted_snr_db"],
                "picture_psnr_db": round(psnr(picture(folders[k], args.backend, 20), reference), 2)}
            print(f"{args.component} step {k}: {json.dumps(result['pictures'][k])}")
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
