"""Scaled dot-product attention -> difflite.Attention(q_proj, k_proj, v_proj).

A plain onnx-ir pass, not a rewriter pattern: the exporters differ in the chains of Reshape /
Transpose (and d^-1/4 scalings) around the attention core, so the core is matched structurally
and each chain is checked by what it computes rather than by its spelling.

Core, anchored at each Softmax (over the last axis):
    scores = MatMul(q_heads, k_heads_t) [-> Mul/Div by a constant scalar]* [-> Add(constant mask)]
    out = MatMul(Softmax(scores), v_heads)
or at an opset-23 Attention node (no softcap, no extra outputs, no past key/value).
Chains: q_heads / k_heads_t / v_heads are traced back through Reshape, Transpose, Squeeze,
Unsqueeze and Mul/Div by scalar constants to the farthest rank-3 tensor [N, L, H*D] from which
the chain is exactly the head split (q, v: [N, H, L, D] or [N*H, L, D]; k: the same with the last
two axes swapped). "Exactly" is checked by running the chain on an index tensor (np.arange),
so the dynamo SDPA form (K^T via [-1, L, d] / [1, h, d, L]), transformers' eager form
(Transpose(0, 2, 3, 1)), the 3-D head forms (diffusers AttnProcessor, legacy bmm) and
single-head attention all pass, and a wrong permutation cannot. The output is traced forward the
same way to the farthest [N, Lq, H*Dv] that is exactly the head merge. The product of all scalar
factors becomes `scale`. What lies before the sources (e.g. the VAE's [N,C,H,W] -> [N,HW,C]
Reshape/Transpose) stays outside the op.
Masks: a constant that is all zeros is no mask; exactly the strict upper triangle of [L, L] at
<= -1e4 (broadcast over batch and heads) is causal=1; any other mask, a mask computed at run
time, or a Softmax over another axis is not matched. A mask that cleanup left computed from
constants too large to fold (Trilu, comparisons, Where, reshapes, Expand) is evaluated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from difflite.core import custom_ops
from difflite.passes import ir_utils

RESHAPES = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
SCALINGS = ("Mul", "Div")
MASKED_AT_MOST = -1e4  # exp(-1e4) is 0 in float32 and float16: a "very negative" mask entry


@dataclass
class Attention:
    q: ir.Value
    k: ir.Value
    v: ir.Value
    heads: int
    scale: float
    causal: bool
    out: ir.Value  # the [N, Lq, H*Dv] value the fused op replaces


@dataclass
class Traced:
    source: ir.Value
    scale: float
    batch: int
    heads: int


def fuse_attention(model: ir.Model) -> int:
    """Fuse every matched attention in place; returns how many were fused."""
    ir_utils.ensure_domain(model)
    graph = model.graph
    fused = 0
    for node in list(graph):
        if node.graph is not graph or node.domain != "":
            continue
        if node.op_type == "Softmax":
            found = match_softmax_attention(node)
        elif node.op_type == "Attention":
            found = match_onnx_attention(node)
        else:
            continue
        if found is not None:
            _replace(graph, found)
            fused += 1
    common.RemoveUnusedNodesPass()(model)
    return fused


def match_softmax_attention(softmax: ir.Node) -> Attention | None:
    scores_shape = ir_utils.static_shape(softmax.inputs[0])
    if scores_shape is None or len(scores_shape) not in (3, 4):
        return None
    if softmax.attributes.get_int("axis", -1) % len(scores_shape) != len(scores_shape) - 1:
        return None
    apply = ir_utils.single_consumer(softmax.outputs[0])
    if apply is None or apply.op_type != "MatMul" or apply.inputs[0] is not softmax.outputs[0]:
        return None
    peeled = _peel_scores(softmax.inputs[0], scores_shape)
    if peeled is None:
        return None
    qk, scale, causal = peeled
    product = qk.producer()
    if product is None or product.op_type != "MatMul" or product.domain != "":
        return None
    q_heads, k_heads_t = product.inputs
    return _assemble(q_heads, k_heads_t, apply.inputs[1], apply.outputs[0], scale, causal, k_transposed=True)


def match_onnx_attention(node: ir.Node) -> Attention | None:
    """The Attention op of opset 23 with plain q, k, v (4-D heads or 3-D with num_heads)."""
    attrs = node.attributes
    if any(v is not None for v in node.inputs[4:]) or any(o.uses() for o in node.outputs[1:]):
        return None
    if attrs.get_float("softcap", 0.0) != 0.0 or len(node.inputs) < 3:
        return None
    q, k, v = node.inputs[:3]
    q_shape, k_shape = ir_utils.static_shape(q), ir_utils.static_shape(k)
    if q_shape is None or k_shape is None or len(q_shape) != len(k_shape):
        return None
    causal = bool(attrs.get_int("is_causal", 0))
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        kind = _mask_kind(node.inputs[3], _scores_shape(node, q_shape, k_shape))
        if kind is None or (kind == "causal" and causal):
            return None
        causal = causal or kind == "causal"
    head_dim = q_shape[-1] if len(q_shape) == 4 else q_shape[-1] // max(attrs.get_int("q_num_heads", 1), 1)
    scale = attrs.get_float("scale", 1.0 / math.sqrt(head_dim))
    if causal and q_shape[-2] != k_shape[-2]:
        return None  # ONNX aligns the causal mask top-left; the contract defines square masks only
    if len(q_shape) == 3:
        heads = attrs.get_int("q_num_heads", 0)
        if heads <= 0 or attrs.get_int("kv_num_heads", heads) != heads:
            return None
        return Attention(q, k, v, heads, scale, causal, node.outputs[0])
    if attrs.get_int("q_num_heads", q_shape[1]) != q_shape[1] or k_shape[1] != q_shape[1]:
        return None
    return _assemble(q, k, v, node.outputs[0], scale, causal, k_transposed=False)


def _scores_shape(node: ir.Node, q_shape, k_shape) -> tuple[int, ...]:
    if len(q_shape) == 4:
        return (q_shape[0], q_shape[1], q_shape[2], k_shape[2])
    return (q_shape[0], node.attributes.get_int("q_num_heads", 1), q_shape[1], k_shape[1])


def _peel_scores(value: ir.Value, shape: tuple[int, ...]) -> tuple[ir.Value, float, bool] | None:
    """Walk back from the Softmax input over scalar scalings and at most one constant mask."""
    scale, causal, masked = 1.0, False, False
    while True:
        node = value.producer()
        if node is None or node.domain != "":
            return value, scale, causal
        factor = _scalar_factor(node, len(shape))
        if factor is not None:
            if factor <= 0:
                return None  # a negative factor would turn the mask around
            scale *= factor
        elif node.op_type == "Add" and not masked:
            kind = _mask_kind(node.inputs[1], shape)
            if kind is None:
                return None  # a run-time or non-causal mask
            causal, masked = kind == "causal", True
        else:
            return value, scale, causal
        value = node.inputs[0]


def _scalar_factor(node: ir.Node, max_rank: int) -> float | None:
    """c for Mul(x, c) and 1/c for Div(x, c), c a one-element constant that cannot widen x."""
    if node.op_type not in SCALINGS or len(node.inputs) != 2:
        return None
    constant = node.inputs[1]
    number = ir_utils.scalar_const(constant)
    if number is None or number == 0.0 or constant.const_value.shape.rank() > max_rank:
        return None
    return number if node.op_type == "Mul" else 1.0 / number


def _mask_kind(mask: ir.Value, scores_shape: tuple[int, ...]) -> str | None:
    """"none" for an all-zero mask, "causal" for the strict upper triangle, None otherwise."""
    array = _mask_array(mask)
    if array is None or array.ndim > len(scores_shape):
        return None
    try:
        if np.broadcast_shapes(array.shape, scores_shape) != tuple(scores_shape):
            return None
    except ValueError:
        return None
    if not np.any(array):
        return "none"
    rows, cols = scores_shape[-2:]
    if rows != cols or array.shape[-2:] != (rows, cols):
        return None
    upper = np.triu(np.ones((rows, cols), dtype=bool), 1)
    planes = array.reshape(-1, rows, cols)
    if np.all(planes[:, ~upper] == 0) and np.all(planes[:, upper] <= MASKED_AT_MOST):
        return "causal"
    return None


def _mask_array(mask: ir.Value) -> np.ndarray | None:
    """A constant mask, or the small constant a ConstantOfShape/Expand broadcasts at run time
    (never expanded here: such masks can be [N*H, L, L] with L = 4096), or a constant mask that
    cleanup left computed (see _computed_constant)."""
    array = ir_utils.const_array(mask)
    if array is not None:
        return array
    node = mask.producer()
    rank = len(mask.shape) if mask.shape is not None else None
    if node is None or rank is None or node.domain != "":
        return None
    if node.op_type == "ConstantOfShape":
        attr = node.attributes.get("value")
        fill = attr.value.numpy().reshape(-1)[0] if attr is not None else 0.0
        return np.full((1,) * rank, fill, dtype=np.float64)
    if node.op_type == "Expand":
        return _mask_array(node.inputs[0])
    return _computed_constant(mask)


MASK_LAYOUTS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand")
MASK_ELEMENTWISE = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "Not": np.logical_not,
    "And": np.logical_and, "Or": np.logical_or, "Where": np.where, "Add": np.add, "Sub": np.subtract,
    "Mul": np.multiply, "Neg": np.negative,
}
MAX_MASK_DEPTH = 16


def _computed_constant(value: ir.Value, depth: int = 0) -> np.ndarray | None:
    """The value of a small graph over constants, evaluated here: layout ops, Trilu, comparisons,
    Where, Cast and float arithmetic. cleanup folds only nodes whose constant inputs have at most
    FOLD_INPUT_LIMIT (8192) elements, so a causal mask over L >= 91 tokens stays computed from an
    [L, L] constant: full((L, L), min).triu(1)[None, None].expand(...) (transformers' eager
    attention), Where(Trilu(ones, upper=0) == 0, -inf, 0) (F.scaled_dot_product_attention with
    is_causal). Every value is bounded by SMALL_CONST_LIMIT elements."""
    array = ir_utils.const_array(value)
    if array is not None:
        return array
    node = value.producer()
    shape = ir_utils.static_shape(value)
    if node is None or node.domain != "" or shape is None or depth > MAX_MASK_DEPTH \
            or math.prod(shape) > ir_utils.SMALL_CONST_LIMIT:
        return None
    if node.op_type == "ConstantOfShape":
        attr = node.attributes.get("value")
        return np.full(shape, attr.value.numpy().reshape(-1)[0] if attr is not None else np.float32(0))
    known = node.op_type in MASK_LAYOUTS or node.op_type in MASK_ELEMENTWISE or node.op_type in ("Trilu", "Cast")
    if not known or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type in MASK_LAYOUTS or node.op_type in ("Trilu", "Cast"):
        operands = [_computed_constant(node.inputs[0], depth + 1)]
    else:
        operands = [_computed_constant(v, depth + 1) if v is not None else None for v in node.inputs]
    if any(a is None for a in operands):
        return None
    source = operands[0]
    if node.op_type in MASK_LAYOUTS:
        if node.op_type == "Expand":
            return np.broadcast_to(source, shape).copy() if _broadcasts(source.shape, shape) else None
        return source.reshape(shape) if source.size == math.prod(shape) else None
    if node.op_type == "Trilu":
        k = 0
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            k = ir_utils.scalar_const(node.inputs[1])
            if k is None or source.ndim < 2:
                return None
        triangle = np.triu if node.attributes.get_int("upper", 1) else np.tril
        return triangle(source, int(k))
    if node.op_type == "Cast":
        if value.dtype is None:
            return None
        return source.astype(value.dtype.numpy())
    result = np.asarray(MASK_ELEMENTWISE[node.op_type](*operands))
    if result.shape != shape or (value.dtype is not None and result.dtype != value.dtype.numpy()):
        return None  # numpy would have promoted differently from ONNX: do not guess
    return result


def _broadcasts(source: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(source, target) == tuple(target)
    except ValueError:
        return False


def _assemble(q_heads, k_heads_t, v_heads, product, scale, causal, k_transposed) -> Attention | None:
    for value in (q_heads, k_heads_t, v_heads, product):
        if ir_utils.static_shape(value) is None or value.dtype not in ir_utils.FLOAT_TYPES:
            return None
    q = _trace_back(q_heads, swap_last=False)
    k = _trace_back(k_heads_t, swap_last=k_transposed)
    v = _trace_back(v_heads, swap_last=False)
    if q is None or k is None or v is None:
        return None
    if len({(t.batch, t.heads) for t in (q, k, v)}) != 1:
        return None
    q_shape, k_shape, v_shape = (ir_utils.static_shape(t.source) for t in (q, k, v))
    if q_shape[2] != k_shape[2] or k_shape[1] != v_shape[1]:
        return None
    if causal and q_shape[1] != k_shape[1]:
        return None
    out = _trace_forward(product, q.batch, q.heads)
    if out is None:
        return None
    return Attention(q.source, k.source, v.source, q.heads, scale * q.scale * k.scale, causal, out)


def _trace_back(heads_value: ir.Value, swap_last: bool) -> Traced | None:
    """The farthest rank-3 [N, L, H*D] value that `heads_value` is exactly the head split of."""
    chain = []  # nodes from heads_value backwards
    value = heads_value
    while True:
        node = value.producer()
        if node is None or node.domain != "" or not (_is_layout(node) or _scalar_factor(node, 8) is not None):
            break
        chain.append(node)
        value = node.inputs[0]
    for depth in range(len(chain), -1, -1):  # the farthest candidate first
        segment = list(reversed(chain[:depth]))
        source = segment[0].inputs[0] if segment else heads_value
        traced = _check_split(source, segment, heads_value, swap_last)
        if traced is not None:
            return traced
    return None


def _check_split(source, segment, heads_value, swap_last) -> Traced | None:
    src_shape, heads_shape = ir_utils.static_shape(source), ir_utils.static_shape(heads_value)
    if src_shape is None or len(src_shape) != 3 or len(heads_shape) not in (3, 4):
        return None
    batch = src_shape[0]
    if len(heads_shape) == 4:
        if heads_shape[0] != batch:
            return None
        heads = heads_shape[1]
    elif batch == 0 or heads_shape[0] % batch:
        return None
    else:
        heads = heads_shape[0] // batch
    if heads <= 0 or src_shape[2] % heads:
        return None
    index = np.arange(math.prod(src_shape), dtype=np.int64).reshape(src_shape)
    expected = index.reshape(batch, src_shape[1], heads, src_shape[2] // heads).transpose(0, 2, 1, 3)
    if len(heads_shape) == 3:
        expected = expected.reshape(batch * heads, src_shape[1], src_shape[2] // heads)
    if swap_last:
        expected = np.swapaxes(expected, -1, -2)
    actual = _run_layout(segment, index)
    if actual is None or actual.shape != expected.shape or not np.array_equal(actual, expected):
        return None
    scale = math.prod(_scalar_factor(n, 8) or 1.0 for n in segment if n.op_type in SCALINGS)
    return Traced(source, scale, batch, heads)


def _trace_forward(product: ir.Value, batch: int, heads: int) -> ir.Value | None:
    """The farthest value after `product` (through single-reader layout ops) that is exactly
    the head merge [N, Lq, H*Dv] of it."""
    shape = ir_utils.static_shape(product)
    if len(shape) == 4:
        per_head = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    elif shape[0] == batch * heads:
        per_head = np.arange(math.prod(shape), dtype=np.int64).reshape(batch, heads, *shape[1:])
    else:
        return None
    if per_head.shape[:2] != (batch, heads):
        return None
    _, _, rows, width = per_head.shape
    expected = per_head.transpose(0, 2, 1, 3).reshape(batch, rows, heads * width)
    index = per_head.reshape(shape)
    best, segment, value = None, [], product
    while True:
        node = ir_utils.single_consumer(value)
        if node is None or node.domain != "" or not _is_layout(node) or node.inputs[0] is not value:
            break
        segment.append(node)
        value = node.outputs[0]
        actual = _run_layout(segment, index)
        if actual is not None and actual.shape == expected.shape and np.array_equal(actual, expected):
            best = value
    if best is None and shape == expected.shape:
        best = product  # already merged (heads == 1 exports can fold the layout away)
    return best


def _is_layout(node: ir.Node) -> bool:
    if node.op_type == "Transpose":
        return True
    return node.op_type in RESHAPES and ir_utils.static_shape(node.outputs[0]) is not None


def _run_layout(segment: list[ir.Node], array: np.ndarray) -> np.ndarray | None:
    for node in segment:
        if node.op_type == "Transpose":
            perm = node.attributes.get_ints("perm", None)
            array = array.transpose(perm) if perm is not None else array.transpose()
        elif node.op_type in RESHAPES:
            shape = ir_utils.static_shape(node.outputs[0])
            if shape is None or math.prod(shape) != array.size:
                return None
            array = array.reshape(shape)
        # scalar Mul/Div nodes move no element
    return array


def _replace(graph: ir.Graph, found: Attention) -> None:
    attrs = {"heads": found.heads, "scale": found.scale, "causal": found.causal, "variant": "auto"}
    node = ir_utils.difflite_node(custom_ops.ATTENTION, (found.q, found.k, found.v), attrs, found.out)
    graph.insert_after(found.out.producer(), node)
    new_out = node.outputs[0]
    if found.out.is_graph_output():
        name = found.out.name
        for i, output in enumerate(graph.outputs):
            if output is found.out:
                graph.outputs[i] = new_out
        found.out.name = None
        new_out.name = name
    found.out.replace_all_uses_with(new_out)
