"""The LayerNorm-as-GroupNorm fusion (difflite/passes/layer_norm.py): onnxruntime before vs after, and near misses that must not match."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import helper, numpy_helper
from support import passes_helpers as H
from support.passes_helpers import TOLERANCE

from difflite.core import custom_ops
from difflite.passes import run_passes

# name: (x shape, with bias, epsilon); all normalise the last axis with constant scale/bias
LAYER_NORMS = {"rank3_bias": ((2, 7, 12), True, 1e-5), "rank4_no_bias": ((2, 3, 5, 12), False, 1e-6),
               "rank4_bias": ((1, 3, 5, 20), True, 1e-6), "rank2_no_bias": ((9, 12), False, 1e-5)}


def _layer_norm_model(cases: dict, elem=onnx.TensorProto.FLOAT, chain: bool = False) -> ir.Model:
    """One LayerNormalization per case: on its own graph input and output, or (`chain`) each on
    the previous one's output (all cases then share one shape). A case is (shape, bias, epsilon)
    or (shape, bias, epsilon, axis, scale_is_input, mean_is_output)."""
    rng = np.random.default_rng(0)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    nodes, inputs, outputs, inits, between = [], [], [], [], []
    previous = None
    for name, (shape, bias, epsilon, *rest) in cases.items():
        axis, scale_is_input, mean_is_output = rest or (-1, False, False)
        normalised = list(shape[axis:])
        x = previous or f"{name}_x"
        if x == f"{name}_x":
            inputs.append(helper.make_tensor_value_info(x, elem, shape))
        scale = (1.5 + rng.standard_normal(normalised)).astype(dtype)
        if scale_is_input:
            inputs.append(helper.make_tensor_value_info(f"{name}_scale", elem, normalised))
        else:
            inits.append(numpy_helper.from_array(scale, f"{name}_scale"))
        operands = [x, f"{name}_scale"]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(normalised).astype(dtype), f"{name}_bias"))
            operands.append(f"{name}_bias")
        results = [f"{name}_y"] + ([f"{name}_mean"] if mean_is_output else [])
        nodes.append(helper.make_node("LayerNormalization", operands, results, axis=axis, epsilon=epsilon))
        if chain:
            previous = results[0]
        (outputs if not chain or name == list(cases)[-1] else between).append(
            helper.make_tensor_value_info(results[0], elem, shape))
        if mean_is_output:
            outputs.append(helper.make_tensor_value_info(results[1], elem, [*shape[:axis], *[1] * -axis]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits, value_info=between)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))


def test_layer_norms_become_group_norms_of_one_group():
    model = _layer_norm_model(LAYER_NORMS)
    before = H.snapshot(model)
    counts = run_passes(model, {"layernorm"})
    assert H.relative_error(before, H.snapshot(model)) <= TOLERANCE
    assert counts["layernorm"] == {"matched": 4, "candidates": 4}
    assert counts["groupnorm"] == {"matched": 0, "candidates": 0}
    assert not any(n.op_type == "LayerNormalization" for n in model.graph)
    nodes = H.difflite_nodes(model, custom_ops.GROUP_NORM)
    initializers = {i.name: numpy_helper.to_array(i) for i in before.graph.initializer}
    for node, (name, (shape, bias, epsilon)) in zip(nodes, LAYER_NORMS.items(), strict=True):
        assert (H.attr(node, "groups"), H.attr(node, "activation")) == (1, "none")
        assert math.isclose(H.attr(node, "epsilon"), epsilon, rel_tol=1e-6)
        assert node.inputs[0].shape.dims == (math.prod(shape[:-1]), shape[-1], 1)
        gamma, beta = (v.const_value.numpy() for v in node.inputs[1:])
        np.testing.assert_array_equal(gamma, initializers[f"{name}_scale"])
        np.testing.assert_array_equal(beta, initializers[f"{name}_bias"] if bias else np.zeros(shape[-1]))
    names = [v.name for v in model.graph.initializers.values()]
    assert len(names) == len(set(names))


def test_layer_norm_fp16():
    model = _layer_norm_model({"half": ((2, 7, 12), True, 1e-5)}, elem=onnx.TensorProto.FLOAT16)
    before = H.snapshot(model)
    assert run_passes(model, {"layernorm"})["layernorm"] == {"matched": 1, "candidates": 1}
    [node] = H.difflite_nodes(model, custom_ops.GROUP_NORM)
    assert node.inputs[1].dtype == node.inputs[2].dtype == ir.DataType.FLOAT16
    assert H.relative_error(before, H.snapshot(model)) <= 5e-3  # float16 rounding


@pytest.mark.parametrize("case", [
    ((2, 7, 12), True, 1e-5, -1, True, False),  # scale is a graph input, not a constant
    ((2, 7, 12), True, 1e-5, -2, False, False),  # normalises the last two axes
    ((2, 7, 12), False, 1e-5, 1, False, False),  # the same through a positive axis
    ((2, 7, 12), True, 1e-5, -1, False, True),  # the Mean output is used
], ids=["scale_not_constant", "axis_minus_2", "axis_1_of_3", "mean_used"])
def test_layer_norm_near_misses_are_not_fused(case):
    model = _layer_norm_model({"miss": case})
    before = H.snapshot(model)
    assert run_passes(model, {"layernorm"})["layernorm"] == {"matched": 0, "candidates": 1}
    assert not H.difflite_ops(model)
    assert H.relative_error(before, H.snapshot(model)) <= TOLERANCE


def test_group_norm_of_one_group_on_images_stays_a_group_norm():
    """groups=1 over [N, C, H, W] is no LayerNorm: counted as a group norm, not as a layer norm."""
    module = H.perturb(torch.nn.GroupNorm(1, 12))
    model = H.export(module, (torch.randn(2, 12, 3, 5),))
    counts = run_passes(model, {"groupnorm", "layernorm"})
    assert counts["groupnorm"] == {"matched": 1, "candidates": 1}
    assert counts["layernorm"] == {"matched": 0, "candidates": 0}


def test_layer_norm_tflite_runs_with_the_op_library(lib):
    """The written .tflite holds one difflite.GroupNorm per LayerNorm and none of the
    decomposition's MEAN/RSQRT; LiteRT with the op library (CPU backend) agrees with onnxruntime
    on the original graph. Only "layernorm" is asked for: the writer tells the kinds apart."""
    from ai_edge_litert import interpreter as litert

    from difflite.compiler.tflite.writer import write_tflite

    chained = {"first": ((2, 7, 12), True, 1e-6), "second": ((2, 7, 12), False, 1e-5)}
    model = _layer_norm_model(chained, chain=True)
    original = H.snapshot(model)
    run_passes(model, {"layernorm"})
    result = write_tflite(model, fuse={"layernorm"})
    assert result.op_histogram.get(custom_ops.GROUP_NORM.custom_code) == 2
    assert not {"MEAN", "RSQRT", "TRANSPOSE"} & set(result.op_histogram), result.op_histogram
    unfused = write_tflite(ir.from_proto(original), fuse=()).op_histogram
    assert unfused["MEAN"] == 4 and unfused["RSQRT"] == 2 and not set(unfused) & {custom_ops.GROUP_NORM.custom_code}

    feeds = H.random_feeds(original, seed=3)
    [want] = H.run(original, feeds)
    delegate = litert.load_delegate(str(lib), {"backend": "cpu"})
    runner = litert.Interpreter(model_content=bytes(result.data), experimental_delegates=[delegate]) \
        .get_signature_runner("serving_default")
    got = runner(first_x=feeds["first_x"])["second_y"]
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
