"""Would error-compensated int4 rounding (GPTQ-style) pay on difflite's layers? A lab probe for
issue 32's 2.1 GB: the writer's format stays (blocks of 32 along the input axis, one stored
scale a block); only the choice of integers changes, each column's rounding error pushed onto the
columns not yet rounded through the inverse of the layer's input Gram matrix H = X^T X.

    python lab/int4_gptq_probe.py [--model preset:sd15] [--layers 12] [--size 256]

Captures the inputs of the UNet's largest linear layers on two seeded probes (one to fit H, one
to judge), then per layer prints the output SNR on the judging probe of: round-to-nearest with
quantize_int4's least-error scales (what the writer stores), and GPTQ rounding with the same
scales. Float64 arithmetic; H damped by 1 % of its mean diagonal.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.compiler import export, models
from difflite.compiler.tflite.quantize import quantize_int4, unpack_int4

BLOCK = 32


def capture_inputs(module: torch.nn.Module, layers: dict[str, torch.nn.Linear], args) -> dict[str, np.ndarray]:
    seen: dict[str, list[np.ndarray]] = {name: [] for name in layers}
    hooks = [layer.register_forward_pre_hook(
        lambda _m, inp, name=name: seen[name].append(inp[0].detach().reshape(-1, inp[0].shape[-1]).double().numpy()))
        for name, layer in layers.items()]
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in hooks:
            h.remove()
    return {name: np.concatenate(chunks) for name, chunks in seen.items()}


def rtn(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The writer's int4 (least-error scales, round to nearest) as float64, and its scales."""
    stored = quantize_int4(weight.astype(np.float32), BLOCK, np.float16)
    q = unpack_int4(stored.data, weight.size).reshape(-1, BLOCK).astype(np.float64)
    scales = stored.scales.astype(np.float64)
    return (q * scales[:, None]).reshape(weight.shape), scales.reshape(weight.shape[0], -1)


def gptq(weight: np.ndarray, gram: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Columns in order, each rounded with its block's stored scale; the error spread over the
    later columns by the upper Cholesky factor of H^-1 (GPTQ's update)."""
    w = weight.astype(np.float64).copy()
    damp = 0.01 * np.mean(np.diag(gram))
    h = gram + damp * np.eye(gram.shape[0])
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: H^-1 = U^T U
    out = np.empty_like(w)
    for j in range(w.shape[1]):
        s = scales[:, j // BLOCK]
        q = np.clip(np.rint(w[:, j] / s), -8, 7) * s
        out[:, j] = q
        err = (w[:, j] - q) / hinv[j, j]
        w[:, j + 1:] -= np.outer(err, hinv[j, j + 1:])
    return out


def snr_db(x: np.ndarray, w: np.ndarray, wq: np.ndarray) -> float:
    y, yq = x @ w.T, x @ wq.T
    return float(10 * np.log10((y ** 2).sum() / ((y - yq) ** 2).sum()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:sd15")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args()
    pipe = models.load_pipeline(args.model)
    linears = [(n, m) for n, m in pipe.unet.named_modules()
               if isinstance(m, torch.nn.Linear) and m.in_features % BLOCK == 0 and m.in_features >= 320]
    linears.sort(key=lambda nm: -nm[1].weight.numel())
    chosen = dict(linears[:args.layers])
    probes = [export.component_spec(pipe, "unet", args.size, args.size, 1, seed=seed) for seed in (11, 12)]
    fit = capture_inputs(probes[0].module, chosen, probes[0].example_inputs)
    judge = capture_inputs(probes[1].module, chosen, probes[1].example_inputs)
    print(f"{'layer':<58} {'shape':>12} {'RTN dB':>7} {'GPTQ dB':>8} {'gain':>6}")
    gains = []
    for name, layer in chosen.items():
        weight = layer.weight.detach().double().numpy()
        wq_rtn, scales = rtn(weight)
        x = fit[name]
        wq_gptq = gptq(weight, x.T @ x / len(x), scales)
        a, b = snr_db(judge[name], weight, wq_rtn), snr_db(judge[name], weight, wq_gptq)
        gains.append(b - a)
        print(f"{name:<58} {'x'.join(map(str, weight.shape)):>12} {a:7.2f} {b:8.2f} {b - a:+6.2f}")
    print(f"median gain {np.median(gains):+.2f} dB over {len(gains)} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
