"""Read a .tflite back without copying its weights: ops, custom ops, signatures, tensors."""

from __future__ import annotations

import collections
import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from difflite.folder.schema import NUMPY_TYPES
from difflite.core.errors import BadInput

BUILTIN_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
TENSOR_TYPES = {v for k, v in vars(schema.TensorType).items() if not k.startswith("_")}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    constant: bool
    variable: bool = False  # a variable tensor (state the graph reads before writing)


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

    def gathered_table_rows(self) -> int | None:
        """The rows of the largest constant table a GATHER reads (a text encoder's token embedding:
        its vocabulary, which token ids must stay below); None where no GATHER reads one."""
        made_by = {index: op for op in self.ops for index in op.outputs}
        rows = [self.tensors[op.inputs[0]].shape[0] for op in self.ops
                if op.name == "GATHER" and op.inputs and self._constant_table(op.inputs[0], made_by)]
        return max(rows, default=None)

    def _constant_table(self, index: int, made_by: dict[int, OpInfo]) -> bool:
        """A rank-2 constant, or one dequantized (an int8 table of `--weights int4`)."""
        if index < 0 or len(self.tensors[index].shape) != 2:
            return False
        maker = made_by.get(index)
        if maker is not None and maker.name == "DEQUANTIZE" and maker.inputs:
            index = maker.inputs[0]
        return index >= 0 and self.tensors[index].constant


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


# TFLite computes a tensor's bytes in size_t with an overflow check; a shape whose bytes do not
# fit a signed 64-bit count is refused here (a hostile file may declare [65536]*4, 2^64 elements).
MAX_TENSOR_BYTES = 2**63 - 1
VARIABLE_SIZE_TYPES = {schema.TensorType.STRING, schema.TensorType.RESOURCE, schema.TensorType.VARIANT}


def read_tflite(path) -> TFLiteSummary:
    """The summary of a .tflite file, its structure checked on the way: every offset, size and
    index the file holds must stay inside the file and its own tables (a hostile file can point
    anywhere). BadInput, one line naming the file, for anything that does not hold."""
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
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise BadInput(f"{path}: not a valid .tflite model ({detail})") from exc


class _Checker:
    """Bounds of the file being read: every vector a table names must fit in it."""

    def __init__(self, path: Path, size: int):
        self.path, self.size = path, size

    def bad(self, what: str) -> BadInput:
        return BadInput(f"{self.path}: {what}")

    def count(self, n: int, what: str, element_bytes: int = 4) -> int:
        if n < 0 or n * element_bytes > self.size:
            raise self.bad(f"not a valid .tflite model ({what}: {n} entries cannot fit in "
                           f"{self.size} bytes)")
        return n

    def index(self, value: int, limit: int, what: str, optional: bool = False) -> int:
        if (optional and value == -1) or 0 <= value < limit:
            return value
        raise self.bad(f"{what} {value} is out of range (the model has {limit})")


