"""What a .tflite must hold beyond its structure (reader.py checks offsets, sizes and indices):
a graph that runs in order, and difflite ops that keep the custom-op contract (DESIGN §2).

A hostile file may wire a cycle, let two operators write one tensor, write a constant, or give a
difflite op options of the wrong types or tensors of the wrong rank; every reader refuses such a
file before an interpreter sees it (`check_model`), with one line naming the file, the operator
and the reason. The contract rules mirror the op library's own checks (custom_ops/ops/*/): the
same attributes, types, ranges, tensor counts, ranks and shapes."""

from __future__ import annotations

import math

from difflite.core import custom_ops
from difflite.core.errors import BadInput
from difflite.folder.reader import TFLiteSummary, read_tflite

# Bumped when a check is added, so that files remembered as checked (manifest.check_model_file)
# are checked again.
CHECKS_VERSION = 1
FLOAT_TYPES = ("float32", "float16")
FLOAT32_RANGE = 3.0e38  # the op library's bound on `scale`
# Integer attributes' ranges, as the op library reads them.
INT_RANGES = {("GroupNorm", "groups"): (1, 1 << 20), ("Attention", "heads"): (1, 65536),
              ("LoRA", "slot"): (0, 65535)}


def read_checked(path) -> TFLiteSummary:
    """read_tflite (the file's structure) and check_model (its graph and difflite ops)."""
    summary = read_tflite(path)
    check_model(summary)
    return summary


def check_model(summary: TFLiteSummary) -> None:
    """BadInput when the graph or a difflite op of `summary` does not hold."""
    check_graph(summary)
    slots: dict[int, int] = {}
    for index, op in enumerate(summary.ops):
        if op.name.startswith(f"{custom_ops.DOMAIN}."):
            reason = contract_error(summary, op)
            if not reason and op.name == custom_ops.LORA.custom_code:
                reason = _second_slot(slots, index, op.custom_options["slot"])
            if reason:
                raise BadInput(f"{summary.path}: operator {index} ({op.name}): {reason}")


def _second_slot(slots: dict[int, int], index: int, slot: int) -> str:
    """'' for a LoRA slot not seen yet (recorded in `slots`), else why not: factors are set per
    slot, so two ops of one slot would both take one layer's LoRA."""
    if slot in slots:
        return f"slot {slot} is operator {slots[slot]}'s too"
    slots[slot] = index
    return ""


def check_graph(summary: TFLiteSummary) -> None:
    """Every tensor an operator reads is a constant, a graph input, a variable or the output of an
    earlier operator; no tensor is written twice, and no operator writes a constant or a graph
    input."""
    def bad(index, op, what):
        return BadInput(f"{summary.path}: operator {index} ({op.name}): {what}")

    available = {i for i, t in enumerate(summary.tensors) if t.constant or t.variable} | set(summary.inputs)
    writer: dict[int, int] = {}
    for index, op in enumerate(summary.ops):
        for t in op.outputs:
            if t in writer:
                raise bad(index, op, f"writes tensor {t} ('{summary.tensors[t].name}'), which operator "
                                     f"{writer[t]} writes too")
            writer[t] = index
    for index, op in enumerate(summary.ops):
        for t in op.inputs:
            if t < 0 or t in available:
                continue
            name = summary.tensors[t].name
            if t in writer:
                raise bad(index, op, f"reads tensor {t} ('{name}') before operator {writer[t]} writes it "
                                     f"(a cycle, or operators out of order)")
            raise bad(index, op, f"reads tensor {t} ('{name}'), which no operator writes and which is no "
                                 f"graph input or constant")
        for t in op.outputs:
            tensor = summary.tensors[t]
            if tensor.constant or t in summary.inputs:
                kind = "a constant" if tensor.constant else "a graph input"
                raise bad(index, op, f"writes tensor {t} ('{tensor.name}'), which is {kind}")
        available.update(op.outputs)


def flex_type(value) -> str:
    """The FlexBuffer type a decoded value had, for messages."""
    names = {type(None): "null", bool: "bool", int: "int", float: "float", str: "string", bytes: "blob",
             list: "vector", dict: "map"}
    return names.get(type(value), type(value).__name__)


def _value_error(op: custom_ops.CustomOp, attr: custom_ops.Attr, value) -> str:
    """'' or why `value` is not a valid `attr` of `op` (type, finiteness, range, choices)."""
    kinds = {int: "an int", float: "a float", bool: "a bool", str: "a string"}
    if attr.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif attr.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = type(value) is attr.kind
    if not ok:
        return f"attribute '{attr.name}' must be {kinds[attr.kind]}, got {flex_type(value)}"
    if attr.kind is float and not math.isfinite(value):
        return f"attribute '{attr.name}' must be finite, got {value}"
    low, high = INT_RANGES.get((op.name, attr.name), (None, None))
    if low is not None and not low <= value <= high:
        return f"attribute '{attr.name}' must be in [{low}, {high}], got {value}"
    if (op.name, attr.name) == ("GroupNorm", "epsilon") and not 0 <= value < 1:
        return f"attribute 'epsilon' must be in [0, 1), got {value}"
    if (op.name, attr.name) == ("Attention", "scale") and abs(value) > FLOAT32_RANGE:
        return f"attribute 'scale' is beyond float32's range: {value}"
    if attr.choices and value not in attr.choices:
        return f"attribute '{attr.name}' must be one of {', '.join(map(str, attr.choices))}, got {value!r}"
    return ""


