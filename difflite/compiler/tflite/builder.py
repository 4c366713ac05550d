"""A small append-only builder for one-subgraph .tflite flatbuffers.

It knows the TFLite schema (via ai_edge_litert.schema_py_generated) and nothing of ONNX.
Constant buffers are deduplicated by content, so equal weights are stored once, and spooled to
a temporary file as they arrive, so building a model never holds its weights in memory.
Everything is emitted in insertion order, so the same build sequence gives byte-identical files.

Weights go inside the flatbuffer when the model fits its 2 GiB limit ("inline", what every
TFLite runtime reads) and otherwise after it, located by Buffer.offset/size from the start of
the file ("appended", TFLite's layout for models over 2 GiB)."""

from __future__ import annotations

import hashlib
import io
import shutil
import tempfile

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

from difflite.core.errors import BadInput
from difflite.core.finite import check_finite, check_no_nan
from difflite.folder.schema import NUMPY_TYPES, SIGNATURE_KEY, TFLITE_TYPES

QUANTIZED_TYPES = {"int8": schema.TensorType.INT8, "int4": schema.TensorType.INT4}
# Every weight starts on a 128-byte boundary of the file (inline or appended): the largest
# base-address alignment OpenCL devices ask (1024 bits), so that on a device sharing memory with
# the host a weight can back a buffer in place, straight from the mapped file (zero copy).
BUFFER_ALIGNMENT = 128
APPENDED_ALIGNMENT = BUFFER_ALIGNMENT
FLATBUFFER_LIMIT = 2**31 - 1  # flatbuffers' 32-bit offsets
INLINE_HEADROOM = 64 << 20  # room for the graph itself next to the weights
WEIGHT_LAYOUTS = ("auto", "inline", "appended")
SCHEMA_VERSION = 3


def option_class_name(op_name: str) -> str | None:
    """The BuiltinOptions union member for a builtin op, e.g. CONV_2D -> Conv2DOptions."""
    special = {
        "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
        "CONCATENATION": "ConcatenationOptions", "MEAN": "ReducerOptions",
        "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
        "REDUCE_PROD": "ReducerOptions", "MAXIMUM": "MaximumMinimumOptions",
        "MINIMUM": "MaximumMinimumOptions", "LOGISTIC": None, "TANH": None, "RSQRT": None,
        "SQRT": None, "RELU": None, "SIN": None, "FLOOR": None, "CEIL": None, "ROUND": None,
        "BATCH_MATMUL": "BatchMatMulOptions", "SPLIT_V": "SplitVOptions",
        "SELECT_V2": "SelectV2Options", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
        "STRIDED_SLICE": "StridedSliceOptions", "FULLY_CONNECTED": "FullyConnectedOptions",
        "BROADCAST_TO": "BroadcastToOptions", "GELU": "GeluOptions",
        "SQUARED_DIFFERENCE": "SquaredDifferenceOptions",
    }
    if op_name in special:
        return special[op_name]
    camel = "".join(part.capitalize() for part in op_name.split("_"))
    return f"{camel}Options"


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


class WeightSpool:
    """Constant bytes in an unnamed temporary file, each entry aligned to APPENDED_ALIGNMENT, so
    the file is exactly the weight segment of an "appended" model."""

    def __init__(self, directory=None):
        self._file = tempfile.TemporaryFile(dir=directory)
        self.size = 0

    def add(self, raw: bytes) -> int:
        offset = _align(self.size, APPENDED_ALIGNMENT)
        self._file.seek(offset)
        self._file.write(raw)
        self.size = offset + len(raw)
        return offset

    def read_into(self, offset: int, target: memoryview) -> None:
        self._file.seek(offset)
        if self._file.readinto(target) != len(target):
            raise OSError("weight spool is shorter than expected")

    def copy_to(self, out) -> None:
        self._file.flush()
        self._file.seek(0)
        shutil.copyfileobj(self._file, out, 16 << 20)

    def close(self) -> None:
        self._file.close()


