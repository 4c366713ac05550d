"""Probe: which weight-only quantized forms stock LiteRT's GPU accelerator takes (issue 21).

One small model per form (a FULLY_CONNECTED or a 3x3 CONV_2D whose weight is an int8 / int4
constant brought back to float), written to a folder with one seeded input and the float64
reference, each run in a child process (lab/litert_composites_child.py) on the GPU at fp32
and fp16 and on the CPU interpreter:

    fc-int8-axis     INT8 [N, K], per-axis scales, DEQUANTIZE                 (convert --weights int8)
    fc-int8-tensor   INT8 [N, K], one scale, DEQUANTIZE
    fc-int4-compact  INT4 [NK/32, 32] scale 1, DEQUANTIZE, MUL float16 scales, RESHAPE (--weights int4)
    conv-int8-axis   INT8 OHWI, per-axis, DEQUANTIZE
    conv-int4-compact
    conv-int4-compact4d  the same with the blocks as [R, 1, 1, 32] and scales [R, 1, 1, 1]

    python lab/litert_gpu_qforms.py [--save FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

from litert_composites import ModelFile, gpu_name, run_child  # noqa: E402

from difflite.compiler.tflite import quantize  # noqa: E402
from difflite.compiler.tflite.builder import ModelBuilder  # noqa: E402

N, K, B = 64, 128, 32


def weight(builder: ModelBuilder, w: np.ndarray, form: str) -> tuple[int, np.ndarray]:
    """The float32 weight tensor of `form` and the weight the file really holds (dequantized)."""
    if form in ("int8-axis", "int8-tensor"):
        if form == "int8-tensor":
            scale = np.float32(np.abs(w).max() / 127)
            q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
            axis_values = quantize.Quantized("int8", w.shape, q, np.array([scale], np.float32), 0)
        else:
            axis_values = quantize.quantize_int8(w, 0)
        packed = builder.quantized_constant("w/int8", axis_values)
        out = builder.tensor("w", w.shape, np.float32)
        builder.op("DEQUANTIZE", [packed], [out])
        return out, quantize.dequantize(axis_values)
    stored = quantize.quantize_int4(w, B, np.float16)
    rows = stored.shape if form == "int4-compact" else (stored.shape[0], 1, 1, B)
    unit = quantize.Quantized("int4", rows, stored.data, np.ones(1, np.float32), 0)
    values = builder.tensor("w/values", rows, np.float32)
    builder.op("DEQUANTIZE", [builder.quantized_constant("w/int4", unit)], [values])
    column = stored.scales.reshape((-1, 1) if form == "int4-compact" else (-1, 1, 1, 1))
    half = builder.constant("w/scales16", column.astype(np.float16))
    scales = builder.tensor("w/scales", column.shape, np.float32)
    builder.op("DEQUANTIZE", [half], [scales])
    blocks = builder.tensor("w/blocks", rows, np.float32)
    builder.op("MUL", [values, scales], [blocks])
    out = builder.tensor("w", w.shape, np.float32)
    builder.op("RESHAPE", [blocks, builder.constant("w/shape", np.array(w.shape, np.int32))], [out],
               newShape=list(w.shape))
    return out, quantize.dequantize(stored).reshape(w.shape)


def probe(kind: str, form: str, folder: Path) -> ModelFile:
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    if kind == "fc":
        w = rng.standard_normal((N, K)).astype(np.float32)
        x = rng.standard_normal((4, K)).astype(np.float32)
        wi, wd = weight(b, w, form)
        xi, y = b.tensor("x", x.shape, np.float32), b.tensor("y", (4, N), np.float32)
        b.op("FULLY_CONNECTED", [xi, wi, -1], [y])
        ref = x.astype(np.float64) @ wd.astype(np.float64).T
    else:
        w = rng.standard_normal((N, 3, 3, K)).astype(np.float32)
        x = rng.standard_normal((1, 8, 8, K)).astype(np.float32)
        wi, wd = weight(b, w, form)
        xi, y = b.tensor("x", x.shape, np.float32), b.tensor("y", (1, 6, 6, N), np.float32)
        bias = b.constant("bias", np.zeros(N, np.float32))
        b.op("CONV_2D", [xi, wi, bias], [y], padding=1, strideH=1, strideW=1, dilationHFactor=1,
             dilationWFactor=1)  # padding 1: VALID
        ref = np.zeros((1, 6, 6, N))
        for i in range(3):
            for j in range(3):
                ref += np.einsum("nhwc,oc->nhwo", x[:, i:i + 6, j:j + 6, :].astype(np.float64), wd[:, i, j, :])
    b.inputs.append(("x", xi))
    b.outputs.append(("y", y))
    path = folder / f"{kind}-{form}.tflite"
    path.write_bytes(bytes(b.serialize()))
    io = folder / f"{kind}-{form}.npz"
    np.savez(io, reference=ref, in_x=x)
    return ModelFile(kind, form, None, path, io)


FORMS = [("fc", "int8-axis"), ("fc", "int8-tensor"), ("fc", "int4-compact"), ("conv", "int8-axis"),
         ("conv", "int4-compact"), ("conv", "int4-compact4d")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", action="append", choices=["cpu", "gpu", "gpu-fp16"], default=None)
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for kind, form in FORMS:
            model = probe(kind, form, Path(work))
            for accelerator in args.accelerator or ["cpu", "gpu", "gpu-fp16"]:
                row = run_child(model, None, accelerator, 5, 120)
                rows.append(row)
                print(f"{kind} {form} {accelerator}: {row['status']} {row.get('rel_err', '')} "
                      f"{row.get('detail', '')[:300]}", flush=True)
    if args.save:
        args.save.write_text(json.dumps({"gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows},
                                        indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
