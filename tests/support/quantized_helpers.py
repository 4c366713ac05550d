"""Quantized weights in .tflite test models, as `difflite convert --weights int8|int4` writes them
(TFLite's standard forms; tests/test_quantized_weights_delegate.py's docstring lists them):
QModel (tests/support/opencl_helpers.OpModel plus integer constants with affine quantization, DEQUANTIZE
chains), symmetric quantizers and their float64 dequantization. Shared by the OpenCL backend's
tests and the CPU backend's (tests/test_cpu_quantized_weights.py)."""
from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from .opencl_helpers import OpModel

BLOCK = 32  # int4 block size (difflite convert's default)


def quantize(w: np.ndarray, axis: int | None, bits: int):
    """Symmetric quantization of `w`: (q int8, scales float32) with one scale per index of `axis`
    (None: one scale for the tensor)."""
    top = 2 ** (bits - 1) - 1
    if axis is None:
        scale = np.array([np.abs(w).max() / top], np.float32)
        return np.clip(np.round(w / scale[0]), -top - 1, top).astype(np.int8), scale
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = (np.abs(moved).max(axis=1) / top).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -top - 1, top).astype(np.int8)
    return q, scale


def dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int | None) -> np.ndarray:
    """float64 values of q (the float64 reference's weights)."""
    q = q.astype(np.float64)
    if axis is None or scale.size == 1:
        return (q - float(zero[0])) * float(scale[0])
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q - zero.reshape(shape)) * scale.astype(np.float64).reshape(shape)


def pack_int4(q: np.ndarray) -> bytes:
    """Two values a byte: the even element in the low nibble, the odd one in the high nibble
    (an odd count gets a zero high nibble in its last byte)."""
    nib = (q.reshape(-1).astype(np.int16) & 0xF).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()


class QModel(OpModel):
    """OpModel plus integer constants with TFLite's affine quantization."""

    def quantized(self, name: str, data: bytes, shape, tensor_type: int, scale, zero_point,
                  axis: int = 0) -> int:
        b = schema.BufferT()
        b.data = np.frombuffer(data, dtype=np.uint8)
        self.buffers.append(b)
        t = schema.TensorT()
        t.name = name
        t.shape = [int(d) for d in shape]
        t.type = tensor_type
        t.buffer = len(self.buffers) - 1
        qp = schema.QuantizationParametersT()
        qp.scale = [float(s) for s in np.asarray(scale).reshape(-1)]
        qp.zeroPoint = [int(z) for z in np.asarray(zero_point).reshape(-1)]
        qp.quantizedDimension = int(axis)
        t.quantization = qp
        self.tensors.append(t)
        return len(self.tensors) - 1

    def int8_weight(self, name, q, scale, axis=0, zero_point=None) -> int:
        """DEQUANTIZE of an int8 constant: the float32 tensor it gives."""
        zp = np.zeros(scale.size, np.int64) if zero_point is None else zero_point
        qi = self.quantized(name, q.astype(np.int8).tobytes(), q.shape, schema.TensorType.INT8,
                            scale, zp, axis)
        out = self.activation(name + "_f32", q.shape)
        self.builtin("DEQUANTIZE", [qi], [out])
        return out

    def int4_weight(self, name, w_shape, blocks, scale, form="compact4d", unit=1.0,
                    scale_type=np.float16, **mul) -> int:
        """Blockwise int4 [N*K/B, B] -> the float32 weight of w_shape, in `form` (the module's
        docstring). The compact forms' block scales are float16 + DEQUANTIZE (convert at
        --precision fp16) or, with scale_type float32, a float32 constant (at fp32). `unit` (the
        compact form's per-tensor scale) and `mul` (MUL's options) make variants that are no
        compact form."""
        if form.startswith("compact"):
            rows = (blocks.shape[0], 1, 1, blocks.shape[1]) if form == "compact4d" else blocks.shape
            column = (-1, 1, 1, 1) if form == "compact4d" else (-1, 1)
            qi = self.quantized(name, pack_int4(blocks), rows, schema.TensorType.INT4, [unit], [0], 0)
            values = self.activation(name + "_values", rows)
            self.builtin("DEQUANTIZE", [qi], [values])
            if np.dtype(scale_type) == np.float32:
                scales = self.constant(name + "_scales", (scale / unit).astype(np.float32).reshape(column))
            else:
                half = self.constant(name + "_scales16", (scale / unit).astype(np.float16).reshape(column))
                scales = self.activation(name + "_scales", tuple(self.tensors[half].shape))
                self.builtin("DEQUANTIZE", [half], [scales])
            flat = self.activation(name + "_blocks", rows)
            self.builtin("MUL", [values, scales], [flat], **mul)
        else:
            qi = self.quantized(name, pack_int4(blocks), blocks.shape, schema.TensorType.INT4, scale,
                                np.zeros(scale.size, np.int64), 0)
            flat = self.activation(name + "_blocks", blocks.shape)
            self.builtin("DEQUANTIZE", [qi], [flat])
        out = self.activation(name + "_f32", w_shape)
        self.builtin("RESHAPE", [flat, self.constant(name + "_shape", np.array(w_shape, np.int32))],
                     [out], newShape=list(w_shape))
        return out


def int4_blocks(w: np.ndarray, block: int = BLOCK):
    """w (any shape, size a multiple of block) as int4 blocks: (q [n/B, B], scales [n/B]), as the
    writer stores them (quantize_int4 with float16 scales: each block's least-error scale, so
    some blocks use -8)."""
    from difflite.compiler.tflite.quantize import quantize_int4, unpack_int4

    stored = quantize_int4(np.ascontiguousarray(w, dtype=np.float32).reshape(-1, block), block, np.float16)
    q = unpack_int4(stored.data, w.size).reshape(-1, block)
    return q, stored.scales.astype(np.float32)


def write_int4_lookup(path, precision: str, r, vocab: int = 1000, dim: int = 64) -> np.ndarray:
    """The int4 mix's token lookup as `convert --weights int4` writes it (difflite/compiler/tflite/context.py
    lookup: int8 rows of scale 1, DEQUANTIZE, GATHER, MUL by the gathered row scales) of a seeded
    [vocab, dim] table, ids [1, 77], written to `path`; returns the float table."""
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from difflite.compiler.tflite import quantize as writer_quantize
    from difflite.compiler.tflite.writer import write_tflite

    table = (r.standard_normal((vocab, dim)) * 0.02).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 77])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, 77, dim])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    write_tflite(ir.serde.deserialize_model(model), path=path, precision=precision,
                 quantization=writer_quantize.WeightQuantization("int4"))
    return table
