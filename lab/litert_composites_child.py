"""Child of lab/litert_composites.py: runs one .tflite on one accelerator with whichever
ai_edge_litert comes first on sys.path (the parent puts a runtime's site dir first on PYTHONPATH).

    python lab/litert_composites_child.py MODEL IO.npz cpu|gpu|gpu-fp16 RUNS

IO.npz holds the inputs (`in_<name>`, float32) and `reference` (float64). Every fact is printed as
one line, PREFIX + JSON, as soon as it is known: the runtime's version, then each stage as it starts
(load, first run, timing), so that a run that kills the process still says which build it was and
where it died; last the result (status "run" or "error"). It imports nothing of the project: only
numpy and the runtime under test."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PREFIX = "litert_composites:"
SIGNATURE_KEY = "serving_default"
GPU_BATCHES = 3


def report(**fields) -> None:
    print(PREFIX + json.dumps(fields), flush=True)


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split())[:400]


def litert_version(package) -> str:
    """The distribution that installed the imported package (stable or nightly wheel), read from
    the folder it was imported from, not from whatever else is on sys.path."""
    from importlib import metadata

    site = str(Path(package.__file__).resolve().parent.parent)
    for dist in metadata.distributions(path=[site]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("ai-edge-litert"):
            return f"{name} {dist.version}"
    return getattr(package, "__version__", "unknown")


def relative_error(actual: np.ndarray, reference: np.ndarray) -> float:
    actual = np.asarray(actual, np.float64).reshape(reference.shape)
    return float(np.abs(actual - reference).max() / max(np.abs(reference).max(), 1e-30))


def run_on_interpreter(model: str, inputs: dict[str, np.ndarray], runs: int) -> dict:
    """The CPU interpreter (XNNPACK by default): runs a composite through its decomposition
    subgraph unless a delegate claims it."""
    from ai_edge_litert.interpreter import Interpreter

    report(stage="load")
    runner = Interpreter(model_path=model, num_threads=os.cpu_count()).get_signature_runner(SIGNATURE_KEY)
    report(stage="first run")
    output = next(iter(runner(**inputs).values()))
    report(stage="timing")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runner(**inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return {"output": output, "ms": statistics.median(times), "fully_accelerated": None}


def gpu_options(fp16: bool):
    """GPU alone (FACTS: GPU|CPU does not fall back anyway); enforce_f32 unless fp16 is asked.
    Builds without the grouped options take the hardware_accel shortcut (default precision)."""
    from ai_edge_litert.compiled_model import HardwareAccelerator

    try:
        from ai_edge_litert.options import GpuOptions, Options
    except ImportError:
        return {"hardware_accel": HardwareAccelerator.GPU}, "default precision (no GpuOptions)"
    options = Options(HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=not fp16))
    return {"options": options}, "fp16" if fp16 else "enforce_f32"


def run_on_gpu(model: str, inputs: dict[str, np.ndarray], runs: int, fp16: bool) -> dict:
    from ai_edge_litert.compiled_model import CompiledModel

    kwargs, precision = gpu_options(fp16)
    report(stage="load")
    compiled = CompiledModel.from_file(model, **kwargs)
    accelerated = getattr(compiled, "is_fully_accelerated", None)
    fully_accelerated = bool(accelerated()) if accelerated else None
    in_buffers = compiled.create_input_buffers(0)
    out_buffers = compiled.create_output_buffers(0)
    for buffer, name in zip(in_buffers, compiled.get_input_tensor_details(SIGNATURE_KEY)):
        buffer.write(np.ascontiguousarray(inputs[name]).reshape(-1))  # its own dtype: token ids are int32
    out_info = next(iter(compiled.get_output_tensor_details(SIGNATURE_KEY).values()))
    size = int(np.prod(out_info["shape"]))
    report(stage="first run")
    compiled.run_by_index(0, in_buffers, out_buffers)
    output = out_buffers[0].read(size, np.float32)
    # run_by_index returns before the GPU is done: N queued runs, then one read that waits for
    # them; the read of an idle buffer is measured alone and taken off.
    report(stage="timing")
    start = time.perf_counter()
    out_buffers[0].read(size, np.float32)
    read_ms = (time.perf_counter() - start) * 1e3
    per_run = []
    for _ in range(GPU_BATCHES):
        start = time.perf_counter()
        for _ in range(runs):
            compiled.run_by_index(0, in_buffers, out_buffers)
        out_buffers[0].read(size, np.float32)
        per_run.append(((time.perf_counter() - start) * 1e3 - read_ms) / runs)
    return {"output": output, "ms": statistics.median(per_run), "read_ms": read_ms,
            "fully_accelerated": fully_accelerated, "precision": precision}


def main(argv: list[str]) -> int:
    model, io_path, accelerator, runs = argv[1], argv[2], argv[3], int(argv[4])
    import ai_edge_litert

    report(version=litert_version(ai_edge_litert), module=str(Path(ai_edge_litert.__file__).parent))
    with np.load(io_path) as data:
        inputs = {key[3:]: data[key] for key in data.files if key.startswith("in_")}
        reference = data["reference"]
    try:
        if accelerator == "cpu":
            result = run_on_interpreter(model, inputs, runs)
        else:
            result = run_on_gpu(model, inputs, runs, fp16=accelerator == "gpu-fp16")
    except Exception as exc:  # the row's data: the parent records it
        report(status="error", error=one_line(exc))
        return 0
    output = result.pop("output")
    report(status="run", rel_err=relative_error(output, reference), **result)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    # No interpreter teardown: a runtime that crashes while freeing a model would turn a measured
    # row into a crash.
    os._exit(code)
