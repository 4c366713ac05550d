"""Benchmark: the OpenCL runtime as a phone sees it (memory, start-up, a whole picture).

For an output folder (measured so far: SD 1.5 fp16 at 512x512, default profile, batch 2):

- per component, in a fresh process each (`difflite bench OUT --components C --backend opencl`):
  cold start (empty program caches: difflite's, PoCL's and NVIDIA's) and warm start (filled);
  load (interpreter + delegate + upload), first call, steady call, peak resident memory with its
  anonymous / file-backed split, the op library's device allocations and, on NVIDIA, the GPU
  memory nvidia-smi lists for the process;
- `difflite generate` from the shell, warm caches, with and without --low-memory: wall time and
  the child's peak resident memory (and its GPU memory, polled);
- optionally diffusers' fp16 StableDiffusionPipeline from a saved folder, in a cold process.

The targets of the runtime issue are evaluated into the JSON ("targets") and printed as a table.

    python benchmarks/runtime_memory.py /work/out/sd15 --steps 2 --runs 1 --save benchmarks/results/runtime_memory_pocl_$(date +%Y-%m).json
    DIFFLITE_KERNELS=tiled python benchmarks/runtime_memory.py OUT --components "" --generate-modes low_memory --steps 1  # a phone's peak, on PoCL
    python benchmarks/runtime_memory.py OUT --diffusers-folder F --save benchmarks/results/runtime_memory_h100_$(date +%Y-%m).json  # GPU
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.core.childmem import measure_command  # noqa: E402

CLI = [sys.executable, "-m", "difflite"]
COMPONENTS = ("text_encoder", "unet", "vae_decoder")
MIB = 1 << 20


def cache_env(folder: Path) -> dict:
    """Every program cache a process may use, under `folder`."""
    return {**os.environ, "XDG_CACHE_HOME": str(folder / "xdg"), "POCL_CACHE_DIR": str(folder / "pocl"),
            "CUDA_CACHE_PATH": str(folder / "cuda")}


def timed_child(command: list[str], env: dict) -> dict:
    """Runs `command`; wall seconds, exit status, output, its own peak RSS (MB) and GPU memory
    (difflite.core.childmem)."""
    run = measure_command(command, env=env)
    return {"wall_s": run.wall_s, "returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr[-4000:],
            "peak_rss_mb": run.peak_rss_mb, "gpu_peak_mb": run.gpu_peak_mb}


def bench_component(out: Path, name: str, caches: Path, runs: int, oplib: Path | None = None,
                    warmup: int = 1) -> dict:
    command = [*CLI, "bench", str(out), "--components", name, "--backend", "opencl", "--runs", str(runs),
               "--warmup", str(warmup), "--json"]
    env = cache_env(caches)
    if oplib is not None:
        env["DIFFLITE_OPLIB"] = str(oplib)
    done = timed_child(command, env)
    if done["returncode"] != 0:
        raise SystemExit(f"bench {name} failed:\n{done['stderr']}")
    result = json.loads(done["stdout"])["components"][name]
    device = result.get("device") or {}
    stats = device.get("stats", {})
    keep = ("load_ms", "first_ms", "median_ms", "peak_rss_mb", "baseline_rss_mb", "peak_anon_mb", "peak_file_mb",
            "after_load_anon_mb", "after_load_file_mb")
    return {**{k: result.get(k) for k in keep},
            "device_mb": {k: device.get(k) for k in ("weights_mb", "intermediates_mb", "scratch_mb", "total_mb",
                                                     "nvidia_smi_mb")},
            "programs": {k: stats.get(k) for k in ("programs_built", "programs_compiled", "programs_from_cache",
                                                   "build_seconds", "claim_seconds", "upload_seconds")},
            "zero_copy_mb": stats.get("weights_zero_copy_bytes", 0) / MIB,
            "quantized_mb": stats.get("weights_quantized_bytes", 0) / MIB,
            "dequantized_mb": stats.get("weights_dequantized_bytes", 0) / MIB,
            "model_pages_released_mb": stats.get("model_pages_released_bytes", 0) / MIB,
            "device_name": stats.get("device"), "gpu_peak_mb": done["gpu_peak_mb"], "wall_s": done["wall_s"]}


def run_generate(out: Path, caches: Path, steps: int, prompt: str, low_memory: bool) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        command = [*CLI, "generate", str(out), prompt, "-o", str(Path(folder) / "image.png"), "--steps", str(steps),
                   "--backend", "opencl", "--json", *(["--low-memory"] if low_memory else [])]
        done = timed_child(command, cache_env(caches))
    if done["returncode"] != 0:
        raise SystemExit(f"generate failed:\n{done['stderr']}")
    report = json.loads(done["stdout"])
    return {"wall_s": done["wall_s"], "timings": report["timings"], "low_memory": low_memory, "steps": steps,
            "peak_rss_mb": done["peak_rss_mb"], "gpu_peak_mb": done["gpu_peak_mb"],
            "memory_mb": report.get("memory_mb")}  # generate's own: the peak so far after each stage


DIFFUSERS_CHILD = """
import sys, time, torch
from diffusers import StableDiffusionPipeline
folder, prompt, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
pipe = StableDiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float16, safety_checker=None,
                                               requires_safety_checker=False).to("cuda")
