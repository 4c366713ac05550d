"""Benchmark: SDXL at 1024x1024 on one NVIDIA GPU machine, side by side in one run (issue 32, item 7).

preset:sdxl (SDXL base's architecture, seeded random weights), fp16 storage, the nvidia-h100 device
profile. The conversions the chosen steps need start at once where the disk holds them (else as
others end: DISK_GB), each a child process with its share of the cores (WORK/fp16: every
component, UNet batch 2; int8: --weights int8; int4: --weights int4, generic profile, batch 1,
--weights-layout appended; b1: the UNet at batch 1; int8_b1: its int8 UNet; turbo: every
component at 512x512, UNet batch 1): wall time, peak RSS, stage seconds, files' sizes. Each step
runs as soon as its conversion is there, in the order of STEPS, and is saved to
WORK/sdxl_gpu.json at once:

- peer_b2: benchmarks/gpu_peer.py on the UNet step (batch 2) and the VAE decoder: difflite's op
  library (OpenCL) at fp32 and fp16 storage, PyTorch eager fp32 / fp16;
- picture_fp16: `difflite generate` 20 steps from the shell, a fresh process each (one untimed run
  fills the program caches): wall time, peak RSS (its VmHWM), the process's GPU memory (nvidia-smi);
- peer_litert, peer_litert_vae: stock LiteRT's GPU engine fp32 / fp16 on the --no-fuse UNet and VAE
  decoder written from the fp16 conversion's ONNX (same weights), time-boxed (a crash there loses
  nothing else);
- picture_diffusers_fp16: StableDiffusionXLPipeline at fp16 from a saved folder of the same
  weights, a fresh process each;
- peer_b1: the batch-1 UNet (difflite, PyTorch eager);
- peer_litert_b1: the batch-1 UNet, difflite against stock LiteRT's GPU engine at fp16 in one call,
  on the --no-fuse UNet written from the batch-1 conversion's ONNX (same weights);
- peer_int4, picture_int4_low_memory, peer_int8, peer_int8_b1, picture_int8: the quantized UNets'
  step and VAE decoders' call (peer_int4, peer_int8, peer_int8_b1) and pictures (int4 as a phone
  gets it: the generic profile, batch 1, and --low-memory: one model at a time; int8 at batch 2
  and, beside peer_litert_b1, batch 1);
- peer_int4_apart, picture_int4_low_memory_apart: the same with DIFFLITE_WEIGHT_SLABS=off (a
  device buffer per weight, as before the weight slabs), right after the slabbed runs;
- peer_int4_scratch_apart, picture_int4_low_memory_scratch_apart: the same with
  DIFFLITE_LEND_SCRATCH=off (the op scratch in buffers of its own, not lent from the
  intermediates' idle buffers);
- peer_int4_previous, picture_int4_low_memory_previous: the same with an earlier build of the op
  library (PREVIOUS_OPLIB: .devcarry/libdifflite_delegate_previous.so, built on the host from the
  commit a result's note names), side by side with this one's;
- picture_turbo, picture_diffusers_turbo: SDXL-Turbo's settings (512x512, batch-1 UNet, 4 steps,
  guidance 0, euler-a on trailing timesteps), difflite against diffusers, fresh processes;
- peer_vae_unbanded: the VAE decoder with Winograd's tiles in one band (its scratch unbounded),
  against peer_b2's banded run: time and the delegate's scratch;
- gpu_context: a process that only opens an OpenCL context on the GPU and holds a 4-byte buffer:
  the GPU memory every other row's figure includes before any weight (the driver's own);
- picture_fp32: the same 20-step picture from fp32 files (the reference of item 5's picture PSNR);
- picture_psnr_db: the fp16 / int8 / int4 pictures against the fp32 one and the int8 / int4 ones
  against the fp16 one (same prompt, seed and scheduler).

--recipes DIR reuses the per-layer int8 / int4 choices of earlier conversions of the same model
(DIR/sdxl_int8.json, DIR/sdxl_int4.json: `convert --weights-recipe`), so the quantized conversions
skip the recipes' probes (the SDXL UNet's int4 recipe: 290 s on 2 cores, 819 s on the device's
shared cores); benchmarks/recipes holds preset:sdxl's.

    source benchmarks/device_setup.sh
    python benchmarks/sdxl_gpu.py --work /tmp/sdxl [--runs 5] [--steps peer_litert,peer_b1,...]
    python benchmarks/sdxl_gpu.py --work /tmp/tiny --model preset:sdxl-tiny --size 128 --runs 1  # a smoke run
    python benchmarks/sdxl_gpu.py --report benchmarks/results/sdxl_gpu_h200_2026-11.json

On a lent machine whose calls are capped at 10 minutes, start it detached (`setsid nohup ... &`)
and wait for WORK/done in the following calls; while /tmp/gpu_busy exists (another job timing
the GPU) the steps wait.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import BARE_CONTEXT, CLI, PROMPT, ROOT, machine, run_measured, summary

sys.path.insert(0, str(ROOT))  # difflite itself, for the steps run in this process

MODEL = "preset:sdxl"
SIZE = 1024
CONVERT = ["--precision", "fp16", "--device-profile", "nvidia-h100"]
FOLDERS = {  # name: convert flags beyond CONVERT
    "fp16": ["--batch", "2"],
    # int4 as a phone gets it (the generic profile, batch 1): the --low-memory picture's memory; its
    # weights appended after each flatbuffer, which keeps them out of the host's peak on a GPU with
    # its own memory (notebook §73; on a phone the layout changes nothing)
    "int4": ["--batch", "1", "--weights", "int4", "--device-profile", "generic", "--weights-layout", "appended"],
    "int8": ["--batch", "2", "--weights", "int8"],
    # beside LiteRT's batch-1 UNet; its VAE decoder: the int8 one's time at 1024x1024
    "int8_b1": ["--batch", "1", "--weights", "int8", "--components", "unet,vae_decoder"],
    "b1": ["--batch", "1", "--components", "unet"],
    "turbo": ["--batch", "1"],  # at half the size (SDXL-Turbo's 512x512): its architecture is SDXL's
    "fp32": ["--batch", "2", "--precision", "fp32"],  # the picture PSNR's reference
}
TURBO_FLAGS = ["--steps", "4", "--guidance", "0", "--scheduler", "euler-a", "--timestep-spacing", "trailing"]
# step: the conversion it needs (in the order they run once their conversion is there)
STEPS = {
    "peer_b2": "fp16", "picture_fp16": "fp16", "peer_litert": "fp16", "peer_litert_vae": "fp16",
    "picture_diffusers_fp16": "fp16",
    "peer_b1": "b1", "peer_litert_b1": "b1", "peer_int4": "int4", "peer_int4_apart": "int4",
    "picture_int4_low_memory": "int4", "picture_int4_low_memory_apart": "int4", "peer_int8": "int8",
    "peer_int4_scratch_apart": "int4", "picture_int4_low_memory_scratch_apart": "int4",
    "peer_int4_previous": "int4", "picture_int4_low_memory_previous": "int4",
    "peer_int8_b1": "int8_b1", "picture_int8": "int8", "picture_turbo": "turbo", "picture_diffusers_turbo": "turbo",
    "peer_vae_unbanded": "fp16", "gpu_context": "int4", "picture_fp32": "fp32", "picture_psnr_db": "fp16",
}
# The conversions whose ONNX the --no-fuse files for LiteRT are written from (write_unfused):
# conversion: (gpu_peer folder, {component: the step that times it}), kept where a step is chosen.
UNFUSED_FROM = {"fp16": ("peer", {"unet": "peer_litert", "vae_decoder": "peer_litert_vae"}),
                "b1": ("peer_litert_b1", {"unet": "peer_litert_b1"})}
# A conversion's peak disk, GB (its fp32 ONNX graphs while it writes, then its files): conversions
# start in the order their steps come while the free disk keeps DISK_MARGIN_GB beside their peaks.
DISK_GB = {"fp16": 24, "int4": 18, "int8": 19, "int8_b1": 16, "b1": 22, "turbo": 22, "fp32": 40}  # b1: with its ONNX and --no-fuse UNet
DISK_MARGIN_GB = 10
UNBANDED = {"DIFFLITE_WINOGRAD_SCRATCH_BYTES": str(1 << 40)}  # Winograd's V + M in one band, as before bands
APART = {"DIFFLITE_WEIGHT_SLABS": "off"}  # a device buffer per weight (no weight slabs)
SCRATCH_APART = {"DIFFLITE_LEND_SCRATCH": "off"}  # op scratch in buffers of its own
# An earlier build of the op library, for before / after rows in one run
PREVIOUS_OPLIB = {"DIFFLITE_OPLIB": str(ROOT / ".devcarry" / "libdifflite_delegate_previous.so")}
# While this file exists another job times the GPU: the steps wait for it to go.
GPU_BUSY = Path("/tmp/gpu_busy")
DIFFUSERS_CHILD = """
import sys, time, torch
from diffusers import StableDiffusionXLPipeline
from diffusers import EulerAncestralDiscreteScheduler
folder, prompt, steps, size, guidance = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
pipe = StableDiffusionXLPipeline.from_pretrained(folder, torch_dtype=torch.float16).to("cuda")
if guidance <= 1:  # SDXL-Turbo's settings: euler-a on trailing timesteps, no guidance
    pipe.scheduler = EulerAncestralDiscreteScheduler.from_config(pipe.scheduler.config, timestep_spacing="trailing")
