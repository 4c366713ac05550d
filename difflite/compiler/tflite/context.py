"""The lowering context: what a lowering function sees of the graph being written.

It maps each ONNX value to a TFLite tensor plus the layout (`perm`) it is stored in, hands out
inputs in the layout an op needs (emitting TRANSPOSE or RESHAPE only when needed), and turns
compile-time constants into TFLite constant tensors (float16 + DEQUANTIZE at --precision fp16;
convolution and linear weights int8 / int4 + DEQUANTIZE with --weights)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from difflite.compiler.tflite import layout, quantize
from difflite.compiler.tflite.builder import ModelBuilder
from difflite.compiler.tflite.quantize import WeightQuantization
from difflite.core.errors import UnsupportedOp
from difflite.core.finite import check_finite, check_storable

ONNX_TO_NUMPY = {
    ir.DataType.FLOAT: np.float32,
    ir.DataType.FLOAT16: np.float16,
    ir.DataType.DOUBLE: np.float32,  # TFLite has no float64 activations
    ir.DataType.INT64: np.int32,     # TFLite (and mobile GPUs) index with int32
    ir.DataType.INT32: np.int32,
    ir.DataType.BOOL: np.bool_,
    ir.DataType.UINT8: np.uint8,
    ir.DataType.INT8: np.int8,
}
FP16_MIN_ELEMENTS = 64  # smaller constants stay float32: no size to win, and exact biases
CACHED_CONSTANT_BYTES = 1 << 20  # larger ONNX weights are re-read from the file, not kept


def to_float16(array, what: str) -> np.ndarray:
    """float16 values of `array`; NonFiniteWeights naming `what` where a finite value is beyond
    float16's range (without NumPy's overflow warning)."""
    source = np.asarray(array, np.float32)
    with np.errstate(over="ignore"):
        half = source.astype(np.float16)
    check_storable(source, half, f"weight '{what}'")
    return half


def unsupported_at(node: ir.Node | None, detail: str) -> UnsupportedOp:
    """The refusal of `node` (exit 2): its op type, its name and its first output name it."""
    if node is None:
        return UnsupportedOp("?", "?", detail)
    op_type = node.op_type if not node.domain else f"{node.domain}.{node.op_type}"
    output = node.outputs[0].name if node.outputs and node.outputs[0] is not None else None
    return UnsupportedOp(op_type, node.name or "", detail, output=output)


@dataclass
class Stored:
    index: int
    perm: tuple[int, ...]


@dataclass
class LoweringContext:
    builder: ModelBuilder
    precision: str = "fp32"
    fuse: frozenset = frozenset()
    # forms for stock LiteRT's GPU accelerator where they differ (`--no-fuse` files): quantized
    # linear layers as 1x1 convolutions (ops/matmul.py)
    stock_gpu_forms: bool = False
    quantization: WeightQuantization = field(default_factory=WeightQuantization)
    # Per weight of a convolution / linear layer: its name, shape, storage width and bytes.
    weight_widths: list[dict] = field(default_factory=list)
    values: dict[str, Stored] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _in_layout: dict[tuple, int] = field(default_factory=dict)
    _const_tensors: dict[tuple, int] = field(default_factory=dict)
    node: ir.Node | None = None  # the node being lowered, for error messages and names
    _names: dict[str, int] = field(default_factory=dict)
    _uses_left: dict[str, int] = field(default_factory=dict)
    # Nodes an earlier lowering already emitted (e.g. a bias Add folded into FULLY_CONNECTED):
    # the writer skips them.
    absorbed: set = field(default_factory=set)

    # -- facts about ONNX values ---------------------------------------------------------
    def shape(self, value: ir.Value) -> tuple[int, ...]:
        if value.name in self.shapes:
            return self.shapes[value.name]
        if value.name in self.constants:
            return tuple(self.constants[value.name].shape)
        if value.const_value is not None:
            return tuple(int(d) for d in value.const_value.shape)
        if value.shape is None or not all(isinstance(d, int) for d in value.shape):
            raise self.unsupported(f"value '{value.name}' has no static shape ({value.shape})")
        return tuple(int(d) for d in value.shape)

    def rank(self, value: ir.Value) -> int:
        return len(self.shape(value))

    def dtype(self, value: ir.Value) -> np.dtype:
        if value.name in self.constants:
            return self._tflite_dtype(self.constants[value.name].dtype)
        if value.name in self.values:
            return self.builder.dtype_of(self.values[value.name].index)
        if value.dtype not in ONNX_TO_NUMPY:
            raise self.unsupported(f"value '{value.name}' has unsupported type {value.dtype}")
        return np.dtype(ONNX_TO_NUMPY[value.dtype])

    @staticmethod
    def _tflite_dtype(dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype == np.int64:
            return np.dtype(np.int32)
        if dtype == np.float64:
            return np.dtype(np.float32)
        return dtype

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The value's array if it is a compile-time constant. Weights in the ONNX external-data
        file are copied out and the file unmapped at once: a mapping would keep every page of the
        model resident until the end of the write."""
        if value is None:
            return None
        if value.name in self.constants:
            return self.constants[value.name]
        tensor = value.const_value
        if tensor is None:
            return None
        if not isinstance(tensor, ir.ExternalTensor):
            array = tensor.numpy()  # already in memory: caching it costs nothing
            self.constants[value.name] = array
            return array
        array = np.array(tensor.numpy())
        tensor.release()
        if array.nbytes <= CACHED_CONSTANT_BYTES:
            self.constants[value.name] = array
        return array

    def is_const(self, value: ir.Value | None) -> bool:
        return value is not None and (value.name in self.constants or value.const_value is not None)

    def lowered(self, node: ir.Node) -> None:
        """Forget the constants only `node` still needed (folded weights can be large)."""
        for value in node.inputs:
            if value is None or value.name not in self.constants or value.const_value is not None:
                continue
            left = self._uses_left.get(value.name, len(value.uses())) - 1
            self._uses_left[value.name] = left
            if left <= 0 and not value.is_graph_output():
                del self.constants[value.name]

    def perm(self, value: ir.Value) -> tuple[int, ...]:
        if self.is_const(value):
            return layout.identity(self.rank(value))
        return self.values[value.name].perm

    def unsupported(self, detail: str) -> UnsupportedOp:
        return unsupported_at(self.node, detail)

    # -- TFLite tensors ----------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        count = self._names.get(base, 0)
        self._names[base] = count + 1
        return base if count == 0 else f"{base}:{count}"

    def temp(self, suffix: str, shape, dtype=np.float32) -> int:
        base = self.node.outputs[0].name if self.node is not None else "tmp"
        return self.builder.tensor(self.unique_name(f"{base}/{suffix}"), shape, dtype)

    def output(self, value: ir.Value, perm, dtype=None) -> int:
        """Create the TFLite tensor for ONNX output `value`, stored in layout `perm`."""
        perm = tuple(perm)
        shape = layout.apply(self.shape(value), perm)
        index = self.builder.tensor(self.unique_name(value.name), shape, dtype or self.dtype(value))
        self.define(value, index, perm)
        return index

    def define(self, value: ir.Value, index: int, perm) -> None:
        self.values[value.name] = Stored(index, tuple(perm))
        self.shapes.setdefault(value.name, self.shape_from_tensor(index, perm))

    def shape_from_tensor(self, index: int, perm) -> tuple[int, ...]:
        stored = self.builder.shape_of(index)
        inv = layout.inverse(perm)
        return tuple(stored[i] for i in inv)

    # -- inputs in a wanted layout -------------------------------------------------------
    def input(self, value: ir.Value, perm=None, rank: int | None = None) -> int:
        """The TFLite tensor of `value` stored in layout `perm` (default: as it is stored).
        With `rank`, a lower-rank value is first padded with leading unit axes (broadcasting)."""
        if self.is_const(value):
            array = self.const(value)
            if rank is not None and array.ndim < rank:
                array = array.reshape((1,) * (rank - array.ndim) + array.shape)
            perm = tuple(perm) if perm is not None else layout.identity(array.ndim)
            return self.constant(np.transpose(array, perm) if array.ndim else array, value.name, perm)
        stored = self.values[value.name]
        own_rank = len(stored.perm)
        if perm is None:
            perm = stored.perm
        perm = tuple(perm)
        if rank is not None and own_rank < rank:
            flat = self.input(value, layout.identity(own_rank))
            padded_shape = (1,) * (rank - own_rank) + self.shape(value)
            padded = self._reshape_cached(value.name, flat, padded_shape)
            return self._transpose_cached(value.name + "/bcast", padded, layout.identity(rank), perm,
                                          padded_shape)
        return self._transpose_cached(value.name, stored.index, stored.perm, perm, self.shape(value))

    def _transpose_cached(self, key: str, index: int, current, wanted, onnx_shape) -> int:
        if tuple(current) == tuple(wanted):
            return index
        cache_key = (key, tuple(wanted))
        if cache_key not in self._in_layout:
            out_shape = layout.apply(onnx_shape, wanted)
            out = self.builder.tensor(self.unique_name(f"{key}/{''.join(map(str, wanted))}"),
                                      out_shape, self.builder.dtype_of(index))
            stored_shape = layout.apply(onnx_shape, current)
            rel = layout.relative(current, wanted)
            if layout.transpose_is_reshape(stored_shape, rel):
                self.reshape_op(index, out, out_shape)
            else:
                self.builder.op("TRANSPOSE", [index, self.int_constant(rel)], [out])
            self._in_layout[cache_key] = out
        return self._in_layout[cache_key]

    def _reshape_cached(self, key: str, index: int, shape) -> int:
        cache_key = (key, "reshape", tuple(shape))
        if cache_key not in self._in_layout:
            out = self.builder.tensor(self.unique_name(f"{key}/r"), shape, self.builder.dtype_of(index))
            self.reshape_op(index, out, shape)
            self._in_layout[cache_key] = out
        return self._in_layout[cache_key]

    def reshape_op(self, src: int, dst: int, shape) -> None:
        self.builder.op("RESHAPE", [src, self.int_constant(shape)], [dst], newShape=[int(d) for d in shape])

    # -- constants -------------------------------------------------------------------------
    def int_constant(self, values) -> int:
        array = np.asarray(values, dtype=np.int32)
        key = ("int", array.shape, array.tobytes())
        if key not in self._const_tensors:
            self._const_tensors[key] = self.builder.constant(self.unique_name("const/int"), array)
        return self._const_tensors[key]

    def float_constant(self, values, name: str = "const/float") -> int:
        return self.constant(np.asarray(values, dtype=np.float32), name, None)

    def weight_width(self, array: np.ndarray, name: str) -> tuple[str, str | None]:
        """(width, digest) of a convolution or linear weight in the writer's layout: "float" or
        the width --weights and the recipe give it (int4 falls back to int8 where blocks do not
        tile); the digest where per-layer widths need it (the int4 mix), else None."""
        q = self.quantization
        digest = quantize.weight_digest(array) if q.overrides and q.applies(name, array.size) else None
        return q.width_for(name, array, digest), digest

    def weight(self, array: np.ndarray, name: str, shape=None) -> int:
        """The weight of a convolution (OHWI) or linear layer ([N, K]): axis 0 is the output
        channel, the last axis the input. Quantized per --weights (int8 per output channel, int4
        blockwise along the input, or the width the quantization's per-layer overrides give its
        digest; difflite/compiler/tflite/quantize.py) where it applies, in TFLite's standard ops back to
        float32 (int8: DEQUANTIZE; int4: DEQUANTIZE, MUL by block scales, RESHAPE); else as
        constant() stores it. `shape`: written in that shape instead (a linear weight as a 1x1
        filter [N, 1, 1, K]), its width and digest still those of `array`."""
        array = np.asarray(array, dtype=np.float32)
        check_finite(array, f"weight '{name}'")  # a convolution or linear weight: never infinite on purpose
        width, digest = self.weight_width(array, name)
        layer_shape = list(array.shape)
        if shape is not None:
            array = array.reshape(shape)
        float_bytes = array.size * (2 if self.precision == "fp16" and array.size >= FP16_MIN_ELEMENTS else 4)
        extra = {"digest": digest} if digest else {}
        if width == "float":
            self.weight_widths.append({"name": name, "shape": layer_shape, "width": self.precision,
                                       "bytes": float_bytes, "float_bytes": float_bytes, **extra})
            return self.constant(array, name)
        tensor_name = self.unique_name(name)
        if width == "int8":
            stored = quantize.quantize_int8(array, 0)
            index = self._dequantized(tensor_name, stored, tensor_name)
        else:
            stored = quantize.quantize_int4(array, self.quantization.block, quantize.scale_dtype(self.precision))
            index = self._int4_weight(tensor_name, stored, array.shape)
        self.weight_widths.append({"name": name, "shape": layer_shape, "width": width,
                                   "bytes": stored.total_bytes, "float_bytes": float_bytes, **extra})
        return index

    def lookup(self, table: np.ndarray, name: str, indices: int, out: int) -> bool:
        """out = GATHER(table, indices) on axis 0 of a constant [V, D] float table, with the table
        stored as its quantization's lookup_width says: int8 rows of per-tensor scale 1,
        DEQUANTIZEd, gathered, times their gathered per-row scales (MUL; the scales stored as
        constant() stores floats). The DEQUANTIZE comes first, on the constant, so that every
        runtime sees a constant it folds: a GATHER of the int8 rows would leave those two nodes
        to TFLite in the OpenCL backend, and TFLite's partitioning then puts every weight's
        folded DEQUANTIZE in a partition of its own, dequantized at every call
        (the int4 text encoder took 196 ms a call instead of 3.0 so, on the H100 in 2026-11).
        A float table at precision fp16 is gathered as float16 rows and CAST to float32: stock
        LiteRT's GPU accelerator refuses a DEQUANTIZE feeding a GATHER and runs a float16
        GATHER followed by a CAST (LiteRT 2.3.0 on an H100, 2026-11).
        False (nothing written) where the table stays float32."""
        if self.stock_gpu_forms or self.quantization.lookup_width(name, table.size) == "float":
            # (stock LiteRT's GPU takes no integer GATHER: `--no-fuse` files keep the table float)
            return self._half_lookup(table, name, indices, out)
        table = np.asarray(table, dtype=np.float32)
        stored = quantize.quantize_int8(table, 0, quantize.scale_dtype(self.precision))
        tensor_name = self.unique_name(name)
        unit = quantize.Quantized("int8", stored.shape, stored.data, np.ones(1, np.float32), 0)
        values = self._dequantized(tensor_name, unit, tensor_name + "/values")
        rows_shape = (*self.builder.shape_of(indices), table.shape[1])
        rows = self.builder.tensor(tensor_name + "/rows", rows_shape, np.float32)
        self.builder.op("GATHER", [values, indices], [rows], axis=0)
        scales = self.constant(stored.scales.reshape(-1, 1), tensor_name + "/scales")
        row_scales = self.builder.tensor(tensor_name + "/row_scales", (*rows_shape[:-1], 1), np.float32)
        self.builder.op("GATHER", [scales, indices], [row_scales], axis=0)
        self.builder.op("MUL", [rows, row_scales], [out])
        float_bytes = table.size * (2 if self.precision == "fp16" else 4)
        self.weight_widths.append({"name": name, "shape": list(table.shape), "width": "int8",
                                   "bytes": stored.total_bytes, "float_bytes": float_bytes, "lookup": True})
        return True

    def _half_lookup(self, table: np.ndarray, name: str, indices: int, out: int) -> bool:
        """GATHER of a float16 table, CAST of the rows to float32, where precision fp16 stores
        the table as float16 (else False: the caller gathers the float32 table)."""
        if self.precision != "fp16" or table.size < FP16_MIN_ELEMENTS:
            return False
        tensor_name = self.unique_name(name)
        half = self.builder.constant(tensor_name + "/fp16", to_float16(table, tensor_name))
        rows = self.builder.tensor(tensor_name + "/rows", self.builder.shape_of(out), np.float16)
        self.builder.op("GATHER", [half, indices], [rows], axis=0)
        self.builder.op("CAST", [rows], [out])
        return True

    def _dequantized(self, tensor_name: str, stored: quantize.Quantized, out_name: str) -> int:
        """DEQUANTIZE(the stored integers) to float32 in the stored shape."""
        packed = self.builder.quantized_constant(tensor_name + f"/{stored.width}", stored)
        index = self.builder.tensor(out_name, stored.shape, np.float32)
        self.builder.op("DEQUANTIZE", [packed], [index])
        return index

    def _int4_weight(self, tensor_name: str, stored: quantize.Quantized, shape) -> int:
        """int4's compact form (quantize.py): the integers as floats (per-tensor scale 1) times
        the block scales, reshaped to the weight's shape. Blocks [rows, 1, 1, B] and scales
        [rows, 1, 1, 1]: stock LiteRT's GPU takes a 4-D runtime weight, not a 2-D one
        (LiteRT 2.3.0 on an H100, 2026-11: the 2-D form failed to compile, the 4-D one ran)."""
        check_finite(stored.scales, f"the block scales of weight '{tensor_name}'")
        rows = (stored.shape[0], 1, 1, stored.shape[1])
        unit = quantize.Quantized("int4", rows, stored.data, np.ones(1, np.float32), 0)
        values = self._dequantized(tensor_name, unit, tensor_name + "/values")
        column = stored.scales.reshape(-1, 1, 1, 1)
        scales = (self._half_constant(tensor_name + "/scales", column) if stored.scale_bytes == 2
                  else self.builder.constant(tensor_name + "/scales", column))
        blocks = self.builder.tensor(tensor_name + "/blocks", rows, np.float32)
        self.builder.op("MUL", [values, scales], [blocks])
        index = self.builder.tensor(tensor_name, shape, np.float32)
        self.reshape_op(blocks, index, shape)
        return index

    def constant(self, array: np.ndarray, name: str, perm=None) -> int:
        """A constant tensor; float weights become float16 + DEQUANTIZE at precision fp16."""
        array = np.asarray(array)
        if array.dtype == np.int64:
            if array.size and (array.max() > np.iinfo(np.int32).max or array.min() < np.iinfo(np.int32).min):
                raise self.unsupported(f"constant '{name}' does not fit int32")
            array = array.astype(np.int32)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)
        key = (name, tuple(perm) if perm is not None else None, array.shape, array.dtype.str)
        if key in self._const_tensors:
            return self._const_tensors[key]
        tensor_name = self.unique_name(name)
        if self.precision == "fp16" and array.dtype == np.float32 and array.size >= FP16_MIN_ELEMENTS:
            index = self._half_constant(tensor_name, array)
        else:
            index = self.builder.constant(tensor_name, array)
        self._const_tensors[key] = index
        return index

    def _half_constant(self, tensor_name: str, array: np.ndarray) -> int:
        """float16 in the file, DEQUANTIZE to float32."""
        half = self.builder.constant(tensor_name + "/fp16", to_float16(array, tensor_name))
        index = self.builder.tensor(tensor_name, array.shape, np.float32)
        self.builder.op("DEQUANTIZE", [half], [index])
        return index
