"""A small append-only builder for one-subgraph .tflite flatbuffers.

It knows the TFLite schema (via ai_edge_litert.schema_py_generated) and nothing of ONNX.
Constant buffers are deduplicated by content, so equal weights are stored once; everything is
emitted in insertion order, so the same build sequence gives byte-identical files."""

from __future__ import annotations

import hashlib

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

TFLITE_TYPES = {
    np.dtype(np.float32): schema.TensorType.FLOAT32,
    np.dtype(np.float16): schema.TensorType.FLOAT16,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.int64): schema.TensorType.INT64,
    np.dtype(np.bool_): schema.TensorType.BOOL,
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.uint8): schema.TensorType.UINT8,
}
NUMPY_TYPES = {v: k for k, v in TFLITE_TYPES.items()}
BUFFER_ALIGNMENT = 16
SCHEMA_VERSION = 3
SIGNATURE_KEY = "serving_default"


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


class ModelBuilder:
    def __init__(self, description: str = "difflite"):
        self.description = description
        self.buffers: list[np.ndarray | None] = [None]  # buffer 0 is the empty sentinel
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
        t = schema.TensorT()
        t.name = name
        t.shape = [int(d) for d in shape]
        t.type = TFLITE_TYPES[np.dtype(dtype)]
        t.hasRank = True
        self.tensors.append(t)
        return len(self.tensors) - 1

    def constant(self, name: str, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        index = self.tensor(name, array.shape, array.dtype)
        self.tensors[index].buffer = self._buffer_for(array)
        return index

    def _buffer_for(self, array: np.ndarray) -> int:
        raw = array.tobytes()
        key = (array.dtype.str, hashlib.sha256(raw).hexdigest())
        if key not in self._buffer_index:
            self.buffers.append(np.frombuffer(raw, dtype=np.uint8))
            self._count(self.buffers[-1])
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

    def _count(self, data: np.ndarray) -> None:
        self._constant_bytes += data.nbytes

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
        builtin = getattr(schema.BuiltinOperator, name)
        operator = schema.OperatorT()
        operator.opcodeIndex = self._opcode(builtin, None)
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
        self.operators.append(operator)

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

    def serialize(self) -> memoryview:
        """The finished .tflite. The builder's constant buffers are consumed: call once."""
        model = schema.ModelT()
        model.version = SCHEMA_VERSION
        model.description = self.description
        model.operatorCodes = self.opcodes
        model.subgraphs = [self._subgraph()]
        model.signatureDefs = [self._signature()]
        builder = flatbuffers.Builder(self.constant_bytes() + 16 * len(self.buffers) + (1 << 20))
        buffer_offsets = []
        for i, data in enumerate(self.buffers):
            buffer_offsets.append(self._pack_buffer(builder, data))
            self.buffers[i] = None  # the flatbuffer holds the bytes now: don't keep two copies
        model_offset = _pack_model(builder, model, buffer_offsets)
        builder.Finish(model_offset, file_identifier=b"TFL3")
        # A view, not builder.Output()'s copy: a 2 GB model would otherwise exist three times.
        return memoryview(builder.Bytes)[builder.Head():]

    @staticmethod
    def _pack_buffer(builder: flatbuffers.Builder, data: np.ndarray | None) -> int:
        vector = None
        if data is not None and data.nbytes:
            builder.StartVector(1, data.nbytes, BUFFER_ALIGNMENT)
            builder.head -= data.nbytes
            builder.Bytes[builder.head:builder.head + data.nbytes] = data.tobytes()
            vector = builder.EndVector()
        schema.BufferStart(builder)
        if vector is not None:
            schema.BufferAddData(builder, vector)
        return schema.BufferEnd(builder)


def _pack_model(builder, model: schema.ModelT, buffer_offsets: list[int]) -> int:
    """ModelT.Pack, except that the buffers are the pre-packed, 16-byte aligned ones (the
    generated Pack copies byte by byte and aligns only to the element size)."""
    schema.ModelStartBuffersVector(builder, len(buffer_offsets))
    for offset in reversed(buffer_offsets):
        builder.PrependUOffsetTRelative(offset)
    buffers_vector = builder.EndVector()
    codes = [c.Pack(builder) for c in model.operatorCodes]
    schema.ModelStartOperatorCodesVector(builder, len(codes))
    for c in reversed(codes):
        builder.PrependUOffsetTRelative(c)
    codes_vec = builder.EndVector()
    subs = [s.Pack(builder) for s in model.subgraphs]
    schema.ModelStartSubgraphsVector(builder, len(subs))
    for s in reversed(subs):
        builder.PrependUOffsetTRelative(s)
    subs_vec = builder.EndVector()
    sigs = [s.Pack(builder) for s in model.signatureDefs]
    schema.ModelStartSignatureDefsVector(builder, len(sigs))
    for s in reversed(sigs):
        builder.PrependUOffsetTRelative(s)
    sigs_vec = builder.EndVector()
    description = builder.CreateString(model.description)
    schema.ModelStart(builder)
    schema.ModelAddVersion(builder, model.version)
    schema.ModelAddOperatorCodes(builder, codes_vec)
    schema.ModelAddSubgraphs(builder, subs_vec)
    schema.ModelAddDescription(builder, description)
    schema.ModelAddBuffers(builder, buffers_vector)
    schema.ModelAddSignatureDefs(builder, sigs_vec)
    return schema.ModelEnd(builder)
