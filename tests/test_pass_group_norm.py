"""The GroupNorm(+SiLU) fusion (difflite/passes/group_norm.py): onnxruntime before vs after, and near misses that must not match."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnx import helper
from support import passes_helpers as H
from support.passes_helpers import apply, onnx_model

from difflite.core import custom_ops
from difflite.passes.group_norm import fuse_group_norm


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
