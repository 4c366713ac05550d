"""Run-time LoRA slots (convert --lora-slots): after each linear layer or 1x1 convolution that
core/lora.py names, y -> y + (x D^T) U^T with factors chosen at run time.

A layer is known by the module the exporter recorded for its node (the metadata
`pkg.torch.onnx.name_scopes`: the wrapper's attribute, then the module path), renamed as LoRA files
name it (core.lora.lora_module_name). Its output y is the MatMul's, or the bias Add's where the
MatMul's only reader adds a constant bias along the features (the writer folds that Add into its
FULLY_CONNECTED); a Gemm's or a Conv's own output otherwise.

Two forms (core.lora.FORMS):
  custom  difflite.LoRA(y, x) with the slot number (files that need the op library anyway): no
          factors set is y itself, so a folder converted with slots costs nothing without LoRAs.
  inputs  graph inputs D^T [K, R] and U^T [R, N] per slot (R = the folder's largest rank, all zero
          is no LoRA) and y + MatMul(MatMul(x, D^T), U^T) in standard ops: `--no-fuse` files, which
          stock LiteRT runs without the op library. A 1x1 convolution's NCHW x and y are
          transposed to channels last around the MatMuls (the writer stores them so already).
Slots are numbered in graph order from 0.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

import numpy as np
import onnx_ir as ir

from difflite.core import custom_ops, lora
from difflite.passes import ir_utils

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
_NHWC, _NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


@dataclass(frozen=True)
class Slot:
    """One slot as the manifest records it."""
    slot: int
    module: str  # as LoRA files name it
    in_features: int
    out_features: int
    conv: bool  # a 1x1 convolution (NCHW in ONNX), not a linear layer

    def as_dict(self) -> dict:
        return asdict(self)


def add_lora_slots(model: ir.Model, component: str, which: str = "auto", form: str = "custom",
                   max_rank: int | None = None) -> list[Slot]:
    """Give every layer of `component` that core.lora.takes_slot names under `which` a slot, in
    `form`; returns the slots in order."""
    if form not in lora.FORMS:
        raise ValueError(f"LoRA slot form {form!r} not in {lora.FORMS}")
    if which == "none":
        return []
    max_rank = max_rank or lora.DEFAULT_MAX_RANK[form]
    slots: list[Slot] = []
    for node in list(model.graph):
        found = _layer(node, component, which)
        if found is None:
            continue
        module, x, y, in_features, out_features, conv = found
        slot = Slot(len(slots), module, in_features, out_features, conv)
        readers = list(y.uses())
        if form == "custom":
            ir_utils.ensure_domain(model)
            nodes = [ir_utils.difflite_node(custom_ops.LORA, [y, x], {"slot": slot.slot}, y)]
        else:
            nodes = _builtin_sum(model.graph, slot, x, y, max_rank)
        model.graph.insert_after(y.producer(), nodes)
        result = nodes[-1].outputs[0]
        result.name = ir_utils.unique_name(model.graph, f"{y.name}/lora")
        for usage in readers:
            usage.node.replace_input_with(usage.idx, result)
        slots.append(slot)
    return slots


def _layer(node: ir.Node, component: str, which: str):
    """(module, x, y, K, N, conv) for a layer that takes a slot; else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Conv"):
        return None
    module = _module(node, component)
    if module is None or not lora.takes_slot(component, module, which):
        return None
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    shape = ir_utils.static_shape(weight)
    if weight is None or weight.const_value is None or shape is None:
        return None
    x = node.inputs[0]
    x_shape = ir_utils.static_shape(x)
    if x_shape is None:
        return None
    if node.op_type == "Conv":
        if len(shape) != 4 or shape[2:] != (1, 1) or len(x_shape) != 4 or not _plain_conv(node):
            return None
        return module, x, node.outputs[0], shape[1], shape[0], True
    if len(shape) != 2 or len(x_shape) < 2:
        return None
    if node.op_type == "Gemm":
        if _attr(node, "transA", 0) or len(x_shape) != 2:
            return None
        n, k = shape if _attr(node, "transB", 0) else shape[::-1]
        return module, x, node.outputs[0], k, n, False
    k, n = shape
    y = _bias_added(node.outputs[0], n)
    if y is None or y.is_graph_output():
        return None
    return module, x, y, k, n, False


