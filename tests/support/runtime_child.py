"""A fresh process for tests/test_runtime_memory.py: optionally loads and runs a warm-up model
(OpenCL and PoCL's compiler started, programs cached), then measures loading and running one
model through the OpenCL backend at fp16 storage. Prints one JSON line: the delegate's stats, the
resident set from /proc before (baseline), after loading, after the first run and at its peak (VmHWM, reset after the
warm-up), the first output values and the same values from TFLite's own kernels.

usage: runtime_child.py LIB MODEL CACHE_DIR WARM_MODEL|'' OPTIONS_JSON"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
from ai_edge_litert.interpreter import Interpreter, load_delegate


def status_mb() -> dict[str, float]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                values[name] = int(parts[0]) / 1024
    return values


def run(path: str, delegate=None) -> np.ndarray:
    interpreter = Interpreter(model_path=path, experimental_delegates=[delegate] if delegate else [])
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    x = np.random.default_rng(3).standard_normal(detail["shape"]).astype(np.float32)
    interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).reshape(-1)[:16].copy()


def main() -> None:
    lib, model, cache, warm, extra = sys.argv[1:6]
    options = {"backend": "opencl", "precision": "fp16", **json.loads(extra)}
    if cache:
        options.setdefault("cache_dir", cache)
    if warm:
        run(warm, load_delegate(lib, {k: v for k, v in options.items() if k != "zero_copy"}))
    baseline = status_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    stats_path = os.path.join(tempfile.mkdtemp(), "stats.json")
    delegate = load_delegate(lib, {**options, "stats_path": stats_path})
    interpreter = Interpreter(model_path=model, experimental_delegates=[delegate])
    interpreter.allocate_tensors()
    after_load = status_mb()
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(detail["index"],
                           np.random.default_rng(3).standard_normal(detail["shape"]).astype(np.float32))
    interpreter.invoke()
    head = interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).reshape(-1)[:16].copy()
    after_run = status_mb()
    peak = after_run["VmHWM"]
    with open(stats_path) as f:
        stats = json.load(f)
    del interpreter, delegate
    reference = run(model)
    print(json.dumps({"stats": stats, "baseline_mb": baseline["VmRSS"], "baseline": baseline, "peak_mb": peak,
                      "after_load": after_load, "after_run": after_run, "output_head": head.tolist(),
                      "reference_head": reference.tolist()}))


if __name__ == "__main__":
    main()
