"""ONNX -> ONNX passes, run in a fixed order: cleanup, then the fusions asked for.

    counts = run_passes(model, {"gelu", "groupnorm", "attention"})

mutates the onnx_ir.Model in place and returns {kind: {"matched": int, "candidates": int}} for
the kinds "gelu", "geglu", "groupnorm", "groupnorm_silu", "attention". Candidates come from
passes.census (counted after cleanup, before any fusion); matched is the number of difflite ops
of that kind in the result (0 for a kind not fused).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from compiler import custom_ops
from passes import attention, census, cleanup, gelu, group_norm

FUSION_ORDER = ("gelu", "groupnorm", "attention", "winograd")


def run_passes(model: ir.Model, fuse: Iterable[str]) -> dict[str, dict[str, int]]:
    fuse = set(fuse)
    unknown = fuse - set(custom_ops.FUSE_KINDS)
    if unknown:
        raise ValueError(f"unknown fusion kinds {sorted(unknown)} (known: {', '.join(custom_ops.FUSE_KINDS)})")
    cleanup.cleanup(model)
    candidates = census.graph_census(model)
    fusions = {"gelu": gelu.fuse_gelu, "groupnorm": group_norm.fuse_group_norm,
               "attention": attention.fuse_attention, "winograd": lambda _model: None}
    for kind in FUSION_ORDER:
        if kind in fuse:
            fusions[kind](model)
    matched = fused_counts(model)
    return {kind: {"matched": matched[kind], "candidates": candidates[kind]} for kind in census.KINDS}


def fused_counts(model: ir.Model) -> dict[str, int]:
    """How many difflite ops of each census kind the graph holds."""
    counts = {"gelu": 0, "geglu": 0, "groupnorm": 0, "groupnorm_silu": 0, "attention": 0}
    kind_of = {custom_ops.GELU.name: "gelu", custom_ops.GEGLU.name: "geglu",
               custom_ops.GROUP_NORM.name: "groupnorm", custom_ops.ATTENTION.name: "attention"}
    for node in model.graph:
        if node.domain != custom_ops.DOMAIN or node.op_type not in kind_of:
            continue
        counts[kind_of[node.op_type]] += 1
        activation = node.attributes.get_string("activation", "none")
        if node.op_type == custom_ops.GROUP_NORM.name and activation == "silu":
            counts["groupnorm_silu"] += 1
    return counts
