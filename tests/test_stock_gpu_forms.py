"""`--no-fuse` files hold none of the forms stock LiteRT's GPU accelerator refuses or mis-lowers
(../shared/FACTS.md; measured with LiteRT 2.3.0 on an H100, 2026-11), checked on the files themselves, since CI has no GPU
(`benchmarks/litert_gpu_verify.py` runs them on one):

- a DEQUANTIZE feeding a GATHER ("GATHER: Input / output dtype mismatch");
- GATHER with runtime indices of rank > 1;
- a FULLY_CONNECTED whose weights come from an int8 / int4 constant (fails to compile);
- BATCH_MATMUL with adj_x, or with a constant 2-D right-hand side and adj_y (mis-lowered);
- a CAST from or to int64.

The tiny preset's text encoder, UNet and VAE decoder, converted once with --precision fp16 and the
int4 mix (every form at once: float16 tables, int8 and int4 weights)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ai_edge_litert import schema_py_generated as schema

from support import ROOT

COMPONENTS = ("text_encoder", "unet", "vae_decoder")
OP = schema.BuiltinOperator
QUANTIZED = (schema.TensorType.INT8, schema.TensorType.INT4)


@pytest.fixture(scope="module")
def nofuse_int4(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stock") / "tiny"
    run = subprocess.run([sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o", str(out), "--no-fuse",
                          "--precision", "fp16", "--weights", "int4", "--weights-target-db", "0", "--height", "64",
                          "--width", "64", "--components", ",".join(COMPONENTS)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    return out


class Graph:
    """The first subgraph of a .tflite: its operators, what writes each tensor, constants."""

    def __init__(self, path: Path):
        model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
        graph = model.subgraphs[0]
        self.tensors = graph.tensors
        self.codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
        self.ops = graph.operators
        self.writer = {out: op for op in self.ops for out in op.outputs}
        self.buffers = model.buffers

    def code(self, op) -> int:
        return self.codes[op.opcodeIndex]

    def constant(self, index: int) -> bool:
        buffer = self.buffers[self.tensors[index].buffer]
        return buffer.data is not None and len(buffer.data) > 0

    def from_quantized(self, index: int) -> bool:
        """Whether tensor `index` is computed from an int8 / int4 constant (DEQUANTIZE, MUL by
        scales, RESHAPE)."""
        op = self.writer.get(index)
        if op is None:
            return self.tensors[index].type in QUANTIZED
        return any(i >= 0 and self.from_quantized(i) for i in op.inputs)

    def hazards(self) -> list[str]:
        found = []
        for n, op in enumerate(self.ops):
            code, name = self.code(op), f"node {n}"
            if code == OP.GATHER:
                table, indices = op.inputs[:2]
                writer = self.writer.get(table)
                if writer is not None and self.code(writer) == OP.DEQUANTIZE:
                    found.append(f"{name}: GATHER of a DEQUANTIZE")
                if not self.constant(indices) and len(self.tensors[indices].shape) > 1:
                    found.append(f"{name}: GATHER with {len(self.tensors[indices].shape)}-D runtime indices")
            elif code == OP.FULLY_CONNECTED and self.from_quantized(op.inputs[1]):
                found.append(f"{name}: FULLY_CONNECTED of quantized weights")
            elif code == OP.BATCH_MATMUL:
                options = op.builtinOptions
                if options.adjX:
                    found.append(f"{name}: BATCH_MATMUL with adj_x")
                rhs = op.inputs[1]
                if options.adjY and self.constant(rhs) and len(self.tensors[rhs].shape) == 2:
                    found.append(f"{name}: BATCH_MATMUL of a constant 2-D rhs with adj_y")
            elif code == OP.CAST:
                types = {self.tensors[op.inputs[0]].type, self.tensors[op.outputs[0]].type}
                if schema.TensorType.INT64 in types:
                    found.append(f"{name}: CAST of int64")
        return found


@pytest.mark.parametrize("component", COMPONENTS)
def test_nofuse_files_avoid_the_forms_stock_gpu_refuses(nofuse_int4, component):
    graph = Graph(nofuse_int4 / f"{component}.tflite")
    assert graph.hazards() == []
    if component == "unet":  # its quantized linear layers are there, as 1x1 convolutions
        filters = [graph.tensors[op.inputs[1]].shape for op in graph.ops
                   if graph.code(op) == OP.CONV_2D and graph.from_quantized(op.inputs[1])]
        assert sum(list(f[1:3]) == [1, 1] for f in filters) >= 8, filters
    if component == "text_encoder":  # the token table: float16 rows, gathered, CAST
        gathers = [op for op in graph.ops if graph.code(op) == OP.GATHER and graph.constant(op.inputs[0])]
        assert gathers and all(graph.tensors[op.inputs[0]].type == schema.TensorType.FLOAT16 for op in gathers)


def test_the_check_finds_each_form(tmp_path):
    """The checker against files that hold the forms: the writer's fused-file forms (a quantized
    FULLY_CONNECTED, the int4 mix's DEQUANTIZE -> GATHER) are found."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    from difflite.compiler.tflite import quantize
    from difflite.compiler.tflite.writer import write_tflite

    r = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("MatMul", ["rows", "w"], ["y"])], "hazards",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 64])],
        [numpy_helper.from_array(r.standard_normal((300, 64)).astype(np.float32), "table"),
         numpy_helper.from_array(r.standard_normal((64, 64)).astype(np.float32), "w")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    path = tmp_path / "fused_forms.tflite"
    write_tflite(ir.serde.deserialize_model(model), path=path, precision="fp16",
                 quantization=quantize.WeightQuantization("int4"))
    found = Graph(path).hazards()
    assert any("GATHER of a DEQUANTIZE" in h for h in found), found
    assert any("FULLY_CONNECTED of quantized weights" in h for h in found), found
