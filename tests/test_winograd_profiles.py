"""Device profiles, the Winograd F(4x4,3x3) pass (difflite/passes/winograd.py) and the attention variant
pass (difflite/passes/attention_variant.py).

Equivalence: the rewritten graph runs in onnx's ReferenceEvaluator with a NumPy Winograd
implementation of difflite.WinogradConv3x3 (written here, from the transformed weights only) and
is compared with onnxruntime on the original graph.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from difflite.core import custom_ops
from difflite.core import winograd as wg
from difflite.core.errors import BadInput
from difflite.core.profiles import PROFILE_NAMES, PROFILES_FILE, Profile, load_profile
from difflite.passes.attention_variant import choose_attention_variants
from difflite.passes.winograd import FILTER, apply_winograd, census, conv_cost, find_candidates

from support.passes_helpers import snapshot

TOL = 2e-5  # max |err| / max |reference|, float32 graphs

# A profile under which the small test convs are eligible and compute-bound (so Winograd pays).
TEST_PROFILE = dataclasses.replace(
    load_profile("generic"), name="test", winograd_min_in_channels=8, winograd_min_out_channels=8,
    winograd_min_tiles=4, launch_overhead_us=0.0, bandwidth_gbps=1e6, fp16=False)


# ---------------------------------------------------------------------------------------------
# NumPy references (float64)


def direct_conv_nchw(x, w, bias):
    """3x3, stride 1, pad 1 cross-correlation, NCHW, float64."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, _, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((n, w.shape[0], h, wd))
    for dy in range(3):
        for dx in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, dy:dy + h, dx:dx + wd], w[:, :, dy, dx])
    return y + np.asarray(bias, np.float64)[None, :, None, None]


def winograd_conv_nchw(x, u, bias):
    """F(4x4,3x3) on transformed weights u [36, Cin, Cout], NCHW, float64, any H and W."""
    x = np.asarray(x, np.float64)
    n, cin, h, wd = x.shape
    cout = u.shape[2]
    th, tw = math.ceil(h / 4), math.ceil(wd / 4)
    xp = np.zeros((n, cin, 4 * th + 2, 4 * tw + 2))
    xp[:, :, 1:h + 1, 1:wd + 1] = x
    tiles = sliding_window_view(xp, (6, 6), axis=(2, 3))[:, :, ::4, ::4]  # [n, c, th, tw, 6, 6]
    v = np.einsum("ik,nctskl,jl->ijntsc", wg.BT, tiles, wg.BT, optimize=True)
    m = np.einsum("ijntsc,ijco->ijntso", v, np.asarray(u, np.float64).reshape(6, 6, cin, cout), optimize=True)
    y = np.einsum("ai,ijntso,bj->notasb", wg.AT, m, wg.AT, optimize=True)
    y = y.reshape(n, cout, 4 * th, 4 * tw)[:, :, :h, :wd]
    return y + np.asarray(bias, np.float64)[None, :, None, None]


class WinogradConv3x3(OpRun):
    op_domain = custom_ops.DOMAIN

    def _run(self, x, w, bias, tile=None, activation=None):
        assert tile == 4 and activation in ("none", b"none"), (tile, activation)
        if w.ndim == 4:  # the filter form: [Cout, Cin, 3, 3], transformed here as the kernels do
            w = wg.transform_weights(w)
        assert w.shape[0] == 36 and w.shape[1] == x.shape[1] and bias.shape == (w.shape[2],)
        return (winograd_conv_nchw(x, w, bias).astype(x.dtype),)