pipe.set_progress_bar_config(disable=True)
start = time.perf_counter()
pipe(prompt, num_inference_steps=steps, height=size, width=size, guidance_scale=guidance, output_type="np")
torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def log(message: str) -> None:
    print(f"[sdxl_gpu {time.strftime('%H:%M:%S')}] {message}", flush=True)


def start_convert(work: Path, name: str, threads: int, keep_onnx: bool, recipes: Path | None = None) -> subprocess.Popen:
    """`difflite convert` into WORK/name in a child process of `threads` torch threads (conversions
    side by side each take a share of the cores: on 32 cores, four of 32 threads each made the
    int4 recipe 3x slower than on a 2-core machine)."""
    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    size = SIZE // 2 if name == "turbo" else SIZE
    command = [*CLI, "convert", MODEL, "-o", str(out), *CONVERT, "--height", str(size), "--width", str(size),
               *FOLDERS[name], *(["--keep-onnx"] if keep_onnx else []), *recipe_flags(name, recipes)]
    log(" ".join(command))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=open(work / f"convert_{name}.log", "w"),
                            stderr=subprocess.STDOUT)


def recipe_flags(name: str, recipes: Path | None) -> list[str]:
    """`--weights-recipe` for a quantized folder whose recipe DIR holds (none otherwise: computed)."""
    weights = dict(zip(FOLDERS[name][::2], FOLDERS[name][1::2])).get("--weights")
    recipe = recipes / f"sdxl_{weights}.json" if recipes and weights else None
    return ["--weights-recipe", str(recipe.resolve())] if recipe and recipe.is_file() else []


