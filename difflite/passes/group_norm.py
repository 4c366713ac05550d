"""Group normalization -> difflite.GroupNorm (onnxscript pattern rewriter, three sweeps).

Sweep 1: Reshape(x, [N, G, -1]) -> InstanceNormalization(s, b, eps) -> Reshape(back to x's shape)
         -> Mul(gamma) -> Add(beta), as the dynamo exporter writes torch.nn.GroupNorm.
Sweep 2: the same without the affine Mul/Add (GroupNorm(affine=False)), and ONNX
         GroupNormalization (opset 21 per-channel scale/bias; per-group scale/bias before 21).
Sweep 3: difflite.GroupNorm followed by x * Sigmoid(x) (either order) -> activation="silu".
         The rewriter applies one rule set per sweep in node order, so SiLU needs its own sweep.

Checks: static float x of rank >= 3, G divides C, the grouped shape is [N, G, C/G * spatial], the
second Reshape restores x's shape, gamma and beta are constants that vary only along channel axis 1
(any rank up to x's), the instance-norm scale/bias are constants of length G. A non-unit
instance-norm scale or non-zero bias is folded exactly: gamma' = gamma * s[g(c)],
beta' = gamma * b[g(c)] + beta. Not covered: gamma/beta computed at run time, a LayerNorm-style
decomposition (ReduceMean/Sub/Pow/Sqrt) of a group norm.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.rewriter import pattern

from difflite.core import custom_ops
from difflite.passes import ir_utils


class GroupNormRule(pattern.RewriteRuleClassBase):
    """Reshape -> InstanceNormalization -> Reshape [-> Mul(gamma) -> Add(beta)]."""

    def __init__(self, affine: bool):
        super().__init__(name=f"group_norm_{'affine' if affine else 'plain'}")
        self.affine = affine

    def pattern(self, op, x, grouped_shape, in_scale, in_bias, back_shape, gamma, beta):
        grouped = op.Reshape(x, grouped_shape, _outputs=["grouped"])
        normed = op.InstanceNormalization(grouped, in_scale, in_bias, _outputs=["normed"])
        restored = op.Reshape(normed, back_shape, _outputs=["restored"])
        if not self.affine:
            return restored
        return op.Add(op.Mul(restored, gamma), beta)

    def check(self, context, x, grouped, normed, restored, in_scale, in_bias, gamma=None, beta=None, **_):
        result = pattern.MatchResult()
        shape = _norm_input_shape(x)
        if shape is None:
            return result.fail("x is not a static float [N, C, ...] tensor", x)
        n, channels, spatial = shape[0], shape[1], math.prod(shape[2:])
        grouped_shape = ir_utils.static_shape(grouped)
        if grouped_shape is None or len(grouped_shape) != 3 or grouped_shape[0] != n:
            return result.fail("first Reshape is not [N, G, -1]", grouped)
        groups = grouped_shape[1]
        if groups <= 0 or channels % groups or grouped_shape[2] != channels // groups * spatial:
            return result.fail("G does not divide C or the groups are not channel blocks", grouped)
        if ir_utils.static_shape(restored) != shape:
            return result.fail("second Reshape does not restore x's shape", restored)
        group_scale, group_bias = ir_utils.const_array(in_scale), ir_utils.const_array(in_bias)
        if group_scale is None or group_bias is None or group_scale.shape != (groups,) \
                or group_bias.shape != (groups,):
            return result.fail("instance-norm scale/bias are not constants of length G", normed)
        if self.affine:
            gamma_c, beta_c = _channel_vector(gamma, shape), _channel_vector(beta, shape)
            if gamma_c is None or beta_c is None:
                return result.fail("gamma/beta do not broadcast along the channel axis only", gamma)
        else:
            gamma_c, beta_c = np.ones(channels, np.float64), np.zeros(channels, np.float64)
        self._fused = _fold(gamma_c, beta_c, group_scale, group_bias, groups)
        self._groups = groups
        self._epsilon = normed.producer().attributes.get_float("epsilon", 1e-5)
        return result

    def rewrite(self, op, x, **_):
        return _group_norm(op, x, *self._fused, self._groups, self._epsilon)


class GroupNormalizationRule(pattern.RewriteRuleClassBase):
    """ONNX GroupNormalization: scale/bias per channel from opset 21, per group before."""

    def pattern(self, op, x, scale, bias):
        return op.GroupNormalization(x, scale, bias, _outputs=["y"])

    def check(self, context, x, scale, bias, y, **_):
        result = pattern.MatchResult()
        shape = _norm_input_shape(x)
        node = y.producer()
        groups = node.attributes.get_int("num_groups", 0)
        if shape is None or groups <= 0 or shape[1] % groups:
            return result.fail("x is not static float [N, C, ...] or G does not divide C", x)
        per = groups if ir_utils.onnx_opset(context.model) < 21 else shape[1]
        gamma, beta = ir_utils.const_array(scale), ir_utils.const_array(bias)
        if gamma is None or beta is None or gamma.shape != (per,) or beta.shape != (per,):
            return result.fail("scale/bias are not constants of the opset's length", scale)
        repeat = shape[1] // per
        self._fused = (np.repeat(gamma, repeat), np.repeat(beta, repeat))
        self._groups = groups
        self._epsilon = node.attributes.get_float("epsilon", 1e-5)
        return result

    def rewrite(self, op, x, **_):
        return _group_norm(op, x, *self._fused, self._groups, self._epsilon)


class GroupNormSiluRule(pattern.RewriteRuleClassBase):
    """difflite.GroupNorm(activation="none") -> x * Sigmoid(x)."""

    def __init__(self, norm_first: bool):
        super().__init__(name=f"group_norm_silu_{'norm_first' if norm_first else 'sigmoid_first'}")
        self.norm_first = norm_first

    def pattern(self, op, x, gamma, beta):
        normed = op.GroupNorm(x, gamma, beta, _domain=custom_ops.DOMAIN, activation="none",
                              _outputs=["normed"])
        gate = op.Sigmoid(normed)
        return op.Mul(normed, gate) if self.norm_first else op.Mul(gate, normed)

    def rewrite(self, op, x, gamma, beta, normed, **_):
        attrs = {name: attr.value for name, attr in normed.producer().attributes.items()}
        attrs = ir_utils.difflite_attrs(custom_ops.GROUP_NORM, {**attrs, "activation": "silu"})
        return op.op(custom_ops.GROUP_NORM.name, x, gamma, beta, _domain=custom_ops.DOMAIN,
                     _version=custom_ops.DOMAIN_VERSION, **attrs)


def _norm_input_shape(x: ir.Value) -> tuple[int, ...] | None:
    shape = ir_utils.static_shape(x)
    if shape is None or len(shape) < 3 or x.dtype not in ir_utils.FLOAT_TYPES:
        return None
    return shape


def _channel_vector(value: ir.Value | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """The [C] vector a constant broadcast against x means, if it varies along axis 1 only and
    cannot widen x (rank <= x's, every other dim 1)."""
    array = ir_utils.const_array(value)
    if array is None or array.ndim > len(shape):
        return None
    padded = array.reshape((1,) * (len(shape) - array.ndim) + array.shape)
    if any(d != 1 for i, d in enumerate(padded.shape) if i != 1) or padded.shape[1] not in (1, shape[1]):
        return None
    return np.broadcast_to(padded.reshape(-1), (shape[1],)).astype(np.float64)


def _fold(gamma: np.ndarray, beta: np.ndarray, group_scale: np.ndarray, group_bias: np.ndarray,
          groups: int) -> tuple[np.ndarray, np.ndarray]:
    """gamma*(s*n + b) + beta == (gamma*s)*n + (gamma*b + beta), s and b repeated per channel."""
    repeat = gamma.shape[0] // groups
    scale = np.repeat(group_scale.astype(np.float64), repeat)
    bias = np.repeat(group_bias.astype(np.float64), repeat)
    return gamma * scale, gamma * bias + beta


def _group_norm(op, x: ir.Value, gamma: np.ndarray, beta: np.ndarray, groups: int, epsilon: float):
    dtype = x.dtype.numpy()
    gamma_name = ir_utils.unique_name(x.graph, "group_norm_gamma")
    beta_name = ir_utils.unique_name(x.graph, "group_norm_beta")
    gamma_value = op.initializer(ir.tensor(gamma.astype(dtype)), gamma_name)
    beta_value = op.initializer(ir.tensor(beta.astype(dtype)), beta_name)
    attrs = ir_utils.difflite_attrs(custom_ops.GROUP_NORM, {"groups": groups, "epsilon": epsilon})
    return op.op(custom_ops.GROUP_NORM.name, x, gamma_value, beta_value, _domain=custom_ops.DOMAIN,
                 _version=custom_ops.DOMAIN_VERSION, **attrs)


GROUP_NORM_RULES = pattern.RewriteRuleSet([GroupNormRule.rule(True)])
PLAIN_GROUP_NORM_RULES = pattern.RewriteRuleSet([GroupNormRule.rule(False), GroupNormalizationRule.rule()])
SILU_RULES = pattern.RewriteRuleSet([GroupNormSiluRule.rule(True), GroupNormSiluRule.rule(False)])


def fuse_group_norm(model: ir.Model) -> None:
    ir_utils.ensure_domain(model)
    for rules in (GROUP_NORM_RULES, PLAIN_GROUP_NORM_RULES, SILU_RULES):
        rules.apply_to_model(model)
    common.RemoveUnusedNodesPass()(model)