def run_ort(proto, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_reference(proto, feeds):
    return ReferenceEvaluator(proto, new_ops=[WinogradConv3x3]).run(None, feeds)


def assert_equivalent(before: onnx.ModelProto, after: onnx.ModelProto, feeds):
    ref = run_ort(before, feeds)
    got = run_reference(after, feeds)
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= TOL * max(np.max(np.abs(a)), 1e-12)


# ---------------------------------------------------------------------------------------------
# Profiles


def test_profiles_load():
    assert PROFILE_NAMES[0] == "generic"
    assert {"generic", "adreno-740", "mali-g715"} <= set(PROFILE_NAMES)
    for name in PROFILE_NAMES:
        p = load_profile(name)
        assert isinstance(p, Profile) and p.name == name
        assert p.local_mem_bytes >= 16384 and p.max_work_group_size >= 64
        assert p.bandwidth_gbps > 0 and p.fp32_gflops > 0 and p.fp16_gflops >= p.fp32_gflops
        assert p.winograd_min_in_channels > 0 and p.winograd_min_tiles > 0 and "TFLite" in p.winograd_source
        assert p.flash_block_kv > 0 and p.flash_min_kv_len > 0
        assert p.element_bytes() == (2 if p.fp16 else 4)
        assert load_profile(p) is p
    adreno = load_profile("adreno-740")
    # TFLite GPU's Adreno (7xx) case: 32 slices of 4 channels, 64 tiles.
    assert (adreno.winograd_min_in_channels, adreno.winograd_min_out_channels, adreno.winograd_min_tiles) == (128, 128, 64)
    assert adreno.fp16 and adreno.flash_attention and not load_profile("mali-g715").flash_attention
    h100 = load_profile("nvidia-h100")  # no cl_khr_fp16: stores half, computes in fp32
    assert h100.element_bytes("fp16") == 2 and h100.element_bytes() == 4
    assert h100.peak_gflops("fp16") == h100.fp32_gflops


def test_winograd_budget_defaults_to_the_profile(tmp_path):
    """--winograd-budget-mb unset: the device profile's budget (200 MB unless the profile says)."""
    import json

    from difflite.compiler.convert import ConvertOptions

    assert load_profile("generic").winograd_budget_mb == 200.0
    assert load_profile("nvidia-h100").winograd_budget_mb == 4000.0
    assert ConvertOptions(device_profile="nvidia-h100").budget_mb() == 4000.0
    assert ConvertOptions(device_profile="adreno-740").budget_mb() == 200.0
    options = ConvertOptions(device_profile="nvidia-h100", winograd_budget_mb=0.0)
    assert options.budget_mb() == 0.0 and options.manifest_dict()["winograd_budget_mb"] == 0.0
    assert ConvertOptions(device_profile="nvidia-h100").manifest_dict()["winograd_budget_mb"] == 4000.0
    entry = json.loads(PROFILES_FILE.read_text())["profiles"]["generic"]
    for budget, ok in ((750, True), (-1, False), ("big", False)):
        entry["winograd"]["budget_mb"] = budget
        path = tmp_path / f"profile_{budget}.json"
        path.write_text(json.dumps({"profiles": {"mine": entry}}))
        if ok:
            assert load_profile(str(path)).winograd_budget_mb == 750.0
        else:
            with pytest.raises(BadInput, match="budget_mb"):
                load_profile(str(path))


def test_unknown_profile_names_known_ones():
    with pytest.raises(BadInput) as info:
        load_profile("adreno-999")
    message = str(info.value)
    assert "adreno-999" in message and all(name in message for name in PROFILE_NAMES)
    with pytest.raises(BadInput):
        load_profile("generic").element_bytes("int8")


# ---------------------------------------------------------------------------------------------
# Transform numerics


def test_transform_numerics_odd_sizes():
    rng = np.random.default_rng(1)
    cin, cout, h, w = 5, 7, 9, 11
    x = rng.standard_normal((2, cin, h, w))
    weights = rng.standard_normal((cout, cin, 3, 3))
    bias = rng.standard_normal(cout)
    direct = direct_conv_nchw(x, weights, bias)
    u64 = np.einsum("ak,oikl,bl->abio", wg.G, weights, wg.G).reshape(36, cin, cout)
    assert np.max(np.abs(winograd_conv_nchw(x, u64, bias) - direct)) < 1e-10  # the algorithm, exactly
    u = wg.transform_weights(weights)
    assert u.dtype == np.float32 and u.shape == (36, cin, cout) and u.flags.c_contiguous
    np.testing.assert_allclose(u, u64, rtol=1e-6, atol=1e-7)  # float32 rounding only
    assert np.max(np.abs(winograd_conv_nchw(x, u, bias) - direct)) <= 1e-5 * np.max(np.abs(direct))
    # tests/support/winograd_ref.py re-exports the same definition
    from support import winograd_ref
    assert winograd_ref.transform_weights is wg.transform_weights and winograd_ref.G is wg.G
    with pytest.raises(ValueError):
        wg.transform_weights(np.zeros((2, 2, 1, 1)))


def test_cost_model_matches_the_paper_ratios():
    p = load_profile("adreno-740")
    c = conv_cost(1, 320, 320, 64, 64, p)
    gemm_macs = 36 * (16 * 16) * 320 * 320
    assert c.direct_macs == 4 * gemm_macs  # 4x fewer multiplies in the GEMMs
    assert c.intermediate_bytes == 36 * 256 * (320 + 320) * 2  # V is 2.25x the input: 36/16
    assert 36 * 256 * 320 == 2.25 * 64 * 64 * 320
    assert c.extra_weight_bytes == 3 * 9 * 320 * 320 * 2  # 4x the 3x3 weights = 3 extra copies
    assert c.est_speedup > 1
    # Few tiles: the 36 weight planes dominate the traffic and Winograd loses.
    assert conv_cost(1, 1280, 1280, 8, 8, p).est_speedup < 1


def test_intermediates_are_one_band():
    """The OpenCL op holds V + M of one band of whole tile rows within 64 MiB (wg.band_tiles): SDXL's
    VAE decoder at 1024 x 1024 (Cin 256, Cout 128, fp16; 256 x 256 tiles) takes bands of 9 tile rows,
    64 MB of V + M instead of 1.8 GB; a conv whose V + M fit keeps them all."""
    p = load_profile("adreno-740")
    big = conv_cost(1, 256, 128, 1024, 1024, p, "fp16")
    assert wg.band_tiles(1, 1024, 1024, 256, 128, 2) == 9 * 256
    assert big.intermediate_bytes == 36 * 9 * 256 * (256 + 128) * 2 <= wg.SCRATCH_BYTES < 36 * 10 * 256 * 384 * 2
    assert conv_cost(1, 256, 128, 1024, 1024, p, "fp16", 1, FILTER).intermediate_bytes == \
        big.intermediate_bytes + 36 * 256 * 128 * 2  # + U
    assert wg.band_tiles(2, 13, 10, 24, 40, 4) == 24  # all tiles
    assert wg.band_tiles(2, 13, 10, 24, 40, 4, 36 * 3 * 64 * 4 * 3) == 9  # 3 rows of 3 tiles
    assert wg.band_tiles(2, 13, 10, 24, 40, 4, 1) == 3  # at least a row


# ---------------------------------------------------------------------------------------------
# The pass on a small hand-built conv net


def _small_net(seed=0):
    rng = np.random.default_rng(seed)
    c = 12
    inits, nodes = [], []

    def weight(name, shape):
        inits.append(onnx.numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(np.float32), name))
        return name

    def conv(name, x, w, b=None, **attrs):
        inputs = [x, w] + ([b] if b else [])
        nodes.append(oh.make_node("Conv", inputs, [name], name=name, **attrs))
        return name

    p1 = {"pads": [1, 1, 1, 1]}
    h1 = conv("c1", "x", weight("w1", (c, 8, 3, 3)), weight("b1", (c,)), kernel_shape=[3, 3], **p1)
    nodes.append(oh.make_node("Relu", [h1], ["r1"], name="relu1"))
    h2 = conv("c2", "r1", weight("w2", (c, c, 3, 3)), **p1)  # no bias -> zero bias
    h9 = conv("c9", h2, "w2", weight("b9", (c,)), **p1)  # shares w2 with c2
    # A pre-existing initializer under the name the pass would pick first for w2's transform.
    inits.append(onnx.numpy_helper.from_array(np.float32(0.5).reshape(1), "w2.winograd4x4"))
    nodes.append(oh.make_node("Add", [h9, "w2.winograd4x4"], ["a9"], name="add9"))
    conv("c3", h2, weight("w3", (c, c, 3, 3)), weight("b3", (c,)), strides=[2, 2], **p1)
    conv("c4", h2, weight("w4", (c, c, 1, 1)), weight("b4", (c,)))
    conv("c5", h2, weight("w5", (c, c, 3, 3)), weight("b5", (c,)), pads=[0, 0, 0, 0])
    conv("c6", h2, weight("w6", (c, c // 2, 3, 3)), weight("b6", (c,)), group=2, **p1)
    conv("c7", h2, weight("w7", (4, c, 3, 3)), weight("b7", (4,)), **p1)
    conv("c8", h2, weight("w8", (c, c, 3, 3)), weight("b8", (c,)), dilations=[2, 2], pads=[2, 2, 2, 2])
    nodes.append(oh.make_node("Mul", ["x", "x"], ["xx"], name="sq"))
    conv("c10", "xx", weight("w10", (c, 8, 3, 3)), "bias_in", **p1)  # bias is a graph input
    outputs = ["c2", "a9", "c3", "c4", "c5", "c6", "c7", "c8", "c10"]
    graph = oh.make_graph(
        nodes, "small", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 17, 19]),
                         oh.make_tensor_value_info("bias_in", onnx.TensorProto.FLOAT, [c])],
        [oh.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    onnx.checker.check_model(proto)
    return proto


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 8, 17, 19)).astype(np.float32),
            "bias_in": rng.standard_normal(12).astype(np.float32)}


