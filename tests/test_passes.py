"""The ONNX passes: equivalence (onnxruntime before vs after, difflite ops via difflite.passes.reference),
match counts on real tiny exports against an independent census, and near misses that must not
match."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import helper, numpy_helper

from difflite.core import custom_ops
from difflite.passes import census, run_passes
from difflite.passes import cleanup as cleanup_module
from difflite.passes.attention import fuse_attention
from difflite.passes.cleanup import cleanup
from difflite.passes.gelu import fuse_gelu
from difflite.passes.group_norm import fuse_group_norm
from difflite.passes.reference import with_reference_functions

from support import passes_helpers as H

TOLERANCE = 1e-5
ALL_FUSIONS = {"gelu", "groupnorm", "layernorm", "attention"}


def apply(model: ir.Model, *fusions) -> ir.Model:
    """Cleanup + fusions in place; asserts the result computes what the input did."""
    before = H.snapshot(model)
    cleanup(model)
    for fuse in fusions:
        fuse(model)
    assert H.relative_error(before, H.snapshot(model)) <= TOLERANCE
    return model


def onnx_model(nodes, inputs: dict, output_shape, initializers: dict, opset: int = 18) -> ir.Model:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10))


# --------------------------------------------------------------------------------- reference


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


# --------------------------------------------------------------------------------- cleanup


class BlockCall(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, context):
        return self.block(x, encoder_hidden_states=context)


def _block(processor: str = "sdpa", dim=32, heads=2, head_dim=16):
    """A diffusers BasicTransformerBlock (self + cross attention, GEGLU), batch 2, Lq 10, Lk 5."""
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.attention_processor import AttnProcessor

    torch.manual_seed(0)
    block = BasicTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=head_dim,
                                  cross_attention_dim=24, activation_fn="geglu")
    if processor == "plain":  # the 3-D head form: head_to_batch_dim, baddbmm, bmm
        for attention in (block.attn1, block.attn2):
            attention.set_processor(AttnProcessor())
    return BlockCall(H.perturb(block)), (torch.randn(2, 10, dim), torch.randn(2, 5, 24))


def test_cleanup_makes_legacy_export_static():
    module, args = _block()
    model = apply(H.export(module, args, opset=17, dynamo=False))
    ops = {n.op_type for n in model.graph}
    assert not ops & {"Identity", "Cast", "Shape", "Constant", "Gather"}
    for node in model.graph:
        if node.op_type == "Reshape":
            assert node.inputs[1].const_value.numpy().tolist() == list(node.outputs[0].shape)
    assert not cleanup_module.non_static_values(model) and not cleanup_module.dynamic_shape_inputs(model)


def _tiny_clip(attn_implementation: str):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=16, hidden_act="quick_gelu")
    model = CLIPTextModel(config)
    model.set_attn_implementation(attn_implementation)
    return H.Wrapper(H.perturb(model)), (torch.randint(0, 100, (1, 16)),)


def test_cleanup_drops_softmax_nan_guard():
    model = apply(H.export(*_tiny_clip("sdpa")))
    assert not {n.op_type for n in model.graph} & {"IsNaN", "Where"}


# --------------------------------------------------------------------------------- gelu


def _activations():
    from transformers.activations import ACT2FN

    return [("erf", torch.nn.GELU()), ("tanh", torch.nn.GELU(approximate="tanh")),
            ("erf", ACT2FN["gelu"]), ("tanh", ACT2FN["gelu_new"]), ("tanh", ACT2FN["gelu_fast"]),
            ("sigmoid", ACT2FN["quick_gelu"])]


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("index", range(6))
def test_gelu_forms_fuse(index, dynamo):
    approximate, activation = _activations()[index]
    torch.manual_seed(index)
    module = H.perturb(torch.nn.Sequential(torch.nn.Linear(8, 12), activation))
    model = apply(H.export(module, (torch.randn(2, 5, 8),), dynamo=dynamo), fuse_gelu)
    [node] = H.difflite_nodes(model, custom_ops.GELU)
    assert H.attr(node, "approximate") == approximate
    assert not {n.op_type for n in model.graph} & {"Erf", "Tanh", "Sigmoid"}


def test_gelu_op_of_opset_20_fuses():
    module = H.perturb(torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(approximate="tanh")))
    model = apply(H.export(module, (torch.randn(2, 5, 8),), opset=20), fuse_gelu)
    assert [H.attr(n, "approximate") for n in H.difflite_nodes(model, custom_ops.GELU)] == ["tanh"]


def test_gelu_with_wrong_constant_is_not_fused():
    nodes = [helper.make_node("Div", ["x", "c"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["e1", "half"], ["h"]),
             helper.make_node("Mul", ["x", "h"], ["y"])]
    consts = {"c": np.float32(1.3), "one": np.float32(1.0), "half": np.float32(0.5)}
    model = apply(onnx_model(nodes, {"x": [2, 7]}, [2, 7], consts), fuse_gelu)
    assert not H.difflite_ops(model)


@pytest.mark.parametrize("opset,dynamo", [(18, True), (18, False), (21, True)])
def test_geglu_fuses_projection_halves(opset, dynamo):
    from diffusers.models.activations import GEGLU

    torch.manual_seed(0)
    module = H.perturb(GEGLU(8, 6))
    model = apply(H.export(module, (torch.randn(2, 5, 8),), opset=opset, dynamo=dynamo), fuse_gelu)
    assert H.difflite_ops(model) == {custom_ops.GEGLU.name: 1}
    [node] = H.difflite_nodes(model, custom_ops.GEGLU)
    assert node.inputs[0].shape.dims[-1] == 12 and H.attr(node, "approximate") == "erf"


class ChunkGelu(torch.nn.Module):
    """hidden * gelu(gate) from a chunk of axis 1: a GELU, not a GEGLU (the op splits the last axis)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        hidden, gate = self.proj(x).chunk(2, dim=1)
        return hidden * torch.nn.functional.gelu(gate)


