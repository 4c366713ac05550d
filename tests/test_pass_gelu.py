"""The GELU / GeGLU fusion (difflite/passes/gelu.py): onnxruntime before vs after, and near misses that must not match."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper
from support import passes_helpers as H
from support.passes_helpers import apply, onnx_model

from difflite.core import custom_ops
from difflite.passes.gelu import fuse_gelu


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
