"""Benchmark: which form of a float16 embedding lookup stock LiteRT's GPU accelerator runs (issue
20, item 3: the `--no-fuse` text encoder at `--precision fp16`, whose DEQUANTIZE -> GATHER it
refuses).

One-op-chain files, ids [77] (int32) into a [V, D] table, each form written with difflite's
builder and run by `difflite.runtime.litert_gpu` (a child process; gpu-fp16 and gpu-fp32):

- float32: GATHER of a float32 table (what fp32 files write);
- dequantize-table: DEQUANTIZE of the float16 table, then GATHER (what fp16 files write today);
- gather-half-dequantize: GATHER of the float16 table, then DEQUANTIZE of the rows;
- gather-half-cast: GATHER of the float16 table, then CAST of the rows to float32.

    python lab/litert_gpu_lookup_forms.py [--vocab 49408 --dim 768] [--save FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.compiler.tflite.builder import ModelBuilder  # noqa: E402
from difflite.core.errors import BadInput  # noqa: E402
from difflite.runtime import litert_gpu  # noqa: E402

FORMS = ("float32", "dequantize-table", "gather-half-dequantize", "gather-half-cast")
LENGTH = 77


def write_form(form: str, table: np.ndarray, path: Path) -> None:
    builder = ModelBuilder(f"lookup {form}", spool_dir=path.parent)
    ids = builder.tensor("ids", (LENGTH,), np.int32)
    rows = builder.tensor("rows", (LENGTH, table.shape[1]), np.float32)
    if form == "float32":
        builder.op("GATHER", [builder.constant("table", table), ids], [rows], axis=0)
    elif form == "dequantize-table":
        wide = builder.tensor("table", table.shape, np.float32)
        builder.op("DEQUANTIZE", [builder.constant("table/fp16", table.astype(np.float16))], [wide])
        builder.op("GATHER", [wide, ids], [rows], axis=0)
    else:
        half_rows = builder.tensor("rows/fp16", (LENGTH, table.shape[1]), np.float16)
        builder.op("GATHER", [builder.constant("table/fp16", table.astype(np.float16)), ids], [half_rows], axis=0)
        if form == "gather-half-dequantize":
            builder.op("DEQUANTIZE", [half_rows], [rows])
        else:
            builder.op("CAST", [half_rows], [rows])
    builder.inputs.append(("ids", ids))
    builder.outputs.append(("rows", rows))
    with open(path, "wb") as f:
        builder.write(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49408)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((args.vocab, args.dim)) * 0.02).astype(np.float32)
    ids = rng.integers(0, args.vocab, LENGTH).astype(np.int32)
    want = table.astype(np.float16).astype(np.float32)[ids]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for form in FORMS:
            path = Path(tmp) / f"{form}.tflite"
            write_form(form, table, path)
            for accelerator in ("gpu-fp16", "gpu-fp32"):
                row = {"form": form, "accelerator": accelerator}
                try:
                    run = litert_gpu.run(path, [{"ids": ids}], accelerator)
                    got = run.outputs[0]["rows"]
                    row.update(status="run", fully_accelerated=run.fully_accelerated,
                               max_rel_err=float(np.abs(got - want).max() / np.abs(want).max()))
                except BadInput as exc:
                    row.update(status="refused", reason=str(exc).split(": ", 1)[-1][:300])
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.save:
        args.save.write_text(json.dumps({"vocab": args.vocab, "dim": args.dim, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
