"""Op scratch lent from the intermediates (custom_ops/delegate/opencl/partition_plan.cc: PlanScratch;
delegate option lend_scratch, DIFFLITE_LEND_SCRATCH): each op declares what it asks of each
scratch slot (GpuOp::ScratchSlotBytes), and the backend places those needs with the tensors, each
live at its op's step only, so that an op's scratch lies in a buffer no tensor holds then.

Each case runs a model on PoCL with lending on and off: the outputs must be equal to the bit (a
need placed in a buffer a live tensor holds would overwrite that tensor), the needs must all be
lent (the context then makes no scratch buffer of its own) and the buffers in all must be fewer
bytes than the intermediates and the context's own scratch were. Environment variables make
preset:tiny's UNet ask scratch in every slot the library uses: split-K partials in its GEMMs
and convolutions, attention as GEMMs with S in chunks, GroupNorm's split plan; flat kernels add
the GEMMs' copies of k-major weights. Winograd's V, M and U run in chains of convolutions.

OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import numpy as np
import pytest

from support import winograd_ref
from support.cli import run_difflite
from support.numerics import nonzero, rel_err
from support.opencl_helpers import TOL, opencl_options, run_model
from support.quantized_helpers import QModel
from test_weight_slabs import feeds

SIZE = 64
# What makes the tiny UNet's ops ask scratch: split-K partials (slot 2), attention as GEMMs with
# S in chunks (slots 4 and 1), GroupNorm's split plan (slot 0).
SCRATCH_ENV = {"DIFFLITE_SPLIT_K": "2", "DIFFLITE_ATTN_KERNEL": "partial",
               "DIFFLITE_ATTN_SCORES_BYTES": "8192", "DIFFLITE_GN_PLAN": "split"}
CONFIGS = {
    "tiled_fp32": {"kernels": "tiled", "precision": "fp32"},
    "tiled_fp16": {"kernels": "tiled", "precision": "fp16"},
    "flat_fp32": {"kernels": "flat", "precision": "fp32", "zero_copy": "off"},
}


@pytest.fixture(scope="module")
def unet(tmp_path_factory):
    out = tmp_path_factory.mktemp("lend_scratch") / "tiny"
    run_difflite("convert", "preset:tiny", "-o", out, "--height", SIZE, "--width", SIZE, "--components", "unet",
                 "--precision", "fp32", check=True)
    return out / "unet.tflite"


def lent_and_own(path, lib, model_feeds, options, monkeypatch, env=None):
    """The model's outputs and stats with lending on, then off (the same environment)."""
    monkeypatch.delenv("DIFFLITE_LEND_SCRATCH", raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    lent = run_model(path, lib, model_feeds, opencl_options(**options), stats=True)
    own = run_model(path, lib, model_feeds, opencl_options(**options, lend_scratch="off"), stats=True)
    return lent, own


def check_lent(lent_stats, own_stats, saves: bool):
    """Every declared need lent, none held apart; no more bytes in all than without lending, and
    fewer where `saves` (a model with steps whose tensors are dead at another op's step)."""
    # scratch_bytes: the most one step asks, plus the boundary's staging twins (held either way)
    assert lent_stats["scratch_bytes"] == own_stats["scratch_bytes"], (lent_stats, own_stats)
    assert lent_stats["scratch_lent_bytes"] > 0 and own_stats["scratch_lent_bytes"] == 0, (lent_stats, own_stats)
    staging = lent_stats["scratch_bytes"] - lent_stats["scratch_lent_bytes"]
    assert lent_stats["scratch_held_bytes"] == staging, lent_stats
    # without lending, a buffer per slot as large as the slot's largest need
    assert own_stats["scratch_held_bytes"] >= own_stats["scratch_bytes"], own_stats
    lent_total = lent_stats["arena_bytes"] + lent_stats["scratch_held_bytes"]
    own_total = own_stats["arena_bytes"] + own_stats["scratch_held_bytes"]
    assert lent_total < own_total if saves else lent_total <= own_total, (lent_stats, own_stats)
    # at least the larger of the two parts: the tensors' buffers and the largest step's scratch
    assert lent_stats["arena_bytes"] >= max(own_stats["arena_bytes"], lent_stats["scratch_lent_bytes"])


@pytest.mark.parametrize("config", CONFIGS)
def test_unet_scratch_lent_from_idle_buffers(opencl_lib, unet, config, monkeypatch):
    (lent, lent_stats), (own, own_stats) = lent_and_own(unet, opencl_lib, feeds(unet), CONFIGS[config],
                                                        monkeypatch, SCRATCH_ENV)
    assert lent_stats["nodes_claimed"] == lent_stats["nodes_total"], lent_stats
    check_lent(lent_stats, own_stats, saves=True)
    for got, want in zip(lent, own):
        assert np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)


