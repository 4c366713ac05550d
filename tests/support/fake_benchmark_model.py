"""A stand-in for TFLite's benchmark_model on the fake adb device (tests/support/fake_adb.py).

It checks its flags the way the real tool would fail on them (the graph and the external delegate
must exist, delegate options are key:value pairs separated by ';', backend cpu|opencl), then
prints benchmark_model's log for --warmup_runs and --num_runs with times derived from the model's
size. $FAKE_BM_STYLE: "new" (default: "INFO: " prefixes, p5/median/p95, the periodic peak memory
with --report_peak_memory_footprint=true) or "old" (no prefixes, CRLF line ends, exponent-form
averages, no median, no periodic peak). $FAKE_BM_FAIL set: the
delegate fails to apply, as on a phone without OpenCL. With backend:opencl and stats_path:FILE
it writes FILE as the op library does, for a GPU with cl_khr_fp16 (sizes derived from the
model's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def write_stats(path: str, graph: Path, nodes: int, options: dict[str, str]) -> None:
    """What libdifflite_delegate.so's stats_path holds, for a phone GPU with cl_khr_fp16."""
    half = options.get("precision") == "fp16"
    size = graph.stat().st_size
    Path(path).write_text(json.dumps({
        "arena_bytes": size // (8 if half else 4), "weights_bytes": size * (1 if half else 2),
        "scratch_bytes": size // 16 + size // 32, "scratch_lent_bytes": size // 32, "scratch_held_bytes": size // 16,
        "nodes_claimed": nodes, "nodes_total": nodes, "partitions": 1,
        "device": "QUALCOMM Adreno(TM) 740", "platform": "QUALCOMM Snapdragon(TM)",
        "storage": "float16" if half else "float32",
        "arithmetic": "float16" if half and options.get("math", "auto") == "auto" else "float32",
        "kernels": "tiled", "programs_built": 12, "build_seconds": 1.5}))


def flags(argv: list[str]) -> dict[str, str]:
    parsed = {}
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            key, _, value = arg[2:].partition("=")
            parsed[key] = value
    return parsed


def main(argv: list[str]) -> int:
    f = flags(argv)
    style = os.environ.get("FAKE_BM_STYLE", "new")
    prefix = "INFO: " if style == "new" else ""
    end = "\n" if style == "new" else "\r\n"

    def say(line: str = "") -> None:
        sys.stdout.write((prefix + line if line else "") + end)

    say("STARTING!")
    runs, warmup = int(f.get("num_runs", 50)), int(f.get("warmup_runs", 1))
    say(f"Min num runs: [{runs}]")
    say(f"Min warmup runs: [{warmup}]")
    graph = f.get("graph", "")
    say(f"Graph: [{graph}]")
    if not graph or not Path(graph).is_file():
        sys.stdout.write(f"ERROR: Could not open '{graph}'.{end}ERROR: Benchmarking failed.{end}")
        return 1
    delegate = f.get("external_delegate_path")
    if delegate is not None:
        say(f"External delegate path: [{delegate}]")
        if not Path(delegate).is_file():
            sys.stdout.write(f"ERROR: Failed to load delegate from {delegate}{end}")
            return 1
        options = dict(item.split(":", 1) for item in f.get("external_delegate_options", "").split(";") if item)
        say(f"External delegate options: [{f.get('external_delegate_options', '')}]")
        if options.get("backend", "cpu") not in ("cpu", "opencl"):
            sys.stdout.write(f"ERROR: difflite: backend must be cpu or opencl{end}")
            return 1
    say(f"Loaded model {graph}")
    nodes = 100 + Path(graph).stat().st_size % 400
    if os.environ.get("FAKE_BM_FAIL"):
        sys.stdout.write(f"ERROR: difflite: backend=opencl: no OpenCL platform (libOpenCL.so not found){end}")
        sys.stdout.write(f"ERROR: Failed to apply EXTERNAL delegate.{end}ERROR: Benchmarking failed.{end}")
        return 1
    if delegate is not None:
        if options.get("backend") == "opencl" and "stats_path" in options:
            write_stats(options["stats_path"], Path(graph), nodes, options)
        say("EXTERNAL delegate created.")
        say(f"Replacing {nodes} out of {nodes} node(s) with delegate (TfLiteDelegate) node, "
            f"yielding 1 partitions for subgraph 0.")
    elif f.get("use_gpu") == "true":
        say("Created TensorFlow Lite delegate for GPU.")
        say(f"Replacing {nodes} out of {nodes} node(s) with delegate (TfLiteGpuDelegateV2) node, "
            f"yielding 1 partitions for subgraph 0.")
    size = Path(graph).stat().st_size
    say(f"The input model file size (MB): {size / 1e6:.6g}")
    base = 1000 + size // 100   # microseconds, distinct per model
    init_us = 100000 + size // 1000
    say(f"Initialized session in {init_us / 1e3:g}ms.")
    say(f"Running benchmark for at least {warmup} iterations and at least 0 seconds but terminate if "
        f"exceeding 3600 seconds.")
    first = base * 2
    if style == "new":
        say(f"count={warmup} first={first} curr={base + 50} min={base + 50} max={first} avg={base * 1.5:g} "
            f"std=100 p5={base + 50} median={base + 60} p95={first}")
    else:
        say(f"count={warmup} curr={first}")
    say()
    say(f"Running benchmark for at least {runs} iterations and at least 0 seconds but terminate if "
        f"exceeding 3600 seconds.")
    avg, low, high, median = base + 10, base - 40, base + 90, base + 5
    if style == "new":
        say(f"count={runs} first={base} curr={base} min={low} max={high} avg={avg} std=25 "
            f"p5={low} median={median} p95={high}")
    else:
        say(f"count={runs} first={base} curr={base} min={low} max={high} avg={avg:.6e} std=25")
    say()
    say(f"Inference timings in us: Init: {init_us}, First inference: {first}, Warmup (avg): {base * 1.5:g}, "
        f"Inference (avg): {avg:.6e}" if style == "old" else
        f"Inference timings in us: Init: {init_us}, First inference: {first}, Warmup (avg): {base * 1.5:g}, "
        f"Inference (avg): {avg}")
    say("Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE to "
        "the actual memory footprint of the model at runtime. Take the information at your discretion.")
    if style == "new":
        say("Memory footprint delta from the start of the tool (MB): init=6.42188 overall=38.5")
        if f.get("report_peak_memory_footprint") == "true":  # the monitor thread runs only then
            say(f"Overall peak memory footprint (MB) via periodic monitoring: {40 + size / 2**20:g}")
        say("Memory status at the end of exeution:")
        say("- VmRSS              : 40 MB")
    else:
        say("Peak memory footprint (MB): init=4.92969 overall=138.809")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
