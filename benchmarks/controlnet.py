"""Benchmark: SD 1.5 with one ControlNet (issue 33), each figure the median and range of several runs.

Preset weights (preset:sd15 + preset:controlnet), 512x512, 20 guided steps, fp16 storage. It converts
three folders (fused fp16, fused fp16 with int8 weights, --no-fuse fp16 for stock LiteRT), then
measures, each in a fresh process from the shell as a user runs it:

- `difflite generate ... --control-image edges.png`: wall time, peak RSS (wait4) and GPU memory
  (nvidia-smi, polled), all models resident and with --low-memory; the first run (empty program
  caches) apart;
- `difflite bench --components controlnet_0,unet`: per-call median and range in one process, the
  fused files on the op library's backend and the --no-fuse files on stock LiteRT's GPU engine;
- diffusers' fp16 StableDiffusionControlNetPipeline on the same weights in a fresh process (GPU).

    python benchmarks/controlnet.py --work out/controlnet --runs 5 --save benchmarks/results/controlnet_h200_2026-11.json
    python benchmarks/controlnet.py --work out/controlnet --phase convert        # one phase at a time
    python benchmarks/controlnet.py --report benchmarks/results/controlnet_h200_2026-11.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import headline
from benchmarks.headline import PROMPT, machine, run_measured, summary

FOLDERS = {  # name: convert flags
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "fp16", "--weights", "int8"],
    "stock": ["--precision", "fp16", "--no-fuse"],
}
GENERATE = {  # label: (folder, generate flags)
    "fp16": ("fp16", []),
    "fp16 --low-memory": ("fp16", ["--low-memory"]),
    "int8": ("int8", []),
    "int8 --low-memory": ("int8", ["--low-memory"]),
}
BENCH = {  # label: (folder, bench flags)
    "fp16 difflite (auto)": ("fp16", []),
    "int8 difflite (auto)": ("int8", []),
    "fp16 --no-fuse, stock LiteRT GPU": ("stock", ["--backend", "litert-gpu"]),
}

DIFFUSERS_CHILD = """
import sys, time, torch
from PIL import Image
from diffusers import ControlNetModel, StableDiffusionControlNetPipeline
folder, controlnet, image, prompt, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
net = ControlNetModel.from_pretrained(controlnet, torch_dtype=torch.float16)
pipe = StableDiffusionControlNetPipeline.from_pretrained(folder, controlnet=net, torch_dtype=torch.float16,
                                                         safety_checker=None, requires_safety_checker=False).to("cuda")
pipe.set_progress_bar_config(disable=True)
start = time.perf_counter()
pipe(prompt, image=Image.open(image), num_inference_steps=steps, height=512, width=512, output_type="np")
torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def control_picture(path: Path) -> Path:
    """A 512x512 edge map (white outlines of a few shapes on black), the kind a canny preprocessor gives."""
    from PIL import Image, ImageDraw

    if not path.is_file():
        image = Image.new("RGB", (512, 512))
        draw = ImageDraw.Draw(image)
        draw.ellipse((96, 64, 416, 384), outline="white", width=3)
        draw.rectangle((160, 300, 352, 480), outline="white", width=3)
        draw.line((0, 400, 512, 360), fill="white", width=2)
        image.save(path)
    return path


def convert(work: Path, model: str, controlnet: str, extra: list[str], timeout: float, names: list[str]) -> dict:
    folders = {name: ["--controlnet", controlnet, *flags] for name, flags in FOLDERS.items() if name in names}
    return headline.convert(work, model, extra, timeout, folders)


def generate(work: Path, runs: int, steps: int, timeout: float) -> dict:
    image = control_picture(work / "edges.png")
    return headline.generate(work, runs, steps, timeout, GENERATE, ("--control-image", str(image)))


def bench(work: Path, runs: int, timeout: float) -> dict:
    return headline.bench(work, runs, timeout, BENCH, ("controlnet_0", "unet"))


def save_diffusers_folders(work: Path) -> tuple[Path, Path]:
    """The fp16 folder's source weights as diffusers folders (pipeline, ControlNet) in fp16."""
    import torch
    from diffusers import StableDiffusionPipeline

    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.folder.output_folder import OutputFolder
    from difflite.verify import load_source

    pipeline_dir, controlnet_dir = work / "diffusers", work / "diffusers-controlnet"
    if (pipeline_dir / "model_index.json").is_file() and (controlnet_dir / "config.json").is_file():
        return pipeline_dir, controlnet_dir
    folder = OutputFolder.read(work / "fp16")
    source = load_source(folder, None, None)
    pipe = StableDiffusionPipeline(vae=source.vae, text_encoder=source.text_encoder, tokenizer=source.tokenizer,
                                   unet=source.unet, scheduler=diffusers_scheduler("default", source.scheduler_config),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.to(torch.float16).save_pretrained(str(pipeline_dir))
    source.controlnets[0].to(torch.float16).save_pretrained(str(controlnet_dir))
    return pipeline_dir, controlnet_dir


def run_diffusers(work: Path, runs: int, steps: int, timeout: float) -> dict:
    pipeline_dir, controlnet_dir = save_diffusers_folders(work)
    image = control_picture(work / "edges.png")
    command = [sys.executable, "-c", DIFFUSERS_CHILD, str(pipeline_dir), str(controlnet_dir), str(image), PROMPT,
               str(steps)]
    timed = [run_measured(command, timeout) for _ in range(runs)]
    result = {"wall_s": summary([t["wall_s"] for t in timed]),
              "steps_s": summary([float(t["stdout"].split()[-1]) for t in timed]),
              "peak_rss_mib": summary([t["peak_rss_mib"] for t in timed]),
              "gpu_mib": summary([t["gpu_mib"] for t in timed]) if all(t["gpu_mib"] for t in timed) else None}
    w = result["wall_s"]
    print(f"diffusers fp16: median {w['median']:.2f} s ({w['min']:.2f}-{w['max']:.2f}, {runs} runs)", flush=True)
    return result


def report(data: dict) -> None:
    rows = dict(data.get("generate", {}))
    if "wall_s" in data.get("diffusers", {}):
        rows["diffusers fp16 StableDiffusionControlNetPipeline"] = data["diffusers"]
    headline.generate_table(rows, "SD 1.5 + ControlNet, 512x512, 20 guided steps, from the shell "
                                  f"({headline.where(data)})")
    headline.bench_table(data.get("bench", {}), f"per call, in one process ({headline.where(data)})",
                         {"controlnet_0": "ControlNet, ms", "unet": "UNet, ms"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    headline.add_run_arguments(parser, "controlnet", "convert,generate,bench,diffusers")
    parser.add_argument("--controlnet", default="preset:controlnet")
    parser.add_argument("--folders", default=",".join(FOLDERS), help="the folders the convert phase makes")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    phases = args.phase.split(",")
    data = json.loads(args.save.read_text()) if args.save and args.save.is_file() else {}
    data["machine"] = machine()
    args.work.mkdir(parents=True, exist_ok=True)
    steps = {
        "convert": lambda: {**data.get("convert", {}), **convert(args.work, args.model, args.controlnet,
                                                                 args.convert_args.split(), args.timeout,
                                                                 args.folders.split(","))},
        "generate": lambda: generate(args.work, args.runs, args.steps, args.timeout),
        "bench": lambda: bench(args.work, args.bench_runs, args.timeout),
        "diffusers": lambda: run_diffusers(args.work, args.runs, args.steps, args.timeout),
    }
    for phase in phases:
        data[phase] = steps[phase]()
        if args.save:  # after every phase: a session on a lent machine may end between them
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    report(data)


if __name__ == "__main__":
    main()
