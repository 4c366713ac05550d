"""GELU -> difflite.Gelu, then GEGLU -> difflite.GeGLU (onnxscript pattern rewriter).

Sweep 1 fuses every GELU form into difflite.Gelu:
  erf:     x * 0.5 * (1 + Erf(x / sqrt2))   (or x * (1/sqrt2)) in the three operand groupings
           x*(0.5*(1+e)), (x*(1+e))*0.5, (x*0.5)*(1+e), each with x on either side
  tanh:    the same groupings around 1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)), x^3 as Pow(x, 3),
           x*(x*x) or (x*x)*x, or gelu_fast's factoring (sqrt(2/pi) x) * (1 + 0.044715 x x)
  sigmoid: x * Sigmoid(1.702 * x) (CLIP's quick GELU), x on either side
  Gelu:    the single ONNX op of opset 20+ (approximate "none" | "tanh")
Sweep 2 turns Mul(hidden, difflite.Gelu(gate)) into difflite.GeGLU(projection) when hidden and
gate are the two halves of the projection's last axis, from one Split or (legacy exporter) two
Slices. The projection (MatMul + bias Add) stays outside the op.

Cleanup runs first and puts constants second in Add/Mul, so only the order of non-constant
operands needs alternatives. Not covered: GELUs whose constants are not one-element initializers,
other algebraic rearrangements (e.g. 0.5 folded into the erf argument's scale), GEGLU halves
taken off another axis or in the order (gate, hidden).
"""

from __future__ import annotations

import math

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.rewriter import pattern

from difflite.core import custom_ops
from difflite.passes import ir_utils

SQRT2 = math.sqrt(2.0)
TANH_SCALE = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
QUICK_SCALE = 1.702
ERF, TANH = 0, 1  # tags of the activation alternatives


def _erf_argument(op, x, c_erf):
    return pattern.OrValue([op.Div(x, c_erf), op.Mul(x, c_erf)], tag_var="erf_mul")


def _cube(op, x, c_three):
    return pattern.OrValue([op.Pow(x, c_three), op.Mul(x, op.Mul(x, x)), op.Mul(op.Mul(x, x), x)])


def _tanh_argument(op, x, c_three, c_cubic, c_tanh, c_one_inner):
    inner = pattern.OrValue([
        op.Add(x, op.Mul(_cube(op, x, c_three), c_cubic)),
        op.Add(op.Mul(_cube(op, x, c_three), c_cubic), x),
    ])
    factored = op.Add(op.Mul(op.Mul(x, c_cubic), x), c_one_inner)  # gelu_fast: (c x)(1 + k x x)
    return pattern.OrValue([op.Mul(inner, c_tanh), op.Mul(op.Mul(x, c_tanh), factored)])


class GeluRule(pattern.RewriteRuleClassBase):
    """Erf or tanh GELU in one operand grouping ("a", "b", "c" above) with x first or second."""

    def __init__(self, grouping: str, x_first: bool):
        super().__init__(name=f"gelu_{grouping}_{'x_first' if x_first else 'x_second'}")
        self.grouping, self.x_first = grouping, x_first

    def _mul(self, op, x, other):
        return op.Mul(x, other) if self.x_first else op.Mul(other, x)

    def pattern(self, op, x, c_erf, c_three, c_cubic, c_tanh, c_one_inner, c_one, c_half):
        tanh_argument = _tanh_argument(op, x, c_three, c_cubic, c_tanh, c_one_inner)
        activated = pattern.OrValue(
            [op.Erf(_erf_argument(op, x, c_erf)), op.Tanh(tanh_argument)],
            tag_var="kind", tag_values=[ERF, TANH])
        one_plus = op.Add(activated, c_one)
        if self.grouping == "a":
            return self._mul(op, x, op.Mul(one_plus, c_half))
        if self.grouping == "b":
            return op.Mul(self._mul(op, x, one_plus), c_half)
        half_x = op.Mul(x, c_half)
        return op.Mul(half_x, one_plus) if self.x_first else op.Mul(one_plus, half_x)

    def check(self, context, x, kind, c_one, c_half, erf_mul=None, c_erf=None, c_three=None,
              c_cubic=None, c_tanh=None, c_one_inner=None, **_):
        result = pattern.MatchResult()
        rank = _float_rank(x)
        if rank is None:
            return result.fail("x has no static float shape", x)
        expected = [(c_one, 1.0), (c_half, 0.5)]
        if kind == ERF:
            expected.append((c_erf, 1.0 / SQRT2 if erf_mul else SQRT2))
        else:
            expected += [(c_cubic, TANH_CUBIC), (c_tanh, TANH_SCALE)]
            expected += [(c, target) for c, target in ((c_three, 3.0), (c_one_inner, 1.0)) if c is not None]
        for value, target in expected:
            if not ir_utils.is_scalar_like(value, target, max_rank=rank):
                return result.fail(f"constant is not {target}", value)
        return result

    def rewrite(self, op, x, kind, **_):
        return _gelu(op, x, "erf" if kind == ERF else "tanh")


