"""Benchmark: run-time LoRAs (issue 34) on SD 1.5, side by side in one process.

Converts SD 1.5 (preset weights, 512x512, fp16, batch 2) twice from one export: with LoRA slots
(convert's default, --lora-slots auto) and without (--lora-slots none); writes three rank-32 kohya
LoRA files over every slot of the UNet and text encoder (seeded random factors); then, in one process
on `--backend`:

- the UNet step (one call, batch 2) of the folder without slots, and of the folder with slots with
  0, 1 and 3 LoRAs active: `--rounds` rounds, each config warmed up then timed `--calls` times per
  round, in turn (side by side); each round's median is one run of the summary;
- the switch: `LitePipeline.set_loras` of one LoRA (read the file, check it, set its factors on the
  loaded text encoder and UNet), alternating between two files, and back to none;
- memory: this process's GPU memory (nvidia-smi) and resident memory after each state, and the
  bytes the op library holds for the active LoRAs' factors (difflite_lora_bytes) against the LoRA
  files' own bytes;
- memory per state in fresh processes (`--memory-runs`, states interleaved): each loads the text
  encoder and UNet with slots, sets 0, 1 or 3 LoRAs, runs both once, and reports resident memory
  (and GPU memory where nvidia-smi sees the process); what 1 and 3 LoRAs add over 0 is set
  against the files' bytes: anonymous resident memory (the model files' mapped pages are page
  cache) plus GPU memory. On PoCL (or a phone) the GPU's buffers are the process's memory.

    python benchmarks/lora.py --work out/lora --rounds 5 --save benchmarks/results/lora_h200_2026-11.json
    python benchmarks/lora.py --work out/lora --model preset:tiny --convert-args "--height 64 --width 64"
    python benchmarks/lora.py --work out/lora --convert-args "--height 256 --width 256" --backend opencl \
        --rounds 0 --memory-runs 5   # the memory rows alone, e.g. on PoCL
    python benchmarks/lora.py --report benchmarks/results/lora_h200_2026-11.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import bench, convert, machine, summary  # noqa: E402

FOLDERS = {"slots": ["--precision", "fp16", "--batch", "2"],
           "no_slots": ["--precision", "fp16", "--batch", "2", "--lora-slots", "none"]}
# --stock: the --no-fuse files with and without their factor inputs on stock LiteRT's GPU engine
STOCK_FOLDERS = {"stock_slots": ["--precision", "fp16", "--batch", "2", "--no-fuse", "--lora-slots", "auto"],
                 "stock": ["--precision", "fp16", "--batch", "2", "--no-fuse", "--lora-slots", "none"]}
STOCK_BENCH = {"--no-fuse, factor inputs (zeros), LiteRT GPU": ("stock_slots", ["--backend", "litert-gpu"]),
               "--no-fuse, no slots, LiteRT GPU": ("stock", ["--backend", "litert-gpu"])}
RANK = 32
LORAS = ("style_a", "style_b", "style_c")
KOHYA_PREFIX = {"unet": "lora_unet_", "text_encoder": "lora_te_"}


def write_lora(folder: Path, path: Path, rank: int, seed: int) -> int:
    """A kohya file with a rank-`rank` layer for every slot of the folder (float16, alpha = rank);
    returns its bytes."""
    import numpy as np
    from safetensors.numpy import save_file

    from difflite.folder.output_folder import OutputFolder

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, entry in OutputFolder.read(folder, check_models=False).components.items():
        if entry.lora_slots is None:
            continue
        for s in entry.lora_slots.slots:
            key = KOHYA_PREFIX[name] + s.module.replace(".", "_")
            tail = (1, 1) if s.conv else ()
            down = rng.standard_normal((rank, s.in_features, *tail)) / np.sqrt(s.in_features)
            up = rng.standard_normal((s.out_features, rank, *tail)) * 0.02
            tensors[f"{key}.lora_down.weight"] = down.astype(np.float16)
            tensors[f"{key}.lora_up.weight"] = up.astype(np.float16)
            tensors[f"{key}.alpha"] = np.array(rank, np.float16)
    save_file(tensors, str(path))
    return path.stat().st_size


def unet_feeds(entry) -> dict:
    import numpy as np

    from difflite.core import lora

    rng = np.random.default_rng(0)
    feeds = {}
    for spec in entry.inputs:
        if spec.name == "timestep":
            feeds[spec.name] = np.full(spec.onnx_shape, 500, spec.dtype)
        elif not lora.is_factor_input(spec.name):
            feeds[spec.name] = rng.standard_normal(spec.onnx_shape).astype(spec.dtype)
    return feeds


def memory_now() -> dict:
    from difflite.core.procmem import nvidia_smi_mb, resident_mb

    return {"rss_mib": resident_mb()["rss"], "gpu_mib": nvidia_smi_mb(os.getpid())}


def measure(work: Path, backend: str, rounds: int, calls: int) -> dict:
    """The UNet step per config, the switch times and memory, in this process."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.backend import choose
    from difflite.runtime.component import open_component
    from difflite.runtime.generate import LitePipeline

    choice = choose(backend)
    files = {name: work / f"{name}.safetensors" for name in LORAS}
    plain_folder = OutputFolder.read(work / "no_slots")
    plain = open_component(plain_folder.components["unet"], choice.backend, plain_folder.precision)
    pipe = LitePipeline(work / "slots", backend=choice.backend)
    unet, _ = pipe.component("unet"), pipe.component("text_encoder")
    feeds = unet_feeds(pipe.folder.components["unet"])
    configs = {"no slots": (plain, None), "slots, 0 LoRAs": (unet, []),
               "slots, 1 LoRA": (unet, [files["style_a"]]), "slots, 3 LoRAs": (unet, [files[n] for n in LORAS])}
    steps = {label: [] for label in configs}
    memory = {label: [] for label in configs}
    held = {}  # bytes the op library holds for the active LoRAs, against the files' own bytes
    for _ in range(rounds):
        for label, (component, loras) in configs.items():
            if loras is not None:
                pipe.set_loras(loras)
            for _ in range(2):
                component(**feeds)
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                component(**feeds)
                times.append((time.perf_counter() - start) * 1000)
            steps[label].append(statistics.median(times))
            memory[label].append(memory_now())
            if loras is not None:
                held[label] = {"bytes": pipe.lora_bytes(), "file_bytes": sum(f.stat().st_size for f in loras)}
    switches = {"none -> style_a": [], "style_a -> style_b": [], "style_b -> none": []}
    for _ in range(rounds):
        pipe.set_loras([])
        for label, loras in (("none -> style_a", [files["style_a"]]), ("style_a -> style_b", [files["style_b"]]),
                             ("style_b -> none", [])):
            pipe.set_loras(loras)
            switches[label].append(pipe.lora_seconds)
    pipe.close()
    plain.close()
    base = steps["no slots"]
    return {
        "backend": choice.backend, "calls_per_round": calls,
        "unet_step_ms": {label: summary(values) for label, values in steps.items()},
        "ratio_to_no_slots": {label: summary([v / b for v, b in zip(values, base)]) for label, values in steps.items()},
        "switch_s": {label: summary(values) for label, values in switches.items()},
        "lora_bytes_held": held,
        "memory": {label: {key: summary([m[key] for m in values]) if all(m[key] is not None for m in values) else None
                           for key in ("rss_mib", "gpu_mib")} for label, values in memory.items()},
    }