def test_geglu_off_the_last_axis_is_only_a_gelu():
    model = apply(H.export(H.perturb(ChunkGelu()), (torch.randn(2, 6, 8),)), fuse_gelu)
    assert H.difflite_ops(model) == {custom_ops.GELU.name: 1}


# --------------------------------------------------------------------------------- group norm


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_silu_in_resnet_block(opset):
    from diffusers.models.resnet import ResnetBlock2D

    torch.manual_seed(0)
    block = H.perturb(ResnetBlock2D(in_channels=16, out_channels=24, temb_channels=None, groups=4))
    model = apply(H.export(H.Wrapper(block, temb=None), (torch.randn(2, 16, 5, 7),), opset=opset),
                  fuse_group_norm)
    nodes = H.difflite_nodes(model, custom_ops.GROUP_NORM)
    assert [(H.attr(n, "groups"), H.attr(n, "activation")) for n in nodes] == [(4, "silu")] * 2
    assert not {n.op_type for n in model.graph} & {"InstanceNormalization", "GroupNormalization", "Sigmoid"}


class NormThenSilu(torch.nn.Module):
    def __init__(self, affine=True, reuse=False):
        super().__init__()
        self.norm = torch.nn.GroupNorm(3, 12, eps=1e-3, affine=affine)
        self.reuse = reuse

    def forward(self, x):
        y = self.norm(x)
        out = torch.sigmoid(y) * y  # sigmoid first: the other operand order
        return out + y if self.reuse else out


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_on_3d_input_with_sigmoid_first(affine):
    model = apply(H.export(H.perturb(NormThenSilu(affine)), (torch.randn(2, 12, 10),)), fuse_group_norm)
    [node] = H.difflite_nodes(model, custom_ops.GROUP_NORM)
    assert (H.attr(node, "groups"), H.attr(node, "activation")) == (3, "silu")
    assert math.isclose(H.attr(node, "epsilon"), 1e-3, rel_tol=1e-6)


def test_group_norm_output_used_twice_keeps_silu_outside():
    model = apply(H.export(H.perturb(NormThenSilu(reuse=True)), (torch.randn(2, 12, 10),)), fuse_group_norm)
    [node] = H.difflite_nodes(model, custom_ops.GROUP_NORM)
    assert H.attr(node, "activation") == "none"


