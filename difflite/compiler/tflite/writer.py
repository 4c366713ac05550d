"""ONNX (onnx_ir.Model, channels first) -> .tflite (channels last), one lowering per ONNX op.

Graph inputs and outputs of rank 4 are NHWC in the .tflite (the manifest records it); all other
layout decisions are made per value by the lowerings (see layout.py)."""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.builder import ModelBuilder
from difflite.compiler.tflite.context import LoweringContext, unsupported_at
from difflite.compiler.tflite.ops import LOWERINGS
from difflite.compiler.tflite.quantize import WeightQuantization
from difflite.core.errors import UnsupportedOp
from difflite.core.finite import NonFiniteWeights

NEVER_FOLD = {("", "RandomNormal"), ("", "RandomUniform")}
TORCH_NAME_SCOPES = "pkg.torch.onnx.name_scopes"


@dataclass
class WriteResult:
    data: memoryview | None  # the model, when no path was given
    weight_layout: str = "inline"  # or "appended": weights after the flatbuffer (> 2 GiB models)
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    op_histogram: dict[str, int] = field(default_factory=dict)
    custom_ops: list[str] = field(default_factory=list)
    weight_bytes: int = 0
    weight_widths: list[dict] = field(default_factory=list)  # per conv / linear weight (context.weight)


def interface_layout(rank: int) -> tuple[int, ...]:
    return layout.NHWC if rank == 4 else layout.identity(rank)


def write_tflite(model: ir.Model, precision: str = "fp32", fuse=frozenset(),
                 description: str = "difflite", path=None, weights: str = "auto",
                 quantization: WeightQuantization | None = None, stock_gpu_forms: bool = False) -> WriteResult:
    """Lower `model`; write the .tflite to `path`, or return it in WriteResult.data.
    `weights`: "auto" (inline when the model fits the 2 GiB flatbuffer limit), "inline" or
    "appended" (after the flatbuffer, located by Buffer.offset). `quantization`: int8 / int4
    convolution and linear weights (difflite/compiler/tflite/quantize.py); None keeps them float.
    `stock_gpu_forms`: where forms differ, those stock LiteRT's GPU accelerator compiles
    (`convert --no-fuse`: quantized linear layers as 1x1 convolutions)."""
    builder = ModelBuilder(description, spool_dir=Path(path).parent if path is not None else None)
    ctx = LoweringContext(builder, precision=precision, fuse=frozenset(fuse),
                          quantization=quantization or WeightQuantization(), stock_gpu_forms=stock_gpu_forms)
    graph = model.graph
    inputs, unusable = [], None
    for value in graph.inputs:
        try:
            inputs.append(_add_graph_input(ctx, value))
        except UnsupportedOp as exc:
            if next(iter(value.uses()), None) is not None:
                raise
            # No node reads it: a refusal of a node that names an op comes first, if any.
            unusable = unusable or exc
    ctx.node = None
    for node in graph:
        ctx.node = node
        if node not in ctx.absorbed:
            _lower_node(ctx, node)
        ctx.lowered(node)
    ctx.node = None
    if unusable is not None:
        raise unusable
    outputs = [_add_graph_output(ctx, value) for value in graph.outputs]
    ctx.constants.clear()
    layout_used = builder.weight_layout(weights)
    data = None
    if path is None:
        data = builder.serialize(layout_used)
    else:
        with open(path, "wb") as out:
            builder.write(out, layout_used)
    return WriteResult(
        data=data, weight_layout=layout_used, inputs=inputs, outputs=outputs,
        op_histogram=op_histogram(builder), custom_ops=sorted(
            c.customCode.decode() if isinstance(c.customCode, bytes) else c.customCode
            for c in builder.opcodes if c.customCode),
        weight_bytes=builder.constant_bytes(), weight_widths=ctx.weight_widths)


def op_histogram(builder: ModelBuilder) -> dict[str, int]:
    from ai_edge_litert import schema_py_generated as schema
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    counts = collections.Counter()
    for op in builder.operators:
        code = builder.opcodes[op.opcodeIndex]
        custom = code.customCode
        counts[(custom.decode() if isinstance(custom, bytes) else custom) or names[code.builtinCode]] += 1
    return dict(sorted(counts.items()))