def winograd_chain(path, convs: int, form: str, r):
    """x -> `convs` WinogradConv3x3 in a row, each output added to the conv's input. Returns the
    model's path, x and the float64 reference."""
    n, h, w, c = 1, 13, 10, 5
    x = nonzero(r, (n, h, w, c))
    m = QModel()
    cur = m.activation("x", x.shape)
    inputs, want = [cur], x.astype(np.float64)
    for i in range(convs):
        wt = nonzero(r, (c, c, 3, 3), 0.5)
        bias = nonzero(r, (c,))
        weight = (m.constant(f"w{i}", np.ascontiguousarray(wt.transpose(0, 2, 3, 1)).astype(np.float32))
                  if form == "filter" else m.constant(f"w{i}", winograd_ref.transform_weights(wt).astype(np.float32)))
        y = m.activation(f"y{i}", (n, h, w, c))
        m.custom("difflite.WinogradConv3x3", [cur, weight, m.constant(f"b{i}", bias.astype(np.float32))],
                 [y], {"tile": 4, "activation": "none"})
        conv = winograd_ref.conv3x3_nhwc(want, wt, bias)
        summed = m.activation(f"s{i}", (n, h, w, c))
        m.add(y, cur, summed)
        cur, want = summed, conv + want
    return m.save(path, inputs, [cur]), x, want


@pytest.mark.parametrize("kernels", ["flat", "tiled"])
@pytest.mark.parametrize("form", ["transformed", "filter"])
def test_winograd_scratch_lent_in_a_chain(opencl_lib, tmp_path, form, kernels, monkeypatch):
    path, x, want = winograd_chain(tmp_path / "chain.tflite", 4, form, np.random.default_rng(5))
    ((lent,), lent_stats), ((own,), own_stats) = lent_and_own(
        path, opencl_lib, [x], {"kernels": kernels, "precision": "fp32"}, monkeypatch)
    assert lent_stats["nodes_claimed"] == lent_stats["nodes_total"], lent_stats
    # every tensor here is live at some convolution's step, and every step asks V and M: a chain
    # gains nothing, but each need still lies in a buffer of the plan's
    check_lent(lent_stats, own_stats, saves=False)
    assert rel_err(lent, want) < TOL
    np.testing.assert_array_equal(lent, own)


def room_then_winograd(path, r):
    """a = x * 0.5, b = x + 0.25, c = x * 2 (four tensors live at once: four buffers), e = (a + b) + c,
    y = WinogradConv3x3(e) (transformed form): at the convolution's step two of the four buffers are
    idle, each one tensor of FIT_SHAPE. Returns the model's path, x and the float64 reference."""
    n, h, w, c = FIT_SHAPE
    x = nonzero(r, FIT_SHAPE)
    m = QModel()
    xi = m.activation("x", x.shape)
    made = {}
    for name, op, value in (("a", "MUL", 0.5), ("b", "ADD", 0.25), ("c", "MUL", 2.0)):
        made[name] = m.activation(name, FIT_SHAPE)
        m.builtin(op, [xi, m.constant(f"k_{name}", np.full((1,), value, np.float32))], [made[name]])
    d, e, y = (m.activation(name, FIT_SHAPE) for name in ("d", "e", "y"))
    m.add(made["a"], made["b"], d)
    m.add(d, made["c"], e)
    wt, bias = nonzero(r, (c, c, 3, 3), 0.5), nonzero(r, (c,))
    m.custom("difflite.WinogradConv3x3", [e, m.constant("u", winograd_ref.transform_weights(wt).astype(np.float32)),
                                          m.constant("bias", bias.astype(np.float32))], [y], {"tile": 4, "activation": "none"})
    want = 3.5 * x.astype(np.float64) + 0.25
    return m.save(path, [xi], [y]), x, winograd_ref.conv3x3_nhwc(want, wt, bias)


