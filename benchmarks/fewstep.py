"""Benchmark: few-step against guided generation, per image (issue 17).

The same SD 1.5 architecture two ways, side by side in one process:

- guided: the scheduler config's sampler (PNDM), 20 steps, classifier-free guidance 7.5 with a
  batch-2 UNet (one call a step computes both branches);
- few-step: `--scheduler lcm`, 4 steps, no guidance (an LCM-LoRA merged at conversion, or an
  LCM-distilled UNet), with a batch-1 UNet.

Each folder is converted first when missing (`difflite convert MODEL --batch 2|1`; `--lcm-lora
FILE` merges an LCM-LoRA into the few-step one). Both pipelines are loaded, warmed with one
picture, then timed over --runs pictures each (alternating): median per-image time and its parts
(text encoder, UNet, VAE decoder), the UNet's share, and the ratio. With `--adb SERIAL` the same
two plans are estimated on the phone from `difflite bench OUT --adb` (sum of per-call medians).

    python benchmarks/fewstep.py --model preset:sd15 --work /tmp/fewstep --backend opencl \
        --save benchmarks/results/fewstep_h200_$(date +%Y-%m).json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-m", "difflite"]
PROMPT = "a photo of an astronaut riding a horse on mars"
PLANS = {
    "guided": {"batch": 2, "steps": 20, "guidance": 7.5, "scheduler": "default"},
    "fewstep": {"batch": 1, "steps": 4, "guidance": 1.0, "scheduler": "lcm"},
}


def convert(model: str, out: Path, batch: int, precision: str, lora: str | None) -> float:
    """Convert unless `out` already holds a conversion; returns the seconds it took (0 if reused)."""
    if (out / "manifest.json").is_file():
        return 0.0
    command = [*CLI, "convert", model, "-o", str(out), "--batch", str(batch), "--precision", precision]
    if lora:
        command += ["--lora", lora]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def time_images(pipes: dict, runs: int) -> dict:
    """Per plan: one warm-up picture, then `runs` pictures alternating between the plans."""
    samples = {name: [] for name in pipes}
    for name, pipe in pipes.items():
        plan = PLANS[name]
        pipe(PROMPT, steps=plan["steps"], guidance=plan["guidance"], scheduler=plan["scheduler"], seed=0)
    for run in range(runs):
        for name, pipe in pipes.items():
            plan = PLANS[name]
            start = time.perf_counter()
            result = pipe(PROMPT, steps=plan["steps"], guidance=plan["guidance"], scheduler=plan["scheduler"],
                          seed=run + 1)
            wall = time.perf_counter() - start
            samples[name].append({"wall_s": wall, **result.timings, "unet_calls": result.settings["unet_calls"],
                                  "scheduler": result.settings["scheduler"]})
    return {name: summarize(rows) for name, rows in samples.items()}


def summarize(rows: list[dict]) -> dict:
    def median(key):
        return statistics.median(r[key] for r in rows)

    image, unet = median("wall_s"), median("unet")
    return {"runs": len(rows), "image_s": round(image, 4), "unet_s": round(unet, 4),
            "unet_step_s": round(median("unet_per_step"), 4), "text_encoder_s": round(median("text_encoder"), 4),
            "vae_decoder_s": round(median("vae_decoder"), 4), "unet_share": round(unet / image, 3),
            "unet_calls": rows[0]["unet_calls"], "scheduler": rows[0]["scheduler"], "samples": rows}


def phone_estimate(out: Path, serial: str, plan: dict) -> dict:
    command = [*CLI, "bench", str(out), "--adb", serial, "--steps", str(plan["steps"]),
               "--guidance", str(plan["guidance"]), "--json"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1:] or ["bench --adb failed"]}
    pipeline = json.loads(result.stdout).get("pipeline", {})
    return {"image_ms": pipeline.get("sum_of_medians_ms"), "calls": pipeline.get("calls")}


def adb_devices() -> list[str]:
    try:
        listed = subprocess.run(["adb", "devices"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in listed.splitlines()[1:] if line.strip().endswith("device")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--work", type=Path, required=True, help="Folder for the two conversions (reused).")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    parser.add_argument("--lcm-lora", default=None, help="An LCM-LoRA merged into the few-step conversion.")
    parser.add_argument("--backend", default="opencl", choices=["cpu", "opencl"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--adb", default=None, help="Phone serial for the on-device estimate (default: the "
                                                     "only attached phone, if any).")
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()

    from difflite.runtime.generate import LitePipeline

    folders = {name: args.work / f"{name}_b{plan['batch']}" for name, plan in PLANS.items()}
    convert_s = {name: round(convert(args.model, folders[name], PLANS[name]["batch"], args.precision,
                                     args.lcm_lora if name == "fewstep" else None), 1) for name in PLANS}
    pipes = {name: LitePipeline(folder, backend=args.backend) for name, folder in folders.items()}
    try:
        measured = time_images(pipes, args.runs)
    finally:
        for pipe in pipes.values():
            pipe.close()
    serials = [args.adb] if args.adb else adb_devices()[:1]
    phone = ({name: phone_estimate(folders[name], serials[0], PLANS[name]) for name in PLANS} if serials
             else {"skipped": "no phone attached (adb devices lists none)"})
    ratio = measured["guided"]["image_s"] / measured["fewstep"]["image_s"]
    result = {"model": args.model, "precision": args.precision, "backend": args.backend, "lcm_lora": args.lcm_lora,
              "host": platform.node(), "date": time.strftime("%Y-%m-%d"), "plans": PLANS, "convert_s": convert_s,
              "measured": measured, "guided_over_fewstep": round(ratio, 2), "phone": phone}
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2) + "\n")
    print(f"| per image ({args.model}, {args.precision}, {args.backend}) | steps | UNet calls | image s | "
          f"UNet s (step) | text enc. s | VAE s | UNet share |")
    print("|---|---|---|---|---|---|---|---|")
    for name, m in measured.items():
        print(f"| {name} ({m['scheduler']}, batch {PLANS[name]['batch']}) | {PLANS[name]['steps']} | {m['unet_calls']} "
              f"| {m['image_s']:.3f} | {m['unet_s']:.3f} ({m['unet_step_s'] * 1e3:.1f} ms) | "
              f"{m['text_encoder_s']:.3f} | {m['vae_decoder_s']:.3f} | {m['unet_share']:.0%} |")
    print(f"guided / few-step per image: {ratio:.2f}x; phone: {json.dumps(phone)}")


if __name__ == "__main__":
    main()
