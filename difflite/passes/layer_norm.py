"""LayerNormalization over the last axis -> difflite.GroupNorm(groups=1) (plain onnx-ir pass).

Matches each ONNX LayerNormalization (domain "" / ai.onnx) whose normalised axes are exactly the
last one (axis = -1 or rank-1), with stash_type 1 (the default: float32 statistics), a static
float32/float16 x of rank >= 2, a constant scale of C elements and a constant bias of C elements
or none (-> zeros), and whose Mean/InvStdDev outputs are absent or unused. It becomes

    Reshape(x, [M, 1, C]) -> Transpose(0, 2, 1) -> difflite.GroupNorm(groups=1, epsilon, "none")
    -> Transpose(0, 2, 1) -> Reshape(x's shape)

with M the product of x's leading dims. In the ONNX domain GroupNorm is channels-first
(DESIGN §2): x [N, C, L] is normalised over each (sample, group)'s C/groups x L elements with the
biased variance, then gamma[c] * x_hat + beta[c]. With groups = 1 and L = 1 that is, per row m
of x, mean and biased variance over its C elements and the per-channel affine: exactly
LayerNormalization over the last axis. The writer stores the op channels last, i.e. as the rows
[M, 1, C] themselves: the Transposes are free there (they only change the stored layout), the
two Reshapes move no data, and the op library sees an ordinary [N, L, C] GroupNorm.

Not matched (left to the writer's builtin decomposition): several normalised axes, a scale or
bias computed at run time or not of C elements, another stash_type, a dynamic or non-float x,
a used Mean/InvStdDev output.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common

from difflite.core import custom_ops
from difflite.passes import ir_utils

LAYER_NORM_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
DEFAULT_STASH_TYPE = 1  # ONNX LayerNormalization's default: statistics in float32


def fuse_layer_norm(model: ir.Model) -> int:
    """Rewrite every matching LayerNormalization in place; returns how many were rewritten."""
    ir_utils.ensure_domain(model)
    graph = model.graph
    shapes: dict[tuple[int, ...], ir.Value] = {}
    rewritten = 0
    for node in list(graph):
        params = _match(node)
        if params is not None:
            _replace(graph, node, *params, shapes)
            rewritten += 1
    if rewritten:
        common.RemoveUnusedNodesPass()(model)  # drops scale/bias initializers that were replaced
    return rewritten


def _match(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None, float] | None:
    """(gamma [C], beta [C] or None, epsilon) of a LayerNormalization this pass rewrites."""
    if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
        return None
    x = node.inputs[0]
    shape = ir_utils.static_shape(x)
    if shape is None or len(shape) < 2 or x.dtype not in LAYER_NORM_TYPES or 0 in shape:
        return None
    if node.attributes.get_int("axis", -1) % len(shape) != len(shape) - 1:
        return None
    if node.attributes.get_int("stash_type", DEFAULT_STASH_TYPE) != DEFAULT_STASH_TYPE:
        return None
    if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
        return None
    channels = shape[-1]
    gamma = _channel_vector(node.inputs[1], channels)
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    beta = _channel_vector(bias, channels) if bias is not None else None
    if gamma is None or (bias is not None and beta is None):
        return None
    return gamma, beta, node.attributes.get_float("epsilon", 1e-5)


def _channel_vector(value: ir.Value | None, channels: int) -> np.ndarray | None:
    """A constant of C elements along the last axis ([C], [1, C], ...) as a [C] vector."""
    array = ir_utils.const_array(value)
    if array is None or array.ndim == 0 or array.size != channels or array.shape[-1] != channels:
        return None
    return array.reshape(channels)


def _replace(graph: ir.Graph, node: ir.Node, gamma: np.ndarray, beta: np.ndarray | None,
             epsilon: float, shapes: dict) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = ir_utils.static_shape(x)
    rows, channels = math.prod(shape[:-1]), shape[-1]
    dtype = x.dtype.numpy()
    base = node.name or "layer_norm"
    gamma_value = _vector(graph, node.inputs[1], gamma.astype(dtype), f"{base}.gamma")
    beta_value = _vector(graph, node.inputs[2] if beta is not None else None,
                         np.zeros(channels, dtype) if beta is None else beta.astype(dtype), f"{base}.beta")

    def added(op_type: str, inputs, suffix: str, out_shape: tuple[int, ...], **attrs) -> ir.Value:
        new = ir.node(op_type, inputs, attrs or None, name=f"{node.name}/{suffix}" if node.name else None)
        new.outputs[0].type, new.outputs[0].shape = x.type, ir.Shape(out_shape)
        nodes.append(new)
        return new.outputs[0]

    nodes: list[ir.Node] = []
    rows_view = added("Reshape", [x, _shape_const(graph, (rows, 1, channels), shapes)], "to_rows",
                      (rows, 1, channels))
    grouped = added("Transpose", [rows_view], "to_nc1", (rows, channels, 1), perm=[0, 2, 1])
    norm = ir_utils.difflite_node(custom_ops.GROUP_NORM, (grouped, gamma_value, beta_value),
                                  {"groups": 1, "epsilon": epsilon, "activation": "none"}, grouped)
    norm.name = node.name
    nodes.append(norm)
    normed_rows = added("Transpose", norm.outputs, "from_nc1", (rows, 1, channels), perm=[0, 2, 1])
    new = added("Reshape", [normed_rows, _shape_const(graph, shape, shapes)], "from_rows", shape)
    graph.insert_after(node, nodes)

    ir_utils.replace_node(graph, node, y, new)


def _vector(graph: ir.Graph, original: ir.Value | None, array: np.ndarray, base: str) -> ir.Value:
    """The node's own [C] initializer when it already has this exact shape and dtype, else a new
    one under a name no value of the graph uses."""
    if original is not None and original.is_initializer() and ir_utils.static_shape(original) == array.shape \
            and original.dtype.numpy() == array.dtype:
        return original
    return ir_utils.new_initializer(graph, array, base)


def _shape_const(graph: ir.Graph, shape: tuple[int, ...], cache: dict) -> ir.Value:
    if shape not in cache:
        cache[shape] = ir_utils.new_initializer(graph, np.array(shape, np.int64), "layer_norm_shape")
    return cache[shape]