def test_candidates_and_reasons():
    model = ir.from_proto(_small_net())
    found = {c.name: c for c in find_candidates(model, TEST_PROFILE)}
    assert set(found) == {f"c{i}" for i in range(1, 11)}
    assert {n for n, c in found.items() if c.eligible} == {"c1", "c2", "c9"}
    assert {n for n, c in found.items() if c.structural} == {"c1", "c2", "c9", "c7"}
    reasons = {n: c.reason for n, c in found.items()}
    assert "strides" in reasons["c3"] and "3x3" in reasons["c4"] and "pads" in reasons["c5"]
    assert "group" in reasons["c6"] and "Cout 4 < 8" in reasons["c7"] and "dilations" in reasons["c8"]
    assert "bias" in reasons["c10"]
    assert found["c1"].tiles == 5 * 5 and (found["c1"].cin, found["c1"].cout) == (8, 12)
    # Under a real profile's thresholds (64 channels) nothing of this net qualifies.
    assert not any(c.eligible for c in find_candidates(model, "generic"))
    assert census(model) == 4


def test_pass_rewrites_eligible_convs_equivalently():
    before = _small_net()
    model = ir.from_proto(copy.deepcopy(before))
    decisions = apply_winograd(model, TEST_PROFILE, budget_mb=1000)
    assert [d["node"] for d in decisions] == ["c1", "c2", "c9"]
    for d in decisions:
        assert set(d) >= {"node", "cin", "cout", "h", "w", "extra_mb", "est_speedup"}
        assert d["est_speedup"] > 1 and d["extra_mb"] == pytest.approx(27 * d["cin"] * d["cout"] * 4 / 1e6, abs=1e-4)
        assert (d["h"], d["w"]) == (17, 19)
    after = ir.to_proto(model)
    onnx.checker.check_model(after)
    ops = [(n.domain, n.op_type) for n in after.graph.node]
    assert ops.count((custom_ops.DOMAIN, custom_ops.WINOGRAD_CONV3X3.name)) == 3
    assert ops.count(("", "Conv")) == 7
    assert any(o.domain == custom_ops.DOMAIN for o in after.opset_import)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in after.graph.initializer}
    assert "w2" not in inits and "w1" not in inits  # replaced weights are dropped, shared one too
    assert inits["w2.winograd4x4"].shape == (1,)  # the pre-existing initializer is untouched
    original = {i.name: onnx.numpy_helper.to_array(i) for i in before.graph.initializer}
    for node in after.graph.node:
        if node.op_type == custom_ops.WINOGRAD_CONV3X3.name:
            attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
            assert attrs == {"tile": 4, "activation": b"none"}
            w = inits[node.input[1]]
            assert w.shape[0] == 36 and w.dtype == np.float32
            source = {"c1": "w1", "c2": "w2", "c9": "w2"}[node.name]
            np.testing.assert_array_equal(w, wg.transform_weights(original[source]))
            if node.name == "c2":
                assert not inits[node.input[2]].any()  # zero bias for a conv without one
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    assert_equivalent(before, after, _feeds())
    assert_equivalent(before, after, _feeds(seed=3))


