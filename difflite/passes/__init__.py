"""ONNX -> ONNX passes, run in a fixed order: cleanup, then the fusions asked for.

    counts = run_passes(model, {"gelu", "groupnorm", "layernorm", "attention"})

mutates the onnx_ir.Model in place and returns {kind: {"matched": int, "candidates": int}} for
the kinds "gelu", "geglu", "groupnorm", "groupnorm_silu", "layernorm", "attention" (and
"winograd"). Candidates come from difflite.passes.census (counted after cleanup, before any fusion);
matched is the number of difflite ops of that kind in the result (0 for a kind not fused).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from difflite.core import custom_ops
from difflite.passes import (
    attention,
    attention_variant,
    census,
    cleanup,
    gelu,
    group_norm,
    ir_utils,
    layer_norm,
    winograd,
)

FUSION_ORDER = ("gelu", "groupnorm", "layernorm", "attention", "winograd")


def run_passes(model: ir.Model, fuse: Iterable[str], profile=None, winograd_budget_mb: float = 0.0,
               precision: str | None = None, details: dict | None = None,
               weight_value_bytes: float | None = None) -> dict[str, dict[str, int]]:
    """`profile` (a difflite.core.profiles name or Profile) sets each attention's variant hint and,
    with "winograd" in `fuse`, which 3x3 convolutions become Winograd within
    `winograd_budget_mb` of extra weights. `details`, when given, receives the per-node
    decisions: {"winograd": [...], "attention_variants": [...]}. `weight_value_bytes`: what a
    convolution weight takes when stored quantized (--weights), for Winograd's cost."""
    fuse = set(fuse)
    unknown = fuse - set(custom_ops.FUSE_KINDS)
    if unknown:
        raise ValueError(f"unknown fusion kinds {sorted(unknown)} (known: {', '.join(custom_ops.FUSE_KINDS)})")
    cleanup.cleanup(model)
    candidates = census.graph_census(model)
    winograd_candidates = winograd.census(model)
    fusions = {"gelu": gelu.fuse_gelu, "groupnorm": group_norm.fuse_group_norm,
               "layernorm": layer_norm.fuse_layer_norm, "attention": attention.fuse_attention}
    for kind in FUSION_ORDER:
        if kind in fuse and kind in fusions:
            fusions[kind](model)
    decisions: dict = {"winograd": [], "attention_variants": []}
    if profile is not None:
        decisions["attention_variants"] = attention_variant.choose_attention_variants(model, profile, precision)
        if "winograd" in fuse:
            decisions["winograd"] = winograd.apply_winograd(model, profile, winograd_budget_mb, precision,
                                                            weight_value_bytes)
    if details is not None:
        details.update(decisions)
    matched = fused_counts(model)
    counts = {kind: {"matched": matched[kind], "candidates": candidates[kind]} for kind in census.KINDS}
    counts["winograd"] = {"matched": len(decisions["winograd"]), "candidates": winograd_candidates}
    return counts


def fused_counts(model: ir.Model) -> dict[str, int]:
    """How many difflite ops of each census kind the graph holds. A GroupNorm with groups=1 on
    an x of shape [M, C, 1] is a fused LayerNorm (custom_ops.group_norm_kind), not a group norm."""
    counts = dict.fromkeys(census.KINDS, 0)
    kind_of = {custom_ops.GELU.name: "gelu", custom_ops.GEGLU.name: "geglu",
               custom_ops.GROUP_NORM.name: "groupnorm", custom_ops.ATTENTION.name: "attention"}
    for node in model.graph:
        if node.domain != custom_ops.DOMAIN or node.op_type not in kind_of:
            continue
        kind = kind_of[node.op_type]
        if node.op_type == custom_ops.GROUP_NORM.name:
            kind = custom_ops.group_norm_kind(ir_utils.static_shape(node.inputs[0]),
                                              node.attributes.get_int("groups", 0))
        counts[kind] += 1
        if kind == "groupnorm" and node.attributes.get_string("activation", "none") == "silu":
            counts["groupnorm_silu"] += 1
    return counts