def _summarize(path: Path, data) -> TFLiteSummary:
    if len(data) < 8 or bytes(data[4:8]) != b"TFL3":
        raise BadInput(f"{path}: not a .tflite model (missing the TFL3 identifier)")
    check = _Checker(path, len(data))
    if int.from_bytes(data[0:4], "little") >= len(data):
        raise check.bad("not a valid .tflite model (its root table lies past the end of the file)")
    model = schema.Model.GetRootAs(data, 0)
    if check.count(model.SubgraphsLength(), "subgraphs") < 1:
        raise BadInput(f"{path}: .tflite model has no subgraph")
    buffer_sizes = []
    appended = False
    for i in range(check.count(model.BuffersLength(), "buffers")):
        buf = model.Buffers(i)
        if buf.Offset() > 1:
            appended = True
            if buf.Offset() + buf.Size() > len(data):  # Python integers: no wrap-around
                raise BadInput(f"{path}: truncated .tflite (buffer {i} ends at byte "
                               f"{buf.Offset() + buf.Size()}, the file has {len(data)})")
        buffer_sizes.append(buf.DataLength() if buf.Offset() <= 1 else buf.Size())
    sub = model.Subgraphs(0)
    tensors = []
    quantization_bytes = 0
    n_tensors = check.count(sub.TensorsLength(), "tensors")
    for i in range(n_tensors):
        t = sub.Tensors(i)
        name = _text(t.Name())
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        if t.Type() not in TENSOR_TYPES:
            raise BadInput(f"{path}: tensor {i} ('{name}') has type {t.Type()}, which is no TFLite type")
        if any(d < 0 for d in shape):
            raise check.bad(f"tensor {i} ('{name}') has a negative dimension: {list(shape)}")
        dtype = np.dtype(NUMPY_TYPES.get(t.Type(), np.uint8))
        count = math.prod(shape)
        if t.Type() == schema.TensorType.INT4:  # two values a byte
            nbytes, dtype_name = (count + 1) // 2, "int4"
        else:
            nbytes, dtype_name = count * dtype.itemsize, dtype.name
        if nbytes > MAX_TENSOR_BYTES:
            raise check.bad(f"tensor {i} ('{name}') of shape {list(shape)} has {count} elements: "
                            f"its size overflows a 64-bit count")
        buffer = check.index(t.Buffer(), len(buffer_sizes), f"tensor {i} ('{name}'): its buffer")
        const = buffer > 0 and buffer_sizes[buffer] > 0
        if const and t.Type() not in VARIABLE_SIZE_TYPES and buffer_sizes[buffer] < nbytes:
            raise check.bad(f"tensor {i} ('{name}') of shape {list(shape)} needs {nbytes} bytes, but its "
                            f"buffer {buffer} holds {buffer_sizes[buffer]}")
        quant = t.Quantization() if const else None
        if quant is not None:
            _check_quantization(check, i, name, shape, quant)
            quantization_bytes += 4 * quant.ScaleLength() + 8 * quant.ZeroPointLength()
        tensors.append(TensorInfo(name, shape, dtype_name, nbytes, const, bool(t.IsVariable())))
    codes = []
    for i in range(check.count(model.OperatorCodesLength(), "operator codes")):
        c = model.OperatorCodes(i)
        code = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
        codes.append(_text(c.CustomCode()) if code == schema.BuiltinOperator.CUSTOM
                     else BUILTIN_NAMES.get(code, f"BUILTIN_{code}"))
    ops = []
    for i in range(check.count(sub.OperatorsLength(), "operators")):
        o = sub.Operators(i)
        name = codes[check.index(o.OpcodeIndex(), len(codes), f"operator {i}'s opcode index")]
        inputs = [int(x) for x in o.InputsAsNumpy()] if o.InputsLength() else []
        outputs = [int(x) for x in o.OutputsAsNumpy()] if o.OutputsLength() else []
        for j in inputs:
            check.index(j, n_tensors, f"operator {i} ({name}): input tensor", optional=True)
        for j in outputs:
            check.index(j, n_tensors, f"operator {i} ({name}): output tensor")
        raw = _custom_options(check, i, name, o, data)
        options = None
        if raw:
            try:
                options = flexbuffers.Loads(raw)
            except Exception as exc:
                raise check.bad(f"operator {i} ({name}): custom options are not a FlexBuffer "
                                f"({type(exc).__name__})") from exc
        elif name.startswith("difflite."):
            options = {}
        ops.append(OpInfo(name, inputs, outputs, options))
    graph_inputs = [int(x) for x in sub.InputsAsNumpy()] if sub.InputsLength() else []
    graph_outputs = [int(x) for x in sub.OutputsAsNumpy()] if sub.OutputsLength() else []
    for kind, indices in (("input", graph_inputs), ("output", graph_outputs)):
        for j in indices:
            check.index(j, n_tensors, f"graph {kind} tensor")
    signatures = {}
    for i in range(check.count(model.SignatureDefsLength(), "signature defs")):
        s = model.SignatureDefs(i)
        key = _text(s.SignatureKey())
        check.index(s.SubgraphIndex(), model.SubgraphsLength(), f"signature '{key}' subgraph")
        entry = {}
        for kind, length, item in (("inputs", s.InputsLength(), s.Inputs), ("outputs", s.OutputsLength(), s.Outputs)):
            maps = [item(j) for j in range(check.count(length, f"signature '{key}' {kind}"))]
            entry[kind] = {_text(m.Name()): check.index(m.TensorIndex(), n_tensors, f"signature '{key}' {kind[:-1]} tensor")
                           for m in maps}
        signatures[key] = entry
    return TFLiteSummary(
        str(path), len(data), tensors, ops, graph_inputs, graph_outputs,
        signatures, sum(buffer_sizes) + quantization_bytes, "appended" if appended else "inline",
        quantization_bytes)


def _custom_options(check: _Checker, index: int, name: str, op, data) -> bytes:
    """An operator's custom options: inline, or (large custom options) at an offset of the file."""
    if op.CustomOptionsLength():
        return bytes(op.CustomOptionsAsNumpy())
    offset, size = op.LargeCustomOptionsOffset(), op.LargeCustomOptionsSize()
    if size == 0:
        return b""
    if offset <= 1 or offset + size > check.size:
        raise check.bad(f"operator {index} ({name}): its custom options lie at bytes {offset}..{offset + size}, "
                        f"past the end of the file ({check.size} bytes)")
    return bytes(data[offset:offset + size])


def _check_quantization(check: _Checker, index: int, name: str, shape: tuple, quant) -> None:
    """A constant's quantization as TFLite reads it: as many zero points as scales (or none), and
    per-axis scales along a dimension of the tensor that has that many entries."""
    scales, zero_points = quant.ScaleLength(), quant.ZeroPointLength()
    where = f"tensor {index} ('{name}')"
    if zero_points and zero_points != scales:
        raise check.bad(f"{where} has {scales} quantization scales but {zero_points} zero points")
    if scales > 1:
        axis = quant.QuantizedDimension()
        if not 0 <= axis < len(shape):
            raise check.bad(f"{where} is quantized along dimension {axis} of its shape {list(shape)}")
        if shape[axis] != scales:
            raise check.bad(f"{where} has {scales} quantization scales for dimension {axis} of {list(shape)}")
