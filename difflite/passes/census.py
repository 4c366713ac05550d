"""Independent counts of fusion candidates, to check the matchers against.

`graph_census(model)` counts in an unfused ONNX graph by anchor ops only (no pattern matching):
  groupnorm       InstanceNormalization + GroupNormalization nodes
  groupnorm_silu  those whose normalized output (after the Reshape/Mul/Add that finish the group
                  norm) feeds a Sigmoid and a Mul of itself with that Sigmoid
  gelu / geglu    GELU sites (Erf, Tanh, Gelu nodes, Sigmoid of x*1.702); a site whose input x
                  comes from a Split or Slice is a GEGLU, the others are GELUs
  layernorm       LayerNormalization nodes
  attention       Softmax + Attention (opset 23) nodes
tests/support/passes_helpers.py's `module_census(module)` counts the torch modules the graph came from,
the check of the census.
"""

from __future__ import annotations

import onnx_ir as ir

from difflite.passes import ir_utils

KINDS = ("gelu", "geglu", "groupnorm", "groupnorm_silu", "layernorm", "attention")
ELEMENTWISE = ("Mul", "Div", "Add", "Sub", "Pow")
GROUP_NORM_TAIL = ("Reshape", "Mul", "Add")
QUICK_GELU_SCALE = 1.702


def graph_census(model: ir.Model) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for node in model.graph:
        if node.domain != "":
            continue
        if node.op_type in ("InstanceNormalization", "GroupNormalization"):
            counts["groupnorm"] += 1
            counts["groupnorm_silu"] += _feeds_silu(node)
        elif node.op_type == "LayerNormalization":
            counts["layernorm"] += 1
        elif _is_gelu_site(node):
            counts["geglu" if _gelu_input_is_split(node) else "gelu"] += 1
        elif node.op_type in ("Softmax", "Attention"):
            counts["attention"] += 1
    return counts


def _feeds_silu(norm: ir.Node) -> bool:
    value = norm.outputs[0]
    for _ in GROUP_NORM_TAIL if norm.op_type == "InstanceNormalization" else ():
        reader = ir_utils.single_consumer(value)
        if reader is None or reader.op_type not in GROUP_NORM_TAIL:
            break
        value = reader.outputs[0]
    readers = value.consumers()
    sigmoids = [n for n in readers if n.op_type == "Sigmoid"]
    return any(n.op_type == "Mul" and value in n.inputs and s.outputs[0] in n.inputs
               for s in sigmoids for n in readers)


def _is_gelu_site(node: ir.Node) -> bool:
    if node.op_type in ("Erf", "Tanh", "Gelu"):
        return True
    if node.op_type != "Sigmoid":
        return False
    scaled = node.inputs[0].producer()
    return scaled is not None and scaled.op_type == "Mul" and any(
        ir_utils.is_scalar_like(v, QUICK_GELU_SCALE) for v in scaled.inputs)


def _gelu_input_is_split(site: ir.Node) -> bool:
    """Whether the tensor the GELU acts on is one part of a Split/Slice (walking back over
    elementwise ops with constants to the first non-elementwise producers)."""
    frontier, producers = [site.inputs[0]], set()
    for _ in range(6):
        following = []
        for value in frontier:
            node = value.producer()
            if node is None or value.const_value is not None:
                continue
            if node.op_type in ELEMENTWISE:
                following.extend(v for v in node.inputs if v is not None)
            else:
                producers.add(node.op_type)
        frontier = following
    return bool(producers & {"Split", "Slice"})
