"""GPU peer benchmark: the SD 1.5 UNet step (512x512, batch 2) and VAE decode on one GPU, side by side
in one run:

- difflite: the fused .tflite through libdifflite_delegate.so, backend=opencl (ai-edge-litert's
  interpreter; each invoke includes copying inputs to and outputs from the GPU), precision=fp32
  and fp16 (half storage; on NVIDIA's OpenCL its GEMMs take tensor cores, unless
  DIFFLITE_TENSOR_CORES=off in the environment: how a phone profile's own kernels are timed);
- Google's LiteRT GPU accelerator (ML Drift over WebGPU/Vulkan) on the unfused difflite .tflite of
  the same weights, fp32 (enforce_f32) and fp16; its run_by_index returns before the GPU is done,
  so N queued runs are timed up to one final read;
- PyTorch eager on CUDA: fp32 with TF32 off, and fp16 (SDPA).

    python benchmarks/gpu_peer.py --work /tmp/peer [--runs 10] [--components unet,vae_decoder]
        [--precisions fp32,fp16] [--litert-precisions fp32,fp16] [--skip difflite,litert,torch]

Writes benchmarks/results/gpu_peer_<device>.json (or $OUT/...) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def log(message: str) -> None:
    print(f"[gpu_peer {time.strftime('%H:%M:%S')}] {message}", flush=True)


def convert(work: Path, model: str, size: int, components: str, batch: int,
            extra_args: list[str]) -> tuple[Path, Path]:
    """Fused folder via the CLI (keeping the ONNX), then the unfused .tflite files written from the
    same ONNX graphs (same weights, one export)."""
    fused = work / "fused"
    unfused = work / "unfused"
    if not (fused / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "difflite", "convert", model, "-o", str(fused),
                        "--components", components, "--batch", str(batch), "--precision", "fp16",
                        "--height", str(size), "--width", str(size), "--keep-onnx", *extra_args],
                       check=True, cwd=ROOT)
    if not unfused.is_dir():
        from difflite.compiler.tflite.writer import load_onnx, write_tflite
        from difflite.passes import run_passes

        unfused.mkdir(parents=True)
        for name in components.split(","):
            graph = load_onnx(fused / "onnx" / f"{name}.onnx")
            run_passes(graph, {"gelu", "groupnorm", "attention"})
            result = write_tflite(graph, precision="fp16", fuse=frozenset())
            (unfused / f"{name}.tflite").write_bytes(result.data)
            (unfused / f"{name}.json").write_text(json.dumps({"inputs": result.inputs, "outputs": result.outputs}))
            log(f"unfused {name}: {sum(result.op_histogram.values())} ops")
    return fused, unfused


def random_inputs(entries: list[dict], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs in the .tflite's own layout (NHWC where the manifest says so); each drawn from a
    generator seeded by its name, so the order of `entries` does not matter."""
    feeds = {}
    for e in entries:
        rng = np.random.default_rng([seed, zlib.crc32(e["name"].encode())])
        if e["dtype"].startswith("int"):
            feeds[e["name"]] = rng.integers(0, 400, e["shape"]).astype(e["dtype"])
        elif e["name"] == "timestep":
            feeds[e["name"]] = np.full(e["shape"], 500.0, np.float32)
        else:
            feeds[e["name"]] = rng.standard_normal(e["shape"]).astype(np.float32)
    return feeds


def summarize(times_ms: list[float]) -> dict:
    return {"median_ms": round(statistics.median(times_ms), 3), "min_ms": round(min(times_ms), 3),
            "max_ms": round(max(times_ms), 3), "runs": len(times_ms)}


_REFERENCE: dict[str, np.ndarray] = {}
# Interpreters with the difflite OpenCL delegate stay alive until the process exits: tearing one
# down on NVIDIA's OpenCL segfaults in clReleaseMemObject (open bug, see docs/lab-notebook.md), which would
# lose the measurements taken after it.
_KEEP_ALIVE: list = []


def reference_output(unfused_path: Path) -> np.ndarray:
    """XNNPACK (CPU) on the unfused file with the same inputs: what every GPU engine must match."""
    if str(unfused_path) not in _REFERENCE:
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_path=str(unfused_path), num_threads=os.cpu_count()).get_signature_runner()
        entries = [{"name": k, "shape": list(v["shape"]), "dtype": str(np.dtype(v["dtype"]))}
                   for k, v in runner.get_input_details().items()]
        _REFERENCE[str(unfused_path)] = next(iter(runner(**random_inputs(entries)).values()))
    return _REFERENCE[str(unfused_path)]


