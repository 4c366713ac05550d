"""Run emitted .tflite models on the host: ai-edge-litert's interpreter, plus the difflite op
library as an external delegate when the model has difflite custom ops (or a GPU backend is
asked for). Inputs and outputs are exchanged in ONNX/PyTorch layout (NCHW); the NHWC
transposes at the model boundary happen here."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from compiler.errors import BadInput
from compiler.tflite.builder import SIGNATURE_KEY

BACKENDS = ("cpu", "opencl")
LIBRARY_NAME = "libdifflite_delegate.so"
LIBRARY_ENV = "DIFFLITE_OPLIB"


def find_oplib() -> Path | None:
    """The op library: $DIFFLITE_OPLIB, else the repository's custom_ops/build."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return Path(env)
    candidate = Path(__file__).resolve().parent.parent / "custom_ops" / "build" / LIBRARY_NAME
    return candidate if candidate.is_file() else None


def delegate_for(backend: str, precision: str = "fp32"):
    from ai_edge_litert.interpreter import load_delegate

    library = find_oplib()
    if library is None or not Path(library).is_file():
        raise BadInput(f"the op library {LIBRARY_NAME} is not built: run `difflite oplib build` "
                       f"or set {LIBRARY_ENV}")
    return load_delegate(str(library), {"backend": backend, "precision": precision})


class Component:
    """One emitted model, callable with NCHW numpy arrays by input name."""

    def __init__(self, path, entry: dict | None = None, backend: str = "cpu", threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self.path = Path(path)
        if not self.path.is_file():
            raise BadInput(f"{self.path}: no such model file")
        entry = entry or {}
        custom = entry.get("custom_ops", [])
        delegates = [delegate_for(backend)] if (custom or backend != "cpu") else []
        try:
            self.interpreter = Interpreter(model_path=str(self.path), experimental_delegates=delegates,
                                           num_threads=threads or os.cpu_count())
            self.runner = self.interpreter.get_signature_runner(SIGNATURE_KEY)
        except (ValueError, RuntimeError) as exc:
            raise BadInput(f"{self.path}: cannot load ({exc})") from exc
        self.layouts = {e["name"]: e.get("layout", "as_onnx")
                        for e in entry.get("inputs", []) + entry.get("outputs", [])}
        self.input_details = self.runner.get_input_details()

    def __call__(self, **inputs) -> dict[str, np.ndarray]:
        feeds = {}
        for name, value in inputs.items():
            detail = self.input_details[name]
            value = np.asarray(value)
            if self.layouts.get(name) == "NHWC":
                value = value.transpose(0, 2, 3, 1)
            feeds[name] = np.ascontiguousarray(value.astype(detail["dtype"]))
        outputs = self.runner(**feeds)
        return {name: value.transpose(0, 3, 1, 2) if self.layouts.get(name) == "NHWC" else value
                for name, value in outputs.items()}