def test_budget_is_respected():
    proto = _small_net()
    # Budget 0 buys no transformed filter: float convs left over take the filter form, which adds
    # no weight (each keeps its 3x3 filter; w2 is shared by c2 and c9).
    model = ir.from_proto(copy.deepcopy(proto))
    decisions = apply_winograd(model, TEST_PROFILE, budget_mb=0)
    assert [(d["node"], d["form"], d["extra_mb"]) for d in decisions] == [
        ("c1", "filter", 0), ("c2", "filter", 0), ("c9", "filter", 0)]
    assert_equivalent(proto, ir.to_proto(model), _feeds())
    # The best ratio (saved time per extra MB) alone, then the best two, in the transformed form;
    # the rest in the filter form.
    ranked = sorted((c for c in find_candidates(ir.from_proto(proto), TEST_PROFILE) if c.eligible),
                    key=lambda c: (-c.cost.saved_s / c.cost.extra_weight_bytes, c.index))
    for k in (1, 2):
        budget = sum(c.cost.extra_weight_bytes for c in ranked[:k]) / 1e6
        model = ir.from_proto(copy.deepcopy(proto))
        decisions = apply_winograd(model, TEST_PROFILE, budget_mb=budget)
        assert sorted(d["node"] for d in decisions if d["form"] == "transformed") == sorted(c.name for c in ranked[:k])
        assert sorted(d["node"] for d in decisions if d["form"] == "filter") == sorted(c.name for c in ranked[k:])
        assert sum(d["extra_mb"] for d in decisions) <= budget + 1e-3
        assert_equivalent(proto, ir.to_proto(model), _feeds())
    for bad in (-1, float("nan"), "10"):
        with pytest.raises(BadInput):
            apply_winograd(ir.from_proto(proto), TEST_PROFILE, budget_mb=bad)
    assert len(apply_winograd(ir.from_proto(proto), TEST_PROFILE, budget_mb=float("inf"))) == 3
    # Launch overhead makes these tiny convs slower as Winograd on a real device: never chosen.
    lowered = dataclasses.replace(load_profile("adreno-740"), winograd_min_in_channels=8,
                                  winograd_min_out_channels=8, winograd_min_tiles=4)
    assert apply_winograd(ir.from_proto(proto), lowered, budget_mb=1e6) == []


