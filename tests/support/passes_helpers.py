"""Helpers for the pass tests (tests/test_pass_*.py): export small torch modules, run graphs with onnxruntime
(difflite ops through difflite.passes.reference), compare before/after."""

from __future__ import annotations

import collections
import contextlib
import io
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper

from difflite.core import custom_ops
from difflite.passes.cleanup import cleanup
from difflite.passes.reference import with_reference_functions


class Wrapper(torch.nn.Module):
    """Calls `module(*args, **kwargs)` and returns the first tensor of its output."""

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module = module
        self.kwargs = kwargs

    def forward(self, *args):
        out = self.module(*args, **self.kwargs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return getattr(out, "sample", getattr(out, "last_hidden_state", out))


def perturb(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Move every parameter off its init (norms are identities and biases zero at init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return module.eval()


def export(module: torch.nn.Module, args: tuple, opset: int = 18, dynamo: bool = True) -> ir.Model:
    """torch -> ONNX in memory (quietly) -> onnx_ir.Model."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer), \
            warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            proto = torch.onnx.export(module.eval(), args, dynamo=True, opset_version=opset).model_proto
        else:
            stream = io.BytesIO()
            torch.onnx.export(module.eval(), args, stream, dynamo=False, opset_version=opset)
            proto = onnx.load_from_string(stream.getvalue())
    return ir.from_proto(proto)


def snapshot(model: ir.Model) -> onnx.ModelProto:
    """A self-contained proto of the model (external weights read in: tiny models only)."""
    proto = ir.to_proto(model)
    for index, init in enumerate(proto.graph.initializer):
        if init.data_location == onnx.TensorProto.EXTERNAL:
            array = model.graph.initializers[init.name].const_value.numpy()
            proto.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    return proto


def random_feeds(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(1, 10, size=shape).astype(dtype)
        else:
            feeds[value.name] = (rng.standard_normal(shape) + 0.1).astype(dtype)
    return feeds


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(with_reference_functions(proto).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def relative_error(before: onnx.ModelProto, after: onnx.ModelProto, seed: int = 0) -> float:
    """max |after - before| / max |before| over all outputs, on random non-zero inputs."""
    feeds = random_feeds(before, seed)
    worst = 0.0
    for a, b in zip(run(before, feeds), run(after, feeds), strict=True):
        assert a.shape == b.shape
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12)))
    return worst


def difflite_ops(model: ir.Model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph if n.domain == custom_ops.DOMAIN)


def difflite_nodes(model: ir.Model, op: custom_ops.CustomOp) -> list[ir.Node]:
    return [n for n in model.graph if n.domain == custom_ops.DOMAIN and n.op_type == op.name]


def attr(node: ir.Node, name: str):
    return node.attributes[name].value


def module_census(module) -> dict[str, int]:
    """Counts of torch.nn.GroupNorm, torch.nn.LayerNorm, diffusers GEGLU, stand-alone GELU
    activation modules and attention modules (diffusers Attention, transformers' q/k/v_proj
    attentions) in `module`."""
    import torch
    from diffusers.models.activations import GEGLU
    from diffusers.models.attention_processor import Attention

    counts = {"groupnorm": 0, "layernorm": 0, "geglu": 0, "gelu": 0, "attention": 0}
    inside_geglu = {id(m) for g in module.modules() if isinstance(g, GEGLU) for m in g.modules()}
    for sub in module.modules():
        if isinstance(sub, torch.nn.GroupNorm):
            counts["groupnorm"] += 1
        elif isinstance(sub, torch.nn.LayerNorm):
            counts["layernorm"] += 1
        elif isinstance(sub, GEGLU):
            counts["geglu"] += 1
        elif _is_gelu_module(sub) and id(sub) not in inside_geglu:
            counts["gelu"] += 1
        elif isinstance(sub, Attention) or all(hasattr(sub, n) for n in ("q_proj", "k_proj", "v_proj")):
            counts["attention"] += 1
    return counts


def _is_gelu_module(sub) -> bool:
    """torch.nn.GELU, diffusers GELU / ApproximateGELU, transformers' GELU activations."""
    name = type(sub).__name__
    return "GELU" in name.upper() and "GEGLU" not in name.upper()


TOLERANCE = 1e-5
ALL_FUSIONS = {"gelu", "groupnorm", "layernorm", "attention"}


def apply(model: ir.Model, *fusions) -> ir.Model:
    """Cleanup + fusions in place; asserts the result computes what the input did."""
    before = snapshot(model)
    cleanup(model)
    for fuse in fusions:
        fuse(model)
    assert relative_error(before, snapshot(model)) <= TOLERANCE
    return model


def onnx_model(nodes, inputs: dict, output_shape, initializers: dict, opset: int = 18) -> ir.Model:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10))


class BlockCall(torch.nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, context):
        return self.block(x, encoder_hidden_states=context)


def transformer_block(processor: str = "sdpa", dim=32, heads=2, head_dim=16):
    """A diffusers BasicTransformerBlock (self + cross attention, GEGLU), batch 2, Lq 10, Lk 5."""
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.attention_processor import AttnProcessor

    torch.manual_seed(0)
    block = BasicTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=head_dim,
                                  cross_attention_dim=24, activation_fn="geglu")
    if processor == "plain":  # the 3-D head form: head_to_batch_dim, baddbmm, bmm
        for attention in (block.attn1, block.attn2):
            attention.set_processor(AttnProcessor())
    return BlockCall(perturb(block)), (torch.randn(2, 10, dim), torch.randn(2, 5, 24))


def tiny_clip(attn_implementation: str):
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=16, hidden_act="quick_gelu")
    model = CLIPTextModel(config)
    model.set_attn_implementation(attn_implementation)
    return Wrapper(perturb(model)), (torch.randint(0, 100, (1, 16)),)
