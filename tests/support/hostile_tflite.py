"""Hostile .tflite files (issue 16): a small seed model that uses every difflite custom op, and
mutations of it that a reader or the delegate must refuse without reading out of bounds.

The seed (`seed_model()`), x [1,4,4,8] -> y [1,16,8]:

    GroupNorm(x, gamma, beta) -> WinogradConv3x3(., w, bias) -> RESHAPE [1,16,8] -> Gelu -> e
    DEQUANTIZE(int8 [16,8], per-axis scales) -> FULLY_CONNECTED(e, ., bias) -> f [1,16,16]
    GeGLU(f) -> h;  Attention(q=h, k=h, v=e) -> a;  LoRA(y=a, x=h, slot 3) -> lo;  ADD(lo, e) -> y

with a signature def, as the writer emits. Every case is a function of the seed's object form
(schema.ModelT), or of its bytes, giving the hostile file's bytes; `CASES` lists them with what
each reader must do:

* `tools`: "bad": `difflite inspect` / `verify` exit 2 with one line naming the file; "any": a
  clean exit 0 or that (random damage that may leave a valid model).
* `delegate`: "fail": the interpreter does not load the model (TFLite or the delegate says why);
  "refuse": the delegate refuses the named difflite node (CPU: "not delegating node N (OP): ..."
  and the model then fails to load, TFLite having no kernel for it; OpenCL: loading fails with
  that node and reason); "any": loads and runs, or fails with a reason; never a crash;
  "tflite": TFLite's own loader accepts the file and points a tensor or options outside it (its
  bounds check wraps around), so no interpreter may be made: difflite's runtime refuses the file
  first (difflite.runtime.component.Component), and the delegate is not tried; "refuse-on-cpu": "refuse"
  on the CPU backend, "any" on OpenCL (a form only the OpenCL backend runs).

`random_cases(n, seed)` adds seeded byte-level damage (bit flips, overwritten words, truncation)
for the "any" expectations.
"""
from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

SIGNATURE_KEY = "serving_default"
INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------
# The seed


def _rng() -> np.random.Generator:
    return np.random.default_rng(16)


def _values(shape, scale=1.0) -> np.ndarray:
    r = _rng()
    v = r.uniform(0.2, 1.0, size=shape) * r.choice([-1.0, 1.0], size=shape)
    return (v * scale).astype(np.float32)


class _Builder:
    """Tensors, buffers, opcodes and operators of one subgraph, in schema object form."""

    def __init__(self) -> None:
        self.model = schema.ModelT()
        self.model.version = 3
        self.model.description = "difflite hostile-file seed"
        self.model.buffers = [schema.BufferT()]
        self.model.operatorCodes = []
        self.sub = schema.SubGraphT()
        self.sub.name = "main"
        self.sub.tensors, self.sub.operators = [], []
        self.model.subgraphs = [self.sub]

    def tensor(self, name, shape, ttype=schema.TensorType.FLOAT32, data: bytes | None = None,
               quantization=None) -> int:
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), ttype, 0
        if data is not None:
            b = schema.BufferT()
            b.data = np.frombuffer(data, dtype=np.uint8)
            self.model.buffers.append(b)
            t.buffer = len(self.model.buffers) - 1
        t.quantization = quantization
        self.sub.tensors.append(t)
        return len(self.sub.tensors) - 1

    def const(self, name, value: np.ndarray) -> int:
        types = {np.float32: schema.TensorType.FLOAT32, np.int32: schema.TensorType.INT32}
        return self.tensor(name, value.shape, types[value.dtype.type], np.ascontiguousarray(value).tobytes())

    def _opcode(self, builtin: int, custom: str | None) -> int:
        for i, oc in enumerate(self.model.operatorCodes):
            if oc.builtinCode == builtin and oc.customCode == custom:
                return i
        oc = schema.OperatorCodeT()
        oc.builtinCode, oc.deprecatedBuiltinCode, oc.customCode, oc.version = builtin, min(builtin, 127), custom, 1
        self.model.operatorCodes.append(oc)
        return len(self.model.operatorCodes) - 1

    def custom(self, code: str, inputs, outputs, options: dict) -> None:
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(schema.BuiltinOperator.CUSTOM, code)
        op.inputs, op.outputs = list(inputs), list(outputs)
        op.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(options)), dtype=np.uint8)
        op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        self.sub.operators.append(op)

    def builtin(self, name: str, inputs, outputs, options_type: int = 0, options=None) -> None:
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(getattr(schema.BuiltinOperator, name), None)
        op.inputs, op.outputs = list(inputs), list(outputs)
        op.builtinOptionsType, op.builtinOptions = options_type, options
        self.sub.operators.append(op)


def _tensor_map(name: str, index: int) -> schema.TensorMapT:
    m = schema.TensorMapT()
    m.name, m.tensorIndex = name, index
    return m