def test_quantized_weights_take_the_filter_form_free_of_the_budget():
    """With quantized weights a conv whose U fits in its own V + M keeps its filter (the kernels
    transform it at every call): no weight memory, so even budget 0 takes it."""
    before = _small_net()
    model = ir.from_proto(copy.deepcopy(before))
    decisions = apply_winograd(model, TEST_PROFILE, budget_mb=0, weight_value_bytes=1.0)
    assert [(d["node"], d["form"], d["extra_mb"]) for d in decisions] == [
        ("c1", "filter", 0), ("c2", "filter", 0), ("c9", "filter", 0)]
    for d in decisions:  # the intermediates: V and M, and U (float32 here) in scratch
        tiles = 5 * 5
        assert d["intermediate_mb"] == pytest.approx(36 * (tiles * (d["cin"] + d["cout"]) + d["cin"] * d["cout"]) * 4
                                                     / 1e6, abs=1e-4)
    after = ir.to_proto(model)
    onnx.checker.check_model(after)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in after.graph.initializer}
    nodes = {n.name: n for n in after.graph.node}
    assert [nodes[c].input[1] for c in ("c1", "c2", "c9")] == ["w1", "w2", "w2"]
    assert inits["w1"].shape == (12, 8, 3, 3) and inits["w2.winograd4x4"].shape == (1,)  # nothing transformed
    assert_equivalent(before, after, _feeds())
    # Float weights: the budget buys the transformed form first, then the filter form takes the rest.
    forms = [(d["node"], d["form"]) for d in apply_winograd(ir.from_proto(before), TEST_PROFILE, budget_mb=1000)]
    assert forms == [("c1", "transformed"), ("c2", "transformed"), ("c9", "transformed")]