def _module(node: ir.Node, component: str) -> str | None:
    """The module that made `node`, named as LoRA files name it; None when unrecorded."""
    text = node.metadata_props.get(NAME_SCOPES)
    if not text:
        return None
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2 or not all(isinstance(s, str) for s in scopes):
        return None
    wrapper, _, path = scopes[-2].partition(".")  # the last scope is the op itself ("linear_12")
    if not path or wrapper != component:
        return None
    return lora.lora_module_name(component, path)


def _plain_conv(node: ir.Node) -> bool:
    """A 1x1 convolution that is a linear map per pixel (stride 1, no padding, one group)."""
    return (_attr(node, "group", 1) == 1 and set(_attr(node, "strides", [1, 1])) <= {1}
            and set(_attr(node, "pads", [0, 0, 0, 0])) <= {0} and set(_attr(node, "dilations", [1, 1])) <= {1}
            and _attr(node, "auto_pad", "NOTSET") in ("NOTSET", b"NOTSET", "VALID", b"VALID"))


def _attr(node: ir.Node, name: str, default):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _bias_added(out: ir.Value, n: int) -> ir.Value | None:
    """The Add's output where `out`'s only reader adds a constant bias over the last axis (the
    writer folds it into the FULLY_CONNECTED), else `out`."""
    reader = ir_utils.single_consumer(out)
    if reader is None or reader.op_type != "Add" or reader.domain not in ("", "ai.onnx"):
        return out
    other = reader.inputs[1] if reader.inputs[0] is out else reader.inputs[0]
    shape = ir_utils.static_shape(other)
    if other is None or other.const_value is None or shape is None or int(np.prod(shape)) != n:
        return out
    if shape and shape[-1] != n:
        return out
    return reader.outputs[0]


def _builtin_sum(graph: ir.Graph, slot: Slot, x: ir.Value, y: ir.Value, max_rank: int) -> list[ir.Node]:
    """y + MatMul(MatMul(x, D^T), U^T) with D^T and U^T new graph inputs (float32)."""
    down = _factor_input(graph, lora.down_input(slot.slot), (slot.in_features, max_rank))
    up = _factor_input(graph, lora.up_input(slot.slot), (max_rank, slot.out_features))
    nodes = []
    rows = x
    if slot.conv:
        nodes.append(ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", list(_NHWC))]))
        rows = nodes[-1].outputs[0]
    nodes.append(ir.Node("", "MatMul", [rows, down]))
    nodes.append(ir.Node("", "MatMul", [nodes[-1].outputs[0], up]))
    delta = nodes[-1].outputs[0]
    if slot.conv:
        nodes.append(ir.Node("", "Transpose", [delta], attributes=[ir.AttrInt64s("perm", list(_NCHW))]))
        delta = nodes[-1].outputs[0]
    if y.type is not None and y.dtype != ir.DataType.FLOAT:
        nodes.append(ir.Node("", "Cast", [delta], attributes=[ir.AttrInt64("to", y.dtype.value)]))
        delta = nodes[-1].outputs[0]
    nodes.append(ir.Node("", "Add", [y, delta]))
    _type_outputs(graph, nodes, x, y, slot, max_rank)
    return nodes


def _factor_input(graph: ir.Graph, name: str, shape: tuple[int, int]) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(shape), type=ir.TensorType(ir.DataType.FLOAT))
    graph.inputs.append(value)
    return value


def _type_outputs(graph: ir.Graph, nodes: list[ir.Node], x: ir.Value, y: ir.Value, slot: Slot, rank: int) -> None:
    """The new values' names, shapes and types (the writer needs static shapes everywhere; names
    are deterministic, so the same inputs give the same file)."""
    x_shape = list(ir_utils.static_shape(x))
    rows = [x_shape[0], *x_shape[2:]] if slot.conv else x_shape[:-1]
    float_type = ir.TensorType(ir.DataType.FLOAT)
    shapes = []
    if slot.conv:
        shapes.append([*rows, slot.in_features])
    shapes += [[*rows, rank], [*rows, slot.out_features]]
    if slot.conv:
        shapes.append(list(ir_utils.static_shape(y)))
    for node, shape in zip(nodes, shapes):
        node.outputs[0].shape, node.outputs[0].type = ir.Shape(shape), float_type
    for node in nodes[len(shapes):]:
        node.outputs[0].shape, node.outputs[0].type = y.shape, y.type
    for index, node in enumerate(nodes):
        node.outputs[0].name = ir_utils.unique_name(graph, f"lora_{slot.slot}/{index}")