def _signature_entry(ctx: LoweringContext, name: str, index: int, perm) -> dict:
    return {"name": name, "shape": list(ctx.builder.shape_of(index)),
            "dtype": str(ctx.builder.dtype_of(index)),
            "layout": "NHWC" if tuple(perm) == layout.NHWC else "as_onnx"}


def _add_graph_input(ctx: LoweringContext, value: ir.Value) -> dict:
    # A refusal here names the first node reading the input (the op that cannot take it).
    ctx.node = next((use.node for use in value.uses()), None)
    if value.type is not None and not isinstance(value.type, ir.TensorType):
        raise ctx.unsupported(f"graph input '{value.name}' is of type {value.type}: the .tflite "
                              "interface takes plain tensors only")
    perm = interface_layout(ctx.rank(value))
    index = ctx.output(value, perm)
    ctx.builder.inputs.append((value.name, index))
    return _signature_entry(ctx, value.name, index, perm)


def _add_graph_output(ctx: LoweringContext, value: ir.Value) -> dict:
    perm = interface_layout(ctx.rank(value))
    if ctx.is_const(value):
        raise UnsupportedOp("Constant", "", f"graph output '{value.name}' is a constant", output=value.name)
    index = ctx.input(value, perm)
    if index in [i for _, i in ctx.builder.inputs] or index in [i for _, i in ctx.builder.outputs]:
        copy = ctx.builder.tensor(value.name, ctx.builder.shape_of(index), ctx.builder.dtype_of(index))
        ctx.reshape_op(index, copy, ctx.builder.shape_of(index))
        index = copy
    else:
        ctx.builder.tensors[index].name = value.name
    ctx.builder.outputs.append((value.name, index))
    return _signature_entry(ctx, value.name, index, perm)


def _lower_node(ctx: LoweringContext, node: ir.Node) -> None:
    key = (node.domain or "", node.op_type)
    if _foldable(ctx, node, key):
        _fold(ctx, node)
        return
    lowering = LOWERINGS.get(key)
    if lowering is None:
        raise unsupported_at(node, "no TFLite lowering")
    try:
        lowering(ctx, node)
    except NonFiniteWeights as exc:
        raise NonFiniteWeights(f"layer {layer_of(node)}: {exc}") from exc


def layer_of(node: ir.Node) -> str:
    """The module a node was exported from (the torch exporter's name scopes: the modules from
    the outermost in, then the node's own name), else the node's name: exported weights are
    often renamed (val_115), their module is not."""
    try:
        scopes = ast.literal_eval(node.metadata_props.get(TORCH_NAME_SCOPES, "[]"))
    except (ValueError, SyntaxError):
        scopes = []
    modules = [s for s in scopes[:-1] if isinstance(s, str) and s] if isinstance(scopes, list) else []
    return modules[-1] if modules else f"(ONNX node '{node.name}')"


def _foldable(ctx: LoweringContext, node: ir.Node, key) -> bool:
    if key[0] not in ("", "ai.onnx") or key in NEVER_FOLD:
        return False
    return all(v is None or ctx.is_const(v) for v in node.inputs)


def _fold(ctx: LoweringContext, node: ir.Node) -> None:
    """Evaluate a node whose inputs are all compile-time constants (shape arithmetic, weight
    transposes the exporter left in the graph)."""
    proto = ir.serde.serialize_node(node)
    names = [v.name if v is not None else "" for v in node.inputs]
    feeds = {n: ctx.const(v) for n, v in zip(names, node.inputs) if v is not None}
    try:
        results = ReferenceEvaluator(proto).run(None, feeds)
    except Exception as exc:  # the reference evaluator raises many types
        raise unsupported_at(node, f"constant folding failed: {exc}") from exc
    for value, result in zip(node.outputs, results):
        ctx.constants[value.name] = np.asarray(result)


def load_onnx(path) -> ir.Model:
    """Load an .onnx (external data stays memory-mapped until a lowering reads it)."""
    return ir.load(str(path))

