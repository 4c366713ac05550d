"""Choose the GPU kernel variant of every difflite.Attention node from the device profile.

    decisions = choose_attention_variants(model, "adreno-740")

`variant` is a hint only (DESIGN §2: every variant computes the same function), so this pass only
sets an attribute. Shapes: q [N, Lq, H*Dk], k [N, Lk, H*Dk], v [N, Lk, H*Dv], e = bytes per element
(fp16 where the GPU has it, else fp32).

The two kernels (the paper, §"attention"):
  partial_softmax  scores S = q k^T are written once by a MATMUL; a reduction keeps each row's max m
                   and sum s of exp(scale S - m); a second MATMUL multiplies the normalized scores by
                   v. The op library (attention_opencl.cc) runs it so on GPUs (tiled kernels): the
                   backend's tiled GEMM writes S for all heads at once, attn_softmax_rows normalizes
                   each row in place (max and sum in float), a second GEMM multiplies by v; query
                   rows go in chunks that keep S's scratch within 16 MiB (kScoresBytes: phone
                   intermediate memory), so S is never whole. On CPU-like devices (flat kernels) it
                   keeps two kernels that recompute q k^T instead (row statistics, then the
                   normalized product with v) and write no S. Needs no local memory of its own and
                   few registers: runs everywhere.
  flash            FlashAttention: a work-group holds `flash_block_q` query rows (one per work-item,
                   the q row and the Dv-wide output accumulator in registers) and streams K/V in
                   tiles of `flash_block_kv` rows through local memory with an online softmax; S is
                   never written. Needs on-chip local memory for the K/V tile and many registers.

Rule, first match wins:
  1. a shape is unknown                                   -> "auto" (let the kernel decide)
  2. profile.flash_attention is false                     -> partial_softmax
     (the paper used FlashAttention only "on a select set of GPUs": e.g. Mali's local memory is
     ordinary memory behind the caches, so the K/V tiling saves no DRAM traffic there)
  3. Lk < profile.flash_min_kv_len                         -> partial_softmax
     (short keys, e.g. cross-attention over 77 tokens: S is only Lk/Dv times bigger than the output,
     one K/V tile pass has nothing to stream, and flash's per-tile rescaling is pure overhead)
  4. max(Dk, Dv) > profile.flash_max_head_dim              -> partial_softmax
     (a per-work-item q row + accumulator would spill registers, the paper's "large number of
     registers", e.g. the VAE's single 512-wide head). On GPUs the partial softmax is then two
     GEMMs with S in chunks: a score carries 2 (Dk + Dv) FLOPs (2048 at the VAE's 512) for ~10
     bytes of half S written and read, far above any GPU's ratio of arithmetic to bandwidth, so
     the GEMMs stay arithmetic-bound and S's traffic is cheap; the work-group-tiled FlashAttention
     kernel (attn_wide, still taken for a "flash" or "auto" hint) rescales its whole Dv-wide
     accumulator at every key block. On the H200 (NVIDIA's OpenCL, 2026-11-29) the SD 1.5 VAE's
     head took 1.04 ms as GEMMs against attn_wide's 2.43 ms, the nvidia-h100 profile's decoder
     25.5 against 26.9 ms of kernels.
  5. flash_block_q > max_work_group_size, or the K/V tile flash_block_kv * (Dk + Dv) * e bytes
     exceeds local_mem_bytes                               -> partial_softmax
     ("only works for SRAM with certain sizes"; narrow heads, per-work-item kernel)
  6. otherwise                                             -> flash
     (long self-attention, e.g. 4096 x 4096 at 64x64 latents: S would be N*H*Lq*Lk*e bytes,
     268 MB in fp16 for SD 1.5's first level, written once and read twice by partial_softmax,
     chunk by chunk)

Each decision: {node, n, lq, lk, heads, head_dim, head_dim_v, variant, reason, scores_mb,
kv_tile_bytes}, in graph order.
"""

from __future__ import annotations

import onnx_ir as ir

from difflite.core import custom_ops
from difflite.core.profiles import Profile, load_profile
from difflite.passes import ir_utils

MB = 1e6


def choose_attention_variants(model: ir.Model, profile: Profile | str, precision: str | None = None) -> list[dict]:
    """Set `variant` on every difflite.Attention node of the main graph; returns the decisions."""
    profile = load_profile(profile)
    e = profile.element_bytes(precision)
    decisions = []
    for index, node in enumerate(model.graph):
        if not ir_utils.is_difflite(node, custom_ops.ATTENTION):
            continue
        decision = decide(node, profile, e)
        decision = {"node": node.name or (node.outputs[0].name if node.outputs else None) or f"Attention_{index}",
                    **decision}
        node.attributes["variant"] = ir.AttrString("variant", decision["variant"])
        decisions.append(decision)
    return decisions


def decide(node: ir.Node, profile: Profile, e: int) -> dict:
    heads_attr = node.attributes.get("heads")
    heads = int(heads_attr.value) if heads_attr is not None else 1
    shapes = [ir_utils.static_shape(v) for v in list(node.inputs)[:3]]
    out = {"n": None, "lq": None, "lk": None, "heads": heads, "head_dim": None, "head_dim_v": None,
           "variant": "auto", "reason": "", "scores_mb": None, "kv_tile_bytes": None}
    if len(shapes) < 3 or any(s is None or len(s) != 3 for s in shapes) or heads <= 0:
        out["reason"] = "q/k/v shapes unknown or not [N, L, H*D]"
        return out
    (n, lq, qw), (_, lk, kw), (_, _, vw) = shapes
    if qw % heads or vw % heads or qw != kw:
        out["reason"] = f"widths q {qw} k {kw} v {vw} do not split into {heads} heads"
        return out
    dk, dv = qw // heads, vw // heads
    kv_tile = profile.flash_block_kv * (dk + dv) * e
    out.update(n=n, lq=lq, lk=lk, head_dim=dk, head_dim_v=dv,
               scores_mb=round(n * heads * lq * lk * e / MB, 3), kv_tile_bytes=kv_tile)
    if not profile.flash_attention:
        variant, reason = "partial_softmax", f"no FlashAttention kernel on {profile.name}"
    elif lk < profile.flash_min_kv_len:
        variant, reason = "partial_softmax", f"short keys: Lk {lk} < {profile.flash_min_kv_len}"
    elif max(dk, dv) > profile.flash_max_head_dim:
        variant, reason = "partial_softmax", (f"head dim {max(dk, dv)} > {profile.flash_max_head_dim} (registers): "
                                              f"two GEMMs, {2 * (dk + dv)} FLOPs a score against its bytes of S")
    elif profile.flash_block_q > profile.max_work_group_size:
        variant, reason = "partial_softmax", (f"query block {profile.flash_block_q} > work-group limit "
                                              f"{profile.max_work_group_size}")
    elif kv_tile > profile.local_mem_bytes:
        variant, reason = "partial_softmax", f"K/V tile {kv_tile} B > local memory {profile.local_mem_bytes} B"
    else:
        variant, reason = "flash", (f"Lk {lk} >= {profile.flash_min_kv_len}, K/V tile {kv_tile} B fits "
                                    f"{profile.local_mem_bytes} B; avoids writing {out['scores_mb']} MB of scores")
    out["variant"], out["reason"] = variant, reason
    return out