def seed_model() -> schema.ModelT:
    b = _Builder()
    x = b.tensor("x", [1, 4, 4, 8])
    gamma = b.const("gamma", _values(8, 1.5))
    beta = b.const("beta", _values(8))
    g = b.tensor("g", [1, 4, 4, 8])
    b.custom("difflite.GroupNorm", [x, gamma, beta], [g], {"groups": 2, "epsilon": 1e-5, "activation": "silu"})
    w = b.const("w", _values((36, 8, 8), 0.3))
    bias = b.const("bias", _values(8))
    c = b.tensor("c", [1, 4, 4, 8])
    b.custom("difflite.WinogradConv3x3", [g, w, bias], [c], {"tile": 4, "activation": "none"})
    shape = b.const("shape", np.array([1, 16, 8], np.int32))
    r = b.tensor("r", [1, 16, 8])
    reshape = schema.ReshapeOptionsT()
    reshape.newShape = [1, 16, 8]
    b.builtin("RESHAPE", [c, shape], [r], schema.BuiltinOptions.ReshapeOptions, reshape)
    e = b.tensor("e", [1, 16, 8])
    b.custom("difflite.Gelu", [r], [e], {"approximate": "tanh"})
    q = schema.QuantizationParametersT()
    q.scale = [float(s) for s in np.linspace(0.01, 0.02, 16)]
    q.zeroPoint = [0] * 16
    q.quantizedDimension = 0
    wq = b.tensor("wq", [16, 8], schema.TensorType.INT8,
                  _rng().integers(-100, 100, size=(16, 8), dtype=np.int8).tobytes(), quantization=q)
    wf = b.tensor("wf", [16, 8])
    b.builtin("DEQUANTIZE", [wq], [wf])
    fc_bias = b.const("fc_bias", _values(16))
    f = b.tensor("f", [1, 16, 16])
    fc = schema.FullyConnectedOptionsT()
    fc.keepNumDims = True
    b.builtin("FULLY_CONNECTED", [e, wf, fc_bias], [f], schema.BuiltinOptions.FullyConnectedOptions, fc)
    h = b.tensor("h", [1, 16, 8])
    b.custom("difflite.GeGLU", [f], [h], {"approximate": "erf"})
    a = b.tensor("a", [1, 16, 8])
    b.custom("difflite.Attention", [h, h, e], [a],
             {"heads": 2, "scale": 0.5, "causal": False, "variant": "auto"})
    lo = b.tensor("lo", [1, 16, 8])
    b.custom("difflite.LoRA", [a, h], [lo], {"slot": 3})  # no factors set: lo is a
    y = b.tensor("y", [1, 16, 8])
    add = schema.AddOptionsT()
    b.builtin("ADD", [lo, e], [y], schema.BuiltinOptions.AddOptions, add)
    b.sub.inputs, b.sub.outputs = [x], [y]
    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = SIGNATURE_KEY, 0
    sig.inputs, sig.outputs = [_tensor_map("x", x)], [_tensor_map("y", y)]
    b.model.signatureDefs = [sig]
    return b.model


def pack(model: schema.ModelT) -> bytes:
    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def seed_bytes() -> bytes:
    return pack(seed_model())


def seed_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 4, 4, 8)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Finding things in the seed


def _sub(m: schema.ModelT) -> schema.SubGraphT:
    return m.subgraphs[0]


def tensor_index(m: schema.ModelT, name: str) -> int:
    for i, t in enumerate(_sub(m).tensors):
        if (t.name.decode() if isinstance(t.name, bytes) else t.name) == name:
            return i
    raise KeyError(name)


def op_name(m: schema.ModelT, op: schema.OperatorT) -> str:
    code = m.operatorCodes[op.opcodeIndex]
    custom = code.customCode
    if custom is not None:
        return custom.decode() if isinstance(custom, bytes) else custom
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    return names[max(code.builtinCode, code.deprecatedBuiltinCode)]


def op_index(m: schema.ModelT, name: str) -> int:
    for i, op in enumerate(_sub(m).operators):
        if op_name(m, op) == name:
            return i
    raise KeyError(name)


def op_of(m: schema.ModelT, name: str) -> schema.OperatorT:
    return _sub(m).operators[op_index(m, name)]


def tensor_of(m: schema.ModelT, name: str) -> schema.TensorT:
    return _sub(m).tensors[tensor_index(m, name)]


# ---------------------------------------------------------------------------------------------
# Mutations: each returns the hostile file's bytes


Mutation = Callable[[schema.ModelT], bytes]


def edit(change: Callable[[schema.ModelT], object]) -> Mutation:
    """A change made to a copy of the seed in object form, then packed."""
    def apply(seed: schema.ModelT) -> bytes:
        m = copy.deepcopy(seed)
        change(m)
        return pack(m)
    return apply