class ModelBuilder:
    def __init__(self, description: str = "difflite", spool_dir=None):
        self.description = description
        # (spool offset, bytes) per buffer; buffer 0 is the empty sentinel
        self.buffers: list[tuple[int, int] | None] = [None]
        self._spool = WeightSpool(spool_dir)
        self._constant_bytes = 0
        self._buffer_index: dict[tuple, int] = {}
        self.tensors: list[schema.TensorT] = []
        self.operators: list[schema.OperatorT] = []
        self.opcodes: list[schema.OperatorCodeT] = []
        self._opcode_index: dict[tuple, int] = {}
        self.inputs: list[tuple[str, int]] = []
        self.outputs: list[tuple[str, int]] = []

    # -- tensors ---------------------------------------------------------------------------
    def tensor(self, name: str, shape, dtype) -> int:
        self.tensors.append(tensor_t(name, shape, dtype))
        return len(self.tensors) - 1

    def constant(self, name: str, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        check_no_nan(array, f"constant '{name}'")  # an infinity may be meant (a mask), a NaN never is
        index = self.tensor(name, array.shape, array.dtype)
        self.tensors[index].buffer = self._buffer_for(array)
        return index

    def quantized_constant(self, name: str, stored) -> int:
        """An INT8 or INT4 constant (quantize.Quantized) with its per-axis scales, zero points 0."""
        check_finite(np.asarray(stored.scales, np.float32), f"the scales of weight '{name}'")
        index = self.tensor(name, stored.shape, np.int8)
        tensor = self.tensors[index]
        tensor.type = QUANTIZED_TYPES[stored.width]
        tensor.buffer = self._buffer_for(np.ascontiguousarray(stored.data), tag=stored.width)
        params = schema.QuantizationParametersT()
        params.scale = [float(s) for s in stored.scales]
        params.zeroPoint = [0] * len(params.scale)
        params.quantizedDimension = int(stored.axis)
        tensor.quantization = params
        return index

    def _buffer_for(self, array: np.ndarray, tag: str | None = None) -> int:
        raw = array.tobytes()
        key = (tag or array.dtype.str, hashlib.sha256(raw).hexdigest())
        if key not in self._buffer_index:
            self.buffers.append((self._spool.add(raw), len(raw)) if raw else None)
            self._constant_bytes += len(raw)
            self._buffer_index[key] = len(self.buffers) - 1
        return self._buffer_index[key]

    def shape_of(self, index: int) -> tuple[int, ...]:
        return tuple(self.tensors[index].shape)

    def dtype_of(self, index: int) -> np.dtype:
        return NUMPY_TYPES[self.tensors[index].type]

    def is_constant(self, index: int) -> bool:
        return self.tensors[index].buffer != 0

    def constant_bytes(self) -> int:
        return self._constant_bytes

    def weight_layout(self, requested: str = "auto") -> str:
        """`requested`, or for "auto" "inline" when the weights fit inside the flatbuffer, else
        "appended". "inline" for weights that cannot fit is refused (BadInput), naming the size."""
        if requested not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight layout {requested!r} is not one of {WEIGHT_LAYOUTS}")
        inline_bytes = self._constant_bytes + BUFFER_ALIGNMENT * len(self.buffers) + INLINE_HEADROOM
        fits = inline_bytes < FLATBUFFER_LIMIT
        if requested == "inline" and not fits:
            raise BadInput(f"--weights-layout inline: {self.description}'s {self._constant_bytes / 2**30:.2f} GiB "
                           f"of weights do not fit inside a flatbuffer (2 GiB); use appended or auto")
        if requested != "auto":
            return requested
        return "inline" if fits else "appended"

    # -- operators -------------------------------------------------------------------------
    def _opcode(self, builtin: int, custom_code: str | None) -> int:
        key = (builtin, custom_code)
        if key not in self._opcode_index:
            code = schema.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            code.version = 1
            if custom_code is not None:
                code.customCode = custom_code
            self.opcodes.append(code)
            self._opcode_index[key] = len(self.opcodes) - 1
        return self._opcode_index[key]

    def op(self, name: str, inputs: list[int], outputs: list[int], **options) -> None:
        """Append builtin operator `name` (e.g. "CONV_2D"); keyword options set its
        BuiltinOptions fields (camelCase as in the schema)."""
        opcode = self._opcode(getattr(schema.BuiltinOperator, name), None)
        self.operators.append(builtin_operator(opcode, name, inputs, outputs, **options))

    def custom_op(self, custom_code: str, inputs: list[int], outputs: list[int], options: dict) -> None:
        operator = schema.OperatorT()
        operator.opcodeIndex = self._opcode(schema.BuiltinOperator.CUSTOM, custom_code)
        operator.inputs = list(inputs)
        operator.outputs = list(outputs)
        operator.customOptions = list(flexbuffers.Dumps(options))
        operator.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        self.operators.append(operator)

    # -- serialisation ---------------------------------------------------------------------
    def _subgraph(self) -> schema.SubGraphT:
        sub = schema.SubGraphT()
        sub.tensors = self.tensors
        sub.operators = self.operators
        sub.inputs = [i for _, i in self.inputs]
        sub.outputs = [i for _, i in self.outputs]
        sub.name = "main"
        return sub

    def _signature(self) -> schema.SignatureDefT:
        def tensor_map(name, index):
            m = schema.TensorMapT()
            m.name = name
            m.tensorIndex = index
            return m

        sig = schema.SignatureDefT()
        sig.signatureKey = SIGNATURE_KEY
        sig.subgraphIndex = 0
        sig.inputs = [tensor_map(n, i) for n, i in self.inputs]
        sig.outputs = [tensor_map(n, i) for n, i in self.outputs]
        return sig

    def _model(self) -> schema.ModelT:
        model = schema.ModelT()
        model.version = SCHEMA_VERSION
        model.description = self.description
        model.operatorCodes = self.opcodes
        model.subgraphs = [self._subgraph()]
        model.signatureDefs = [self._signature()]
        return model

    def write(self, out, weights: str = "auto") -> str:
        """Write the finished .tflite to the binary file `out`; returns the weight layout used.
        Call once: the weight spool is closed afterwards."""
        layout = self.weight_layout(weights)
        try:
            if layout == "inline":
                out.write(self._inline_flatbuffer())
            else:
                self._write_appended(out)
        finally:
            self._spool.close()
        return layout

    def serialize(self, weights: str = "auto") -> memoryview:
        """The finished .tflite in memory (for tests and small models)."""
        out = io.BytesIO()
        self.write(out, weights)
        return out.getbuffer()

    def _inline_flatbuffer(self) -> memoryview:
        builder = flatbuffers.Builder(self._constant_bytes + BUFFER_ALIGNMENT * len(self.buffers) + (1 << 20))
        offsets = [self._pack_inline_buffer(builder, entry) for entry in self.buffers]
        builder.Finish(_pack_model(builder, self._model(), offsets), file_identifier=b"TFL3")
        # A view, not builder.Output()'s copy: a 2 GB model would otherwise exist twice.
        return memoryview(builder.Bytes)[builder.Head():]

    def _pack_inline_buffer(self, builder: flatbuffers.Builder, entry: tuple[int, int] | None) -> int:
        vector = None
        if entry is not None:
            offset, size = entry
            builder.StartVector(1, size, BUFFER_ALIGNMENT)
            builder.head -= size
            self._spool.read_into(offset, memoryview(builder.Bytes)[builder.head:builder.head + size])
            vector = builder.EndVector()
        schema.BufferStart(builder)
        if vector is not None:
            schema.BufferAddData(builder, vector)
        return schema.BufferEnd(builder)

    def _appended_flatbuffer(self, segment_start: int) -> bytearray:
        builder = flatbuffers.Builder(1 << 20)
        offsets = []
        for entry in self.buffers:
            schema.BufferStart(builder)
            if entry is not None:
                schema.BufferAddOffset(builder, segment_start + entry[0])
                schema.BufferAddSize(builder, entry[1])
            offsets.append(schema.BufferEnd(builder))
        builder.Finish(_pack_model(builder, self._model(), offsets), file_identifier=b"TFL3")
        return builder.Output()

    def _write_appended(self, out) -> None:
        # Every offset is a non-zero ulong whatever the segment start, so the flatbuffer's size
        # does not depend on it: pack once to measure, once with the real offsets.
        probe = len(self._appended_flatbuffer(FLATBUFFER_LIMIT))
        segment_start = _align(probe, APPENDED_ALIGNMENT)
        flatbuffer = self._appended_flatbuffer(segment_start)
        if len(flatbuffer) != probe:
            raise AssertionError("appended-weights flatbuffer changed size between packings")
        out.write(flatbuffer)
        out.write(b"\0" * (segment_start - len(flatbuffer)))
        self._spool.copy_to(out)


def tensor_t(name: str, shape, dtype, buffer: int = 0) -> schema.TensorT:
    """A tensor of static `shape` and NumPy `dtype`, its data in `buffer` (0: none)."""
    t = schema.TensorT()
    t.name = name
    t.shape = [int(d) for d in shape]
    t.type = TFLITE_TYPES[np.dtype(dtype)]
    t.hasRank = True
    t.buffer = buffer
    return t


def builtin_operator(opcode_index: int, name: str, inputs, outputs, **options) -> schema.OperatorT:
    """Builtin operator `name` ("CONV_2D") at `opcode_index`; keyword options set its
    BuiltinOptions fields (camelCase as in the schema)."""
    operator = schema.OperatorT()
    operator.opcodeIndex = opcode_index
    operator.inputs = list(inputs)
    operator.outputs = list(outputs)
    class_name = option_class_name(name)
    if class_name is not None and hasattr(schema, class_name + "T"):
        opts = getattr(schema, class_name + "T")()
        for key, value in options.items():
            if not hasattr(opts, key):
                raise AttributeError(f"{class_name} has no field {key}")
            setattr(opts, key, value)
        operator.builtinOptionsType = getattr(schema.BuiltinOptions, class_name)
        operator.builtinOptions = opts
    elif options:
        raise AttributeError(f"{name} takes no options, got {sorted(options)}")
    return operator


def _offsets_vector(builder, start, offsets: list[int]) -> int:
    """A flatbuffer vector of already packed tables (flatbuffers builds vectors back to front)."""
    start(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def _pack_model(builder, model: schema.ModelT, buffer_offsets: list[int]) -> int:
    """ModelT.Pack, except that the buffers are the pre-packed, BUFFER_ALIGNMENT-aligned ones (the
    generated Pack copies byte by byte and aligns only to the element size)."""
    buffers_vector = _offsets_vector(builder, schema.ModelStartBuffersVector, buffer_offsets)
    codes_vec = _offsets_vector(builder, schema.ModelStartOperatorCodesVector,
                                [c.Pack(builder) for c in model.operatorCodes])
    subs_vec = _offsets_vector(builder, schema.ModelStartSubgraphsVector, [s.Pack(builder) for s in model.subgraphs])
    sigs_vec = _offsets_vector(builder, schema.ModelStartSignatureDefsVector,
                               [s.Pack(builder) for s in model.signatureDefs])
    description = builder.CreateString(model.description)
    schema.ModelStart(builder)
    schema.ModelAddVersion(builder, model.version)
    schema.ModelAddOperatorCodes(builder, codes_vec)
    schema.ModelAddSubgraphs(builder, subs_vec)
    schema.ModelAddDescription(builder, description)
    schema.ModelAddBuffers(builder, buffers_vector)
    schema.ModelAddSignatureDefs(builder, sigs_vec)
    return schema.ModelEnd(builder)
