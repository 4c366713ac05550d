"""Helpers for the lowering tests: build a tiny ONNX model, write it with the TFLite writer, run it
in LiteRT (or tensorflow's tf.lite) and in onnxruntime, and compare.

Layout contract checked here: an entry whose `layout` is "NHWC" holds the ONNX tensor transposed
by (0, 2, 3, 1); int64 ONNX inputs are int32 in the .tflite."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from difflite.compiler.tflite.context import FP16_MIN_ELEMENTS
from difflite.compiler.tflite.writer import WriteResult, write_tflite

OPSET = 18
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
NP_TO_ONNX = {
    np.dtype(np.float32): onnx.TensorProto.FLOAT,
    np.dtype(np.int64): onnx.TensorProto.INT64,
    np.dtype(np.int32): onnx.TensorProto.INT32,
    np.dtype(np.bool_): onnx.TensorProto.BOOL,
    np.dtype(np.int8): onnx.TensorProto.INT8,
    np.dtype(np.uint8): onnx.TensorProto.UINT8,
    np.dtype(np.float16): onnx.TensorProto.FLOAT16,
}
NHWC = (0, 2, 3, 1)
NCHW = (0, 3, 1, 2)

node = helper.make_node


@dataclass
class Rand:
    """A random graph input: uniform magnitude in [lo, hi] (lo > 0 keeps it away from zero),
    with a random sign unless `positive`."""
    shape: tuple
    lo: float = 0.1
    hi: float = 2.0
    positive: bool = False

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        x = rng.uniform(self.lo, self.hi, self.shape).astype(np.float32)
        if not self.positive:
            x *= rng.choice(np.array([-1.0, 1.0], np.float32), self.shape)
        return x


@dataclass
class Case:
    """One table row: ONNX nodes, graph inputs (shape tuple -> Rand, Rand, or a fixed array),
    initializers, output names, and optional checks of the WriteResult."""
    id: str
    nodes: list
    inputs: dict
    outputs: list
    inits: dict = field(default_factory=dict)
    opset: int = OPSET
    check: object = None  # callable(WriteResult) -> None

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for name, spec in self.inputs.items():
            if isinstance(spec, tuple):
                spec = Rand(spec)
            out[name] = spec.sample(rng) if isinstance(spec, Rand) else np.asarray(spec)
        return out


def weight(seed, *shape, scale=0.5):
    """A seeded random, non-zero float32 initializer."""
    rng = np.random.default_rng(1000 + seed)
    w = rng.uniform(0.1, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
    return (w * scale).astype(np.float32)


def i64(*values):
    return np.array(values, np.int64)


def make_model(case: Case, inits: dict | None = None) -> onnx.ModelProto:
    feeds = case.feeds()
    graph_inputs = [helper.make_tensor_value_info(n, NP_TO_ONNX[a.dtype], a.shape) for n, a in feeds.items()]
    # Output types are left for shape inference to fill in.
    graph_outputs = [onnx.ValueInfoProto(name=n) for n in case.outputs]
    initializers = [numpy_helper.from_array(np.asarray(a), n)
                    for n, a in (case.inits if inits is None else inits).items()]
    graph = helper.make_graph(case.nodes, case.id.replace("-", "_"), graph_inputs, graph_outputs,
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 9
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    # Graph outputs: take the inferred types from value_info.
    inferred = {vi.name: vi for vi in model.graph.value_info}
    for out in model.graph.output:
        if not out.type.HasField("tensor_type") and out.name in inferred:
            out.type.CopyFrom(inferred[out.name].type)
    return model


def to_ir(model: onnx.ModelProto) -> ir.Model:
    return ir.serde.deserialize_model(model)


def write(case: Case, precision: str = "fp32") -> WriteResult:
    return write_tflite(to_ir(make_model(case)), precision=precision)


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _interpreter(data: bytes, runtime: str):
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
    elif runtime == "tf":
        import tensorflow as tf
        Interpreter = tf.lite.Interpreter
    else:
        raise ValueError(runtime)
    return Interpreter(model_content=bytes(data))


def run_tflite(result: WriteResult, feeds: dict, runtime: str = "litert") -> list[np.ndarray]:
    """Run the written model through its serving_default signature; inputs and outputs in ONNX
    (channels-first) layout and dtypes."""
    interpreter = _interpreter(result.data, runtime)
    runner = interpreter.get_signature_runner("serving_default")
    args = {}
    for entry in result.inputs:
        x = np.asarray(feeds[entry["name"]])
        if entry["layout"] == "NHWC":
            x = x.transpose(NHWC)
        if x.dtype == np.int64:
            x = x.astype(np.int32)
        assert list(x.shape) == entry["shape"], (entry, x.shape)
        args[entry["name"]] = np.ascontiguousarray(x)
    got = runner(**args)
    outs = []
    for entry in result.outputs:
        y = np.asarray(got[entry["name"]])
        if entry["layout"] == "NHWC":
            y = y.transpose(NCHW)
        outs.append(y)
    return outs


def compare(got: list, want: list, names: list, rtol: float) -> None:
    assert len(got) == len(want)
    for name, g, w in zip(names, got, want):
        w = np.asarray(w)
        assert tuple(g.shape) == tuple(w.shape), f"{name}: shape {g.shape} != {w.shape}"
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=name)
            continue
        assert np.isfinite(w).all(), f"{name}: reference has non-finite values"
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-30)
        assert err <= rtol * scale, f"{name}: max|err| {err:.3g} > {rtol:g} * max|ref| {scale:.3g}"


def check_case(case: Case, runtime: str = "litert", seed: int = 0, rtol: float = 1e-5) -> WriteResult:
    """fp32: the written model agrees with onnxruntime on seeded random inputs."""
    model = make_model(case)
    result = write_tflite(to_ir(model), precision="fp32")
    feeds = case.feeds(seed)
    want = run_onnxruntime(model, feeds)
    got = run_tflite(result, feeds, runtime)
    compare(got, want, case.outputs, rtol)
    if case.check is not None:
        case.check(result)
    return result


def round_weights_fp16(inits: dict) -> dict:
    """The initializers as the fp16 writer stores them: float tensors of at least
    FP16_MIN_ELEMENTS elements rounded to float16, the rest unchanged."""
    out = {}
    for name, a in inits.items():
        a = np.asarray(a)
        if a.dtype == np.float32 and a.size >= FP16_MIN_ELEMENTS:
            a = a.astype(np.float16).astype(np.float32)
        out[name] = a
    return out


def check_case_fp16(case: Case, runtime: str = "litert", seed: int = 0, rtol: float = 1e-4) -> WriteResult:
    """fp16 weights: the written model agrees with onnxruntime run on fp16-rounded weights."""
    result = write_tflite(to_ir(make_model(case)), precision="fp16")
    rounded = make_model(case, round_weights_fp16(case.inits))
    feeds = case.feeds(seed)
    want = run_onnxruntime(rounded, feeds)
    got = run_tflite(result, feeds, runtime)
    compare(got, want, case.outputs, rtol)
    return result


def tensors_and_buffers(data) -> list[tuple[str, int, int, list]]:
    """(name, buffer index, TFLite type, shape) of every tensor of the first subgraph."""
    from ai_edge_litert import schema_py_generated as schema
    model = schema.Model.GetRootAs(bytes(data), 0)
    sub = model.Subgraphs(0)
    out = []
    for i in range(sub.TensorsLength()):
        t = sub.Tensors(i)
        out.append((t.Name().decode(), t.Buffer(), t.Type(), list(t.ShapeAsNumpy()) if t.ShapeLength() else []))
    return out