def relative_error(actual: np.ndarray, reference: np.ndarray) -> float:
    actual = np.asarray(actual, np.float64).reshape(reference.shape)
    return float(np.abs(actual - reference).max() / max(np.abs(reference).max(), 1e-30))


def delegate_options(spec: str) -> dict[str, str]:
    """--precisions entry -> the delegate's options: PRECISION[:KEY=VALUE[:...]], e.g. fp16:math=fp32
    (half storage, float arithmetic on a device with cl_khr_fp16)."""
    precision, *extra = spec.split(":")
    options = {"precision": precision}
    for item in extra:
        key, _, value = item.partition("=")
        if not key or not value:
            raise SystemExit(f"--precisions {spec}: {item!r} is not KEY=VALUE")
        options[key] = value
    return options


def time_difflite(path: Path, entries: list[dict], runs: int, library: Path, precision: str) -> dict:
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    stats_path = Path(f"/tmp/difflite_stats_{path.stem}_{precision.replace(':', '_').replace('=', '-')}.json")
    start = time.perf_counter()
    delegate = load_delegate(str(library), {"backend": "opencl", **delegate_options(precision),
                                            "stats_path": str(stats_path)})
    interpreter = Interpreter(model_path=str(path), experimental_delegates=[delegate])
    _KEEP_ALIVE.append((interpreter, delegate))
    runner = interpreter.get_signature_runner("serving_default")
    feeds = random_inputs(entries)
    first = next(iter(runner(**feeds).values()))
    prepare_s = time.perf_counter() - start
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        runner(**feeds)
        times.append((time.perf_counter() - t) * 1e3)
    result = {**summarize(times), "first_run_s": round(prepare_s, 2)}
    unfused = path.parent.parent / "unfused" / path.name
    if unfused.is_file():  # a folder may leave a component's --no-fuse file out (no reference then)
        result["rel_err_vs_xnnpack"] = relative_error(first, reference_output(unfused))
    if stats_path.is_file():
        result["delegate_stats"] = json.loads(stats_path.read_text())
    return result


# LiteRT GPU precision: GpuOptions' enforce_f32 (fp16: half arithmetic allowed).
LITERT_PRECISIONS = {"fp32": True, "fp16": False}


def time_litert_gpu(path: Path, runs: int, enforce_f32: bool) -> dict:
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.options import GpuOptions, HardwareAccelerator, Options

    start = time.perf_counter()
    model = CompiledModel.from_file(str(path), options=Options(
        HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=enforce_f32)))
    inputs = model.create_input_buffers(0)
    outputs = model.create_output_buffers(0)
    in_details = model.get_input_tensor_details("serving_default")
    entries = [{"name": k, "shape": list(v["shape"]), "dtype": str(v["dtype"])} for k, v in in_details.items()]
    feeds = random_inputs(entries)
    for buffer, info in zip(inputs, in_details.values()):
        buffer.write(feeds[info["name"]].reshape(-1))
    out_info = list(model.get_output_tensor_details("serving_default").values())[0]
    out_size = int(np.prod(out_info["shape"]))
    model.run_by_index(0, inputs, outputs)
    first = outputs[0].read(out_size, np.float32)
    compile_s = time.perf_counter() - start
    # Queued runs, then one read that waits for the GPU: the mean per run, five times.
    per_run = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(runs):
            model.run_by_index(0, inputs, outputs)
        outputs[0].read(out_size, np.float32)
        per_run.append((time.perf_counter() - t) * 1e3 / runs)
    return {**summarize(per_run), "compile_and_first_s": round(compile_s, 2),
            "fully_accelerated": bool(model.is_fully_accelerated()),
            "finite": bool(np.isfinite(first).all()),
            "rel_err_vs_xnnpack": relative_error(first, reference_output(path))}