def _manual_group_norm(shape, grouped, group_scale, group_bias, gamma, beta) -> ir.Model:
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["g"]),
             helper.make_node("InstanceNormalization", ["g", "s", "b"], ["n"], epsilon=1e-5),
             helper.make_node("Reshape", ["n", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["y"])]
    consts = {"grouped": np.array(grouped, np.int64), "shape": np.array(shape, np.int64),
              "s": group_scale.astype(np.float32), "b": group_bias.astype(np.float32),
              "gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32)}
    return onnx_model(nodes, {"x": list(shape)}, list(shape), consts)


def test_group_norm_folds_instance_norm_scale_and_bias():
    rng = np.random.default_rng(0)
    model = _manual_group_norm((2, 12, 3, 5), (2, 4, -1), rng.standard_normal(4) + 1.5, rng.standard_normal(4),
                               rng.standard_normal((12, 1, 1)), rng.standard_normal((12, 1, 1)))
    model = apply(model, fuse_group_norm)
    assert H.difflite_ops(model) == {custom_ops.GROUP_NORM.name: 1}


def test_group_norm_gamma_along_width_is_not_absorbed():
    rng = np.random.default_rng(0)
    gamma = rng.standard_normal((1, 1, 1, 5))
    model = _manual_group_norm((2, 12, 3, 5), (2, 4, -1), np.ones(4), np.zeros(4), gamma,
                               rng.standard_normal((12, 1, 1)))
    model = apply(model, fuse_group_norm)
    [node] = H.difflite_nodes(model, custom_ops.GROUP_NORM)  # the plain norm only
    assert np.all(node.inputs[1].const_value.numpy() == 1) and np.all(node.inputs[2].const_value.numpy() == 0)
    assert [n.op_type for n in model.graph] == ["GroupNorm", "Mul", "Add"]


def test_group_norm_with_groups_cutting_channels_is_not_fused():
    rng = np.random.default_rng(0)  # [N, 5, -1] of 12 channels: the "groups" cut through channels
    model = _manual_group_norm((2, 12, 5, 5), (2, 5, -1), np.ones(5), np.zeros(5),
                               rng.standard_normal((12, 1, 1)), rng.standard_normal((12, 1, 1)))
    model = apply(model, fuse_group_norm)
    assert not H.difflite_ops(model)


# --------------------------------------------------------------------------------- layer norm

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


# --------------------------------------------------------------------------------- attention


@pytest.mark.parametrize("processor,opset,dynamo", [
    ("sdpa", 18, True), ("plain", 18, True), ("sdpa", 18, False), ("plain", 17, False), ("sdpa", 23, True)])
def test_attention_forms_in_transformer_block(processor, opset, dynamo):
    module, args = _block(processor)
    model = apply(H.export(module, args, opset=opset, dynamo=dynamo), fuse_gelu, fuse_attention)
    nodes = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert [(H.attr(n, "heads"), round(H.attr(n, "scale"), 6), H.attr(n, "causal")) for n in nodes] == \
        [(2, 0.25, 0)] * 2
    assert [n.inputs[1].shape.dims[1] for n in nodes] == [10, 5]  # self, then cross attention
    assert not {n.op_type for n in model.graph if n.domain == ""} & {"Softmax", "Attention", "Transpose"}


def test_attention_head_dim_64():
    module, args = _block(dim=128, heads=2, head_dim=64)
    model = apply(H.export(module, args), fuse_attention)
    assert [round(H.attr(n, "scale"), 6) for n in H.difflite_nodes(model, custom_ops.ATTENTION)] == [0.125] * 2


def test_onnx_attention_op_with_3d_inputs():
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=3, kv_num_heads=3, is_causal=1)
    model = apply(onnx_model([node], {"q": [2, 5, 12], "k": [2, 5, 12], "v": [2, 5, 18]}, [2, 5, 18], {},
                             opset=23), fuse_attention)
    [fused] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(fused, "heads"), H.attr(fused, "causal")) == (3, 1)
    assert math.isclose(H.attr(fused, "scale"), 0.5, rel_tol=1e-6)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_clip_attention_is_causal(implementation, dynamo):
    """legacy + eager: the causal mask's expand(b, 1, L, L) is shape arithmetic around a
    ConstantOfShape, which cleanup must fold for the mask to be a constant."""
    model = apply(H.export(*_tiny_clip(implementation), dynamo=dynamo), fuse_gelu, fuse_attention)
    nodes = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert [(H.attr(n, "heads"), H.attr(n, "causal")) for n in nodes] == [(4, 1)] * 2
    assert math.isclose(H.attr(nodes[0], "scale"), 8 ** -0.5, rel_tol=1e-6)
    assert H.difflite_ops(model)[custom_ops.GELU.name] == 2