def options(op: str, value) -> Mutation:
    """The custom options of the first `op` replaced by `value` (a dict: a FlexBuffer map; bytes:
    as they are; None: no options at all)."""
    def change(m):
        o = op_of(m, op)
        if value is None:
            o.customOptions = None
        else:
            raw = value if isinstance(value, (bytes, bytearray)) else bytes(flexbuffers.Dumps(value))
            o.customOptions = np.frombuffer(bytes(raw), dtype=np.uint8)
    return edit(change)


def dumps(attrs: dict) -> bytes:
    """A FlexBuffer map of `attrs`, writing floats beyond float32's range as 64-bit floats
    (flexbuffers.Dumps cannot)."""
    fbb = flexbuffers.Builder()
    with fbb.Map():
        for key, value in attrs.items():
            fbb.Key(key)
            if isinstance(value, float) and np.isfinite(value) and abs(value) > 3.4e38:
                fbb.Float(value, 8)
            else:
                fbb.Add(value)
    return bytes(fbb.Finish())


def attribute(op: str, name: str, value) -> Mutation:
    """One attribute of the first `op` set to `value` (a FlexBuffer of that Python type)."""
    def change(m):
        o = op_of(m, op)
        attrs = flexbuffers.Loads(bytes(o.customOptions))
        attrs[name] = value
        o.customOptions = np.frombuffer(dumps(attrs), dtype=np.uint8)
    return edit(change)


def without_attribute(op: str, name: str) -> Mutation:
    def change(m):
        o = op_of(m, op)
        attrs = flexbuffers.Loads(bytes(o.customOptions))
        del attrs[name]
        o.customOptions = np.frombuffer(bytes(flexbuffers.Dumps(attrs)), dtype=np.uint8)
    return edit(change)


def shape(tensor: str, dims) -> Mutation:
    """A tensor's declared shape; a constant's buffer keeps its bytes."""
    return edit(lambda m: setattr(tensor_of(m, tensor), "shape", list(dims)))


def retype(tensor: str, ttype: int) -> Mutation:
    return edit(lambda m: setattr(tensor_of(m, tensor), "type", ttype))


def recast(tensor: str, value: np.ndarray, ttype: int) -> Mutation:
    """A constant replaced by `value` (shape and bytes) stored as `ttype`."""
    def change(m):
        t = tensor_of(m, tensor)
        t.shape, t.type = list(value.shape), ttype
        m.buffers[t.buffer].data = np.frombuffer(np.ascontiguousarray(value).tobytes(), dtype=np.uint8)
    return edit(change)


def rewire(op: str, kind: str, position: int, to) -> Mutation:
    """Input or output `position` of the first `op` pointed at tensor `to` (a name or an index)."""
    def change(m):
        o = op_of(m, op)
        target = tensor_index(m, to) if isinstance(to, str) else to
        getattr(o, kind)[position] = target
    return edit(change)


def io_list(op: str, kind: str, names) -> Mutation:
    """The whole input or output list of the first `op` (names or indices)."""
    def change(m):
        setattr(op_of(m, op), kind, [tensor_index(m, n) if isinstance(n, str) else n for n in names])
    return edit(change)


def appended(tensor: str, offset: int | Callable[[int], int], size: int | None = None) -> Mutation:
    """A constant's bytes moved out of the flatbuffer: its Buffer gets offset/size (the layout of
    models over 2 GiB) pointing where `offset` says (a number, or a function of the file's size)."""
    def apply(seed):
        m = copy.deepcopy(seed)
        buf = m.buffers[tensor_of(m, tensor).buffer]
        length = len(buf.data)
        buf.data = None
        buf.offset, buf.size = 1 << 40, size if size is not None else length  # placeholder, same width
        probe = pack(m)
        buf.offset = offset(len(probe)) if callable(offset) else offset
        return pack(m)
    return apply


def large_custom_options(op: str, offset: int | Callable[[int], int], size: int) -> Mutation:
    """The first `op`'s options stored outside the flatbuffer (large_custom_options_offset/size)."""
    def apply(seed):
        m = copy.deepcopy(seed)
        o = op_of(m, op)
        o.customOptions = None
        o.largeCustomOptionsOffset, o.largeCustomOptionsSize = 1 << 40, size
        probe = pack(m)
        o.largeCustomOptionsOffset = offset(len(probe)) if callable(offset) else offset
        return pack(m)
    return apply


def buffer_data(tensor: str, change: Callable[[np.ndarray], np.ndarray]) -> Mutation:
    """A constant's buffer bytes replaced by `change(bytes)` (its shape kept)."""
    def edit_buffer(m):
        buf = m.buffers[tensor_of(m, tensor).buffer]
        buf.data = change(buf.data)
    return edit(edit_buffer)


def quantization(change: Callable[[schema.QuantizationParametersT], object]) -> Mutation:
    return edit(lambda m: change(tensor_of(m, "wq").quantization))


def new_tensor(m: schema.ModelT, name: str, dims, ttype=schema.TensorType.FLOAT32) -> int:
    t = schema.TensorT()
    t.name, t.shape, t.type, t.buffer = name, list(dims), ttype, 0
    _sub(m).tensors.append(t)
    return len(_sub(m).tensors) - 1


