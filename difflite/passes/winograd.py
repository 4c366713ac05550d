"""Selective Winograd F(4x4, 3x3): replace chosen 3x3 convolutions by difflite.WinogradConv3x3.

    decisions = apply_winograd(model, "adreno-740", budget_mb=400)

A plain onnx-ir pass (weight packing is non-local: FACTS). Steps:

1. Candidates: top-level Conv nodes with a constant [Cout, Cin, 3, 3] weight, strides 1,
   dilations 1, pads [1, 1, 1, 1] (or auto_pad SAME_*: the same for a 3x3 stride-1 kernel),
   group 1, a constant bias or none (none -> a zero bias), float32/float16, static shapes
   [N, Cin, H, W] -> [N, Cout, H, W].
2. Eligibility (profile): Cin >= winograd_min_in_channels, Cout >= winograd_min_out_channels and
   ceil(H/4) * ceil(W/4) >= winograd_min_tiles (4x4 output tiles per image), the thresholds
   TFLite's GPU delegate uses (difflite/core/device_profiles.json cites them).
3. Cost model (`conv_cost`), e = bytes per element on the device (fp16 where the GPU has it),
   T = N * tiles, each GPU kernel timed as a roofline max(bytes / bandwidth, 2 * MACs / peak)
   plus the profile's launch overhead:
     direct:   one kernel: reads x (N H W Cin) and the 9 Cin Cout weights, writes y (N H W Cout);
               9 N H W Cin Cout MACs.
     winograd: input transform  reads x, writes V = 36 T Cin (2.25x x for H, W multiples of 4),
                                MACs = nnz-counted B^T d B per tile and channel;
               36 batched GEMMs reads V and the 36 Cin Cout transformed weights, writes M = 36 T Cout,
                                36 T Cin Cout MACs (4x fewer than direct);
               output transform reads M, writes y (+ bias), A^T m A MACs per tile and channel.
   est_speedup = direct time / winograd time; saved = direct - winograd (seconds).
   Intermediates (intermediate_mb) = V + M of the largest band of whole tile rows the OpenCL op
   runs at once (difflite.core.winograd.band_tiles: all T where 36 T (Cin + Cout) e fits 64 MiB).
   Extra weight memory = 36 Cin Cout e - 9 Cin Cout q (q: bytes a value of the direct conv's
   weight takes, e for float, 1 for int8): the transformed weight replaces the 3x3 one.
   With quantized weights (`weight_value_bytes` given) a conv may instead keep its filter as the
   file stores it (the "filter" form): a filter-transform kernel (reads 9 Cin Cout q, writes the
   36 Cin Cout float U into scratch) runs first at every call, so it costs no weight memory, the
   extra time of that kernel, and U's bytes of intermediates.
4. Choice. The filter form "pays" where it saves time and its U is no larger than the layer's
   own transformed activations (V + M: the transient at most doubles); it adds no weight, so it
   is never budgeted. The transformed form is bought with budget_mb: greedily by saved time per
   extra MB (ties: graph order), each conv taken if it still fits the remaining budget.
   - Quantized weights: every eligible conv whose filter form pays takes it first (the
     transformed form would store a float U in place of a quantized filter: 4 / 0.28 = 14x an
     int4 filter's bytes), then the budget buys the transformed form for the others.
   - Float weights: the budget first (the transformed form spares the per-call filter transform
     for the same weight bytes x 4), then every eligible conv left over takes the filter form
     where it pays, instead of staying direct: on the SD 1.5 VAE decoder at the default 200 MB,
     eight 64x64 x 512-channel convs (direct: 9 MACs a tap for Winograd's 2.25; the ranking puts
     them last) that a phone runs at its arithmetic rate.
   Budget 0 buys no transformed form; "off" (compiler/convert.py) skips the pass.
5. Rewrite: each chosen Conv becomes WinogradConv3x3(x, U, bias) with U =
   difflite.core.winograd.transform_weights(W) (cast back to W's dtype) under a new, unique initializer
   name, or in the filter form WinogradConv3x3(x, W, bias) (W [Cout, Cin, 3, 3] itself, which the
   writer stores as any conv weight: quantized per --weights); the original weight initializer
   is dropped when nothing else reads it.

Returns one dict per chosen conv, in graph order: {node, n, cin, cout, h, w, tiles, form
("transformed" | "filter"), extra_mb, intermediate_mb, est_speedup, saved_us}. Deterministic: same model, profile and budget -> same
choice, names and bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from difflite.core import custom_ops
from difflite.core import winograd as wg
from difflite.core.errors import BadInput
from difflite.core.profiles import Profile, load_profile
from difflite.passes import ir_utils

MB = 1e6  # budgets and reports in decimal megabytes
TRANSFORMED, FILTER = "transformed", "filter"  # what WinogradConv3x3's w holds (DESIGN §2)
_FLOAT_DTYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class ConvCost:
    direct_bytes: int
    direct_macs: int
    direct_s: float
    winograd_bytes: int
    winograd_macs: int
    winograd_s: float
    extra_weight_bytes: int
    # V + M, the transformed activations of the OpenCL op's largest band of tiles (all of them where
    # they fit its 64 MiB bound: wg.band_tiles), + U in the filter form
    intermediate_bytes: int
    form: str = TRANSFORMED

    @property
    def est_speedup(self) -> float:
        return self.direct_s / self.winograd_s

    @property
    def saved_s(self) -> float:
        return self.direct_s - self.winograd_s


@dataclass
class Candidate:
    node: ir.Node
    index: int  # position in the graph (tie-break, report order)
    name: str
    n: int = 0
    cin: int = 0
    cout: int = 0
    h: int = 0
    w: int = 0
    tiles: int = 0  # 4x4 output tiles per image
    structural: bool = False  # a 3x3 stride-1 pad-1 group-1 conv with constant weights
    eligible: bool = False  # ... that also passes the profile thresholds
    reason: str = ""  # why not (empty when eligible)
    cost: ConvCost | None = None
    filter_cost: ConvCost | None = None  # the filter form's, where the weights are quantized


def conv_cost(n: int, cin: int, cout: int, h: int, w: int, profile: Profile | str,
              precision: str | None = None, weight_value_bytes: float | None = None,
              form: str = TRANSFORMED) -> ConvCost:
    """Bytes moved, MACs and roofline time of a 3x3 stride-1 conv, direct vs Winograd F(4x4,3x3).
    `weight_value_bytes`: what a value of the direct conv's weights takes (int8: 1, int4 at block
    32: 0.625); Winograd's transformed filters are float whatever the direct conv stores, so a
    quantized layer pays more extra weight memory for Winograd (and reads more). `form`: FILTER
    costs the per-call filter transform instead of the stored U (module docstring, step 3)."""
    if form not in (TRANSFORMED, FILTER):
        raise ValueError(f"Winograd form {form!r}")
    profile = load_profile(profile)
    e = profile.element_bytes(precision)
    qe = e if weight_value_bytes is None else weight_value_bytes
    bandwidth = profile.bandwidth_gbps * 1e9
    flops = profile.peak_gflops(precision) * 1e9
    launch = profile.launch_overhead_us * 1e-6

    def kernel(elements: int, macs: int) -> float:
        return max(elements * e / bandwidth, 2 * macs / flops) + launch

    pixels = n * h * w
    tiles = n * math.ceil(h / wg.TILE) * math.ceil(w / wg.TILE)
    p = wg.POSITIONS
    in_tf_macs, out_tf_macs = wg.transform_macs()

    direct_elems = pixels * cin + 9 * cin * cout * qe / e + pixels * cout + cout
    direct_macs = 9 * pixels * cin * cout
    stages = [
        (pixels * cin + p * tiles * cin, in_tf_macs * tiles * cin),  # input transform
        (p * tiles * cin + p * cin * cout + p * tiles * cout, p * tiles * cin * cout),  # 36 GEMMs
        (p * tiles * cout + pixels * cout + cout, out_tf_macs * tiles * cout),  # output transform
    ]
    extra = p * cin * cout * e - 9 * cin * cout * qe
    filter_scratch = 0
    if form == FILTER:
        stages.insert(0, (9 * cin * cout * qe / e + p * cin * cout, wg.filter_transform_macs() * cin * cout))
        extra, filter_scratch = 0, p * cin * cout * e
    return ConvCost(
        direct_bytes=direct_elems * e, direct_macs=direct_macs, direct_s=kernel(direct_elems, direct_macs),
        winograd_bytes=sum(el for el, _ in stages) * e, winograd_macs=sum(m for _, m in stages),
        winograd_s=sum(kernel(el, m) for el, m in stages),
        extra_weight_bytes=extra,
        intermediate_bytes=p * wg.band_tiles(n, h, w, cin, cout, e) * (cin + cout) * e + filter_scratch,
        form=form,
    )


def find_candidates(model: ir.Model, profile: Profile | str, precision: str | None = None,
                    weight_value_bytes: float | None = None) -> list[Candidate]:
    """Every top-level Conv node, with whether it can become a WinogradConv3x3 and why not."""
    profile = load_profile(profile)
    out = []
    for index, node in enumerate(model.graph):
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            continue
        cand = Candidate(node=node, index=index, name=_node_name(node, index))
        cand.reason = _structure(cand)
        cand.structural = not cand.reason
        if cand.structural:
            cand.reason = _thresholds(cand, profile)
            cand.eligible = not cand.reason
            shape = (cand.n, cand.cin, cand.cout, cand.h, cand.w)
            cand.cost = conv_cost(*shape, profile, precision, weight_value_bytes)
            cand.filter_cost = conv_cost(*shape, profile, precision, weight_value_bytes, FILTER)
        out.append(cand)
    return out


def _filter_form_pays(cand: Candidate) -> bool:
    """The filter form saves time, and its per-call U is no larger than the layer's V + M."""
    f = cand.filter_cost
    return f is not None and f.saved_s > 0 and 2 * cand.cost.intermediate_bytes >= f.intermediate_bytes