def test_a_filter_larger_than_its_activations_stays_with_the_budget():
    """48 -> 48 channels on a 6x6 image: U (36 x 48 x 48) outgrows V + M (36 x 4 tiles x 96), so the
    filter form would add more transient memory than the layer's Winograd already needs; the conv
    is budgeted in the transformed form, as with float weights."""
    rng = np.random.default_rng(1)
    w = (0.1 * rng.standard_normal((48, 48, 3, 3))).astype(np.float32)
    graph = oh.make_graph([oh.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[1, 1, 1, 1])], "g",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 48, 6, 6])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 48, 6, 6])],
                          [onnx.numpy_helper.from_array(w, "w")])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    assert apply_winograd(ir.from_proto(proto), TEST_PROFILE, budget_mb=0, weight_value_bytes=1.0) == []
    assert apply_winograd(ir.from_proto(proto), TEST_PROFILE, budget_mb=0) == []  # float weights alike
    model = ir.from_proto(copy.deepcopy(proto))
    decisions = apply_winograd(model, TEST_PROFILE, budget_mb=10, weight_value_bytes=1.0)
    assert [(d["node"], d["form"]) for d in decisions] == [("c", "transformed")]
    assert decisions[0]["extra_mb"] == pytest.approx((36 * 4 - 9) * 48 * 48 / 1e6, abs=1e-4)
    x = np.random.default_rng(2).standard_normal((1, 48, 6, 6)).astype(np.float32)
    assert_equivalent(proto, ir.to_proto(model), {"x": x})


def test_pass_is_deterministic():
    runs = []
    for _ in range(2):
        model = ir.from_proto(_small_net())
        decisions = apply_winograd(model, TEST_PROFILE, budget_mb=1000)
        runs.append((decisions, ir.to_proto(model).SerializeToString()))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------------
# A real tiny UNet export


@pytest.fixture(scope="module")
def tiny_unet(tmp_path_factory):
    from difflite.compiler.export import component_spec, export_onnx
    from difflite.compiler.models import load_pipeline

    pipe = load_pipeline("preset:tiny")
    path = export_onnx(component_spec(pipe, "unet", 128, 128, 1), tmp_path_factory.mktemp("wino") / "unet.onnx")
    convs = [m for m in pipe.unet.modules() if isinstance(m, torch.nn.Conv2d)]
    expected = sum(m.kernel_size == (3, 3) and m.stride == (1, 1) and m.padding == (1, 1)
                   and m.dilation == (1, 1) and m.groups == 1 for m in convs)
    return path, expected