def contract_error(summary: TFLiteSummary, op) -> str:
    """'' or why the difflite operator `op` breaks the contract: its name, options, tensor count,
    types, ranks and shapes, output included."""
    spec = custom_ops.BY_CUSTOM_CODE.get(op.name)
    if spec is None:
        return "unknown difflite op"
    attrs = op.custom_options
    if not isinstance(attrs, dict):
        return f"custom options must be a FlexBuffer map, got {flex_type(attrs)}"
    known = {a.name: a for a in spec.attrs}
    for key in attrs:
        if key not in known:
            return f"unknown attribute '{key}'"
    for attr in spec.attrs:
        if attr.name not in attrs:
            return f"missing attribute '{attr.name}'"
        reason = _value_error(spec, attr, attrs[attr.name])
        if reason:
            return reason
    if len(op.inputs) != len(spec.inputs):
        return f"takes {len(spec.inputs)} inputs ({', '.join(spec.inputs)}), got {len(op.inputs)}"
    if len(op.outputs) != 1:
        return f"has one output, got {len(op.outputs)}"
    tensors = {}
    for role, t in zip(spec.inputs, op.inputs):
        if t < 0:
            return f"input '{role}' is omitted"
        tensors[role] = summary.tensors[t]
    for role, tensor in (*tensors.items(), ("output", summary.tensors[op.outputs[0]])):
        if tensor.dtype not in FLOAT_TYPES:
            return f"'{role}' must be float32 or float16, got {tensor.dtype}"
    shapes = {role: list(tensor.shape) for role, tensor in tensors.items()}
    want, reason = _output_shape(spec.name, shapes, attrs)
    if reason:
        return reason
    got = list(summary.tensors[op.outputs[0]].shape)
    if got != want:
        return f"the output is declared {got}, the op gives {want}"
    return ""


def _output_shape(name: str, s: dict, attrs: dict) -> tuple[list, str]:
    """(the output shape, '') of op `name` on input shapes `s`, or ([], why not)."""
    x = s["x"] if "x" in s else s["q"]
    if any(d <= 0 for d in x):
        return [], f"'{'x' if 'x' in s else 'q'}' has a dimension that is not positive: {x}"
    if name == "GroupNorm":
        if len(x) not in (3, 4):
            return [], f"'x' must be [N,H,W,C] or [N,L,C], got {x}"
        c = x[-1]
        if c % attrs["groups"]:
            return [], f"channels {c} are not divisible by groups {attrs['groups']}"
        for role in ("gamma", "beta"):
            if s[role] != [c]:
                return [], f"'{role}' must be [{c}], got {s[role]}"
        return x, ""
    if name == "Gelu":
        return x, ""
    if name == "GeGLU":
        if not x or x[-1] % 2:
            return [], f"'x''s last dimension must be even (2*D), got {x}"
        return [*x[:-1], x[-1] // 2], ""
    if name == "Attention":
        q, k, v = s["q"], s["k"], s["v"]
        if any(len(t) != 3 for t in (q, k, v)):
            return [], f"q, k and v must be rank 3 [N,L,H*D], got {q}, {k}, {v}"
        if any(d <= 0 for d in (*k, *v)):
            return [], f"k and v must have positive dimensions, got {k}, {v}"
        heads = attrs["heads"]
        if k[0] != q[0] or v[0] != q[0] or v[1] != k[1] or k[2] != q[2] or q[2] % heads or v[2] % heads:
            return [], f"q {q}, k {k} and v {v} do not fit together with {heads} heads"
        return [q[0], q[1], v[2]], ""
    if name == "WinogradConv3x3":
        w, bias = s["w"], s["bias"]
        if len(x) != 4:
            return [], f"'x' must be [N,H,W,Cin], got {x}"
        transformed = len(w) == 3 and w[0] == 36 and w[1] == x[3] and w[2] > 0
        filter_form = len(w) == 4 and w[0] > 0 and w[1:] == [3, 3, x[3]]
        if not (transformed or filter_form):
            return [], f"'w' must be [36,{x[3]},Cout] (transformed) or [Cout,3,3,{x[3]}] (the filter), got {w}"
        cout = w[2] if transformed else w[0]
        if bias != [cout]:
            return [], f"'bias' must be [{cout}], got {bias}"
        return [*x[:3], cout], ""
    if name == "LoRA":
        y = s["y"]
        if len(x) < 2 or len(y) != len(x) or y[:-1] != x[:-1] or y[-1] <= 0:
            return [], f"'y' and 'x' must be [..., N] and [..., K] over the same rows, got {y} and {x}"
        return y, ""
    return [], "unknown difflite op"
