"""The five difflite ops on randomized configurations from the ranges real checkpoints use
(tests/support/randomized_ops.py: channels, groups, epsilons, activations, GELU approximations and
spellings, GeGLU widths, heads and head sizes, self / cross / causal attention, scales, variants,
3x3 convolution widths; odd sizes, batch 1 and 2), drawn with fixed seeds. Each test id spells its
configuration out, so a failure reproduces from the id.

For every configuration, a small torch module computing the op's decomposition is exported
(torch.onnx; ids ending in -dynamo: the dynamo exporter `convert` uses, else TorchScript's) and run
through the passes as `difflite convert` runs them, then:

  (a) the passes fuse it into exactly one difflite op of the expected kind, with the attributes
      the configuration implies (groups, epsilon, activation, approximate, heads, scale, causal,
      the folded gamma / beta or transformed weights), and the written .tflite carries them as
      the CUSTOM op's options;
  (b) the written fused file on the op library's CPU backend, and the --no-fuse file (the writer's
      builtin decomposition) on LiteRT's own kernels, match PyTorch's float64 output of the module
      within the kernel bar (max |err| <= 1e-4 x max |ref|);
  (c) the fused file on the OpenCL backend (PoCL) matches it too: fp32 storage within the kernel
      bar, fp16 storage at PSNR >= 40 dB (DESIGN §7's fp16 bar).

Outputs are poisoned with NaN before every run. No OpenCL is a failure, never a skip.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from difflite.core import custom_ops
from difflite.core import winograd as wg
from difflite.passes import ir_utils
from difflite.verify import FP16_MIN_PSNR_DB

from support import randomized_ops as R
from support.numerics import rel_err

KERNEL_BAR = 1e-4  # max |err| / max |ref| in float32 (the op-library kernel tests' bar)

GROUP_NORMS = R.draw_group_norms(7, layer_norms=3, dynamo=2)
GELUS = R.draw_gelus(6)
GEGLUS = R.draw_geglus(6)
ATTENTIONS = R.draw_attentions(12, dynamo=2)
WINOGRADS = R.draw_winograds(7)
CONFIGS = GROUP_NORMS + GELUS + GEGLUS + ATTENTIONS + WINOGRADS
IDS = [c.id for c in CONFIGS]

# ONNX ops of each pattern that must be gone once it is fused
PATTERN_OPS = {
    custom_ops.GROUP_NORM.name: {"InstanceNormalization", "GroupNormalization", "LayerNormalization", "Sigmoid"},
    custom_ops.GELU.name: {"Erf", "Tanh", "Sigmoid", "Gelu", "Pow"},
    custom_ops.GEGLU.name: {"Erf", "Tanh", "Gelu", "Split", "Slice"},
    custom_ops.ATTENTION.name: {"Softmax", "MatMul", "Attention"},
    custom_ops.WINOGRAD_CONV3X3.name: {"Conv"},
}


def psnr_db(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape and np.isfinite(got).all()
    rmse = float(np.sqrt(np.mean((got.astype(np.float64) - want) ** 2)))
    return math.inf if rmse == 0 else 20 * math.log10(float(np.abs(want).max()) / rmse)


# ------------------------------------------------------------------------------------------------


def test_draws_cover_the_ranges():
    """The fixed seeds give distinct configurations that reach every named value the ranges are
    about (a reseeding that lost one would silently test less)."""
    assert len(set(IDS)) == len(IDS)
    assert {c.activation for c in GROUP_NORMS if not c.layer_norm} == {"none", "silu"}
    assert {len(c.shape) for c in GROUP_NORMS if not c.layer_norm} == {3, 4}
    assert any(c.groups == 32 for c in GROUP_NORMS) and any(c.groups not in (1, 32) for c in GROUP_NORMS)
    assert any(c.layer_norm for c in GROUP_NORMS) and len({c.epsilon for c in GROUP_NORMS}) == 3
    assert {c.shape[0] for c in GROUP_NORMS} == {1, 2}
    assert {c.approximate for c in GELUS} == set(R.GELU_APPROXIMATIONS)
    assert {c.inner for c in GEGLUS} == set(R.GEGLU_INNER) and {c.approximate for c in GEGLUS} == {"erf", "tanh"}
    assert {c.variant for c in ATTENTIONS} == set(R.ATTENTION_VARIANTS)
    assert {c.family for c in ATTENTIONS} == set(R.ATTENTION_FAMILIES)
    assert {c.causal for c in ATTENTIONS} == {True, False}
    assert any(c.lk == R.TEXT_TOKENS != c.lq for c in ATTENTIONS)  # cross-attention
    assert any(c.causal and c.family != "clip" for c in ATTENTIONS)
    assert any(c.scale != 1 / math.sqrt(c.head_dim) for c in ATTENTIONS)
    assert {c.form for c in ATTENTIONS} == set(R.ATTENTION_FORMS)
    assert {c.shape[0] for c in WINOGRADS} == {1, 2}
    for configs in (GROUP_NORMS, GELUS, GEGLUS, ATTENTIONS, WINOGRADS):
        assert {c.exporter for c in configs} == {"legacy", "dynamo"}
    assert {c.layer_norm for c in GROUP_NORMS if c.exporter == "dynamo"} == {False, True}
    for c in ATTENTIONS:
        assert c.lq == 1 or c.lq % 4, c.id  # odd query lengths
    for c in WINOGRADS:
        assert c.shape[1] % 2 and c.shape[2] % 2, c.id


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_pass_fuses_the_config(config):
    """(a) One difflite op of the expected kind, with the configuration's attributes, in the graph
    and in the written file."""
    prepared = R.prepare(config)
    expected = config.expected
    graph = prepared.fused_onnx.graph
    fused = [n for n in graph if n.domain == custom_ops.DOMAIN]
    assert [n.op_type for n in fused] == [expected.op.name], [n.op_type for n in graph]
    [node] = fused
    left = {n.op_type for n in graph if n.domain == ""} & PATTERN_OPS[expected.op.name]
    assert not left, f"pattern ops left beside the fused op: {sorted(left)}"
    assert tuple(ir_utils.static_shape(v) for v in node.inputs) == expected.shapes
    if expected.op is custom_ops.ATTENTION:  # q, k, v are the graph inputs, in order
        assert [v.name for v in node.inputs] == [v.name for v in graph.inputs]
    attrs = {name: attr.value for name, attr in node.attributes.items()}
    _check_attributes(attrs, expected.attrs)
    _check_constants(config, node)

    kind = config.fuse_kind if config.fuse_kind != "gelu" else expected.op.name.lower()
    assert prepared.fusion_counts[kind] == {"matched": 1, "candidates": 1}, prepared.fusion_counts
    if kind == "groupnorm":
        silu = int(config.activation == "silu")
        assert prepared.fusion_counts["groupnorm_silu"] == {"matched": silu, "candidates": silu}
    [op] = R.custom_ops_in(prepared.fused_path)
    assert op.name == expected.op.custom_code
    written = dict(expected.attrs)
    if expected.op is custom_ops.ATTENTION:
        written["variant"] = config.variant
    _check_attributes(op.custom_options, written)
    assert set(op.custom_options) == {a.name for a in expected.op.attrs}


def _check_attributes(got: dict, want: dict) -> None:
    for name, value in want.items():
        assert name in got, f"attribute {name} missing: {got}"
        if isinstance(value, float):
            assert math.isclose(got[name], value, rel_tol=1e-6), f"{name}: {got[name]!r} != {value!r}"
        elif isinstance(value, bool):
            assert bool(got[name]) is value and got[name] in (0, 1), f"{name}: {got[name]!r} != {value!r}"
        else:
            got_value = got[name].decode() if isinstance(got[name], bytes) else got[name]
            assert got_value == value, f"{name}: {got_value!r} != {value!r}"


def _check_constants(config, node) -> None:
    """The op's constant inputs are the module's parameters (as the op takes them)."""
    module = R.perturbed_module(config)
    params = {name: p.detach().numpy().astype(np.float64) for name, p in module.named_parameters()}
    constants = [None if v.const_value is None else v.const_value.numpy() for v in node.inputs[1:]]
    if isinstance(config, R.GroupNormConfig):
        gamma, beta = _norm_params(params)
        np.testing.assert_allclose(constants[0], gamma, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(constants[1], beta, rtol=1e-6, atol=1e-7)
    elif isinstance(config, R.WinogradConfig):
        np.testing.assert_allclose(constants[0], wg.transform_weights(params["weight"].astype(np.float32)),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(constants[1], params["bias"], rtol=1e-6, atol=1e-7)
    else:
        assert all(c is None for c in constants), "unexpected constant inputs"


def _norm_params(params: dict) -> tuple[np.ndarray, np.ndarray]:
    [gamma] = [v for k, v in params.items() if k.endswith("weight")]
    [beta] = [v for k, v in params.items() if k.endswith("bias")]
    return gamma, beta


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_cpu_backend_and_decomposition(config, lib):
    """(b) The fused file on the CPU backend and the --no-fuse file on LiteRT's kernels."""
    prepared = R.prepare(config)
    [got] = R.run_written(prepared.fused_path, prepared.fused, prepared.inputs, lib, {"backend": "cpu"})
    error = rel_err(got, prepared.reference)
    assert error <= KERNEL_BAR, f"CPU backend: max |err| {error:.3g} x max |ref| > {KERNEL_BAR:g}"

    assert not R.custom_ops_in(prepared.unfused_path), "the --no-fuse file holds custom ops"
    [got] = R.run_written(prepared.unfused_path, prepared.unfused, prepared.inputs)
    error = rel_err(got, prepared.reference)
    assert error <= KERNEL_BAR, f"--no-fuse on LiteRT: max |err| {error:.3g} x max |ref| > {KERNEL_BAR:g}"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_opencl_backend(config, precision, opencl_lib):
    """(c) The fused file on the OpenCL backend, float and half storage."""
    from support.opencl_helpers import opencl_options

    prepared = R.prepare(config)
    [got] = R.run_written(prepared.fused_path, prepared.fused, prepared.inputs, opencl_lib,
                          opencl_options(precision=precision))
    if precision == "fp32":
        error = rel_err(got, prepared.reference)
        assert error <= KERNEL_BAR, f"OpenCL fp32: max |err| {error:.3g} x max |ref| > {KERNEL_BAR:g}"
    else:
        psnr = psnr_db(got, prepared.reference)
        assert psnr >= FP16_MIN_PSNR_DB, f"OpenCL fp16: PSNR {psnr:.1f} dB < {FP16_MIN_PSNR_DB:g} dB"