MEMORY_STATES = {"0 LoRAs": (), "1 LoRA": ("style_a",), "3 LoRAs": LORAS}


def memory_child(work: Path, backend: str, state: str) -> None:
    """One fresh process's memory in `state` (printed as JSON): the text encoder and UNet loaded
    with slots, the state's LoRAs set, both run once."""
    import numpy as np

    from difflite.core.procmem import high_water_mark_mb
    from difflite.runtime.generate import LitePipeline

    pipe = LitePipeline(work / "slots", backend=backend)
    pipe.set_loras([work / f"{name}.safetensors" for name in MEMORY_STATES[state]])
    unet, text_encoder = pipe.component("unet"), pipe.component("text_encoder")
    unet(**unet_feeds(pipe.folder.components["unet"]))
    spec = pipe.folder.components["text_encoder"].inputs[0]
    text_encoder(**{spec.name: np.zeros(spec.onnx_shape, spec.dtype)})
    from difflite.core.procmem import resident_mb

    print(json.dumps({**memory_now(), "anon_mib": resident_mb()["anon"], "peak_rss_mib": high_water_mark_mb(),
                      "lora_bytes": pipe.lora_bytes(),
                      "pipeline_held_bytes": pipe.loras.held_bytes(), "backend": pipe.backend}))


