"""Cleanup before fusion: fold shape arithmetic, drop no-ops, make every shape static.

After `cleanup(model)` every value has a static shape and a dtype; every Reshape shape, Slice
start/end/axes/step, Split size (and the like) input is a constant initializer, with explicit
values where the TFLite writer needs them (Reshape shapes without 0 / -1, Split sizes instead of
num_outputs, positive-step Slice bounds clamped into range); constants are the second operand of
commutative Add/Mul; no Identity, no-op Cast, Mul / Div by a one-element 1, Softmax NaN guard or
unused node/initializer is left. Large initializers
are never read: folding skips nodes with big constant inputs, and onnx shape inference runs on
a copy without them (onnx-ir's ShapeInferencePass).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
import onnxscript.optimizer

from difflite.passes import ir_utils

FOLD_INPUT_LIMIT = 8192  # elements; bigger constant inputs (weights) are never folded
FOLD_OUTPUT_LIMIT = 1 << 20
MAX_ROUNDS = 4
SHAPE_INPUTS = {  # op_type -> indices of inputs that must end up constant
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Split": (1,), "Expand": (1,), "Tile": (1,),
    "Unsqueeze": (1,), "Squeeze": (1,), "Pad": (1, 2, 3), "ConstantOfShape": (0,),
    "Resize": (1, 2, 3), "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "Range": (0, 1, 2),
    "TopK": (1,), "OneHot": (1,),
}
COMMUTATIVE = ("Add", "Mul")


def cleanup(model: ir.Model) -> dict:
    """Run the cleanup in place; returns {"nodes": n, "non_static": [...], "dynamic_inputs": [...]}."""
    if model.functions:
        common.InlinePass()(model)
    _lift_constants(model)
    _infer_shapes(model)
    for _ in range(MAX_ROUNDS):
        changed = _fold_constants(model)
        changed |= common.IdentityEliminationPass()(model).modified
        changed |= _remove_noop_casts(model.graph)
        changed |= _remove_unit_scalings(model.graph)
        changed |= _remove_nan_guards(model.graph)
        common.RemoveUnusedNodesPass()(model)
        if not changed:
            break
    _lift_constants(model)
    _constants_second(model.graph)
    _make_shape_inputs_static(model)
    common.RemoveUnusedNodesPass()(model)
    _infer_shapes(model)
    return {"nodes": len(model.graph), "non_static": non_static_values(model),
            "dynamic_inputs": dynamic_shape_inputs(model)}


def non_static_values(model: ir.Model) -> list[str]:
    """Names of node outputs lacking a dtype or a fully static shape."""
    return [str(v.name) for node in model.graph for v in node.outputs
            if v.dtype is None or ir_utils.static_shape(v) is None]


def dynamic_shape_inputs(model: ir.Model) -> list[str]:
    """'op_type:node' for each shape-like input (SHAPE_INPUTS) that is not a constant."""
    out = []
    for node in model.graph:
        if node.domain != "":
            continue
        for index in SHAPE_INPUTS.get(node.op_type, ()):
            value = node.inputs[index] if index < len(node.inputs) else None
            if value is not None and value.const_value is None:
                out.append(f"{node.op_type}:{node.name}")
    return out


def _lift_constants(model: ir.Model) -> None:
    common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)


def _infer_shapes(model: ir.Model) -> None:
    # strict_mode=False: one op onnx cannot infer (e.g. a custom domain) must not void the rest.
    common.ShapeInferencePass(strict_mode=False)(model)


def _fold_constants(model: ir.Model) -> bool:
    def should_fold(node: ir.Node) -> bool | None:
        # The folder folds a Transpose of any size; we keep big weights on disk instead.
        for value in node.inputs:
            if value is not None and value.const_value is not None \
                    and value.const_value.size > FOLD_INPUT_LIMIT:
                return False
        if node.op_type == "ConstantOfShape" and node.domain == "":
            # onnxscript never folds ConstantOfShape by default (its output may be large); a small
            # one is shape arithmetic, e.g. the TorchScript exporter's expand(b, 1, L, L) of a causal
            # mask: Where(Equal(sizes, ConstantOfShape([r]) * -1), ConstantOfShape([r]), sizes).
            shape = ir_utils.int_list(node.inputs[0]) if node.inputs else None
            return shape is not None and 0 <= int(np.prod(shape)) <= FOLD_INPUT_LIMIT
        return None

    result = onnxscript.optimizer.fold_constants(
        model, onnx_shape_inference=True, input_size_limit=FOLD_INPUT_LIMIT,
        output_size_limit=FOLD_OUTPUT_LIMIT, should_fold=should_fold)
    return result.modified


def _remove_noop_casts(graph: ir.Graph) -> bool:
    changed = False
    for node in list(graph):
        if node.op_type != "Cast" or node.domain != "":
            continue
        source, out = node.inputs[0], node.outputs[0]
        target = node.attributes.get_int("to", None)
        if source is None or source.dtype is None or target is None or source.dtype.value != target:
            continue
        changed |= _bypass(graph, node, source, out)
    return changed


def _remove_unit_scalings(graph: ir.Graph) -> bool:
    """Mul(x, 1) / Div(x, 1) by a one-element constant that widens nothing: x exactly. The folder
    folds these only while x is a small constant; TorchScript's baddbmm(mask, q, k^T, beta=1) writes
    Mul(mask, 1), and a mask of more than FOLD_INPUT_LIMIT elements (e.g. [N*H, 77, 77]) then stayed
    a computed value that the attention pass cannot read."""
    changed = False
    for node in list(graph):
        if node.op_type not in ("Mul", "Div") or node.domain != "" or len(node.inputs) != 2:
            continue
        source, one = node.inputs
        out = node.outputs[0]
        if source is None or one is None or ir_utils.scalar_const(one) != 1.0:
            continue
        shape = ir_utils.static_shape(source)
        if shape is None or shape != ir_utils.static_shape(out) or one.const_value.shape.rank() > len(shape) \
                or source.dtype is None or source.dtype != out.dtype:
            continue
        changed |= _bypass(graph, node, source, out)
    return changed


def _remove_nan_guards(graph: ir.Graph) -> bool:
    """Where(IsNaN(p), 0, p) after a Softmax: p is finite for finite scores (the causal mask is a
    large finite negative), so the guard is an identity (FACTS: CLIP sdpa export)."""
    changed = False
    for node in list(graph):
        if node.op_type != "Where" or node.domain != "" or len(node.inputs) != 3:
            continue
        cond, zero, probs = node.inputs
        guard = cond.producer() if cond is not None else None
        if guard is None or guard.op_type != "IsNaN" or guard.inputs[0] is not probs:
            continue
        if probs.producer() is None or probs.producer().op_type != "Softmax":
            continue
        same_shape = ir_utils.static_shape(probs) == ir_utils.static_shape(node.outputs[0])
        if ir_utils.scalar_const(zero) != 0.0 or not same_shape:
            continue
        changed |= _bypass(graph, node, probs, node.outputs[0])
    return changed


def _bypass(graph: ir.Graph, node: ir.Node, source: ir.Value, out: ir.Value) -> bool:
    """Make the readers of `out` read `source` instead and drop `node`."""
    if out.is_graph_output():
        if source.is_graph_input() or source.is_graph_output() or source.is_initializer():
            return False  # the node is what names the graph output; keep it
        source.name, out.name = out.name, None
        graph.outputs[graph.outputs.index(out)] = source
    out.replace_all_uses_with(source)
    graph.remove(node, safe=True)
    return True


def _constants_second(graph: ir.Graph) -> None:
    """Put a constant operand of Add/Mul second, so patterns need one operand order for it."""
    for node in graph:
        if node.op_type in COMMUTATIVE and node.domain == "" and len(node.inputs) == 2:
            a, b = node.inputs
            if a is not None and b is not None and a.const_value is not None and b.const_value is None:
                node.replace_input_with(0, b)
                node.replace_input_with(1, a)


def _make_shape_inputs_static(model: ir.Model) -> None:
    """Replace Reshape shapes containing 0/-1 by the output's static shape, clamp Slice bounds to
    the static input shape, give Split explicit sizes: the TFLite writer then needs no shape logic."""
    builders = {"Reshape": _static_reshape, "Slice": _static_slice, "Split": _static_split}
    if ir_utils.onnx_opset(model) < 13:  # Split sizes and Slice bounds were attributes before 13
        return
    graph = model.graph
    cache: dict[tuple, ir.Value] = {}
    for node in list(graph):
        if node.domain == "" and node.op_type in builders:
            builders[node.op_type](graph, node, cache)


def _int64_const(graph: ir.Graph, values, cache: dict, base: str) -> ir.Value:
    key = (base, tuple(int(v) for v in values))
    if key not in cache:
        cache[key] = ir_utils.new_initializer(graph, np.array(key[1], dtype=np.int64), base)
    return cache[key]


def _static_reshape(graph: ir.Graph, node: ir.Node, cache: dict) -> None:
    out_shape = ir_utils.static_shape(node.outputs[0])
    current = ir_utils.int_list(node.inputs[1])
    if out_shape is None or current == list(out_shape) or 0 in out_shape:
        return
    node.replace_input_with(1, _int64_const(graph, out_shape, cache, "reshape_shape"))
    node.attributes.pop("allowzero", None)


def _static_slice(graph: ir.Graph, node: ir.Node, cache: dict) -> None:
    in_shape = ir_utils.static_shape(node.inputs[0])
    starts, ends = ir_utils.int_list(node.inputs[1]), ir_utils.int_list(node.inputs[2])
    if in_shape is None or starts is None or ends is None:
        return
    rank = len(in_shape)
    axes = ir_utils.int_list(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None \
        else list(range(len(starts)))
    steps = ir_utils.int_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None \
        else [1] * len(starts)
    if axes is None or steps is None or any(s <= 0 for s in steps):
        return  # negative steps have no non-negative end for "before index 0": leave them
    axes = [a + rank if a < 0 else a for a in axes]
    starts = [_clamp_index(s, in_shape[a]) for s, a in zip(starts, axes)]
    ends = [_clamp_index(e, in_shape[a]) for e, a in zip(ends, axes)]
    inputs = [node.inputs[0], _int64_const(graph, starts, cache, "slice_starts"),
              _int64_const(graph, ends, cache, "slice_ends"), _int64_const(graph, axes, cache, "slice_axes"),
              _int64_const(graph, steps, cache, "slice_steps")]
    node.resize_inputs(5)
    for index, value in enumerate(inputs):
        node.replace_input_with(index, value)


def _clamp_index(index: int, dim: int) -> int:
    if index < 0:
        index += dim
    return min(max(index, 0), dim)


def _static_split(graph: ir.Graph, node: ir.Node, cache: dict) -> None:
    sizes = []
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    axis = node.attributes.get_int("axis", 0)
    for out in node.outputs:
        shape = ir_utils.static_shape(out)
        if shape is None or rank is None:
            return
        sizes.append(shape[axis])
    node.resize_inputs(2)
    node.replace_input_with(1, _int64_const(graph, sizes, cache, "split_sizes"))
    node.attributes.pop("num_outputs", None)