def test_tiny_unet_counts_and_equivalence(tiny_unet):
    path, expected = tiny_unet
    model = ir.load(str(path))
    before = snapshot(model)
    assert census(model) == expected > 0
    counts = {}
    for name in PROFILE_NAMES:
        found = find_candidates(model, name)
        counts[name] = {"candidates": sum(c.structural for c in found), "eligible": sum(c.eligible for c in found)}
    # 128x128 px -> 16x16 latents: <= 16 tiles and <= 64 channels, under every phone's threshold. The
    # nvidia-h100 profile takes 16 tiles an image (measured on the H100, 2026-11): its one 64 -> 64 conv at 16x16.
    h100 = counts.pop("nvidia-h100")
    assert all(c == {"candidates": expected, "eligible": 0} for c in counts.values()), counts
    assert h100 == {"candidates": expected, "eligible": 1}, h100
    assert apply_winograd(model, "generic", budget_mb=1e6) == []
    eligible = [c for c in find_candidates(model, TEST_PROFILE) if c.eligible]
    decisions = apply_winograd(model, TEST_PROFILE, budget_mb=1e6)
    print(f"tiny UNet: {expected} 3x3 stride-1 convs; per profile {counts}; "
          f"test profile: {len(eligible)} eligible, {len(decisions)} chosen")
    assert 0 < len(decisions) <= len(eligible)
    after = snapshot(model)
    onnx.checker.check_model(after)
    feeds = {}
    rng = np.random.default_rng(0)
    for value in before.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(shape) + 0.1).astype(np.float32)
    feeds["timestep"] = np.array([321.0], np.float32)
    assert_equivalent(before, after, feeds)


# ---------------------------------------------------------------------------------------------
# Attention variants


def _attention_graph():
    """difflite.Attention nodes shaped like SD 1.5 at 512x512 (and the VAE mid-block)."""
    cases = [  # name, Lq, Lk, heads, width q/k, width v
        ("self_64", 4096, 4096, 8, 320, 320),
        ("cross_64", 4096, 77, 8, 320, 320),
        ("self_32", 1024, 1024, 8, 640, 640),
        ("self_16", 256, 256, 8, 1280, 1280),
        ("vae_mid", 4096, 4096, 1, 512, 512),
    ]
    nodes, inputs, outputs = [], [], []
    for name, lq, lk, heads, wqk, wv in cases:
        for role, length, width in (("q", lq, wqk), ("k", lk, wqk), ("v", lk, wv)):
            inputs.append(oh.make_tensor_value_info(f"{name}_{role}", onnx.TensorProto.FLOAT, [1, length, width]))
        nodes.append(oh.make_node(custom_ops.ATTENTION.name, [f"{name}_q", f"{name}_k", f"{name}_v"], [name],
                                  name=name, domain=custom_ops.DOMAIN, heads=heads,
                                  scale=1 / math.sqrt(wqk // heads), causal=0, variant="auto"))
        outputs.append(oh.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, lq, wv]))
    graph = oh.make_graph(nodes, "attn", inputs, outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(custom_ops.DOMAIN, 1)],
                         ir_version=10)