class QuickGeluRule(pattern.RewriteRuleClassBase):
    """x * Sigmoid(1.702 * x)."""

    def __init__(self, x_first: bool):
        super().__init__(name=f"quick_gelu_{'x_first' if x_first else 'x_second'}")
        self.x_first = x_first

    def pattern(self, op, x, c_scale):
        gate = op.Sigmoid(op.Mul(x, c_scale))
        return op.Mul(x, gate) if self.x_first else op.Mul(gate, x)

    def check(self, context, x, c_scale, **_):
        rank = _float_rank(x)
        if rank is None or not ir_utils.is_scalar_like(c_scale, QUICK_SCALE, max_rank=rank):
            return pattern.MatchResult().fail("not x * sigmoid(1.702 x)", x)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):
        return _gelu(op, x, "sigmoid")


class OnnxGeluRule(pattern.RewriteRuleClassBase):
    """The Gelu op of opset 20+."""

    def pattern(self, op, x):
        return op.Gelu(x, _outputs=["y"])

    def check(self, context, x, y, **_):
        if _float_rank(x) is None or _onnx_approximation(y) is None:
            return pattern.MatchResult().fail("not a float Gelu with a known approximation", x)
        return pattern.MatchResult()

    def rewrite(self, op, x, y, **_):
        return _gelu(op, x, _onnx_approximation(y))


def _onnx_approximation(y: ir.Value) -> str | None:
    mode = y.producer().attributes.get_string("approximate", "none")
    return {"none": "erf", "tanh": "tanh"}.get(mode)


class GeGluSplitRule(pattern.RewriteRuleClassBase):
    """hidden * gelu(gate) with (hidden, gate) = Split(projection) in halves of the last axis."""

    def __init__(self, hidden_first: bool):
        super().__init__(name=f"geglu_split_{'hidden_first' if hidden_first else 'gelu_first'}")
        self.hidden_first = hidden_first

    def pattern(self, op, projection, approximate):
        hidden, gate = op.Split(projection, _allow_other_inputs=True, _outputs=["hidden", "gate"])
        activated = op.Gelu(gate, _domain=custom_ops.DOMAIN, approximate=approximate)
        return op.Mul(hidden, activated) if self.hidden_first else op.Mul(activated, hidden)

    def check(self, context, projection, hidden, gate, **_):
        split = hidden.producer()
        return _check_halves(projection, hidden, gate, split.attributes.get_int("axis", 0))

    def rewrite(self, op, projection, approximate, **_):
        return _geglu(op, projection, approximate)