# 32 x 32 x 8: 8 tile rows of 8 tiles; a tile row's V (or M) is 36 * 8 * 8 floats, so a tensor's
# buffer (32 * 32 * 8 floats) holds 3 rows' V.
FIT_SHAPE = (1, 32, 32, 8)


def test_winograd_bands_fit_the_idle_buffers(opencl_lib, tmp_path, monkeypatch):
    """GpuOp::FitScratch: with the bound at all tiles' V + M (one band by the rule), the convolution
    finds two idle buffers of one tensor each and takes bands of 3 tile rows (3, 3, 2), whose V and
    M fit them: the intermediates' buffers (four, one tensor each) grow by nothing. Without lending, one band of all rows in
    buffers of their own. Outputs equal to the bit, and to the reference."""
    n, h, w, c = FIT_SHAPE
    row = 36 * (w // 4) * c * 4  # one tile row's V (or M), bytes
    monkeypatch.setenv("DIFFLITE_WINOGRAD_SCRATCH_BYTES", str(2 * 8 * row))  # all 8 rows' V + M
    monkeypatch.setenv("DIFFLITE_TENSOR_CORES", "off")  # tiles chosen by a GEMM's rows: same sums
    path, x, want = room_then_winograd(tmp_path / "fit.tflite", np.random.default_rng(8))
    ((lent,), lent_stats), ((own,), own_stats) = lent_and_own(
        path, opencl_lib, [x], {"kernels": "tiled", "precision": "fp32"}, monkeypatch)
    assert lent_stats["nodes_claimed"] == lent_stats["nodes_total"], lent_stats
    assert lent_stats["scratch_lent_bytes"] == 2 * 3 * row, lent_stats  # V and M of 3 rows
    assert lent_stats["arena_bytes"] == lent_stats["arena_tensors_bytes"] == own_stats["arena_bytes"] == \
        4 * n * h * w * c * 4, lent_stats
    assert 3 * row <= n * h * w * c * 4 < 4 * row  # a tensor's buffer holds 3 rows' V, not 4
    assert own_stats["scratch_held_bytes"] == 2 * 8 * row and own_stats["scratch_lent_bytes"] == 0, own_stats
    assert rel_err(lent, want) < TOL
    np.testing.assert_array_equal(lent, own)


def test_the_environment_turns_lending_off(opencl_lib, tmp_path, monkeypatch):
    """DIFFLITE_LEND_SCRATCH=off does what lend_scratch=off does; a bad value of either is refused."""
    path, x, _ = winograd_chain(tmp_path / "chain.tflite", 2, "transformed", np.random.default_rng(6))
    monkeypatch.setenv("DIFFLITE_LEND_SCRATCH", "off")
    _, stats = run_model(path, opencl_lib, [x], opencl_options(precision="fp32"), stats=True)
    assert stats["scratch_lent_bytes"] == 0 and stats["scratch_held_bytes"] >= stats["scratch_bytes"] > 0, stats
    monkeypatch.setenv("DIFFLITE_LEND_SCRATCH", "sometimes")
    with pytest.raises(ValueError, match="DIFFLITE_LEND_SCRATCH"):
        run_model(path, opencl_lib, [x], opencl_options(), stats=True)
    monkeypatch.delenv("DIFFLITE_LEND_SCRATCH")
    with pytest.raises(ValueError, match="lend_scratch"):
        run_model(path, opencl_lib, [x], opencl_options(lend_scratch="always"), stats=True)
    with pytest.raises(ValueError, match="lend_scratch apply to backend=opencl only"):
        run_model(path, opencl_lib, [x], {"backend": "cpu", "lend_scratch": "off"}, stats=True)
