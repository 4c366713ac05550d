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


class CompiledRunner:
    """One .tflite on LiteRT's CompiledModel: runner(**feeds) -> outputs (float32), both in the
    file's layout. Used by this child and, in process, by the runtime's litert-gpu backend."""

    def __init__(self, model: str, accelerator: str):
        self.compiled = compiled_model(model, accelerator)
        self.fully_accelerated = bool(self.compiled.is_fully_accelerated()) if accelerator != "cpu" else None
        self.input_names = list(self.compiled.get_input_tensor_details(SIGNATURE_KEY))
        self.outputs = {name: tuple(int(d) for d in detail["shape"])
                        for name, detail in self.compiled.get_output_tensor_details(SIGNATURE_KEY).items()}
        self.in_buffers = self.compiled.create_input_buffers(0)
        self.out_buffers = self.compiled.create_output_buffers(0)

    def __call__(self, **feeds) -> dict[str, np.ndarray]:
        for buffer, name in zip(self.in_buffers, self.input_names):
            buffer.write(np.ascontiguousarray(feeds[name]).reshape(-1))  # its own dtype: token ids are int32
        self.compiled.run_by_index(0, self.in_buffers, self.out_buffers)
        # reading waits for the accelerator: run_by_index returns before a GPU has finished
        return {name: buffer.read(int(np.prod(shape)), np.float32).reshape(shape)
                for buffer, (name, shape) in zip(self.out_buffers, self.outputs.items())}


def run(model: str, in_path: str, out_path: str, accelerator: str) -> None:
    report(stage="load")
    runner = CompiledRunner(model, accelerator)
    results = {}
    for i, feeds in enumerate(feed_sets(in_path)):
        report(stage=f"run {i}")
        results.update({f"{i}/{name}": value for name, value in runner(**feeds).items()})
    np.savez(out_path, **results)
    report(status="run", fully_accelerated=runner.fully_accelerated)


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