def time_torch(model: str, size: int, components: list[str], runs: int, batch: int) -> dict:
    import torch

    from difflite.compiler import export, models

    pipe = models.load_pipeline(model)
    results = {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for dtype_name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        for name in components:
            spec = export.component_spec(pipe, name, size, size, batch if name == "unet" else 1)
            module = spec.module.to("cuda", dtype)
            args = [t.to("cuda") if t.dtype == torch.int64 else t.to("cuda", dtype) for t in spec.example_inputs]
            with torch.no_grad():
                for _ in range(3):
                    module(*args)
                torch.cuda.synchronize()
                times = []
                for _ in range(runs):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    module(*args)
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b))
            results[f"{name}/torch_{dtype_name}"] = summarize(times)
            module.to("cpu", torch.float32)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/difflite_peer"))
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--size", type=int, default=512, help="image height and width")
    parser.add_argument("--components", default="unet,vae_decoder")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--library", type=Path, default=ROOT / "custom_ops" / "build" / "libdifflite_delegate.so")
    parser.add_argument("--skip", default="", help="comma-separated: difflite,litert,torch")
    parser.add_argument("--precisions", default="fp32,fp16",
                        help="difflite's delegate precisions (fp16: half storage, float arithmetic "
                             "where the GPU has no cl_khr_fp16), each PRECISION[:KEY=VALUE...] with more "
                             "delegate options, e.g. fp16:math=fp32")
    parser.add_argument("--litert-precisions", default=",".join(LITERT_PRECISIONS),
                        help="LiteRT GPU precisions: fp32 (enforce_f32) and/or fp16")
    parser.add_argument("--convert-args", default="--device-profile nvidia-h100",
                        help="more `difflite convert` arguments for the fused files (default: the lent GPU's "
                             "device profile; the generic one hints the partial softmax and fewer Winograd layers)")
    args = parser.parse_args()
    if not set(args.litert_precisions.split(",")) <= set(LITERT_PRECISIONS):
        parser.error(f"--litert-precisions {args.litert_precisions}: each of fp32, fp16")
    skip = set(filter(None, args.skip.split(",")))
    components = args.components.split(",")
    results: dict = {"components": components, "batch": args.batch, "convert_args": args.convert_args}
    device = os.environ.get("DIFFLITE_DEVICE_NAME", "gpu")
    out_dir = Path(os.environ.get("OUT", ROOT / "benchmarks" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / f"gpu_peer_{device}.json"

    def save() -> None:  # after every measurement: a run cut short keeps what it measured
        result_path.write_text(json.dumps(results, indent=2) + "\n")

    start = time.perf_counter()
    fused, unfused = convert(args.work, args.model, args.size, args.components, args.batch,
                             shlex.split(args.convert_args))
    results["convert_s"] = round(time.perf_counter() - start, 1)
    save()
    manifest = json.loads((fused / "manifest.json").read_text())
    for name in components:
        entries = manifest["components"][name]["inputs"]
        for precision in [] if "difflite" in skip else args.precisions.split(","):
            key = f"{name}/difflite_opencl_{precision}"
            try:
                log(f"difflite opencl {precision} {name}")
                results[key] = time_difflite(fused / f"{name}.tflite", entries, args.runs, args.library,
                                             precision)
            except Exception as exc:  # keep the other columns when one engine fails
                results[key] = {"error": f"{type(exc).__name__}: {exc}"}
            save()
        if "litert" not in skip:
            for label in args.litert_precisions.split(","):
                enforce = LITERT_PRECISIONS[label]
                try:
                    log(f"LiteRT GPU {label} {name}")
                    results[f"{name}/litert_gpu_{label}"] = time_litert_gpu(unfused / f"{name}.tflite", args.runs, enforce)
                except Exception as exc:
                    results[f"{name}/litert_gpu_{label}"] = {"error": f"{type(exc).__name__}: {exc}"}
                save()
    if "torch" not in skip:
        log("PyTorch eager")
        results.update(time_torch(args.model, args.size, components, args.runs, args.batch))
    save()
    print("\n| component / engine | median ms | min | max | notes |\n|---|---|---|---|---|")
    for key, r in results.items():
        if isinstance(r, dict) and "median_ms" in r:
            notes = {k: v for k, v in r.items() if k not in ("median_ms", "min_ms", "max_ms", "runs")}
            print(f"| {key} | {r['median_ms']} | {r['min_ms']} | {r['max_ms']} | {json.dumps(notes)[:200]} |")
        elif isinstance(r, dict) and "error" in r:
            print(f"| {key} | - | - | - | {r['error'][:200]} |")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown (see _KEEP_ALIVE)
