"""Benchmark: the README's headline figures, each the median and range of several runs.

For SD 1.5 (preset weights, 512x512, fp16 storage, convert's defaults: batch 1, the generic profile) it converts
four folders (fused fp16, fused int8, --no-fuse fp16 for stock LiteRT, and fused fp16 with its
weights appended after each flatbuffer: `convert --weights-layout appended`), then measures, each in a
fresh process from the shell as a user runs it:

- `difflite generate` 20 steps with warm program caches: wall time, the process's peak resident
  memory (its own, measured through a launcher: run_measured) and its GPU memory (nvidia-smi, polled), with all models
  resident and with --low-memory; the first run of each folder (empty caches) is reported apart;
- `difflite bench` of the UNet and VAE decoder: per-call median and range in one process, the
  fused files on the op library's backend (--backend auto) and the --no-fuse files on stock
  LiteRT's GPU accelerator (--backend litert-gpu), side by side in one run.

    python benchmarks/headline.py --work out/headline --runs 5 --save results/headline_h200_2026-11.json
    python benchmarks/headline.py --work out/headline --phase convert      # one phase at a time
    python benchmarks/headline.py --work out/headline --folders fp16        # the fp16 rows alone
    python benchmarks/headline.py --report results/headline_h200_2026-11.json

Every figure in the JSON carries its runs, median, min and max, the machine and the date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.core.childmem import measure_command  # noqa: E402

CLI = [sys.executable, "-m", "difflite"]
PROMPT = "a photo of an astronaut riding a horse on mars"
FOLDERS = {  # name: convert flags
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "fp16", "--weights", "int8"],
    "stock": ["--precision", "fp16", "--no-fuse"],
    # the weights after each flatbuffer: loading maps almost none of their pages (the host's peak
    # where the GPU has its own memory)
    "fp16-appended": ["--precision", "fp16", "--weights-layout", "appended"],
}
GENERATE = {  # label: (folder, generate flags)
    "fp16": ("fp16", []),
    "fp16 --low-memory": ("fp16", ["--low-memory"]),
    "int8 --low-memory": ("int8", ["--low-memory"]),
    "fp16 appended": ("fp16-appended", []),
    "fp16 appended --low-memory": ("fp16-appended", ["--low-memory"]),
}
BENCH = {  # label: (folder, bench flags)
    "fp16 difflite (auto)": ("fp16", []),
    "int8 difflite (auto)": ("int8", []),
    "fp16 --no-fuse, stock LiteRT GPU": ("stock", ["--backend", "litert-gpu"]),
}


# A process that only opens an OpenCL context on the GPU and holds a 4-byte buffer: the GPU memory
# the driver gives any process before its first weight (sdxl_gpu.py, gpu_memory_parts.py).
BARE_CONTEXT = """
import time
import numpy as np
import pyopencl as cl
devices = [d for p in cl.get_platforms() for d in p.get_devices()]
gpu = next((d for d in devices if d.type & cl.device_type.GPU), devices[0])
context = cl.Context([gpu])
buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(1, np.float32))
cl.CommandQueue(context).finish()
time.sleep(3)  # held while the GPU memory is polled
print(gpu.name)
"""


def summary(values: list[float]) -> dict:
    return {"runs": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def run_measured(command: list[str], timeout: float) -> dict:
    """One process from the repository root: wall seconds, its own peak RSS MiB and its peak GPU
    MiB (difflite.core.childmem: a small launcher, so that the peak is the command's own and not
    this benchmark's). A failure or a timeout raises with the command's stderr."""
    run = measure_command(command, cwd=ROOT, timeout=timeout)
    if run.returncode != 0:
        status = "timed out" if run.timed_out else f"exited {run.returncode}"
        raise RuntimeError(f"{' '.join(command)} {status}:\n{run.stderr[-3000:]}")
    return {"wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mb, "gpu_mib": run.gpu_peak_mb,
            "host_plus_gpu_mib": run.combined_peak_mb, "at_combined_peak_mib": run.combined_peak_parts,
            "stdout": run.stdout, "stderr": run.stderr}


def convert(work: Path, model: str, extra: list[str], timeout: float, folders: dict = FOLDERS) -> dict:
    """Each of `folders` (name: convert flags) converted into work/name, unless it is there already."""
    result = {}
    for name, flags in folders.items():
        out = work / name
        if (out / "manifest.json").is_file():
            result[name] = {"reused": True}
            continue
        measured = run_measured([*CLI, "convert", model, "-o", str(out), *flags, *extra, "--export-cache",
                                 str(work / "exports")], timeout)
        result[name] = {"wall_s": measured["wall_s"], "peak_rss_mib": measured["peak_rss_mib"]}
        print(f"converted {name} in {measured['wall_s']:.0f} s", flush=True)
    return result


def generate(work: Path, runs: int, steps: int, timeout: float, table: dict = GENERATE,
             extra: tuple[str, ...] = ()) -> dict:
    """Per row of `table` (label: (folder, flags)): a first `generate` (caches filled), then `runs`
    timed ones, each a fresh process; `extra`: flags every row gets."""
    result = {}
    for label, (folder, flags) in table.items():
        command = [*CLI, "generate", str(work / folder), PROMPT, "-o", str(work / f"{folder}.png"), "--steps",
                   str(steps), "--json", *extra, *flags]
        first = run_measured(command, timeout)
        timed = [run_measured(command, timeout) for _ in range(runs)]
        report = json.loads(timed[-1]["stdout"])
        result[label] = {
            "first_run_s": first["wall_s"],
            "wall_s": summary([t["wall_s"] for t in timed]),
            "peak_rss_mib": summary([t["peak_rss_mib"] for t in timed]),
            "gpu_mib": summary([t["gpu_mib"] for t in timed]) if all(t["gpu_mib"] for t in timed) else None,
            "backend_choice": report.get("backend_choice"),
            "unet_per_step_s": report["timings"].get("unet_per_step"), "timings": report["timings"],
            "memory_mb": report.get("memory_mb")}
        print(f"generate {label}: median {result[label]['wall_s']['median']:.2f} s "
              f"({result[label]['wall_s']['min']:.2f}-{result[label]['wall_s']['max']:.2f}, {runs} runs)", flush=True)
    return result


def bench(work: Path, runs: int, timeout: float, table: dict = BENCH,
          components: tuple[str, ...] = ("unet", "vae_decoder")) -> dict:
    """Per row of `table` (label: (folder, flags)): `difflite bench` of `components`, one process."""
    result = {}
    for label, (folder, flags) in table.items():
        command = [*CLI, "bench", str(work / folder), "--components", ",".join(components), "--runs", str(runs),
                   "--warmup", "2", "--json", *flags]
        try:
            measured = run_measured(command, timeout)
        except RuntimeError as exc:
            said = [line for line in str(exc).splitlines() if line.startswith("difflite: error:")]
            result[label] = {"error": (said or str(exc).splitlines())[-1][:300]}
            print(f"bench {label}: {result[label]['error']}", flush=True)
            continue
        text = measured["stdout"]
        data = json.loads(text[text.index("{"):])  # a runtime's own log lines may precede the JSON
        result[label] = {"backend": data["backend"], "backend_choice": data.get("backend_choice"),
                         "components": {name: {key: c[key] for key in ("median_ms", "min_ms", "max_ms", "load_ms",
                                                                       "first_ms", "runs")}
                                        for name, c in data["components"].items()}}
        print(f"bench {label}: " + ", ".join(f"{name} {c['median_ms']:.1f} ms ({c['min_ms']:.1f}-{c['max_ms']:.1f}, "
                                             f"{c['runs']} calls)" for name, c in result[label]["components"].items()),
              flush=True)
    return result


def machine() -> dict:
    gpu = None
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip() or None
    return {"gpu": gpu, "cpus": os.cpu_count(), "python": platform.python_version(), "host": platform.machine(),
            "date": datetime.date.today().isoformat()}


def folder_arguments(description: str):
    """(parser, args, manifest, component names) of a benchmark over a converted folder's
    components: OUT, --components (default: every component of the folder) and --save FILE."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", type=Path, help="a converted folder")
    parser.add_argument("--components", help="comma-separated [default: every component of the folder]")
    parser.add_argument("--save", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    manifest = json.loads((args.out / "manifest.json").read_text())
    names = args.components.split(",") if args.components else list(manifest["components"])
    return parser, args, manifest, names


def cell(s: dict | None, unit: str = "", digits: int = 2) -> str:
    """A summary as "median (min-max)"; "-" where there is none."""
    if not s:
        return "-"
    return f"{s['median']:,.{digits}f}{unit} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f})"


def where(data: dict) -> str:
    return f"{data['machine'].get('gpu') or 'no GPU'}, {data['machine']['date']}"


def generate_table(rows: dict, title: str) -> None:
    print(f"\n| {title} | wall, median (range) | peak RSS, MiB | GPU, MiB | runs |")
    print("|---|---|---|---|---|")
    for label, r in rows.items():
        print(f"| {label} | {cell(r['wall_s'], ' s')} | {cell(r['peak_rss_mib'], digits=0)} | "
              f"{cell(r.get('gpu_mib'), digits=0)} | {r['wall_s']['runs']} |")


def bench_table(rows: dict, title: str, columns: dict[str, str]) -> None:
    """Per bench row, the per-call median (range) of each component in `columns` (name: header)."""
    print(f"\n| {title} | {' | '.join(columns.values())} | calls |")
    print("|---" * (len(columns) + 2) + "|")
    for label, r in rows.items():
        if "error" in r:
            print(f"| {label} | {r['error']} |" + " |" * len(columns))
            continue
        calls = [r["components"][name] for name in columns]
        print(f"| {label} ({r['backend']}) | "
              + " | ".join(f"{c['median_ms']:.1f} ({c['min_ms']:.1f}-{c['max_ms']:.1f})" for c in calls)
              + f" | {calls[0]['runs']} |")


def report(data: dict) -> None:
    generate_table(data.get("generate", {}),
                   f"`difflite generate`, 20 steps, warm caches, from the shell ({where(data)})")
    bench_table(data.get("bench", {}), f"per call, in one process ({where(data)})",
                {"unet": "UNet step, ms", "vae_decoder": "VAE decode, ms"})


def add_run_arguments(parser: argparse.ArgumentParser, work: str, phases: str) -> None:
    """The options of a benchmark built on these phases (this script, controlnet.py)."""
    parser.add_argument("--work", type=Path, default=ROOT / "out" / work, help="folder for the conversions")
    parser.add_argument("--model", default="preset:sd15")
    parser.add_argument("--convert-args", default="", help="extra flags for every conversion (e.g. a smaller size)")
    parser.add_argument("--phase", default=phases, help=f"comma-separated: {phases}")
    parser.add_argument("--runs", type=int, default=5, help="processes per generate figure")
    parser.add_argument("--bench-runs", type=int, default=20, help="timed calls per component in bench")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per process")
    parser.add_argument("--save", type=Path)
    parser.add_argument("--report", type=Path, help="print the tables of a saved result and stop")


def only_folders(table: dict, folders: set[str]) -> dict:
    """The rows of a GENERATE / BENCH table (label: (folder, flags)) whose folder is in `folders`."""
    return {label: row for label, row in table.items() if row[0] in folders}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, "headline", "convert,generate,bench")
    parser.add_argument("--folders", default=",".join(FOLDERS),
                        help=f"comma-separated, of {', '.join(FOLDERS)}: the conversions and the rows that use them")
    args = parser.parse_args()
    folders = set(args.folders.split(","))
    if not folders <= set(FOLDERS):
        parser.error(f"--folders: unknown {', '.join(sorted(folders - set(FOLDERS)))}")
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    phases = set(args.phase.split(","))
    data = json.loads(args.save.read_text()) if args.save and args.save.is_file() else {}
    data["machine"] = machine()
    args.work.mkdir(parents=True, exist_ok=True)
    if "convert" in phases:
        data["convert"] = convert(args.work, args.model, args.convert_args.split(), args.timeout,
                                  {name: flags for name, flags in FOLDERS.items() if name in folders})
    if "generate" in phases:
        data["generate"] = generate(args.work, args.runs, args.steps, args.timeout, only_folders(GENERATE, folders))
        if args.save:
            args.save.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if "bench" in phases:
        data["bench"] = bench(args.work, args.bench_runs, args.timeout, only_folders(BENCH, folders))
    if args.save:
        args.save.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    report(data)


if __name__ == "__main__":
    main()
