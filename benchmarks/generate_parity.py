"""Benchmark: `difflite generate` against diffusers' PyTorch StableDiffusionPipeline, same prompt,
seed and weights (default preset:sd15, 512x512, 20 steps, fp32, UNet batch 2).

1. converts the model with the real `difflite convert` in a child process (or reuses --out when
   it already holds a conversion of the same model and size: --reuse);
2. makes the picture with difflite's files (difflite.runtime.generate.LitePipeline) per scheduler, timing
   each stage (text encoder, UNet, VAE decoder);
3. frees the LiteRT interpreters, then makes the same picture with diffusers on the source torch
   modules (load_pipeline of the manifest's source), timing the same stages with wrappers;
4. writes benchmarks/results/generate_parity_<name>.json (PSNR per scheduler, times per stage)
   and prints a table. Target: PSNR >= 30 dB for every scheduler (exit 1 otherwise).

    python benchmarks/generate_parity.py                       # preset:sd15, 512x512, 20 steps
    python benchmarks/generate_parity.py --out /tmp/sd15 --reuse --schedulers euler,ddim,dpm++
    python benchmarks/generate_parity.py --model preset:tiny --height 64 --width 96 --steps 4

Needs about 8 GB of memory for preset:sd15 (the conversion; then each side holds ~4 GB in turn)
and, on a 2-core machine, well over 15 minutes (UNet at 512x512, 2 x 20 steps on each side).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MIN_PSNR_DB = 30.0
PROMPT = "a photo of an astronaut riding a horse on the moon, detailed, cinematic lighting"

sys.path.insert(0, str(ROOT))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def peak_rss_gb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / 1024**2, 2)


def convert(args, out: Path) -> dict:
    """Run `difflite convert` unless --reuse finds a matching conversion in `out`."""
    manifest_path = out / "manifest.json"
    if args.reuse and manifest_path.is_file():
        man = json.loads(manifest_path.read_text())
        options = man.get("options", {})
        if (man["source"]["model"] == args.model and options.get("height") == args.height
                and options.get("width") == args.width and options.get("precision") == args.precision):
            print(f"[generate_parity] reusing {out}", file=sys.stderr)
            return {"reused": True}
    command = [sys.executable, "-m", "difflite", "convert", args.model, "-o", str(out),
               "--height", str(args.height), "--width", str(args.width), "--batch", str(args.batch),
               "--precision", args.precision, "--components", "text_encoder,unet,vae_decoder",
               *shlex.split(args.convert_args)]
    print(f"[generate_parity] {' '.join(command[1:])}", file=sys.stderr)
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, check=False)
    wall = time.perf_counter() - start
    if completed.returncode != 0:
        raise SystemExit(f"difflite convert failed ({completed.returncode})")
    report = json.loads((out / "report.json").read_text())
    return {"reused": False, "command": " ".join(command[2:]), "wall_s": round(wall, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2, 2),
            "stages": {name: r["stages"] for name, r in report["components"].items()}}


def run_difflite(out: Path, args, schedulers: list[str]) -> dict:
    from difflite.runtime.generate import LitePipeline

    start = time.perf_counter()
    pipe = LitePipeline(out, backend=args.backend)
    for name in ("text_encoder", "unet", "vae_decoder"):
        pipe.component(name)
    load_s = time.perf_counter() - start
    results = {}
    for scheduler in schedulers:
        print(f"[generate_parity] difflite {scheduler}", file=sys.stderr)
        result = pipe(args.prompt, negative_prompt=args.negative_prompt, steps=args.steps, seed=args.seed,
                      guidance=args.guidance, scheduler=scheduler)
        results[scheduler] = {"image": result.image, "timings": result.timings, "settings": result.settings}
    del pipe
    gc.collect()
    return {"load_s": round(load_s, 2), "runs": results}


class StageTimer:
    """Wall time of the torch modules' calls, by wrapping them on the instance."""

    def __init__(self, sync=None):
        self.sync = sync  # e.g. torch.cuda.synchronize: GPU calls return before the work is done
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, owner, attribute: str, stage: str) -> None:
        original = getattr(owner, attribute)

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                if self.sync is not None:
                    self.sync()
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
                self.calls[stage] = self.calls.get(stage, 0) + 1

        setattr(owner, attribute, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def run_diffusers(out: Path, args, schedulers: list[str]) -> dict:
    import torch
    from diffusers import StableDiffusionPipeline

    from difflite.folder.output_folder import OutputFolder
    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.verify import load_source

    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    source = load_source(OutputFolder.read(out), None, None)
    if args.torch_device != "cpu":
        # fp32 as on the host: no TF32 shortcuts in the reference.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        for module in (source.text_encoder, source.unet, source.vae):
            module.to(args.torch_device)
    load_s = time.perf_counter() - start
    timer = StageTimer(torch.cuda.synchronize if args.torch_device.startswith("cuda") else None)
    timer.wrap(source.text_encoder, "forward", "text_encoder")
    timer.wrap(source.unet, "forward", "unet")
    timer.wrap(source.vae, "decode", "vae_decoder")
    results = {}
    for scheduler in schedulers:
        print(f"[generate_parity] diffusers {scheduler}", file=sys.stderr)
        pipe = StableDiffusionPipeline(vae=source.vae, text_encoder=source.text_encoder, tokenizer=source.tokenizer,
                                       unet=source.unet, scheduler=diffusers_scheduler(scheduler, source.scheduler_config),
                                       safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        timer.reset()
        start = time.perf_counter()
        with torch.inference_mode():
            image = pipe(args.prompt, negative_prompt=args.negative_prompt, height=args.height, width=args.width,
                         num_inference_steps=args.steps, guidance_scale=args.guidance, output_type="np",
                         generator=torch.Generator("cpu").manual_seed(args.seed)).images[0]
        total = time.perf_counter() - start
        timings = {k: round(v, 4) for k, v in timer.seconds.items()}
        timings["unet_per_step"] = round(timer.seconds.get("unet", 0.0) / max(timer.calls.get("unet", 1), 1), 4)
        timings["total"] = round(total, 4)
        results[scheduler] = {"image": image, "timings": timings, "unet_calls": timer.calls.get("unet", 0)}
    del source
    gc.collect()
    return {"load_s": round(load_s, 2), "runs": results}


def save_png(image: np.ndarray, path: Path) -> None:
    from difflite.runtime.generate import save_png as save
    from difflite.runtime.generate import to_uint8

    save(to_uint8(image), path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance", type=float, default=7.5)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--schedulers", default="euler",
                        help="comma-separated: euler, ddim, dpm++, pndm, default (each adds 2 x steps UNet runs)")
    parser.add_argument("--batch", type=int, default=2, help="UNet batch of the conversion")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    parser.add_argument("--backend", default="cpu", choices=["cpu", "opencl"])
    parser.add_argument("--torch-device", default="cpu",
                        help="where diffusers runs (e.g. cuda; fp32 with TF32 off); latents are drawn on the CPU")
    parser.add_argument("--convert-args", default="", help="more `difflite convert` arguments, e.g. --no-fuse")
    parser.add_argument("--out", type=Path, default=None, help="conversion folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="reuse --out when it holds this model and size")
    parser.add_argument("--images", type=Path, default=None, help="also write both pictures into this folder")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="default: benchmarks/results/generate_parity_<model name>.json")
    args = parser.parse_args()
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    name = args.model.removeprefix("preset:") if args.model.startswith("preset:") else Path(args.model).name
    json_out = args.json_out or RESULTS / f"generate_parity_{name}.json"

    temporary = None
    out = args.out
    if out is None:
        temporary = tempfile.TemporaryDirectory(prefix="difflite-parity-")
        out = Path(temporary.name) / name
    started = time.perf_counter()
    conversion = convert(args, out)
    lite = run_difflite(out, args, schedulers)
    torch_side = run_diffusers(out, args, schedulers)

    rows = []
    for scheduler in schedulers:
        a, b = lite["runs"][scheduler], torch_side["runs"][scheduler]
        diff = np.abs(np.round(a["image"] * 255).astype(int) - np.round(b["image"] * 255).astype(int))
        value = psnr(a["image"], b["image"])
        rows.append({"scheduler": scheduler, "scheduler_class": a["settings"]["scheduler"],
                     "psnr_db": round(value, 2) if math.isfinite(value) else "inf",
                     "max_abs_diff_uint8": int(diff.max()), "mean_abs_diff_uint8": round(float(diff.mean()), 4),
                     "passed": value >= MIN_PSNR_DB,
                     "difflite": {"timings_s": a["timings"], "unet_calls": a["settings"]["unet_calls"]},
                     "diffusers": {"timings_s": b["timings"], "unet_calls": b["unet_calls"]}})
        if args.images:
            save_png(a["image"], args.images / f"{name}_{scheduler}_difflite.png")
            save_png(b["image"], args.images / f"{name}_{scheduler}_diffusers.png")

    manifest = json.loads((out / "manifest.json").read_text())
    result = {
        "model": args.model, "height": args.height, "width": args.width, "steps": args.steps, "seed": args.seed,
        "guidance": args.guidance, "prompt": args.prompt, "negative_prompt": args.negative_prompt,
        "precision": manifest["options"]["precision"], "unet_batch": manifest["options"]["batch"],
        "fuse": manifest["options"]["fuse"], "backend": args.backend, "torch_device": args.torch_device,
        "machine": {"node": platform.node(), "arch": platform.machine(), "cpus": os.cpu_count()},
        "convert": conversion, "difflite_load_s": lite["load_s"], "diffusers_load_s": torch_side["load_s"],
        "results": rows, "min_psnr_db": MIN_PSNR_DB, "passed": all(r["passed"] for r in rows),
        "wall_s": round(time.perf_counter() - started, 1), "peak_rss_gb": peak_rss_gb(),
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result, json_out)
    if temporary is not None:
        temporary.cleanup()
    return 0 if result["passed"] else 1


def print_table(result: dict, path: Path) -> None:
    print(f"\n{result['model']} {result['width']}x{result['height']}, {result['steps']} steps, "
          f"{result['precision']}, UNet batch {result['unet_batch']}, fuse {result['fuse'] or 'none'}")
    print("| scheduler | PSNR dB | max |diff| (0-255) | side | text encoder s | UNet s | UNet s/step "
          "| VAE decoder s | total s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in result["results"]:
        for side in ("difflite", "diffusers"):
            t = r[side]["timings_s"]
            print(f"| {r['scheduler']} | {r['psnr_db']} | {r['max_abs_diff_uint8']} | {side} | "
                  f"{t.get('text_encoder', 0):.2f} | {t.get('unet', 0):.2f} | {t.get('unet_per_step', 0):.3f} | "
                  f"{t.get('vae_decoder', 0):.2f} | {t.get('total', 0):.2f} |")
    print(f"\nwall {result['wall_s']} s, peak RSS {result['peak_rss_gb']} GB, "
          f"{'PASSED' if result['passed'] else 'FAILED'} (PSNR >= {result['min_psnr_db']} dB); wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