def finish_convert(work: Path, name: str, process: subprocess.Popen, started: float) -> dict:
    """Wait for a conversion: its wall time, exit status and report (peak RSS as convert measured it
    from /proc, stage seconds) and the files' sizes."""
    code = process.wait()
    result = {"wall_s": round(time.perf_counter() - started, 1), "exit": code}
    report_path = work / name / "report.json"
    if code == 0 and report_path.is_file():
        report = json.loads(report_path.read_text())
        result["peak_rss_mb"] = report.get("peak_rss_mb")
        result["stages"] = {c: r.get("stages") for c, r in report["components"].items()}
        result["files_mib"] = {p.name: round(p.stat().st_size / 2**20, 1) for p in (work / name).glob("*.tflite")}
        result["total_mib"] = round(sum(result["files_mib"].values()), 1)
    else:
        result["log_tail"] = (work / f"convert_{name}.log").read_text()[-2000:]
    log(f"converted {name}: {result['wall_s']} s, exit {code}")
    return result


def write_unfused(work: Path, components: tuple[str, ...], source: str, peer_name: str) -> dict:
    """gpu_peer's layout (WORK/<peer_name>/fused -> WORK/<source>, WORK/<peer_name>/unfused/NAME.tflite)
    from the source conversion's ONNX graphs; the ONNX is deleted afterwards (disk)."""
    from difflite.compiler.tflite.writer import load_onnx, write_tflite
    from difflite.passes import run_passes

    peer = work / peer_name
    unfused = peer / "unfused"
    unfused.mkdir(parents=True, exist_ok=True)
    link(peer / "fused", work / source)
    ops = {}
    for name in components:
        graph = load_onnx(work / source / "onnx" / f"{name}.onnx")
        run_passes(graph, {"gelu", "groupnorm", "attention"})
        result = write_tflite(graph, precision="fp16", fuse=frozenset())
        (unfused / f"{name}.tflite").write_bytes(result.data)
        (unfused / f"{name}.json").write_text(json.dumps({"inputs": result.inputs, "outputs": result.outputs}))
        ops[name] = sum(result.op_histogram.values())
        del graph, result
    shutil.rmtree(work / source / "onnx")
    return ops


