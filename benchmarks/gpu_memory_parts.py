"""Where a process's GPU memory goes, per component of a converted folder (an NVIDIA GPU: nvidia-smi).

For each component a fresh `difflite bench OUT --components NAME --backend opencl` process; its GPU
memory (nvidia-smi, the largest polled), split into: the driver's context (a process that only opens
an OpenCL context, measured beside it), the op library's own buffers (its stats: weights,
intermediates, scratch) and the rest, what the driver holds for the programs and their launches.
On a phone the first and last parts are the GPU driver's, not the app's files or plans.

    source benchmarks/device_setup.sh
    python benchmarks/gpu_memory_parts.py OUT [--components unet,vae_decoder] [--save parts.json]
    DIFFLITE_TENSOR_CORES=off python benchmarks/gpu_memory_parts.py OUT   # a variant's rest
    DIFFLITE_WEIGHT_SLABS=off python benchmarks/gpu_memory_parts.py OUT   # a buffer per weight
    DIFFLITE_LEND_SCRATCH=off python benchmarks/gpu_memory_parts.py OUT   # op scratch apart
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import BARE_CONTEXT, CLI, folder_arguments, machine, run_measured

TIMEOUT_S = 600
RUNS = "40"


def component_parts(out: Path, name: str, context_mib: float) -> dict:
    """One component's GPU memory in parts, from a fresh bench process."""
    # RUNS calls keep the buffers held for several of nvidia-smi's 0.5 s polls: with 2, a short
    # component's (the VAE decoder's 57 ms) peak fell between two polls (notebook §77)
    measured = run_measured([*CLI, "bench", str(out), "--components", name, "--backend", "opencl", "--runs", RUNS,
                             "--warmup", "1", "--json"], TIMEOUT_S)
    device = json.loads(measured["stdout"])["components"][name]["device"] or {}
    buffers = {key: round(device.get(key, 0.0), 1) for key in ("weights_mb", "intermediates_mb", "scratch_mb")}
    gpu = measured["gpu_mib"]
    return {"gpu_mib": gpu, "context_mib": context_mib, **buffers,
            "rest_mib": round(gpu - context_mib - sum(buffers.values()), 1) if gpu else None,
            # the weights in a few large buffers, or one buffer each (DIFFLITE_WEIGHT_SLABS=off)
            "weight_slabs": (device.get("stats") or {}).get("weight_slabs"),
            # the op scratch placed in the intermediates' buffers (counted there), or 0 with
            # DIFFLITE_LEND_SCRATCH=off (then all in the scratch column)
            "scratch_lent_mb": round(device.get("scratch_lent_mb", 0.0), 1),
            "host_peak_mib": round(measured["peak_rss_mib"]), "host_plus_gpu_mib": measured["host_plus_gpu_mib"]}


def main() -> int:
    parser, args, manifest, names = folder_arguments(__doc__.split("\n\n")[0])
    context = run_measured([sys.executable, "-c", BARE_CONTEXT], TIMEOUT_S)
    if context["gpu_mib"] is None:
        parser.error("nvidia-smi lists no GPU memory for an OpenCL context here (an NVIDIA GPU is needed)")
    data = {"machine": machine(), "out": str(args.out), "context_gpu_mib": context["gpu_mib"],
            "context_host_mib": round(context["peak_rss_mib"]),
            "components": {name: component_parts(args.out, name, context["gpu_mib"]) for name in names}}
    if args.save:
        args.save.write_text(json.dumps(data, indent=2) + "\n")
    print("| component | GPU, MiB | driver's context | weights | intermediates | scratch | rest | host peak |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in data["components"].items():
        print(f"| {name} | {p['gpu_mib']} | {p['context_mib']} | {p['weights_mb']} | {p['intermediates_mb']} "
              f"| {p['scratch_mb']} | {p['rest_mib']} | {p['host_peak_mib']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
