"""Small onnx-ir helpers shared by the passes (shapes, constants, new initializers)."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from difflite.core import custom_ops

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
# Constants up to this many elements are read (mask checks, gamma/beta); bigger ones are left on
# disk: a pass must never pull the multi-GB weights of a real checkpoint into memory.
SMALL_CONST_LIMIT = 1 << 22


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The shape as ints, or None when unknown or any dim is symbolic."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape.dims:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


def const_array(value: ir.Value | None, limit: int = SMALL_CONST_LIMIT) -> np.ndarray | None:
    """The constant's data (an initializer or a folded value) when it has at most `limit` elements."""
    if value is None or value.const_value is None:
        return None
    tensor = value.const_value
    if tensor.size > limit:
        return None
    try:
        return tensor.numpy()
    except Exception:  # noqa: BLE001 - e.g. external data that is gone
        return None


def scalar_const(value: ir.Value | None) -> float | None:
    """A one-element constant (any rank) as a float."""
    array = const_array(value, limit=1)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(-1)[0])


def is_scalar_like(value: ir.Value | None, target: float, rel: float = 1e-4, max_rank: int = 8) -> bool:
    """A one-element constant close to `target` whose rank cannot widen a tensor of rank `max_rank`."""
    number = scalar_const(value)
    if number is None or value.const_value.shape.rank() > max_rank:
        return False
    return math.isclose(number, target, rel_tol=rel, abs_tol=1e-7)


def int_list(value: ir.Value | None) -> list[int] | None:
    array = const_array(value, limit=64)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def unique_name(graph: ir.Graph, base: str) -> str:
    """A name no initializer or value of the graph uses yet (an existing name would silently
    rebind that initializer, see FACTS)."""
    taken = _graph_names(graph)
    name, index = base, 0
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def _graph_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs if v.name}
    names.update(graph.initializers)
    for node in graph:
        names.update(v.name for v in node.outputs if v.name)
    return names


def new_initializer(graph: ir.Graph, array: np.ndarray, base: str) -> ir.Value:
    tensor = ir.tensor(np.ascontiguousarray(array))
    value = ir.Value(name=unique_name(graph, base), shape=ir.Shape(array.shape),
                     type=ir.TensorType(tensor.dtype), const_value=tensor)
    graph.register_initializer(value)
    return value


def difflite_node(op: custom_ops.CustomOp, inputs, attrs: dict, output_like: ir.Value) -> ir.Node:
    """A node of the difflite domain, attributes completed and checked by the contract, with its
    output typed like `output_like`."""
    options = op.options(attrs)
    node = ir.Node(custom_ops.DOMAIN, op.name, list(inputs), attributes=_attributes(options),
                   version=custom_ops.DOMAIN_VERSION)
    out = node.outputs[0]
    out.type = output_like.type
    out.shape = output_like.shape
    return node


def difflite_attrs(op: custom_ops.CustomOp, attrs: dict) -> dict:
    """Attribute values as the rewriter's builder takes them (bool -> int)."""
    return {k: (int(v) if isinstance(v, bool) else v) for k, v in op.options(attrs).items()}


def _attributes(options: dict) -> list[ir.Attr]:
    out = []
    for name, value in options.items():
        if isinstance(value, bool):
            out.append(ir.AttrInt64(name, int(value)))
        elif isinstance(value, int):
            out.append(ir.AttrInt64(name, value))
        elif isinstance(value, float):
            out.append(ir.AttrFloat32(name, value))
        else:
            out.append(ir.AttrString(name, value))
    return out


def ensure_domain(model: ir.Model) -> None:
    model.opset_imports.setdefault(custom_ops.DOMAIN, custom_ops.DOMAIN_VERSION)


def is_difflite(node: ir.Node, op: custom_ops.CustomOp) -> bool:
    return node.domain == custom_ops.DOMAIN and node.op_type == op.name


def single_consumer(value: ir.Value) -> ir.Node | None:
    """The only node reading `value` (None if it has several readers or is a graph output)."""
    users = value.consumers()
    if len(users) != 1 or value.is_graph_output():
        return None
    return users[0]


def onnx_opset(model: ir.Model) -> int:
    return model.opset_imports.get("", 1)


def replace_node(graph: ir.Graph, node: ir.Node, old: ir.Value, new: ir.Value) -> None:
    """Remove `node` after routing every use of its output `old` (graph outputs included) to `new`,
    which takes over old's name (so graph outputs and later lookups keep their names)."""
    name = old.name
    for i, output in enumerate(graph.outputs):
        if output is old:
            graph.outputs[i] = new
    old.replace_all_uses_with(new)
    graph.remove(node, safe=True)
    old.name = None
    new.name = name
