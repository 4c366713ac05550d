"""Child of difflite/runtime/litert_gpu.py: runs one .tflite on stock LiteRT's CompiledModel, on its GPU
accelerator (or its CPU one, which tests use to check this plumbing on machines without a GPU).

    python -m difflite.runtime.litert_gpu_child MODEL IN.npz OUT.npz gpu-fp32|gpu-fp16|cpu

IN.npz holds feed sets as "<i>/<input name>"; OUT.npz gets "<i>/<output name>" (float32). One
line, PREFIX + JSON, is printed per stage as it starts (so that a crash says where), then the
result: status "run" (with fully_accelerated) or "error". It imports only numpy and the runtime:
the runtime is what may crash, and nothing of difflite's should run in its process."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

PREFIX = "difflite-litert-gpu:"
SIGNATURE_KEY = "serving_default"


def report(**fields) -> None:
    print(PREFIX + json.dumps(fields), flush=True)


def compiled_model(model: str, accelerator: str):
    from ai_edge_litert.compiled_model import CompiledModel, HardwareAccelerator

    if accelerator == "cpu":
        return CompiledModel.from_file(model, hardware_accel=HardwareAccelerator.CPU)
    from ai_edge_litert.options import GpuOptions, Options

    options = Options(HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=accelerator == "gpu-fp32"))
    return CompiledModel.from_file(model, options=options)


def feed_sets(path: str) -> list[dict[str, np.ndarray]]:
    sets: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            index, name = key.split("/", 1)
            sets.setdefault(int(index), {})[name] = data[key]
    return [sets[i] for i in sorted(sets)]


def run(model: str, in_path: str, out_path: str, accelerator: str) -> None:
    report(stage="load")
    compiled = compiled_model(model, accelerator)
    fully_accelerated = bool(compiled.is_fully_accelerated()) if accelerator != "cpu" else None
    inputs = list(compiled.get_input_tensor_details(SIGNATURE_KEY))
    outputs = compiled.get_output_tensor_details(SIGNATURE_KEY)
    in_buffers = compiled.create_input_buffers(0)
    out_buffers = compiled.create_output_buffers(0)
    results = {}
    for i, feeds in enumerate(feed_sets(in_path)):
        report(stage=f"run {i}")
        for buffer, name in zip(in_buffers, inputs):
            buffer.write(np.ascontiguousarray(feeds[name]).reshape(-1))  # its own dtype: token ids are int32
        compiled.run_by_index(0, in_buffers, out_buffers)
        for buffer, (name, detail) in zip(out_buffers, outputs.items()):
            shape = tuple(int(d) for d in detail["shape"])
            results[f"{i}/{name}"] = buffer.read(int(np.prod(shape)), np.float32).reshape(shape)
    np.savez(out_path, **results)
    report(status="run", fully_accelerated=fully_accelerated)


def main(argv: list[str]) -> int:
    model, in_path, out_path, accelerator = argv[1:5]
    try:
        run(model, in_path, out_path, accelerator)
    except Exception as exc:  # the runtime's own types; the parent words the message
        report(status="error", error=" ".join(f"{type(exc).__name__}: {exc}".split())[:400])
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # no runtime teardown: a crash while freeing would hide the result
