"""The reference implementations of the difflite ops (difflite/passes/reference.py) that the pass tests run the fused graphs with."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper
from support import passes_helpers as H

from difflite.core import custom_ops
from difflite.passes.reference import with_reference_functions


def _run_one_op(op: str, inputs: dict, output_shape, **attrs) -> np.ndarray:
    node = helper.make_node(op, list(inputs), ["y"], domain=custom_ops.DOMAIN, **attrs)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info(n, 1, a.shape) for n, a in inputs.items()],
                              [helper.make_tensor_value_info("y", 1, output_shape)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return H.run(proto, inputs)[0]


def _gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "erf":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return x / (1 + np.exp(-1.702 * x))


@pytest.mark.parametrize("approximate", custom_ops.APPROXIMATIONS)
def test_reference_gelu_and_geglu_match_numpy(approximate):
    x = np.random.default_rng(1).standard_normal((2, 3, 10)).astype(np.float32)
    got = _run_one_op("Gelu", {"x": x}, x.shape, approximate=approximate)
    assert np.max(np.abs(got - _gelu64(x.astype(np.float64), approximate))) < 1e-6
    got = _run_one_op("GeGLU", {"x": x}, (2, 3, 5), approximate=approximate)
    assert np.max(np.abs(got - x[..., :5] * _gelu64(x[..., 5:].astype(np.float64), approximate))) < 1e-6


@pytest.mark.parametrize("shape", [(2, 6, 3, 5), (1, 6, 7)])
def test_reference_group_norm_matches_numpy(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    got = _run_one_op("GroupNorm", {"x": x, "g": gamma, "b": beta}, shape, groups=3, epsilon=1e-4,
                      activation="silu")
    grouped = x.astype(np.float64).reshape(shape[0], 3, -1)
    normed = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-4)
    channel = (6,) + (1,) * (len(shape) - 2)
    pre = normed.reshape(shape) * gamma.reshape(channel) + beta.reshape(channel)
    assert np.max(np.abs(got - pre / (1 + np.exp(-pre)))) < 1e-5


@pytest.mark.parametrize("causal", [0, 1])
def test_reference_attention_matches_numpy(causal):
    rng = np.random.default_rng(2)
    n, length, heads, dk, dv = 2, 5, 3, 4, 6
    q, k = (rng.standard_normal((n, length, heads * dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((n, length, heads * dv)).astype(np.float32)
    got = _run_one_op("Attention", {"q": q, "k": k, "v": v}, (n, length, heads * dv), heads=heads,
                      scale=0.3, causal=causal, variant="auto")
    split = lambda t, d: t.astype(np.float64).reshape(n, length, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    scores = 0.3 * split(q, dk) @ split(k, dk).transpose(0, 1, 3, 2)
    if causal:
        scores = scores + np.triu(np.full((length, length), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = (probs @ split(v, dv)).transpose(0, 2, 1, 3).reshape(n, length, heads * dv)
    assert np.max(np.abs(got - expected)) < 1e-5


def test_reference_functions_are_specialized_per_string_attribute():
    node = helper.make_node("GeGLU", ["x"], ["y"], domain=custom_ops.DOMAIN, approximate="tanh")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [2, 4])],
                              [helper.make_tensor_value_info("y", 1, [2, 2])])
    proto = with_reference_functions(helper.make_model(graph, ir_version=10))
    assert {f.name for f in proto.functions} == {"GeGLU__tanh", "Gelu__tanh"}
    assert proto.graph.node[0].op_type == "GeGLU__tanh" and not proto.graph.node[0].attribute
