"""Test helpers for the C++ op library (custom_ops/).

* build_oplib(): configure + build custom_ops with CMake (cached, rebuilt only
  when a source is newer than the library) and return the .so path.
* TinyModel: write small .tflite files by hand with the schema object API that
  ships in ai_edge_litert: custom difflite ops (FlexBuffer options), builtin
  ADD, constant tensors as buffers.
* single_op_model / chain models used by tests/test_op_*.py and
  tests/test_oplib_delegate.py.
* run_tflite(): run a model through ai_edge_litert or tf.lite with the
  delegate, output buffers poisoned with NaN before the run.
* check(): the CPU backend's bar, max |err| <= CPU_TOL x max |reference|.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from difflite.compiler.tflite.builder import tensor_t

from . import ROOT as REPO
from .numerics import assert_close

CUSTOM_OPS = REPO / "custom_ops"
LIB_NAME = "libdifflite_delegate.so"
INT_POISON = -123456789  # what poisoned_runs writes into integer outputs before each invoke
CPU_TOL = 1e-4  # the CPU backend against float64 references: max |err| / max |reference|


# --------------------------------------------------------------------------
# Building the library


def build_oplib(build_dir: str | os.PathLike | None = None, jobs: int = 2) -> Path:
    """Build custom_ops (Release, cached) and return the path of libdifflite_delegate.so, or the
    prebuilt library $DIFFLITE_OPLIB names (e.g. on a machine without the build headers)."""
    from difflite.runtime.oplib import build

    if os.environ.get("DIFFLITE_OPLIB"):
        return Path(os.environ["DIFFLITE_OPLIB"])
    return build("host", Path(build_dir) if build_dir else None, jobs)


# --------------------------------------------------------------------------
# Writing .tflite files

class TinyModel:
    """A single-subgraph TFLite model assembled tensor by tensor."""

    def __init__(self) -> None:
        self.buffers: list[schema.BufferT] = [schema.BufferT()]  # 0: empty sentinel
        self.tensors: list[schema.TensorT] = []
        self.operators: list[schema.OperatorT] = []
        self.opcodes: list[schema.OperatorCodeT] = []
        self._opcode_index: dict[tuple[int, str | None], int] = {}

    def _tensor(self, name: str, shape: Sequence[int], dtype, buffer: int = 0) -> int:
        self.tensors.append(tensor_t(name, shape, dtype, buffer))
        return len(self.tensors) - 1

    def activation(self, name: str, shape: Sequence[int], dtype=np.float32) -> int:
        """A non-constant tensor (graph input, output or intermediate)."""
        return self._tensor(name, shape, dtype)

    def constant(self, name: str, value: np.ndarray) -> int:
        value = np.ascontiguousarray(value)
        b = schema.BufferT()
        b.data = np.frombuffer(value.tobytes(), dtype=np.uint8)
        self.buffers.append(b)
        return self._tensor(name, value.shape, value.dtype, buffer=len(self.buffers) - 1)

    def _opcode(self, builtin: int, custom: str | None = None) -> int:
        key = (builtin, custom)
        if key not in self._opcode_index:
            oc = schema.OperatorCodeT()
            oc.builtinCode = builtin
            oc.deprecatedBuiltinCode = min(builtin, 127)
            oc.customCode = custom
            oc.version = 1
            self.opcodes.append(oc)
            self._opcode_index[key] = len(self.opcodes) - 1
        return self._opcode_index[key]

    def custom(self, code: str, inputs: Sequence[int], outputs: Sequence[int],
               options: Mapping | bytes | None) -> None:
        """A CUSTOM op; `options` is a dict (FlexBuffer map) or raw bytes."""
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(schema.BuiltinOperator.CUSTOM, code)
        op.inputs = list(inputs)
        op.outputs = list(outputs)
        if options is not None:
            raw = options if isinstance(options, (bytes, bytearray)) else flexbuffers.Dumps(dict(options))
            op.customOptions = np.frombuffer(bytes(raw), dtype=np.uint8)
        op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        self.operators.append(op)

    def add(self, a: int, b: int, out: int) -> None:
        """Builtin ADD (no fused activation)."""
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(schema.BuiltinOperator.ADD)
        op.inputs = [a, b]
        op.outputs = [out]
        op.builtinOptionsType = schema.BuiltinOptions.AddOptions
        opts = schema.AddOptionsT()
        opts.fusedActivationFunction = schema.ActivationFunctionType.NONE
        op.builtinOptions = opts
        self.operators.append(op)

    def to_bytes(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        sg = schema.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = list(inputs)
        sg.outputs = list(outputs)
        sg.operators = self.operators
        sg.name = "main"
        m = schema.ModelT()
        m.version = 3
        m.operatorCodes = self.opcodes
        m.subgraphs = [sg]
        m.buffers = self.buffers
        m.description = "difflite op-library test model"
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def save(self, path: str | os.PathLike, inputs: Sequence[int], outputs: Sequence[int]) -> Path:
        path = Path(path)
        path.write_bytes(self.to_bytes(inputs, outputs))
        return path


def single_op_model(path, code: str, options, inputs: Sequence[tuple[str, np.ndarray, bool]],
                    output_shape: Sequence[int], output_dtype=np.float32) -> Path:
    """One custom op. `inputs`: (name, array, is_constant); non-constant
    arrays only give shape and dtype (graph inputs in this order)."""
    m = TinyModel()
    graph_inputs, op_inputs = [], []
    for name, arr, is_const in inputs:
        if is_const:
            op_inputs.append(m.constant(name, arr))
        else:
            idx = m.activation(name, arr.shape, arr.dtype)
            graph_inputs.append(idx)
            op_inputs.append(idx)
    y = m.activation("y", output_shape, output_dtype)
    m.custom(code, op_inputs, [y], options)
    return m.save(path, graph_inputs, [y])


# --------------------------------------------------------------------------
# Running


def load_runtime(runtime: str):
    """(Interpreter class, load_delegate) of 'litert' (ai_edge_litert) or 'tf'."""
    if runtime == "litert":
        from ai_edge_litert import interpreter as lrt

        return lrt.Interpreter, lrt.load_delegate
    if runtime == "tf":
        try:
            import tensorflow as tf  # noqa: F401
        except Exception as e:  # pragma: no cover - environment problem
            raise RuntimeError(
                "tensorflow is required for the second-runtime ABI check "
                f"(pip install tensorflow-cpu==2.21): import failed: {e!r}"
            ) from e
        return tf.lite.Interpreter, tf.lite.experimental.load_delegate
    raise ValueError(runtime)


def make_interpreter(model_path, lib: Path, runtime: str = "litert",
                     options: Mapping[str, str] | None = None):
    interp_cls, load_delegate = load_runtime(runtime)
    delegate = load_delegate(str(lib), dict(options or {"backend": "cpu"}))
    return interp_cls(model_path=str(model_path), experimental_delegates=[delegate])


def run_tflite(model_path, lib: Path, feeds: Sequence[np.ndarray], runtime: str = "litert",
               options: Mapping[str, str] | None = None, repeats: int = 1) -> list[np.ndarray]:
    """Allocate, feed the graph inputs in order, poison every output with NaN,
    invoke (`repeats` times, re-poisoning each time), return copies of the outputs."""
    return poisoned_runs(make_interpreter(model_path, lib, runtime, options), feeds, repeats)


def poisoned_runs(interp, feeds: Sequence[np.ndarray], repeats: int) -> list[np.ndarray]:
    """Allocate, feed the graph inputs in order, then `repeats` times: poison every output (NaN,
    integers INT_POISON) and invoke. Copies of the last run's outputs: an element a kernel left
    unwritten shows as the poison."""
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds):
        interp.set_tensor(detail["index"], np.ascontiguousarray(value, dtype=detail["dtype"]))
    outs = interp.get_output_details()
    result = None
    for _ in range(repeats):
        for d in outs:
            view = interp.tensor(d["index"])()
            if isinstance(view, np.ndarray) and view.ndim > 0:  # 0-d comes back as a copy
                view[...] = np.nan if np.issubdtype(view.dtype, np.floating) else INT_POISON
            del view  # no live references into the interpreter during invoke
        interp.invoke()
        result = [interp.get_tensor(d["index"]).copy() for d in outs]
    return result


def check(got, want, tol=CPU_TOL):
    assert_close(got, want, tol)