def wait_for_gpu() -> None:
    while GPU_BUSY.exists():
        time.sleep(2)


def link(path: Path, target: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def save_diffusers_folder(work: Path) -> None:
    """A conversion's source weights (the same in each) as StableDiffusionXLPipeline's folder, in
    float16."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.verify import load_source

    folder = next(work / name for name in ("fp16", "turbo", "b1") if (work / name / "manifest.json").is_file())
    pipe = load_source(OutputFolder.read(folder), None, None)
    for name in ("text_encoder", "text_encoder_2", "unet", "vae"):
        getattr(pipe, name).half()
    pipe.save_pretrained(work / "diffusers")


def peer(work: Path, name: str, fused: str, components: str, batch: int, skip: str, runs: int,
         timeout: float, env: dict | None = None, litert: str = "fp32,fp16") -> dict:
    """benchmarks/gpu_peer.py on WORK/<name>/fused -> WORK/<fused>: its JSON. The batch-2 folders
    share WORK/peer/unfused (the --no-fuse files: LiteRT's input and the CPU reference); the batch-1
    UNet has none (no reference error)."""
    folder = work / name
    folder.mkdir(exist_ok=True)
    link(folder / "fused", work / fused)
    if name != "peer" and batch == 2 and (work / "peer" / "unfused").is_dir():
        link(folder / "unfused", work / "peer" / "unfused")
    else:
        (folder / "unfused").mkdir(exist_ok=True)  # none: no CPU reference (gpu_peer converts nothing)
    out = work / f"out_{name}_{skip.replace(',', '-') or 'all'}"
    out.mkdir(exist_ok=True)
    library = {**os.environ, **(env or {})}.get("DIFFLITE_OPLIB")  # a step's own (PREVIOUS_OPLIB) first
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_peer.py"), "--work", str(folder), "--model", MODEL,
               "--size", str(SIZE), "--components", components, "--batch", str(batch), "--runs", str(runs),
               "--skip", skip, "--litert-precisions", litert, *(["--library", library] if library else [])]
    log(" ".join(command))
    try:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **(env or {}), "OUT": str(out)},
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        done = subprocess.CompletedProcess(command, -9, "", f"timed out after {timeout} s: {exc.stderr!r}"[-2000:])
    results = [json.loads(p.read_text()) for p in out.glob("gpu_peer_*.json")]
    result = results[0] if results else {}
    if done.returncode != 0:
        result["exit"] = done.returncode
        result["stderr_tail"] = done.stderr[-2000:]
    return result


def picture(command: list[str], runs: int, timeout: float, warm_up: bool = True) -> dict:
    """One untimed process first (program caches filled) where `warm_up`, then `runs` timed ones."""
    first = run_measured(command, timeout) if warm_up else None
    timed = [run_measured(command, timeout) for _ in range(runs)]
    result = {"first_run_s": round(first["wall_s"], 2) if first else None,
              "wall_s": summary([round(t["wall_s"], 2) for t in timed]),
              "peak_rss_mib": summary([round(t["peak_rss_mib"]) for t in timed]),
              "gpu_mib": summary([t["gpu_mib"] for t in timed]) if all(t["gpu_mib"] for t in timed) else None,
              # host + GPU read at the same poll (what unified memory would hold at once)
              "host_plus_gpu_mib": summary([round(t["host_plus_gpu_mib"]) for t in timed])
              if all(t["host_plus_gpu_mib"] for t in timed) else None,
              # the last timed run's poll with the most host + GPU: GPU and host's parts (MiB)
              "at_combined_peak_mib": timed[-1]["at_combined_peak_mib"]}
    try:
        said = json.loads(timed[-1]["stdout"])
    except ValueError:
        result["stdout_tail"] = timed[-1]["stdout"][-500:]
        return result
    if isinstance(said, dict):
        result["report"] = said  # difflite generate --json
    else:  # DIFFUSERS_CHILD prints its pipeline call's seconds
        result["pipeline_call_s"] = summary([round(float(t["stdout"]), 2) for t in timed])
    return result


def gpu_context(runs: int, timeout: float) -> dict:
    """The GPU memory and host peak of a process holding only an OpenCL context and a 4-byte buffer."""
    return picture([sys.executable, "-c", BARE_CONTEXT], runs, timeout, warm_up=False)


def generate_command(work: Path, folder: str, flags: list[str]) -> list[str]:
    """`difflite generate` of WORK/folder on the GPU (no silent CPU run), 20 steps unless `flags`
    say otherwise (click takes the last)."""
    return [*CLI, "generate", str(work / folder), PROMPT, "-o", str(work / f"{folder}.png"), "--steps", "20",
            "--json", "--backend", "opencl", *flags]


def main() -> int:
    global MODEL, SIZE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/sdxl_gpu"))
    parser.add_argument("--model", default=MODEL, help="an SDXL model (preset:sdxl-tiny for a smoke run)")
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of: {', '.join(STEPS)}")
    parser.add_argument("--runs", type=int, default=5, help="timed processes per picture")
    parser.add_argument("--peer-runs", type=int, default=10, help="timed calls per component in gpu_peer")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--report", type=Path, help="print the tables of a saved result and stop")
    parser.add_argument("--recipes", type=Path, help="a folder of sdxl_int8.json / sdxl_int4.json weight recipes")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    steps = [step for step in STEPS if step in args.steps.split(",")]
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"--steps: unknown {', '.join(sorted(unknown))}")
    MODEL, SIZE = args.model, args.size
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    (work / "done").unlink(missing_ok=True)
    data: dict = {"machine": machine(), "model": MODEL, "size": SIZE, "convert_flags": CONVERT, "convert": {},
                  "steps": steps}
    save = lambda: (work / "sdxl_gpu.json").write_text(json.dumps(data, indent=2) + "\n")
    pending = list(dict.fromkeys(STEPS[step] for step in steps))
    threads = max(1, (os.cpu_count() or 1) // len(pending))
    # conversion: the components whose --no-fuse files its ONNX gives
    unfused = {name: tuple(c for c, step in timed_by.items() if step in steps)
               for name, (_, timed_by) in UNFUSED_FROM.items()}
    keep_onnx = {name: components for name, components in unfused.items() if components}
    running: dict[str, tuple[subprocess.Popen, float]] = {}

    def start_what_fits() -> None:
        """Starts pending conversions, in order, while the disk holds their peaks (the first always)."""
        committed = sum(DISK_GB.get(name, 24) for name in running)
        while pending:
            free = shutil.disk_usage(work).free / 1e9 - committed - DISK_MARGIN_GB
            if running and free < DISK_GB.get(pending[0], 24):
                return
            name = pending.pop(0)
            running[name] = (start_convert(work, name, threads, name in keep_onnx, args.recipes),
                             time.perf_counter())
            committed += DISK_GB.get(name, 24)

    start_what_fits()
    started = time.perf_counter()
    while steps:
        ready = [step for step in steps if STEPS[step] in data["convert"]
                 and (step != "picture_psnr_db" or steps == [step])]  # after the pictures
        if not ready:  # wait for the next conversion to end
            while not any(p.poll() is not None for p, _ in running.values()):
                time.sleep(2)
            name = next(name for name, (p, _) in running.items() if p.poll() is not None)
            process, began = running.pop(name)
            data["convert"][name] = finish_convert(work, name, process, began)
            if name in keep_onnx and data["convert"][name]["exit"] == 0:
                key = "unfused_ops" if name == "fp16" else f"unfused_ops_{name}"
                run_step(data, key, running, write_unfused, work, keep_onnx[name], name, UNFUSED_FROM[name][0])
            start_what_fits()
            save()
            continue
        step = ready[0]
        steps.remove(step)
        if data["convert"][STEPS[step]]["exit"] != 0:
            data[step] = {"error": f"the {STEPS[step]} conversion failed"}
            continue
        wait_for_gpu()
        run_step(data, step, running, *step_call(step, work, args))
        save()
    data["total_s"] = round(time.perf_counter() - started)
    save()
    (work / "done").write_text("done\n")
    report(data)
    return 0


def step_call(step: str, work: Path, args: argparse.Namespace) -> tuple:
    """(function, arguments) of a step."""
    runs, peer_runs, timeout = args.runs, args.peer_runs, args.timeout
    return {
        "peer_b2": (peer, work, "peer", "fp16", "unet,vae_decoder", 2, "litert", peer_runs, timeout),
        "picture_fp16": (picture, generate_command(work, "fp16", []), runs, timeout),
        # LiteRT's first fp32 UNet call (its kernels compiled) took 107 s on the H200 (2026-11-29), and
        # its fp32 UNet was measured then (522.4 ms): fp16, the missing one, is timed here
        "peer_litert": (peer, work, "peer", "fp16", "unet", 2, "difflite,torch", peer_runs, min(timeout, 540), None,
                        "fp16"),
        "peer_litert_vae": (peer, work, "peer_litert_vae", "fp16", "vae_decoder", 2, "difflite,torch", peer_runs,
                            min(timeout, 420)),
        "picture_diffusers_fp16": (diffusers_picture, work, runs, timeout),
        "peer_b1": (peer, work, "peer_b1", "b1", "unet", 1, "litert", peer_runs, timeout),
        # LiteRT's fp16 UNet at batch 1 beside difflite's (its unfused folder is written after the b1
        # conversion); fp32 left out as in peer_litert
        "peer_litert_b1": (peer, work, "peer_litert_b1", "b1", "unet", 1, "torch", peer_runs, min(timeout, 540), None,
                           "fp16"),
        "peer_int4": (peer, work, "peer_int4", "int4", "unet,vae_decoder", 1, "litert,torch", peer_runs, timeout),
        "peer_int4_apart": (peer, work, "peer_int4_apart", "int4", "unet", 1, "litert,torch", peer_runs, timeout,
                            APART),
        "picture_int4_low_memory": (picture, generate_command(work, "int4", ["--low-memory"]), runs, timeout),
        "picture_int4_low_memory_apart": (picture, ["env", *[f"{k}={v}" for k, v in APART.items()],
                                                    *generate_command(work, "int4", ["--low-memory"])], runs, timeout),
        "peer_int4_scratch_apart": (peer, work, "peer_int4_scratch_apart", "int4", "unet,vae_decoder", 1,
                                    "litert,torch", peer_runs, timeout, SCRATCH_APART),
        "picture_int4_low_memory_scratch_apart": (picture, ["env", *[f"{k}={v}" for k, v in SCRATCH_APART.items()],
                                                            *generate_command(work, "int4", ["--low-memory"])], runs,
                                                  timeout),
        "peer_int4_previous": (peer, work, "peer_int4_previous", "int4", "unet,vae_decoder", 1, "litert,torch",
                               peer_runs, timeout, PREVIOUS_OPLIB),
        "picture_int4_low_memory_previous": (picture, ["env", *[f"{k}={v}" for k, v in PREVIOUS_OPLIB.items()],
                                                       *generate_command(work, "int4", ["--low-memory"])], runs,
                                             timeout),
        "peer_int8": (peer, work, "peer_int8", "int8", "unet,vae_decoder", 2, "litert,torch", peer_runs, timeout),
        "peer_int8_b1": (peer, work, "peer_int8_b1", "int8_b1", "unet,vae_decoder", 1, "litert,torch", peer_runs,
                         timeout),
        "picture_int8": (picture, generate_command(work, "int8", []), runs, timeout),
        "picture_turbo": (picture, generate_command(work, "turbo", TURBO_FLAGS), runs, timeout),
        "picture_diffusers_turbo": (diffusers_picture, work, runs, timeout, 4, SIZE // 2, 0.0),
        "peer_vae_unbanded": (peer, work, "peer_vae_unbanded", "fp16", "vae_decoder", 2, "litert,torch", peer_runs,
                              timeout, UNBANDED),
        "gpu_context": (gpu_context, runs, timeout),
        "picture_fp32": (picture, generate_command(work, "fp32", []), 1, timeout, False),
        "picture_psnr_db": (picture_psnr, work),
    }[step]


def run_step(data: dict, key: str, running: dict, fn, *fn_args) -> None:
    """data[key] = fn(*fn_args), or the error it raised (the other steps go on), with its seconds
    and the conversions running beside it."""
    log(f"step {key}")
    started = time.perf_counter()
    try:
        data[key] = fn(*fn_args) or {}
    except Exception as exc:  # noqa: BLE001 (keep the other steps when one fails)
        data[key] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    data[key]["step_s"] = round(time.perf_counter() - started)
    data[key]["conversions_running"] = [name for name, (p, _) in running.items() if p.poll() is None]


def diffusers_picture(work: Path, runs: int, timeout: float, steps: int = 20, size: int | None = None,
                      guidance: float = 5.0) -> dict:
    """diffusers' fp16 SDXL pipeline from its saved folder, `runs` fresh processes (guidance 5, as
    difflite's SDXL default; guidance <= 1 with SDXL-Turbo's scheduler)."""
    if not (work / "diffusers" / "model_index.json").is_file():
        # in a child: building the preset here would leave this process ~10 GB for the rest of the run
        subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                        "import sdxl_gpu; sdxl_gpu.save_diffusers_folder(Path(sys.argv[2]))",
                        str(Path(__file__).resolve().parent), str(work)], cwd=ROOT, check=True, timeout=timeout)
    return picture([sys.executable, "-c", DIFFUSERS_CHILD, str(work / "diffusers"), PROMPT, str(steps),
                    str(size or SIZE), str(guidance)], runs, timeout, warm_up=False)


def picture_psnr(work: Path) -> dict:
    """PSNR (dB, 8-bit) of the folders' 20-step pictures: fp16 / int8 / int4 against the fp32 files'
    picture ("vs_fp32", issue 32 item 5's reference) and int8 / int4 against the fp16 one
    ("vs_fp16"); the same prompt, seed and scheduler, only the weights' storage differs."""
    import numpy as np
    from PIL import Image

    def pixels(name: str):
        path = work / f"{name}.png"
        return np.asarray(Image.open(path).convert("RGB"), np.float64) if path.is_file() else None

    def psnr(image, reference) -> float:
        mse = float(np.mean((image - reference) ** 2))
        return round(float(10 * np.log10(255.0**2 / mse)), 2) if mse > 0 else float("inf")

    result = {}
    for reference_name, names in (("fp32", ("fp16", "int8", "int4")), ("fp16", ("int8", "int4"))):
        reference = pixels(reference_name)
        if reference is not None:
            scores = {name: psnr(image, reference) for name in names if (image := pixels(name)) is not None}
            if scores:
                result[f"vs_{reference_name}"] = scores
    return result


def report(data: dict) -> None:
    where = f"{data['machine'].get('gpu')}, {data['machine']['date']}"
    print(f"\n| conversion ({where}) | wall, s | peak RSS, MB | files, MiB |\n|---|---|---|---|")
    for name, r in data.get("convert", {}).items():
        print(f"| {name} | {r.get('wall_s')} | {r.get('peak_rss_mb')} | {r.get('total_mib', '-')} |")
    print(f"\n| per call ({where}) | median ms | range | runs |\n|---|---|---|---|")
    for key in ("peer_b2", "peer_vae_unbanded", "peer_litert", "peer_litert_vae", "peer_b1", "peer_litert_b1", "peer_int4",
                "peer_int4_apart", "peer_int4_scratch_apart", "peer_int8", "peer_int8_b1"):
        for name, r in data.get(key, {}).items():
            if isinstance(r, dict) and "median_ms" in r:
                print(f"| {key}: {name} | {r['median_ms']} | {r['min_ms']}-{r['max_ms']} | {r['runs']} |")
            elif isinstance(r, dict) and "error" in r:
                print(f"| {key}: {name} | {r['error'][:120]} | | |")
    print(f"\n| 20-step picture from the shell ({where}) | wall, s | peak RSS, MiB | GPU, MiB | host + GPU at once, MiB |"
          "\n|---|---|---|---|---|")
    for key in ("picture_fp32", "picture_fp16", "picture_int8", "picture_int4_low_memory",
                "picture_int4_low_memory_apart", "picture_int4_low_memory_scratch_apart", "picture_diffusers_fp16", "picture_turbo", "picture_diffusers_turbo",
                "gpu_context"):
        r = data.get(key)
        if r and "wall_s" in r:
            gpu, both = r["gpu_mib"], r.get("host_plus_gpu_mib")
            print(f"| {key} | {cell(r['wall_s'])} | {cell(r['peak_rss_mib'], 0)} | {cell(gpu, 0) if gpu else '-'} "
                  f"| {cell(both, 0) if both else '-'} |")
        elif r:
            print(f"| {key} | {r.get('error', '')[:200]} | | |")
    print(f"\npicture PSNR, dB: {data.get('picture_psnr_db')}")


def cell(s: dict, digits: int = 2) -> str:
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f}, {s['runs']} runs)"


if __name__ == "__main__":
    sys.exit(main())