def test_attention_variants():
    expected = {
        "adreno-740": {"self_64": "flash", "cross_64": "partial_softmax", "self_32": "flash",
                       "self_16": "partial_softmax", "vae_mid": "partial_softmax"},
        "nvidia-h100": {"self_64": "flash", "cross_64": "flash", "self_32": "flash",
                        "self_16": "partial_softmax", "vae_mid": "partial_softmax"},
        "mali-g715": dict.fromkeys(["self_64", "cross_64", "self_32", "self_16", "vae_mid"], "partial_softmax"),
    }
    for name, want in expected.items():
        model = ir.from_proto(_attention_graph())
        decisions = choose_attention_variants(model, name)
        assert {d["node"]: d["variant"] for d in decisions} == want, decisions
        got = {n.name: n.attributes["variant"].value for n in model.graph}
        assert got == want
        for node in ir.to_proto(model).graph.node:  # still valid for the contract
            custom_ops.ATTENTION.options({a.name: oh.get_attribute_value(a) for a in node.attribute})
    model = ir.from_proto(_attention_graph())
    by_node = {d["node"]: d for d in choose_attention_variants(model, "adreno-740")}
    assert by_node["self_64"]["head_dim"] == 40 and by_node["self_64"]["kv_tile_bytes"] == 32 * 80 * 2
    assert by_node["self_64"]["scores_mb"] == pytest.approx(8 * 4096 * 4096 * 2 / 1e6, rel=1e-3)
    assert "short keys" in by_node["cross_64"]["reason"]
    assert "registers" in by_node["vae_mid"]["reason"] and "two GEMMs" in by_node["vae_mid"]["reason"]
    # A small local memory rules flash out even for long self-attention.
    small = dataclasses.replace(load_profile("adreno-740"), local_mem_bytes=4096)
    decisions = choose_attention_variants(ir.from_proto(_attention_graph()), small)
    assert {d["variant"] for d in decisions} == {"partial_softmax"}
    assert any("local memory" in d["reason"] for d in decisions)
    # No attention nodes: nothing to do.
    assert choose_attention_variants(ir.from_proto(_small_net()), "adreno-740") == []


def test_winograd_budget_per_component():
    """--winograd-budget-mb 150,vae_decoder=0: the VAE decoder none, the others 150; a component
    named alone overrides the profile's budget for it only. Bad specs are exit-2 errors."""
    from difflite.compiler.convert import ConvertOptions, parse_winograd_budget

    default, per = parse_winograd_budget("150, vae_decoder=0")
    options = ConvertOptions(device_profile="nvidia-h100", winograd_budget_mb=default, winograd_budgets_mb=per)
    options.validate()
    assert [options.budget_mb(c) for c in ("text_encoder", "unet", "vae_decoder")] == [150.0, 150.0, 0.0]
    budgets = options.manifest_dict()["winograd_budgets_mb"]
    assert budgets["vae_decoder"] == 0.0 and budgets["unet"] == 150.0 and set(budgets) == set(options.components)
    only = ConvertOptions(device_profile="nvidia-h100", winograd_budgets_mb=parse_winograd_budget("unet=50")[1])
    assert only.budget_mb("unet") == 50.0 and only.budget_mb("vae_decoder") == 4000.0
    off = ConvertOptions(winograd_budgets_mb=parse_winograd_budget("vae_decoder=off,unet=7")[1])
    off.validate()
    assert off.winograd_off("vae_decoder") and off.budget_mb("vae_decoder") == 0.0 and not off.winograd_off("unet")
    assert off.manifest_dict()["winograd_budgets_mb"]["vae_decoder"] == "off"
    # int8 / int4 weights: budget 0 (the filter form needs none), the int8 VAE decoder off; a budget
    # given still applies.
    int8, int4 = ConvertOptions(weights="int8"), ConvertOptions(weights="int4")
    assert [int8.winograd_setting(c) for c in ("text_encoder", "unet", "vae_decoder")] == [0.0, 0.0, "off"]
    assert [int4.winograd_setting(c) for c in ("text_encoder", "unet", "vae_decoder")] == [0.0, 0.0, 0.0]
    assert ConvertOptions(weights="int8", winograd_budget_mb=30.0).winograd_setting("vae_decoder") == 30.0
    for spec, message in (("x", "not a number"), ("1,2", "twice"), ("unet=1,unet=2", "twice"),
                          ("decoder=3", "unknown component"), ("nan", ">= 0"), ("unet=-1", ">= 0"), ("unet=inf", "finite")):
        with pytest.raises(BadInput, match=message):
            d, p = parse_winograd_budget(spec)
            ConvertOptions(winograd_budget_mb=d, winograd_budgets_mb=p).validate()
