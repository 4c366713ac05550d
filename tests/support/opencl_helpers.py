"""Helpers for the OpenCL backend tests (backend=opencl of custom_ops/).

* OpModel: TinyModel (tests/support/oplib_helpers.py) plus any builtin operator with
  its BuiltinOptions, bool/int64 constants, for single-op models.
* opencl_delegate_options / run_model: run a model through ai_edge_litert with
  the delegate (outputs poisoned before every run), optionally with
  stats_path, returning the outputs and the delegate's stats JSON.
* require_opencl(lib): load_delegate(backend=opencl) or fail with a clear
  message (the tests must fail, not skip, when OpenCL is missing).
* TOL, HALF_TOL, halved: the bars of the difflite ops' OpenCL tests (tests/test_op_*.py) in float
  storage and in half storage without cl_khr_fp16.
* run_delegate: one difflite op through the library with backend=opencl (the C++ host code of
  custom_ops/ops/<op>/<op>_opencl.cc), its output and stats.
"""
from __future__ import annotations

import gc
import json
import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from difflite.compiler.tflite.builder import builtin_operator

from .oplib_helpers import TinyModel, poisoned_runs, run_tflite, single_op_model

# The difflite ops' OpenCL kernels (launched with pyopencl or through the library) against float64
# references, float32 storage: max |err| / max |ref|.
TOL = 2e-5
# Half storage without cl_khr_fp16 (-DDL_HALF_IO=1: vload_half / vstore_half, ops/common/dl_storage.cl),
# which PoCL can run: inputs and outputs in half, arithmetic in float. The reference runs on the
# half-rounded inputs; one rounding of the output to half is ~5e-4 of its magnitude.
HALF_TOL = 1.5e-3

_EXTRA_TYPES = {
    np.dtype(np.bool_): schema.TensorType.BOOL,
    np.dtype(np.int64): schema.TensorType.INT64,
}


class OpModel(TinyModel):
    """TinyModel with generic builtin operators."""

    def _tensor(self, name, shape, dtype, buffer=0):
        dt = np.dtype(dtype)
        if dt in _EXTRA_TYPES:
            t = schema.TensorT()
            t.name = name
            t.shape = [int(d) for d in shape]
            t.type = _EXTRA_TYPES[dt]
            t.buffer = buffer
            self.tensors.append(t)
            return len(self.tensors) - 1
        return super()._tensor(name, shape, dtype, buffer)

    def builtin(self, name: str, inputs: Sequence[int], outputs: Sequence[int], **options) -> None:
        """Builtin operator `name` ("CONV_2D"); keyword options are the schema's
        BuiltinOptions fields (camelCase). -1 in `inputs` is an omitted input."""
        opcode = self._opcode(getattr(schema.BuiltinOperator, name))
        self.operators.append(builtin_operator(opcode, name, inputs, outputs, **options))


def opencl_options(**extra) -> dict[str, str]:
    opts = {"backend": "opencl"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def require_opencl(lib: Path) -> None:
    """Fails (never skips) with the delegate's own reason when backend=opencl
    cannot be created here."""
    from ai_edge_litert.interpreter import load_delegate

    try:
        load_delegate(str(lib), {"backend": "opencl"})
    except ValueError as e:
        raise AssertionError(
            "OpenCL is not available for the OpenCL backend tests: "
            f"{e}. Install an ICD loader and a driver (Debian: ocl-icd-libopencl1 "
            "pocl-opencl-icd) or run on a machine with a GPU driver.") from e


def run_model(model_path, lib: Path, feeds: Sequence[np.ndarray],
              options: Mapping[str, str] | None = None, repeats: int = 2,
              stats: bool = False, num_threads: int | None = None):
    """Runs the model with the delegate; returns (outputs, stats dict or None).
    Float outputs are poisoned with NaN and int outputs with INT_POISON before
    every invoke."""
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    opts = dict(options or opencl_options())
    stats_file = None
    if stats:
        fd, stats_file = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        opts["stats_path"] = stats_file
    delegates = [] if opts.get("backend") == "none" else [load_delegate(str(lib), opts)]
    interp = Interpreter(model_path=str(model_path), experimental_delegates=delegates,
                         num_threads=num_threads)
    result = poisoned_runs(interp, feeds, repeats)
    info = None
    if stats_file:
        with open(stats_file) as f:
            info = json.load(f)
        os.unlink(stats_file)
    return result, info


def run_reference(model_path, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The same model on TFLite's own kernels (XNNPACK / reference), no delegate."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(model_path))
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), feeds):
        interp.set_tensor(detail["index"], np.ascontiguousarray(value, dtype=detail["dtype"]))
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def halved(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def run_delegate(tmp_path, lib, code, attrs, inputs, out_shape, feeds, stats=False, kernels="auto", profile=0,
                 **extra):
    """One difflite op `code` (single_op_model's inputs) through the library with backend=opencl:
    (output, the stats_path JSON or None). A node the OpenCL backend refused would stay with
    TFLite, which cannot run a difflite op: the run fails."""
    path = single_op_model(tmp_path / "op.tflite", code, attrs, inputs, out_shape)
    options = {"backend": "opencl", "kernels": kernels, **extra}
    if profile:
        options["profile"] = str(profile)
    stats_path = tmp_path / "stats.json"
    if stats:
        options["stats_path"] = str(stats_path)
    (out,) = run_tflite(path, lib, feeds, options=options)
    gc.collect()  # the interpreter and its delegate go (the backend writes stats_path then)
    if not stats:
        return out, None
    assert stats_path.exists(), "backend=opencl wrote no stats_path file"
    return out, json.loads(stats_path.read_text())
