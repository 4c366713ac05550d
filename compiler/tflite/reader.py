"""Read a .tflite back without copying its weights: ops, custom ops, signatures, tensors."""

from __future__ import annotations

import collections
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from compiler.errors import BadInput
from compiler.tflite.builder import NUMPY_TYPES

BUILTIN_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
TENSOR_TYPES = {v for k, v in vars(schema.TensorType).items() if not k.startswith("_")}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    constant: bool


@dataclass
class OpInfo:
    name: str  # builtin name or custom code
    inputs: list[int]
    outputs: list[int]
    custom_options: dict | None = None


@dataclass
class TFLiteSummary:
    path: str
    file_bytes: int
    tensors: list[TensorInfo]
    ops: list[OpInfo]
    inputs: list[int]
    outputs: list[int]
    signatures: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    # the constants' buffers plus their quantization parameters as the file stores them (a float32
    # scale and an int64 zero point each: for int4 blocks of 32, 3 of a weight's 7 bits)
    weight_bytes: int = 0
    weight_layout: str = "inline"  # "appended": weights after the flatbuffer (Buffer.offset)
    quantization_bytes: int = 0  # of weight_bytes: the quantization parameters

    @property
    def op_histogram(self) -> dict[str, int]:
        return dict(sorted(collections.Counter(op.name for op in self.ops).items()))

    @property
    def custom_ops(self) -> list[OpInfo]:
        return [op for op in self.ops if op.custom_options is not None]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def read_tflite(path) -> TFLiteSummary:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:
            raise BadInput(f"{path}: empty file, not a .tflite model") from exc
    try:
        return _summarize(path, data)
    except BadInput:
        raise
    except Exception as exc:  # a truncated or foreign flatbuffer fails in many ways
        raise BadInput(f"{path}: not a valid .tflite model ({type(exc).__name__}: {exc})") from exc


def _summarize(path: Path, data) -> TFLiteSummary:
    if len(data) < 8 or bytes(data[4:8]) != b"TFL3":
        raise BadInput(f"{path}: not a .tflite model (missing the TFL3 identifier)")
    model = schema.Model.GetRootAs(data, 0)
    if model.SubgraphsLength() < 1:
        raise BadInput(f"{path}: .tflite model has no subgraph")
    buffer_sizes = []
    appended = False
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        if buf.Offset() > 1:
            appended = True
            if buf.Offset() + buf.Size() > len(data):
                raise BadInput(f"{path}: truncated .tflite (buffer {i} ends at byte "
                               f"{buf.Offset() + buf.Size()}, the file has {len(data)})")
        buffer_sizes.append(buf.DataLength() if buf.Offset() <= 1 else buf.Size())
    sub = model.Subgraphs(0)
    tensors = []
    quantization_bytes = 0
    for i in range(sub.TensorsLength()):
        t = sub.Tensors(i)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        if t.Type() not in TENSOR_TYPES:
            raise BadInput(f"{path}: tensor {i} ('{_text(t.Name())}') has type {t.Type()}, which is no TFLite type")
        dtype = np.dtype(NUMPY_TYPES.get(t.Type(), np.uint8))
        count = int(np.prod(shape, dtype=np.int64))
        if t.Type() == schema.TensorType.INT4:  # two values a byte
            nbytes, dtype_name = (count + 1) // 2, "int4"
        else:
            nbytes, dtype_name = count * dtype.itemsize, dtype.name
        if t.Buffer() >= len(buffer_sizes):
            raise BadInput(f"{path}: tensor {i} points at a missing buffer")
        const = t.Buffer() > 0 and buffer_sizes[t.Buffer()] > 0
        quant = t.Quantization() if const else None
        if quant is not None:
            quantization_bytes += 4 * quant.ScaleLength() + 8 * quant.ZeroPointLength()
        tensors.append(TensorInfo(_text(t.Name()), shape, dtype_name, nbytes, const))
    codes = []
    for i in range(model.OperatorCodesLength()):
        c = model.OperatorCodes(i)
        code = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
        codes.append(_text(c.CustomCode()) if code == schema.BuiltinOperator.CUSTOM
                     else BUILTIN_NAMES.get(code, f"BUILTIN_{code}"))
    ops = []
    for i in range(sub.OperatorsLength()):
        o = sub.Operators(i)
        name = codes[o.OpcodeIndex()]
        options = None
        if o.CustomOptionsLength():
            options = flexbuffers.Loads(bytes(o.CustomOptionsAsNumpy()))
        elif name.startswith("difflite."):
            options = {}
        ops.append(OpInfo(name, [int(x) for x in o.InputsAsNumpy()] if o.InputsLength() else [],
                          [int(x) for x in o.OutputsAsNumpy()] if o.OutputsLength() else [], options))
    signatures = {}
    for i in range(model.SignatureDefsLength()):
        s = model.SignatureDefs(i)
        signatures[_text(s.SignatureKey())] = {
            "inputs": {_text(s.Inputs(j).Name()): s.Inputs(j).TensorIndex() for j in range(s.InputsLength())},
            "outputs": {_text(s.Outputs(j).Name()): s.Outputs(j).TensorIndex() for j in range(s.OutputsLength())},
        }
    return TFLiteSummary(
        str(path), len(data), tensors, ops,
        [int(x) for x in sub.InputsAsNumpy()] if sub.InputsLength() else [],
        [int(x) for x in sub.OutputsAsNumpy()] if sub.OutputsLength() else [],
        signatures, sum(buffer_sizes) + quantization_bytes, "appended" if appended else "inline",
        quantization_bytes)