def test_vae_single_head_attention_keeps_layout_outside():
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    block = H.perturb(Attention(16, heads=1, dim_head=16, norm_num_groups=4, residual_connection=True,
                                bias=True, upcast_softmax=True, _from_deprecated_attn_block=True))
    model = apply(H.export(H.Wrapper(block), (torch.randn(1, 16, 6, 5),)), fuse_group_norm, fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert H.attr(node, "heads") == 1 and list(node.inputs[0].shape) == [1, 30, 16]
    assert H.difflite_ops(model)[custom_ops.GROUP_NORM.name] == 1


class ToyAttention(torch.nn.Module):
    """Hand-written attention: the knobs make near misses."""

    def __init__(self, mask=None, softmax_dim=-1, split="heads_last"):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
        self.mask, self.softmax_dim, self.split = mask, softmax_dim, split

    def _heads(self, t):
        n, length, _ = t.shape
        if self.split == "heads_first":  # mixes tokens into heads: not a head split
            return t.reshape(n, 2, length, 8)
        return t.reshape(n, length, 2, 8).transpose(1, 2)

    def forward(self, x):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = q @ k.transpose(-1, -2) * 8 ** -0.5
        if self.mask is not None:
            scores = scores + self.mask
        out = scores.softmax(self.softmax_dim) @ v
        return out.transpose(1, 2).reshape(x.shape)


def _toy(**kwargs) -> ir.Model:
    torch.manual_seed(0)
    return apply(H.export(H.perturb(ToyAttention(**kwargs)), (torch.randn(2, 6, 16),)), fuse_attention)


def test_causal_mask_of_a_toy_attention():
    model = _toy(mask=torch.full((6, 6), -1e9).triu(1))
    assert [H.attr(n, "causal") for n in H.difflite_nodes(model, custom_ops.ATTENTION)] == [1]


class CausalAttention(torch.nn.Module):
    """Causal self-attention as transformers' eager attention writes it (scores + full((L, L),
    min).triu(1)[None, None].expand(N, 1, L, L)) or as F.scaled_dot_product_attention(is_causal)."""

    def __init__(self, sdpa: bool):
        super().__init__()
        self.sdpa = sdpa

    def forward(self, q, k, v):
        n, length, width = q.shape

        def split(t):
            return t.reshape(n, length, 2, width // 2).transpose(1, 2)

        if self.sdpa:
            out = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        else:
            scores = split(q) @ split(k).transpose(-1, -2) * (width // 2) ** -0.5
            mask = torch.full((length, length), torch.finfo(q.dtype).min).triu(1)
            scores = scores + mask[None, None].expand(n, 1, length, length)
            out = scores.softmax(-1) @ split(v)
        return out.transpose(1, 2).reshape(n, length, width)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
@pytest.mark.parametrize("sdpa", [False, True], ids=["eager", "sdpa"])
@pytest.mark.parametrize("length", [77, 97])  # the [L, L] mask within / over cleanup's folding limit
def test_causal_mask_of_any_length(length, sdpa, dynamo):
    q, k, v = (torch.randn(2, length, 16) for _ in range(3))
    model = apply(H.export(CausalAttention(sdpa), (q, k, v), dynamo=dynamo), fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(node, "heads"), H.attr(node, "causal")) == (2, 1)
    assert not {n.op_type for n in model.graph} & {"Trilu", "Expand", "Where", "Softmax"}


class BaddbmmCausal(torch.nn.Module):
    """diffusers AttnProcessor's scores with a mask: baddbmm(mask, q, k^T, beta=1, alpha=scale) on
    [N*H, L, D]; the TorchScript exporter writes beta * mask as Mul(mask, 1)."""

    def forward(self, q, k, v):
        length = q.shape[1]
        mask = torch.full((length, length), -10000.0).triu(1).expand(q.shape[0], length, length)
        scores = torch.baddbmm(mask, q, k.transpose(-1, -2), beta=1, alpha=0.25)
        return torch.bmm(scores.softmax(-1), v)


@pytest.mark.parametrize("batch_heads", [2, 16])  # the expanded mask within / over the folding limit
def test_baddbmm_causal_mask_of_any_size(batch_heads):
    q, k, v = (torch.randn(batch_heads, 24, 8) for _ in range(3))
    model = apply(H.export(BaddbmmCausal(), (q, k, v), dynamo=False), fuse_attention)
    [node] = H.difflite_nodes(model, custom_ops.ATTENTION)
    assert (H.attr(node, "causal"), round(H.attr(node, "scale"), 6)) == (1, 0.25)


def _causal_mask_with(row: int, col: int, value: float) -> torch.Tensor:
    mask = torch.full((6, 6), -1e9).triu(1)
    mask[row, col] = value
    return mask


@pytest.mark.parametrize("case", ["softmax_over_queries", "mask_lower_triangle", "mask_partial",
                                  "mask_bias_below", "heads_first_split"])
def test_attention_near_misses_are_not_fused(case):
    kwargs = {
        "softmax_over_queries": {"softmax_dim": -2},
        "mask_lower_triangle": {"mask": torch.full((6, 6), -1e9).tril(-1)},
        "mask_partial": {"mask": _causal_mask_with(0, 4, -1.0)},  # one entry not masked off
        "mask_bias_below": {"mask": _causal_mask_with(3, 1, 0.5)},  # a bias, not a mask
        "heads_first_split": {"split": "heads_first"},
    }[case]
    assert not H.difflite_ops(_toy(**kwargs))


# --------------------------------------------------------------------------------- real exports

TINY_HEIGHT, TINY_WIDTH, TINY_BATCH = 48, 32, 2  # non-square; the batch applies to the UNet


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from difflite.compiler.export import COMPONENTS, component_spec, export_onnx
    from difflite.compiler.models import load_pipeline

    pipe = load_pipeline("preset:tiny")
    folder = tmp_path_factory.mktemp("tiny_onnx")
    paths = {name: export_onnx(component_spec(pipe, name, TINY_HEIGHT, TINY_WIDTH, TINY_BATCH),
                               folder / f"{name}.onnx")
             for name in COMPONENTS}
    modules = {"text_encoder": pipe.text_encoder, "unet": pipe.unet,
               "vae_decoder": pipe.vae.decoder, "vae_encoder": pipe.vae.encoder}
    return paths, modules


@pytest.mark.parametrize("component", ["text_encoder", "unet", "vae_decoder", "vae_encoder"])
def test_tiny_component_all_candidates_fused(tiny, component):
    paths, modules = tiny
    model = ir.load(str(paths[component]))
    before = H.snapshot(model)
    counts = run_passes(model, ALL_FUSIONS | {"winograd"})
    for kind, count in counts.items():
        if kind == "winograd":  # selective by design: chosen by a cost model, not all candidates
            continue
        assert count["matched"] == count["candidates"], (component, kind, counts)
    expected = H.module_census(modules[component])
    for kind in ("gelu", "geglu", "groupnorm", "layernorm", "attention"):
        assert counts[kind]["candidates"] == expected[kind], (component, kind, counts, expected)
    assert set(counts) == {*census.KINDS, "winograd"}
    assert cleanup_module.non_static_values(model) == []
    assert H.relative_error(before, H.snapshot(model)) <= TOLERANCE


def test_tiny_unet_counts_and_partial_fusion(tiny):
    paths, modules = tiny
    model = ir.load(str(paths["unet"]))
    counts = run_passes(model, {"groupnorm", "winograd"})
    assert counts["groupnorm"]["matched"] == H.module_census(modules["unet"])["groupnorm"] > 0
    assert counts["groupnorm_silu"]["matched"] == counts["groupnorm_silu"]["candidates"] > 0
    assert counts["attention"] == {"matched": 0, "candidates": H.module_census(modules["unet"])["attention"]}
    assert counts["layernorm"] == {"matched": 0, "candidates": H.module_census(modules["unet"])["layernorm"]}
    assert counts["layernorm"]["candidates"] > 0
    assert counts["geglu"]["matched"] == 0 < counts["geglu"]["candidates"]
    with pytest.raises(ValueError):
        run_passes(model, {"flash"})


@pytest.mark.parametrize("component", ["text_encoder", "unet", "vae_decoder", "vae_encoder"])
def test_tiny_component_cleanup_is_static(tiny, component):
    model = ir.load(str(tiny[0][component]))
    stats = cleanup(model)
    assert stats["non_static"] == [] and stats["dynamic_inputs"] == []