def choose(candidates: list[Candidate], budget_mb: float, quantized: bool = False) -> list[Candidate]:
    """The chosen candidates in graph order (module docstring, step 4); each chosen candidate's
    `cost` is that of the form it takes."""
    if not isinstance(budget_mb, (int, float)) or isinstance(budget_mb, bool) or math.isnan(budget_mb) \
            or budget_mb < 0:
        raise BadInput(f"Winograd budget {budget_mb!r} MB must be a number >= 0 (inf: no limit)")
    eligible = [c for c in candidates if c.eligible]
    chosen = _take_filter_form(eligible) if quantized else []
    chosen += _buy_transformed([c for c in eligible if c not in chosen], budget_mb * MB)
    if not quantized:
        chosen += _take_filter_form([c for c in eligible if c not in chosen])
    return sorted(chosen, key=lambda c: c.index)


def _take_filter_form(candidates) -> list[Candidate]:
    taken = [c for c in candidates if _filter_form_pays(c)]
    for cand in taken:
        cand.cost = cand.filter_cost
    return taken


def _buy_transformed(candidates, budget_bytes: float) -> list[Candidate]:
    """Greedily by saved time per extra byte (ties: graph order), each while it fits."""
    worth = sorted((c for c in candidates if c.cost.saved_s > 0),
                   key=lambda c: (-c.cost.saved_s / c.cost.extra_weight_bytes, c.index))
    bought, used = [], 0
    for cand in worth:
        if used + cand.cost.extra_weight_bytes <= budget_bytes:
            bought.append(cand)
            used += cand.cost.extra_weight_bytes
    return bought


