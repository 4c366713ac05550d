"""Benchmark: converted files on stock LiteRT's GPU accelerator (issue 20, item 3; issue 21: stock
runtimes run the quantized forms).

App developers ship `--no-fuse` files with stock LiteRT. For every component of each output folder
given, seeded random inputs run on the CPU interpreter (stock LiteRT, no difflite delegate: the
reference) and then, in a child process each (lab/litert_composites_child.py), on the GPU
accelerator at fp32 (enforce_f32) and fp16: a row says run, wrong (max error over the
accelerator's tolerance, relative to the reference's largest magnitude), fallback (not fully
accelerated), error or crash, with ms per call.

    python lab/litert_gpu_files.py OUT [OUT ...] [--accelerator gpu --accelerator gpu-fp16]
        [--save FILE.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

from litert_composites import ModelFile, OneLineParser, gpu_name, run_child  # noqa: E402

SIGNATURE_KEY = "serving_default"


def cpu_reference(path: Path, feeds: dict) -> np.ndarray:
    """The component's (first) output on stock LiteRT's CPU interpreter."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner(SIGNATURE_KEY)
    return next(iter(runner(**feeds).values())).astype(np.float64)


def component_files(out: Path, work: Path) -> list[ModelFile]:
    """One ModelFile per component of `out`, its inputs and CPU reference saved beside."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.bench import random_feeds, vocab_size

    files = []
    for name, entry in OutputFolder.read(out).components.items():
        path = entry.path
        feeds = random_feeds(entry, np.random.default_rng(0), vocab_size(out))
        io = work / f"{out.name}_{name}.npz"
        np.savez(io, reference=cpu_reference(path, feeds), **{f"in_{k}": v for k, v in feeds.items()})
        files.append(ModelFile(name, out.name, None, path, io))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", nargs="+", type=Path, help="Converted output folders.")
    parser.add_argument("--accelerator", action="append", choices=["cpu", "gpu", "gpu-fp16"], default=None)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args(argv)
    for out in args.outs:
        if not (out / "manifest.json").is_file():
            parser.error(f"{out}: not an output folder (no manifest.json)")
    accelerators = args.accelerator or ["gpu", "gpu-fp16"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="difflite-litert-gpu-") as work:
        for out in args.outs:
            for model in component_files(out, Path(work)):
                for accelerator in accelerators:
                    row = run_child(model, None, accelerator, args.runs, args.timeout)
                    row.update(folder=str(out), component=model.kind)
                    rows.append(row)
                    print(f"{out.name} {model.kind} {accelerator}: {row['status']} {row.get('rel_err', '')} "
                          f"{row.get('detail', '')[:200]}", flush=True)
    result = {"host": platform.node(), "gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