class GeGluSliceRule(pattern.RewriteRuleClassBase):
    """The legacy exporter's form: the halves come from two Slices of the projection."""

    def __init__(self, hidden_first: bool):
        super().__init__(name=f"geglu_slice_{'hidden_first' if hidden_first else 'gelu_first'}")
        self.hidden_first = hidden_first

    def pattern(self, op, projection, approximate, s0, e0, a0, p0, s1, e1, a1, p1):
        hidden = op.Slice(projection, s0, e0, a0, p0, _outputs=["hidden"])
        gate = op.Slice(projection, s1, e1, a1, p1, _outputs=["gate"])
        activated = op.Gelu(gate, _domain=custom_ops.DOMAIN, approximate=approximate)
        return op.Mul(hidden, activated) if self.hidden_first else op.Mul(activated, hidden)

    def check(self, context, projection, hidden, gate, s0, e0, a0, p0, s1, e1, a1, p1, **_):
        result = pattern.MatchResult()
        shape = ir_utils.static_shape(projection)
        if shape is None:
            return result.fail("projection shape unknown", projection)
        last, width = len(shape) - 1, shape[-1]
        bounds = [ir_utils.int_list(v) for v in (s0, e0, a0, p0, s1, e1, a1, p1)]
        if any(b is None or len(b) != 1 for b in bounds):
            return result.fail("slice bounds are not constant single-axis", hidden)
        (s0, e0, a0, p0, s1, e1, a1, p1) = [b[0] for b in bounds]
        if {a0 % len(shape), a1 % len(shape)} != {last} or (p0, p1) != (1, 1):
            return result.fail("slices are not unit-step on the last axis", hidden)
        if (s0, e0, s1, min(e1, width)) != (0, width // 2, width // 2, width) or width % 2:
            return result.fail("slices are not the two halves", hidden)
        return _check_halves(projection, hidden, gate, last)

    def rewrite(self, op, projection, approximate, **_):
        return _geglu(op, projection, approximate)


def _check_halves(projection: ir.Value, hidden: ir.Value, gate: ir.Value, axis: int) -> pattern.MatchResult:
    result = pattern.MatchResult()
    shape = ir_utils.static_shape(projection)
    if shape is None or _float_rank(projection) is None:
        return result.fail("projection has no static float shape", projection)
    half = list(shape[:-1]) + [shape[-1] // 2]
    if axis % len(shape) != len(shape) - 1 or shape[-1] % 2:
        return result.fail("not split on the last axis", projection)
    if list(ir_utils.static_shape(hidden) or ()) != half or list(ir_utils.static_shape(gate) or ()) != half:
        return result.fail("not split in two equal halves", projection)
    return result


def _gelu(op, x, approximate: str):
    attrs = ir_utils.difflite_attrs(custom_ops.GELU, {"approximate": approximate})
    return op.op(custom_ops.GELU.name, x, _domain=custom_ops.DOMAIN, _version=custom_ops.DOMAIN_VERSION, **attrs)


def _geglu(op, projection, approximate: ir.Attr):
    attrs = ir_utils.difflite_attrs(custom_ops.GEGLU, {"approximate": approximate.as_string()})
    return op.op(custom_ops.GEGLU.name, projection, _domain=custom_ops.DOMAIN,
                 _version=custom_ops.DOMAIN_VERSION, **attrs)


def _float_rank(value: ir.Value | None) -> int | None:
    shape = ir_utils.static_shape(value)
    if shape is None or value.dtype not in ir_utils.FLOAT_TYPES:
        return None
    return len(shape)


GELU_RULES = pattern.RewriteRuleSet([
    *(GeluRule.rule(grouping, x_first) for grouping in "abc" for x_first in (True, False)),
    QuickGeluRule.rule(True), QuickGeluRule.rule(False), OnnxGeluRule.rule(),
])
GEGLU_RULES = pattern.RewriteRuleSet([
    GeGluSplitRule.rule(True), GeGluSplitRule.rule(False),
    GeGluSliceRule.rule(True), GeGluSliceRule.rule(False),
])


def fuse_gelu(model: ir.Model) -> None:
    """Sweep 1 (GELU) then sweep 2 (GEGLU on the fused Gelu), in place."""
    ir_utils.ensure_domain(model)
    GELU_RULES.apply_to_model(model)
    GEGLU_RULES.apply_to_model(model)
    common.RemoveUnusedNodesPass()(model)