def apply_winograd(model: ir.Model, profile: Profile | str, budget_mb: float,
                   precision: str | None = None, weight_value_bytes: float | None = None) -> list[dict]:
    """Rewrite the chosen convs in place (see the module docstring); returns the decisions."""
    profile = load_profile(profile)
    candidates = find_candidates(model, profile, precision, weight_value_bytes)
    chosen = choose(candidates, budget_mb, quantized=weight_value_bytes is not None)
    if chosen:
        ir_utils.ensure_domain(model)
    decisions = []
    for cand in chosen:
        _rewrite(model.graph, cand)
        cost = cand.cost
        decisions.append({
            "node": cand.name, "n": cand.n, "cin": cand.cin, "cout": cand.cout, "h": cand.h, "w": cand.w,
            "tiles": cand.tiles, "form": cost.form, "extra_mb": round(cost.extra_weight_bytes / MB, 4),
            "intermediate_mb": round(cost.intermediate_bytes / MB, 4),
            "est_speedup": round(cost.est_speedup, 4), "saved_us": round(cost.saved_s * 1e6, 3),
        })
    return decisions


def census(model: ir.Model) -> int:
    """How many convs could become WinogradConv3x3 on some profile (3x3, stride 1, pad 1, ...)."""
    return sum(c.structural for c in find_candidates(model, "generic"))


# ---------------------------------------------------------------------------------------------


def _node_name(node: ir.Node, index: int) -> str:
    if node.name:
        return node.name
    out = node.outputs[0].name if node.outputs else None
    return out or f"Conv_{index}"