def memory_states(work: Path, backend: str, runs: int, timeout: float) -> dict:
    """`runs` fresh processes per state, the states in turn; what each state adds over no LoRA."""
    import subprocess

    from difflite.runtime.backend import choose

    backend = choose(backend).backend
    rows = {state: [] for state in MEMORY_STATES}
    for _ in range(runs):
        for state in MEMORY_STATES:
            done = subprocess.run([sys.executable, __file__, "--work", str(work), "--backend", backend,
                                   "--memory-child", state], capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise SystemExit(f"memory child ({state}) failed:\n{done.stderr[-2000:]}")
            rows[state].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def total(row: dict) -> float:
        # anonymous resident memory (what the process allocated; the model files' mapped pages are
        # page cache, evictable and shared) plus the GPU's, where it has its own
        return row["anon_mib"] + (row["gpu_mib"] or 0)

    base = statistics.median(total(r) for r in rows["0 LoRAs"])
    result = {"backend": rows["0 LoRAs"][0]["backend"], "runs": runs, "states": {}}
    for state, values in rows.items():
        file_bytes = sum((work / f"{name}.safetensors").stat().st_size for name in MEMORY_STATES[state])
        added = [total(r) - base for r in values]
        result["states"][state] = {
            "rss_mib": summary([r["rss_mib"] for r in values]), "anon_mib": summary([r["anon_mib"] for r in values]),
            "gpu_mib": summary([r["gpu_mib"] for r in values]) if all(r["gpu_mib"] is not None for r in values) else None,
            "peak_rss_mib": summary([r["peak_rss_mib"] for r in values]),
            "added_mib": summary(added), "file_mib": file_bytes / 2**20,
            "added_x_files": summary([a * 2**20 / file_bytes for a in added]) if file_bytes else None,
            "lora_bytes": values[0]["lora_bytes"], "pipeline_held_bytes": max(r["pipeline_held_bytes"] for r in values)}
    return result


def report_memory(m: dict) -> None:
    print(f"| memory, fresh process each ({m['backend']}, {m['runs']} runs) | RSS MiB | anonymous MiB | GPU MiB "
          f"| added MiB (range) | LoRA files MiB | added x files |")
    print("|---|---|---|---|---|---|---|")
    for state, r in m["states"].items():
        gpu = f"{r['gpu_mib']['median']:.0f}" if r["gpu_mib"] else "-"
        ratio = f"{r['added_x_files']['median']:.3f}" if r["added_x_files"] else "-"
        print(f"| {state} | {r['rss_mib']['median']:.0f} | {r['anon_mib']['median']:.0f} | {gpu} | "
              f"{r['added_mib']['median']:.1f} "
              f"({r['added_mib']['min']:.1f}-{r['added_mib']['max']:.1f}) | {r['file_mib']:.1f} | {ratio} |")


def report(data: dict) -> None:
    print(f"\n{data['machine'].get('gpu') or data['machine'].get('host')}, {data['date']}, LoRA rank {data['rank']}, "
          f"{data['lora_file_mib']:.1f} MiB a file")
    if data.get("memory_states"):
        report_memory(data["memory_states"])
    m = data["measured"]
    if m is None:
        return
    print(f"backend {m['backend']}, "
          f"{data['rounds']} rounds of {m['calls_per_round']} calls")
    print("| UNet step (batch 2) | median ms | range | x no slots | GPU MiB | RSS MiB |")
    print("|---|---|---|---|---|---|")
    for label, s in m["unet_step_ms"].items():
        ratio, mem = m["ratio_to_no_slots"][label], m["memory"][label]
        gpu = f"{mem['gpu_mib']['median']:.0f}" if mem["gpu_mib"] else "-"
        print(f"| {label} | {s['median']:.1f} | {s['min']:.1f}-{s['max']:.1f} | {ratio['median']:.3f} "
              f"({ratio['min']:.3f}-{ratio['max']:.3f}) | {gpu} | {mem['rss_mib']['median']:.0f} |")
    for label, row in data.get("stock", {}).items():
        unet = row.get("components", {}).get("unet")
        print(f"| {label} | " + (f"{unet['median_ms']:.1f} | {unet['min_ms']:.1f}-{unet['max_ms']:.1f} | | | |"
                                  if unet else f"{row.get('error')} | | | | |"))
    if m.get("lora_bytes_held"):
        print("| factors held by the op library | MiB | x the files' bytes |")
        print("|---|---|---|")
        for label, h in m["lora_bytes_held"].items():
            ratio = f"{h['bytes'] / h['file_bytes']:.3f}" if h["file_bytes"] else "-"
            print(f"| {label} | {h['bytes'] / 2**20:.1f} | {ratio} |")
    print("| switch (set_loras) | median s | range |")
    print("|---|---|---|")
    for label, s in m["switch_s"].items():
        print(f"| {label} | {s['median']:.3f} | {s['min']:.3f}-{s['max']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("out/lora"))
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--convert-args", default="", help="extra convert flags, e.g. '--height 64 --width 64'")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rank", type=int, default=RANK)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--stock", action="store_true", help="also the --no-fuse files on stock LiteRT's GPU engine")
    parser.add_argument("--convert-only", action="store_true", help="convert the folders and stop (a second run reuses them)")
    parser.add_argument("--memory-runs", type=int, default=0,
                        help="fresh processes per LoRA state for the memory rows (0: none)")
    parser.add_argument("--memory-child", choices=list(MEMORY_STATES), help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="print the table of a saved run")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    if args.memory_child:
        memory_child(args.work, args.backend, args.memory_child)
        return
    import datetime

    args.work.mkdir(parents=True, exist_ok=True)
    folders = {**FOLDERS, **(STOCK_FOLDERS if args.stock else {})}
    converted = convert(args.work, args.model, shlex.split(args.convert_args), args.timeout, folders)
    if args.convert_only:
        print(json.dumps(converted))
        return
    sizes = [write_lora(args.work / "slots", args.work / f"{name}.safetensors", args.rank, seed)
             for seed, name in enumerate(LORAS)]
    data = {"machine": machine(), "date": datetime.date.today().isoformat(), "model": args.model,
            "convert": converted, "rounds": args.rounds, "rank": args.rank,
            "lora_file_mib": sizes[0] / 2**20,
            "measured": measure(args.work, args.backend, args.rounds, args.calls) if args.rounds else None}
    if args.memory_runs:
        data["memory_states"] = memory_states(args.work, args.backend, args.memory_runs, args.timeout)
    if args.stock:
        data["stock"] = bench(args.work, args.rounds * args.calls, args.timeout, STOCK_BENCH, ("unet",))
    report(data)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