pipe.set_progress_bar_config(disable=True)
start = time.perf_counter()
pipe(prompt, num_inference_steps=steps, height=512, width=512, output_type="np")
torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def run_diffusers(folder: Path, steps: int, prompt: str) -> dict:
    done = timed_child([sys.executable, "-c", DIFFUSERS_CHILD, str(folder), prompt, str(steps)], dict(os.environ))
    if done["returncode"] != 0:
        return {"error": done["stderr"][-1500:]}
    return {"wall_s": done["wall_s"], "steps_s": float(done["stdout"].split()[-1]),
            "peak_rss_mb": done["peak_rss_mb"], "gpu_peak_mb": done["gpu_peak_mb"]}


def save_diffusers_folder(out: Path, folder: Path) -> None:
    """The conversion's source weights as a diffusers StableDiffusionPipeline folder in fp16, for
    the diffusers reference (the same weights difflite runs)."""
    import torch
    from diffusers import StableDiffusionPipeline

    from difflite.folder.output_folder import OutputFolder
    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.verify import load_source

    source = load_source(OutputFolder.read(out), None, None)
    pipe = StableDiffusionPipeline(vae=source.vae, text_encoder=source.text_encoder, tokenizer=source.tokenizer,
                                   unet=source.unet, scheduler=diffusers_scheduler("default", source.scheduler_config),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.to(torch.float16).save_pretrained(str(folder))


def is_pocl(result: dict) -> bool:
    device = result.get("device") or ""
    return "pthread" in device or "cpu" in device.lower()


def smallest_component(result: dict) -> str:
    return min(result["components"], key=lambda n: result["components"][n]["warm"]["device_mb"]["total_mb"] or 0.0)


def context_mb(result: dict) -> float | None:
    """The GPU memory a process holds beyond what the op library allocated (the driver's context,
    ~0.6 GB on an H100): nvidia-smi's figure for the smallest component minus its allocations
    (so that component is the reference, not checked); None without components."""
    if not result["components"]:
        return None
    device = result["components"][smallest_component(result)]["warm"]["device_mb"]
    return None if device["nvidia_smi_mb"] is None else device["nvidia_smi_mb"] - device["total_mb"]


def targets(result: dict, pocl: bool) -> list[dict]:
    rows = []
    context = None if pocl else context_mb(result)
    for name, r in result["components"].items():
        warm, cold = r["warm"], r["cold"]
        plan = warm["device_mb"]["total_mb"] or 0.0
        if pocl:
            rows.append({"target": f"{name} peak RSS <= 1.15 x plan + 200 MB", "value": warm["peak_rss_mb"],
                         "limit": 1.15 * plan + 200, "ok": warm["peak_rss_mb"] <= 1.15 * plan + 200})
        else:
            host = warm["peak_rss_mb"] - warm["baseline_rss_mb"]
            rows.append({"target": f"{name} host peak <= baseline + 1 GB", "value": host, "limit": 1024,
                         "ok": host <= 1024})
            gpu = warm["device_mb"]["nvidia_smi_mb"]
            if gpu is not None and context is not None and name != smallest_component(result):
                held = gpu - context
                rows.append({"target": f"{name} GPU memory less the context ({context:.0f} MB) within 10% of "
                                       f"the op library's allocations ({plan:.0f} MB)", "value": held,
                             "limit": 1.1 * plan, "ok": abs(held - plan) <= 0.1 * plan})
        if name == "unet" and not pocl:  # start-up targets are the GPU's (PoCL computes on the CPU)
            for label, run, limit in (("cold", cold, 15.0), ("warm", warm, 3.0)):
                seconds = (run["load_ms"] + run["first_ms"]) / 1e3
                rows.append({"target": f"unet load + first call, {label} <= {limit:.0f} s", "value": seconds,
                             "limit": limit, "ok": seconds <= limit})
    gen = result.get("generate", {})
    if pocl and "low_memory" in gen and gen["low_memory"]["peak_rss_mb"]:
        rows.append({"target": "generate --low-memory peak <= 2.3 GB", "value": gen["low_memory"]["peak_rss_mb"],
                     "limit": 2.3 * 1024, "ok": gen["low_memory"]["peak_rss_mb"] <= 2.3 * 1024})
    if not pocl and "resident" in gen:
        wall = gen["resident"]["wall_s"]
        rows.append({"target": "generate 20 steps, warm, <= 6 s wall", "value": wall, "limit": 6.0, "ok": wall <= 6.0})
        ref = result.get("diffusers", {}).get("wall_s")
        if ref:
            rows.append({"target": "generate no slower than diffusers (cold process)", "value": wall, "limit": ref,
                         "ok": wall <= ref})
    return rows


def print_tables(result: dict) -> None:
    print(f"\n{result.get('device', 'device not read')}, {result['out']}, kernels {result.get('kernels', 'auto')}\n")
    print("| component | start | load s | first call s | steady s | peak RSS MB (anon / file) | device MB "
          "(weights + intermediates + scratch) | nvidia-smi MB | programs compiled / from cache |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = list(result["components"].items())
    if "baseline_unet" in result:
        rows.append(("unet (baseline library)", result["baseline_unet"]))
    for name, r in rows:
        for label in ("cold", "warm"):
            x = r[label]
            d, p = x["device_mb"], x["programs"]
            print(f"| {name} | {label} | {x['load_ms'] / 1e3:.2f} | {x['first_ms'] / 1e3:.2f} | "
                  f"{x['median_ms'] / 1e3:.3f} | {x['peak_rss_mb']:.0f} ({x['peak_anon_mb']:.0f} / "
                  f"{x['peak_file_mb']:.0f}) | {d['total_mb']:.0f} ({d['weights_mb']:.0f} + "
                  f"{d['intermediates_mb']:.0f} + {d['scratch_mb']:.0f}) | {d['nvidia_smi_mb']} | "
                  f"{p['programs_compiled']} / {p['programs_from_cache']} |")
    for label, g in result.get("generate", {}).items():
        print(f"\ngenerate ({label}, {g['steps']} steps): {g['wall_s']:.2f} s wall, peak RSS {g['peak_rss_mb']} MB, "
              f"GPU {g['gpu_peak_mb']} MB; timings {g['timings']}")
        for stage, m in (g.get("memory_mb") or {}).items():
            print(f"  after {stage}: peak {m['peak_rss_mb']} MB, resident {m['rss_after_mb']} MB")
    if "diffusers" in result:
        print(f"\ndiffusers fp16, cold process: {result['diffusers']}")
    print("\n| target | value | limit | met |\n|---|---|---|---|")
    for t in result["targets"]:
        print(f"| {t['target']} | {t['value']:.2f} | {t['limit']:.2f} | {'yes' if t['ok'] else 'NO'} |")


def save(result: dict, path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--components", default=",".join(COMPONENTS))
    parser.add_argument("--runs", type=int, default=3, help="steady calls per component")
    parser.add_argument("--warmup", type=int, default=1, help="calls before the steady ones (0: the first is timed)")
    parser.add_argument("--steps", type=int, default=20, help="generate's steps")
    parser.add_argument("--prompt", default="a photo of an astronaut riding a horse on mars")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--generate-modes", default="resident,low_memory",
                        help="which generate runs: resident, low_memory (each after a 1-step run that fills the caches)")
    parser.add_argument("--diffusers-folder", type=Path,
                        help="time diffusers' fp16 pipeline from this folder too (GPU); made from OUT's source if missing")
    parser.add_argument("--baseline-oplib", type=Path,
                        help="also time the UNet cold and warm with this op library (e.g. an earlier commit's)")
    parser.add_argument("--save", type=Path)
    parser.add_argument("--report", type=Path, help="print the tables and targets of a saved result and stop")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.report:
        result = json.loads(args.report.read_text())
        result["targets"] = targets(result, is_pocl(result))
        print_tables(result)
        return 0
    result = {"out": str(args.out), "components": {}, "generate": {}}
    with tempfile.TemporaryDirectory(prefix="difflite-caches-") as scratch:
        caches = Path(scratch)
        for name in [c for c in args.components.split(",") if c]:  # --components "": generate alone
            shutil.rmtree(caches, ignore_errors=True)
            caches.mkdir()
            print(f"[runtime_memory] {name}: cold", file=sys.stderr)
            cold = bench_component(args.out, name, caches, args.runs, warmup=args.warmup)
            print(f"[runtime_memory] {name}: warm", file=sys.stderr)
            warm = bench_component(args.out, name, caches, args.runs, warmup=args.warmup)
            result["components"][name] = {"cold": cold, "warm": warm}
            save(result, args.save)  # what is measured so far survives a stopped run
        if result["components"]:
            result["device"] = warm["device_name"]
        result["kernels"] = os.environ.get("DIFFLITE_KERNELS", "auto")  # tiled on PoCL: a GPU's kernels
        if args.baseline_oplib:
            shutil.rmtree(caches, ignore_errors=True)
            caches.mkdir()
            runs = {}
            for label in ("cold", "warm"):
                print(f"[runtime_memory] unet with {args.baseline_oplib}: {label}", file=sys.stderr)
                runs[label] = bench_component(args.out, "unet", caches, args.runs, args.baseline_oplib)
            result["baseline_unet"] = {"oplib": str(args.baseline_oplib), **runs}
        if not args.no_generate:
            for label in args.generate_modes.split(","):
                low = label == "low_memory"
                print(f"[runtime_memory] generate ({label})", file=sys.stderr)
                run_generate(args.out, caches, 1, args.prompt, low)  # the caches of every component
                result["generate"][label] = run_generate(args.out, caches, args.steps, args.prompt, low)
                save(result, args.save)
    if args.diffusers_folder:
        if not (args.diffusers_folder / "model_index.json").is_file():
            print("[runtime_memory] saving the diffusers folder", file=sys.stderr)
            save_diffusers_folder(args.out, args.diffusers_folder)
        print("[runtime_memory] diffusers", file=sys.stderr)
        result["diffusers"] = run_diffusers(args.diffusers_folder, args.steps, args.prompt)
    result["targets"] = targets(result, is_pocl(result))
    save(result, args.save)
    print_tables(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