def byte_patch(position: Callable[[bytes], int], value: bytes) -> Callable[[schema.ModelT], bytes]:
    def apply(seed):
        data = bytearray(pack(seed))
        at = position(bytes(data))
        data[at:at + len(value)] = value
        return bytes(data)
    return apply


# ---------------------------------------------------------------------------------------------
# The cases


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[schema.ModelT], bytes]
    delegate: str  # "fail" | "refuse" | "any" | "tflite" | "refuse-on-cpu" (the OpenCL backend runs it)
    tools: str = "bad"  # "bad" | "any"
    op: str = ""  # delegate == "refuse": the difflite op refused
    reason: str = ""  # delegate == "refuse": in the delegate's reason (both backends)


def _refuse(id, make, op, reason="", tools="bad") -> Case:
    return Case(id, make, "refuse", tools, op, reason)


def _fail(id, make, tools="bad") -> Case:
    return Case(id, make, "fail", tools)


GN, GELU, GEGLU, ATT, WINO, LORA = ("difflite.GroupNorm", "difflite.Gelu", "difflite.GeGLU", "difflite.Attention",
                                    "difflite.WinogradConv3x3", "difflite.LoRA")
T = schema.TensorType
HUGE = [65536, 65536, 65536, 65536]  # 2^64 elements: wraps a 64-bit count to 0
OVERFLOW = [INT32_MAX, INT32_MAX, INT32_MAX, 8]