def _ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    attr = node.attributes.get(name)
    return list(attr.value) if attr is not None else default


def _structure(c: Candidate) -> str:
    """Empty when the conv is a 3x3 stride-1 pad-1 group-1 conv Winograd can replace, else why not.
    Fills the shape fields of `c`."""
    node = c.node
    inputs = list(node.inputs)
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        return "missing input"
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    if weight.const_value is None:
        return "weight is not constant"
    wshape = tuple(weight.const_value.shape.numpy())
    if len(wshape) != 4 or wshape[2:] != (3, 3):
        return f"kernel {'x'.join(map(str, wshape[2:]))} is not 3x3"
    if _ints(node, "kernel_shape", [3, 3]) != [3, 3]:
        return "kernel_shape is not 3x3"
    if _ints(node, "strides", [1, 1]) != [1, 1]:
        return f"strides {_ints(node, 'strides', [1, 1])}"
    if _ints(node, "dilations", [1, 1]) != [1, 1]:
        return f"dilations {_ints(node, 'dilations', [1, 1])}"
    group = node.attributes.get("group")
    if group is not None and group.value != 1:
        return f"group {group.value}"
    auto_pad = node.attributes.get("auto_pad")
    auto_pad = auto_pad.value if auto_pad is not None else "NOTSET"
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad == "NOTSET":
        if _ints(node, "pads", [0, 0, 0, 0]) != [1, 1, 1, 1]:
            return f"pads {_ints(node, 'pads', [0, 0, 0, 0])}"
    elif auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad {auto_pad}"
    if x.dtype not in _FLOAT_DTYPES or weight.const_value.dtype != x.dtype:
        return f"dtype {x.dtype} / {weight.const_value.dtype}"
    xshape = ir_utils.static_shape(x)
    yshape = ir_utils.static_shape(node.outputs[0])
    if xshape is None or len(xshape) != 4:
        return "input shape unknown or not 4-D"
    n, cin, h, w = xshape
    cout = wshape[0]
    if wshape[1] != cin:
        return f"weight Cin {wshape[1]} != input channels {cin}"
    if yshape is not None and yshape != (n, cout, h, w):
        return f"output shape {yshape} is not {(n, cout, h, w)}"
    if min(n, cin, cout, h, w) <= 0:
        return "empty tensor"
    if bias is not None:
        if bias.const_value is None:
            return "bias is not constant"
        if tuple(bias.const_value.shape.numpy()) != (cout,) or bias.const_value.dtype != x.dtype:
            return "bias is not a [Cout] tensor of the input dtype"
    c.n, c.cin, c.cout, c.h, c.w = n, cin, cout, h, w
    c.tiles = math.ceil(h / wg.TILE) * math.ceil(w / wg.TILE)
    return ""


def _thresholds(c: Candidate, profile: Profile) -> str:
    misses = []
    if c.cin < profile.winograd_min_in_channels:
        misses.append(f"Cin {c.cin} < {profile.winograd_min_in_channels}")
    if c.cout < profile.winograd_min_out_channels:
        misses.append(f"Cout {c.cout} < {profile.winograd_min_out_channels}")
    if c.tiles < profile.winograd_min_tiles:
        misses.append(f"tiles {c.tiles} < {profile.winograd_min_tiles}")
    return ", ".join(misses)


def _base(value: ir.Value, fallback: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", value.name or fallback)


def _rewrite(graph: ir.Graph, cand: Candidate) -> None:
    conv = cand.node
    x, weight = conv.inputs[0], conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    dtype = weight.const_value.dtype.numpy()
    if cand.cost.form == FILTER:
        w_value = weight
    else:
        u = wg.transform_weights(weight.const_value.numpy()).astype(dtype, copy=False)
        w_value = ir_utils.new_initializer(graph, u, f"{_base(weight, cand.name)}.winograd4x4")
    if bias is None:
        bias = ir_utils.new_initializer(graph, np.zeros(cand.cout, dtype), f"{cand.name}.winograd_zero_bias")
    node = ir_utils.difflite_node(custom_ops.WINOGRAD_CONV3X3, (x, w_value, bias),
                                  {"tile": wg.TILE, "activation": "none"}, conv.outputs[0])
    node.name = conv.name
    graph.insert_after(conv, node)
    ir_utils.replace_node(graph, conv, conv.outputs[0], node.outputs[0])
    if not weight.uses() and weight.name in graph.initializers and not weight.is_graph_input():
        del graph.initializers[weight.name]
