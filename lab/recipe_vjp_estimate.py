"""Each layer's output error at the mix's low width estimated from R random vector-Jacobian products
(weight_recipe.vjp_errors: one forward and R backward passes for all layers together) against the
exact per-layer runs the recipe made before (one forward a layer), on a preset's component.

Why: the sweep is the recipe's cost. The SDXL UNet's int4 sweep is 794 forward runs, about 4 s each
on a 2-core machine (issue 32 item 5 wants the whole UNet recipe within 30 minutes there). To first
order a layer's output error is J_L dY_L, with dY_L = op(X_L, dW_L) its output's change; for r with
independent standard normal entries E[(r . J dY)^2] = |J dY|^2, and r . J dY = (J^T r) . dY, where
J^T r is the gradient of r . y with respect to the layer's output: one backward pass gives it for
every layer at once. Per probe the estimate is separate (the probes are independent samples of one
batch); per output it takes a backward pass of its own.

    python lab/recipe_vjp_estimate.py [--model preset:tiny] [--component unet] [--width int4] [--draws 8,32]

Prints, per draw count R, how far the estimates are from the sweep's errors (the ratio's median and
10-90 % range, in dB) and the rank correlation, and the seconds each took.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.compiler import weight_recipe  # noqa: E402
from difflite.compiler.models import load_pipeline  # noqa: E402
from difflite.compiler.tflite import quantize  # noqa: E402


def exact(probe: weight_recipe.Probes, layers: list, width: str, block: int) -> dict:
    return {layer.name: probe.error([layer], {layer.name: width}, block) for layer in layers}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:tiny")
    parser.add_argument("--component", default="unet")
    parser.add_argument("--width", default="int4", choices=["int4", "int8"])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--draws", default="8,32")
    args = parser.parse_args()
    torch.manual_seed(0)
    pipe = load_pipeline(args.model)
    quant = quantize.WeightQuantization(args.width)
    probe = weight_recipe.Probes(pipe, args.component, args.size, args.size, weight_recipe.DEFAULT_PROBES)
    layers = [layer for layer in weight_recipe.eligible_layers(probe.module, probe.inputs, quant)
              if layer.fixed is None]
    start = time.perf_counter()
    truth = exact(probe, layers, args.width, quant.block)
    sweep_s = time.perf_counter() - start
    print(f"{args.model} {args.component} {args.width}: {len(layers)} layers, exact sweep {sweep_s:.1f} s")
    t = np.array([float(np.sum(truth[layer.name])) for layer in layers])
    for draws in [int(d) for d in args.draws.split(",")]:
        start = time.perf_counter()
        est = weight_recipe.vjp_errors(probe, layers, {layer.name: args.width for layer in layers}, quant.block,
                                       draws)
        seconds = time.perf_counter() - start
        e = np.array([float(np.sum(est[layer.name])) for layer in layers])
        ratio_db = 10 * np.log10(np.maximum(e, 1e-300) / np.maximum(t, 1e-300))
        lo, med, hi = np.percentile(ratio_db, [10, 50, 90])
        print(f"R={draws}: {seconds:.1f} s; estimate / exact {med:+.2f} dB (10-90 %: {lo:+.2f} to {hi:+.2f}); "
              f"rank correlation {spearman(e, t):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