def _structure_cases() -> list[Case]:
    """Malformed files: offsets, indices and sizes that do not hold."""
    return [
        _fail("buffer-offset-past-eof", appended("gamma", lambda size: size + 4096)),
        _fail("buffer-ends-past-eof", appended("w", lambda size: size - 64)),
        # TFLite's own bounds check wraps around and accepts these two: the interpreter then hands
        # out a constant 16 bytes before / past the mapped file (a crash or a stray read, whoever
        # reads it). difflite's readers and runtime refuse them before making an interpreter.
        Case("buffer-offset-wraps", appended("gamma", 2**64 - 16, 32), "tflite"),
        Case("buffer-size-wraps", appended("gamma", lambda size: size - 16, 2**64 - 8), "tflite"),
        _fail("constant-buffer-short", buffer_data("gamma", lambda data: data[:30])),
        # More bytes than the shape needs: TFLite takes it (it checks <=) and the readers too.
        Case("constant-buffer-long", buffer_data("w", lambda data: np.concatenate([data, np.zeros(8, np.uint8)])),
             "any", tools="any"),
        _fail("constant-shape-wraps-to-buffer", shape("gamma", HUGE)),
        _fail("tensor-buffer-index-out-of-range", edit(lambda m: setattr(tensor_of(m, "beta"), "buffer", 1000))),
        _fail("opcode-index-out-of-range", edit(lambda m: setattr(op_of(m, GELU), "opcodeIndex", 77))),
        _fail("op-input-index-out-of-range", rewire(GELU, "inputs", 0, 5000)),
        _fail("op-input-index-negative", rewire(GN, "inputs", 0, -7)),
        _fail("op-output-index-out-of-range", rewire(GEGLU, "outputs", 0, 2**31 - 1)),
        _fail("graph-input-index-out-of-range", edit(lambda m: setattr(_sub(m), "inputs", [4096]))),
        _fail("graph-output-index-out-of-range", edit(lambda m: setattr(_sub(m), "outputs", [-3]))),
        # The interpreter reads signature defs only when a signature runner is asked for.
        Case("signature-index-out-of-range",
             edit(lambda m: setattr(m.signatureDefs[0].inputs[0], "tensorIndex", 999)), "any"),
        _fail("input-shape-overflows", shape("x", OVERFLOW)),
        _fail("input-shape-wraps-to-zero", shape("x", HUGE)),
        _fail("input-shape-negative", shape("x", [1, -4, 4, 8])),
        _fail("large-custom-options-past-eof", large_custom_options(GN, lambda size: size + 100, 64)),
        # Accepted by TFLite's wrapping bounds check: the node's options point 8 bytes before the file.
        Case("large-custom-options-wrap", large_custom_options(GN, 2**64 - 8, 64), "tflite"),
        _fail("root-offset-past-eof", byte_patch(lambda d: 0, (2**31 - 5).to_bytes(4, "little"))),
        _fail("truncated-half", lambda seed: pack(seed)[: len(pack(seed)) // 2]),
        _fail("no-subgraph", edit(lambda m: setattr(m, "subgraphs", []))),
    ]


def _graph_cases() -> list[Case]:
    """Well-formed flatbuffers whose graph does not hold: cycles, two writers, constants written."""
    def dangling(m):
        op_of(m, ATT).inputs[1] = new_tensor(m, "nobody_writes_me", [1, 16, 8])

    def smaller_second_writer(m):  # e: Gelu's [1,16,8], then GeGLU's [1,16,4]; both read by Attention
        e, r = tensor_index(m, "e"), tensor_index(m, "r")
        op_of(m, GEGLU).inputs, op_of(m, GEGLU).outputs = [r], [e]
        op_of(m, ATT).inputs = [e, e, e]

    return [
        _fail("cycle", rewire(GELU, "inputs", 0, "a")),
        _fail("self-loop", rewire(GELU, "inputs", 0, "e")),
        _fail("two-writers", io_list(GEGLU, "outputs", ["e"])),
        _fail("two-writers-smaller-second", edit(smaller_second_writer)),
        _fail("op-writes-a-constant", rewire(GELU, "outputs", 0, "gamma")),
        _fail("op-writes-the-graph-input", rewire(GEGLU, "outputs", 0, "x")),
        _fail("input-read-before-written", edit(dangling)),
    ]


def _attribute_type_cases() -> list[Case]:
    """Every attribute of every op given a value of each wrong FlexBuffer type."""
    wrong = {
        int: {"float": 8.5, "string": "8", "bool": True, "vector": [2], "map": {"v": 2}},
        float: {"string": "0.5", "bool": False, "vector": [0.5], "blob": b"\x00\x00\x00?"},
        str: {"int": 3, "float": 1.0, "bool": True, "vector": ["none"], "blob": b"none"},
        bool: {"int": 1, "string": "false", "float": 0.0},
    }
    attrs = {GN: {"groups": int, "epsilon": float, "activation": str},
             GELU: {"approximate": str}, GEGLU: {"approximate": str},
             ATT: {"heads": int, "scale": float, "causal": bool, "variant": str},
             WINO: {"tile": int, "activation": str}, LORA: {"slot": int}}
    cases = []
    for op, names in attrs.items():
        short = op.split(".")[1].lower()
        for name, kind in names.items():
            for label, value in wrong[kind].items():
                cases.append(_refuse(f"{short}-{name}-as-{label}", attribute(op, name, value), op, f"'{name}'"))
            cases.append(_refuse(f"{short}-{name}-missing", without_attribute(op, name), op,
                                 f"missing attribute '{name}'"))
    return cases


def _attribute_value_cases() -> list[Case]:
    return [
        _refuse("groupnorm-groups-zero", attribute(GN, "groups", 0), GN, "groups"),
        _refuse("groupnorm-groups-huge", attribute(GN, "groups", 2**40), GN, "groups"),
        _refuse("groupnorm-groups-int64-min", attribute(GN, "groups", -2**63), GN, "groups"),
        _refuse("groupnorm-groups-not-dividing", attribute(GN, "groups", 3), GN, "not divisible"),
        _refuse("groupnorm-epsilon-nan", attribute(GN, "epsilon", float("nan")), GN, "epsilon"),
        _refuse("groupnorm-epsilon-negative", attribute(GN, "epsilon", -1.0), GN, "epsilon"),
        _refuse("groupnorm-activation-unknown", attribute(GN, "activation", "relu"), GN, "activation"),
        _refuse("groupnorm-unknown-attribute", attribute(GN, "colour", 1), GN, "unknown attribute 'colour'"),
        _refuse("gelu-approximate-unknown", attribute(GELU, "approximate", "exact"), GELU, "approximate"),
        _refuse("attention-heads-zero", attribute(ATT, "heads", 0), ATT, "heads"),
        _refuse("attention-heads-negative", attribute(ATT, "heads", -2), ATT, "heads"),
        _refuse("attention-heads-2^33", attribute(ATT, "heads", 2**33), ATT, "heads"),
        _refuse("attention-heads-not-dividing", attribute(ATT, "heads", 3), ATT, "heads"),
        _refuse("attention-scale-infinite", attribute(ATT, "scale", float("inf")), ATT, "scale"),
        _refuse("attention-scale-beyond-float", attribute(ATT, "scale", 1e300), ATT, "scale"),
        _refuse("attention-variant-unknown", attribute(ATT, "variant", "fastest"), ATT, "variant"),
        _refuse("winograd-tile-2", attribute(WINO, "tile", 2), WINO, "tile"),
        _refuse("winograd-tile-int64-max", attribute(WINO, "tile", 2**63 - 1), WINO, "tile"),
        _refuse("winograd-activation-silu", attribute(WINO, "activation", "silu"), WINO, "activation"),
        _refuse("lora-slot-negative", attribute(LORA, "slot", -1), LORA, "slot"),
        _refuse("lora-slot-65536", attribute(LORA, "slot", 65536), LORA, "slot"),
        _refuse("lora-slot-int64-min", attribute(LORA, "slot", -2**63), LORA, "slot"),
        _refuse("lora-unknown-attribute", attribute(LORA, "rank", 4), LORA, "unknown attribute 'rank'"),
        _refuse("options-not-a-flexbuffer", options(GN, b"\x07\xff\x13garbage\x00\x01"), GN, "custom options"),
        _refuse("options-a-vector", options(GN, bytes(flexbuffers.Dumps([2, 1e-5, "silu"]))), GN, "custom options"),
        _refuse("options-an-int", options(GN, bytes(flexbuffers.Dumps(2))), GN, "custom options"),
        _refuse("options-truncated", lambda seed: options(GN, bytes(flexbuffers.Dumps(
            {"groups": 2, "epsilon": 1e-5, "activation": "silu"}))[:-5])(seed), GN, "custom options"),
        _refuse("options-empty", options(ATT, None), ATT, "missing attribute"),
        _refuse("options-nested-deep", options(GELU, bytes(flexbuffers.Dumps(
            {"approximate": "erf", "x": [[[[[[[[[[[[1]]]]]]]]]]]]}))), GELU, "unknown attribute"),
    ]


def graph_input(m: schema.ModelT, name: str, dims, ttype=schema.TensorType.FLOAT32) -> int:
    """A new tensor fed by the caller: a graph input and a signature input."""
    index = new_tensor(m, name, dims, ttype)
    _sub(m).inputs.append(index)
    m.signatureDefs[0].inputs.append(_tensor_map(name, index))
    return index


def attention_input(position: int, dims, ttype=schema.TensorType.FLOAT32) -> Mutation:
    """The Attention's input `position` fed by a new graph input of `dims` and `ttype`."""
    return edit(lambda m: op_of(m, ATT).inputs.__setitem__(position, graph_input(m, "fed", dims, ttype)))


def lora_input(position: int, dims, ttype=schema.TensorType.FLOAT32) -> Mutation:
    """The LoRA's input `position` (0: y, 1: x) fed by a new graph input of `dims` and `ttype`."""
    return edit(lambda m: op_of(m, LORA).inputs.__setitem__(position, graph_input(m, "fed", dims, ttype)))


def _second_lora_of_slot_3(m: schema.ModelT) -> None:
    """A second LoRA of slot 3 (lo -> lo2, before the ADD, which then reads lo2): one layer's
    factors would reach two ops. The readers refuse it; the delegate may run it (both ops are
    layers of the same K and N)."""
    lo2 = new_tensor(m, "lo2", [1, 16, 8])
    first = op_of(m, LORA)
    second = copy.deepcopy(first)
    second.inputs, second.outputs = [tensor_index(m, "lo"), tensor_index(m, "h")], [lo2]
    _sub(m).operators.insert(op_index(m, "ADD"), second)
    op_of(m, "ADD").inputs[0] = lo2


def _tensor_cases() -> list[Case]:
    """Custom ops whose tensors have the wrong count, rank, dtype or shape."""
    half = T.FLOAT16
    return [
        _refuse("groupnorm-x-rank-2", shape("x", [16, 8]), GN, "x must be"),
        _refuse("groupnorm-x-rank-5", shape("x", [1, 1, 4, 4, 8]), GN, "x must be"),
        _refuse("groupnorm-x-int32", retype("x", T.INT32), GN, "x"),
        # float16 activations keep the contract (DESIGN §2): the CPU backend's kernels take float32
        # only; the OpenCL backend holds float16 tensors as floats, converted at its boundary.
        Case("groupnorm-x-float16", retype("x", half), "refuse-on-cpu", "any", GN, "float16"),
        _refuse("groupnorm-x-zero-dim", shape("x", [1, 0, 4, 8]), GN, "x"),
        _refuse("groupnorm-gamma-int32", recast("gamma", np.ones(8, np.int32), T.INT32), GN, "gamma"),
        _refuse("groupnorm-gamma-rank-2", recast("gamma", np.ones((1, 8), np.float32), T.FLOAT32), GN, "gamma"),
        _refuse("groupnorm-gamma-short", recast("gamma", np.ones(4, np.float32), T.FLOAT32), GN, "gamma"),
        _refuse("groupnorm-beta-omitted", rewire(GN, "inputs", 2, -1), GN, ""),
        _refuse("groupnorm-two-inputs", io_list(GN, "inputs", ["x", "gamma"]), GN, "inputs"),
        _refuse("groupnorm-output-int32", retype("g", T.INT32), GN, "output"),
        _refuse("gelu-two-inputs", io_list(GELU, "inputs", ["r", "r"]), GELU, "inputs"),
        _refuse("gelu-no-inputs", io_list(GELU, "inputs", []), GELU, "inputs"),
        _refuse("gelu-two-outputs", edit(lambda m: op_of(m, GELU).outputs.append(new_tensor(m, "e2", [1, 16, 8]))),
                GELU, "outputs"),
        _refuse("geglu-odd-last-dim", shape("f", [1, 16, 15]), GEGLU, "even"),
        _refuse("attention-q-rank-4", attention_input(0, [1, 16, 8, 1]), ATT, "rank 3"),
        _refuse("attention-k-int32", attention_input(1, [1, 16, 8], T.INT32), ATT, "int32"),
        _refuse("attention-two-inputs", io_list(ATT, "inputs", ["h", "h"]), ATT, "inputs"),
        _refuse("attention-v-shorter", edit(lambda m: setattr(op_of(m, ATT), "inputs", [
            tensor_index(m, "h"), tensor_index(m, "h"), new_tensor(m, "v_short", [1, 15, 8])])), ATT, "lengths"),
        # The CPU backend gives the output the shape the op computes (and runs it); the OpenCL
        # backend plans the declared shapes and refuses the node.
        Case("attention-output-shape-lies", shape("a", [1, 16, 64]), "any"),
        _refuse("winograd-w-rank-2", recast("w", _values((36, 64)), T.FLOAT32), WINO, "w must be"),
        _refuse("winograd-w-35-positions", recast("w", _values((35, 8, 8)), T.FLOAT32), WINO, "w must be"),
        _refuse("winograd-w-cin-mismatch", recast("w", _values((36, 9, 8)), T.FLOAT32), WINO, "w must be"),
        _refuse("winograd-bias-long", recast("bias", _values(9), T.FLOAT32), WINO, "bias"),
        _refuse("winograd-x-rank-3", edit(lambda m: setattr(op_of(m, WINO), "inputs", [
            graph_input(m, "x3", [1, 16, 8]), tensor_index(m, "w"), tensor_index(m, "bias")])), WINO, "x must be"),
        _refuse("lora-x-other-rows", lora_input(1, [1, 15, 8]), LORA, "same rows"),
        _refuse("lora-x-rank-2", lora_input(1, [16, 8]), LORA, "same rows"),
        _refuse("lora-y-rank-1", lora_input(0, [8]), LORA, "same rows"),
        _refuse("lora-x-zero-dim", lora_input(1, [1, 16, 0]), LORA, "x"),
        _refuse("lora-y-int32", lora_input(0, [1, 16, 8], T.INT32), LORA, "int32"),
        Case("lora-x-float16", lora_input(1, [1, 16, 8], half), "refuse-on-cpu", "any", LORA, "float16"),
        _refuse("lora-one-input", io_list(LORA, "inputs", ["a"]), LORA, "inputs"),
        _refuse("lora-three-inputs", io_list(LORA, "inputs", ["a", "h", "h"]), LORA, "inputs"),
        _refuse("lora-y-omitted", rewire(LORA, "inputs", 0, -1), LORA, ""),
        # As the Attention's: the CPU backend gives the output the op's shape, OpenCL refuses the node.
        Case("lora-output-shape-lies", shape("lo", [1, 16, 9]), "any"),
        Case("lora-two-ops-of-one-slot", edit(_second_lora_of_slot_3), "any"),
    ]


def _builtin_cases() -> list[Case]:
    """Builtins the OpenCL backend folds or claims, with parameters that do not hold."""
    return [
        Case("dequantize-scales-short", quantization(lambda q: setattr(q, "scale", q.scale[:15])), "any"),
        Case("dequantize-zero-points-short", quantization(lambda q: setattr(q, "zeroPoint", q.zeroPoint[:3])), "any"),
        Case("dequantize-axis-out-of-range", quantization(lambda q: setattr(q, "quantizedDimension", 5)), "any"),
        Case("dequantize-scale-nan", quantization(lambda q: q.scale.__setitem__(4, float("nan"))), "any",
             tools="any"),
        Case("dequantize-no-quantization", edit(lambda m: setattr(tensor_of(m, "wq"), "quantization", None)), "any",
             tools="any"),
        _fail("dequantize-int8-buffer-short", buffer_data("wq", lambda data: data[:100])),
        Case("reshape-to-more-elements", edit(lambda m: (
            m.buffers[tensor_of(m, "shape").buffer].__setattr__(
                "data", np.frombuffer(np.array([1, 32, 8], np.int32).tobytes(), np.uint8)),
            setattr(op_of(m, "RESHAPE").builtinOptions, "newShape", [1, 32, 8]))), "any", tools="any"),
        Case("fc-output-shape-lies", shape("f", [1, 16, 12]), "any", tools="any"),
    ]


CASES: list[Case] = [*_structure_cases(), *_graph_cases(), *_attribute_type_cases(), *_attribute_value_cases(),
                     *_tensor_cases(), *_builtin_cases()]


def random_cases(count: int, seed: int = 16) -> list[Case]:
    """Seeded byte-level damage of the seed's bytes: flipped bits, overwritten 32-bit words
    (0, -1, 2^31-1 and random), truncation. Any outcome but a crash is allowed."""
    r = random.Random(seed)
    words = [b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f", b"\x00\x00\x01\x00"]
    cases = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            flips = [(r.randrange(1 << 20), r.randrange(8)) for _ in range(r.randint(1, 4))]

            def make(seed_model, flips=flips):
                data = bytearray(pack(seed_model))
                for at, bit in flips:
                    data[at % len(data)] ^= 1 << bit
                return bytes(data)
        elif kind == 1:
            at, word = r.randrange(1 << 20), r.choice(words + [r.randbytes(4)])

            def make(seed_model, at=at, word=word):
                data = bytearray(pack(seed_model))
                pos = (at % (len(data) - 4)) & ~3
                data[pos:pos + 4] = word
                return bytes(data)
        else:
            cut = r.random()

            def make(seed_model, cut=cut):
                data = pack(seed_model)
                return data[: max(8, int(len(data) * cut))]
        cases.append(Case(f"random-{i:03d}", make, "any", "any"))
    return cases


# ---------------------------------------------------------------------------------------------
# Running the cases through the delegate, in child processes


CHILD = Path(__file__).resolve().parent / "hostile_child.py"
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "SUMMARY: UndefinedBehaviorSanitizer", "SUMMARY: AddressSanitizer")


@dataclass
class Outcome:
    stage: str  # "load" | "allocate" | "invoke" | "ran" | "crashed"
    error: str = ""
    stderr: str = ""  # what the process wrote on stderr while this case ran
    returncode: int = 0


def write_corpus(folder: Path, cases: list[Case]) -> Path:
    """Each case's file as folder/ID.tflite (and the seed as folder/seed.tflite)."""
    folder.mkdir(parents=True, exist_ok=True)
    seed = seed_model()
    (folder / "seed.tflite").write_bytes(pack(seed))
    for case in cases:
        (folder / f"{case.id}.tflite").write_bytes(case.make(seed))
    return folder


def run_children(lib: Path, backend: str, folder: Path, ids: list[str], env: dict | None = None,
                 timeout: float = 600) -> dict[str, Outcome]:
    """Every case through hostile_child.py in as few processes as crashes allow: a child that dies
    is blamed on the case it had started (`crashed`, with its stderr) and a new child takes the
    cases after it."""
    outcomes: dict[str, Outcome] = {}
    todo = list(ids)
    while todo:
        proc = subprocess.run([sys.executable, str(CHILD), str(lib), backend, str(folder), *todo],
                              capture_output=True, text=True, env=env, timeout=timeout)
        per_case: dict[str, list[str]] = {}
        current = None
        for line in proc.stderr.splitlines():
            if line.startswith("@@case "):
                current = line[len("@@case "):]
                per_case[current] = []
            elif line != "@@done" and current is not None:
                per_case[current].append(line)
        done = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        for result in done:
            outcomes[result["id"]] = Outcome(result["stage"], result["error"],
                                             "\n".join(per_case.get(result["id"], [])))
        todo = todo[len(done):]
        if proc.returncode != 0 or "@@done" not in proc.stderr:
            if not todo:  # died after its last case (at exit): blame that one
                todo = [done[-1]["id"]] if done else list(ids[-1:])
            blamed = todo.pop(0)
            outcomes[blamed] = Outcome("crashed", f"exit status {proc.returncode}",
                                       "\n".join(per_case.get(blamed, [])), proc.returncode)
    return outcomes


def delegate_problems(case: Case, backend: str, outcome: Outcome) -> list[str]:
    """What is wrong with how the delegate (backend) took the case's file: [] when nothing.
    Never a crash or a sanitizer report; "fail": no run; "refuse": the named op refused, saying
    why, and the model not run (OpenCL: loading fails naming the node)."""
    problems = []
    if case.delegate == "refuse-on-cpu":
        case = replace(case, delegate="refuse" if backend == "cpu" else "any")
    if outcome.stage == "crashed":
        return [f"the process died ({outcome.error}):\n{outcome.stderr[-4000:]}"]
    report = [mark for mark in SANITIZER_MARKS if mark in outcome.stderr]
    if report:
        problems.append(f"sanitizer report ({report[0]}):\n{outcome.stderr[-4000:]}")
    if case.delegate in ("fail", "refuse") and outcome.stage == "ran":
        problems.append("the model ran")
    if case.delegate in ("fail", "refuse") and outcome.stage != "ran" and not outcome.error.strip():
        problems.append(f"failed at {outcome.stage} without a reason")
    if case.delegate == "refuse":
        lines = [line for line in outcome.stderr.splitlines()
                 if line.startswith("difflite: not delegating node ") and f"({case.op}): " in line]
        if not lines:
            problems.append(f"no 'not delegating node N ({case.op})' line:\n{outcome.stderr[-2000:]}")
        elif case.reason and not any(case.reason in line for line in lines):
            problems.append(f"the refusal does not say {case.reason!r}: {lines}")
        if backend == "opencl" and f"({case.op}) cannot run on the OpenCL backend" not in outcome.error:
            problems.append(f"loading did not fail naming {case.op}: {outcome.stage}: {outcome.error!r}")
    return problems
