"""int4 block scales (quantize.quantize_int4): each block's stored scale is the candidate with the
least squared error, never worse than max|w| / 7 (the scale before), about 1 dB better on
Gaussian weights, exactly what float16 stores at fp16, using -8; the stored integers are the
nearest levels for the stored scales, so dequantize gives what every reader computes; zero, tiny
and non-finite blocks keep their documented scales; the recipe reuses a layer's scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from difflite.compiler import weight_recipe
from difflite.compiler.tflite import quantize

BLOCK = 32


def max7(w: np.ndarray, scales_as) -> np.ndarray:
    """The scales quantize_int4 stored before: max|w| / 7 per block, rounded as stored (written
    out here, not through quantize's helpers)."""
    magnitude = np.abs(w.reshape(-1, BLOCK)).max(axis=1).astype(np.float64) / 7
    if np.dtype(scales_as) == np.float16:
        return np.maximum(magnitude.astype(np.float16), np.finfo(np.float16).tiny).astype(np.float32)
    scales = magnitude.astype(np.float32)
    return np.where(scales < np.finfo(np.float32).tiny, np.float32(1), scales)


def block_errors(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per block squared error (float64) of w stored at `scales` with nearest levels in [-8, 7]."""
    rows = w.reshape(-1, BLOCK)
    q = np.clip(np.rint(rows / scales[:, None]), -8, 7).astype(np.float32)
    return ((q * scales[:, None]).astype(np.float64) - rows) ** 2 @ np.ones(BLOCK)


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"gaussian": (rng.standard_normal((512, 256)) * 0.02).astype(np.float32),
            "laplace": rng.laplace(size=(256, 4, 64)).astype(np.float32),
            # rows of very different sizes, some past float16's normal range at the small end
            "scaled": (rng.standard_normal((64, 128)) * np.logspace(-9, 3, 64)[:, None]).astype(np.float32)}


def snr_db(w: np.ndarray, back: np.ndarray) -> float:
    exact = w.astype(np.float64)
    return 10 * np.log10(np.sum(exact ** 2) / np.sum((back.reshape(w.shape) - exact) ** 2))


@pytest.mark.parametrize("scales_as", [np.float16, np.float32])
@pytest.mark.parametrize("kind", ["gaussian", "laplace", "scaled"])
def test_no_block_is_worse_than_max_over_7(kind, scales_as):
    w = weights()[kind]
    q = quantize.quantize_int4(w, BLOCK, scales_as)
    got, before = block_errors(w, q.scales), block_errors(w, max7(w, scales_as))
    # the search sums float32 squares: a tie may go either way by float32 rounding
    assert np.all(got <= before * (1 + 1e-5)), np.max(got / np.maximum(before, 1e-300))
    assert np.mean(got < before * (1 - 1e-3)) > 0.5  # most blocks do better


@pytest.mark.parametrize("scales_as", [np.float16, np.float32])
def test_gaussian_weights_gain_at_least_0_8_db(scales_as):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((1024, 512)).astype(np.float32)
    new = snr_db(w, quantize.dequantize(quantize.quantize_int4(w, BLOCK, scales_as)))
    rows = w.reshape(-1, BLOCK)
    s = max7(w, scales_as)[:, None]
    old = snr_db(w, np.clip(np.rint(rows / s), -8, 7) * s)
    assert 20.0 < old < 20.5  # the max / 7 scale's ~20.26 dB for Gaussian blocks of 32
    assert new - old >= 0.8, (old, new)


@pytest.mark.parametrize("kind", ["gaussian", "laplace", "scaled"])
def test_float16_scales_are_exact_normal_float16_values(kind):
    w = weights(1)[kind]
    q = quantize.quantize_int4(w, BLOCK, np.float16)
    assert q.scales.dtype == np.float32 and q.scale_bytes == 2
    assert np.array_equal(q.scales.astype(np.float16).astype(np.float32), q.scales)
    assert np.all(q.scales >= np.finfo(np.float16).tiny) and np.all(np.isfinite(q.scales))
    # float32 scales at fp32 are generally not float16 values
    q32 = quantize.quantize_int4(w, BLOCK, np.float32)
    assert q32.scale_bytes == 4 and not np.array_equal(q32.scales.astype(np.float16).astype(np.float32), q32.scales)


def test_the_minus_8_level_is_used():
    w = weights(2)["gaussian"]
    values = quantize.unpack_int4(quantize.quantize_int4(w, BLOCK, np.float16).data, w.size)
    assert values.min() == -8 and values.max() == 7
    assert np.mean(values == -8) > 0.005
    # a block on the grid -8 .. 7 times 0.25 (largest magnitude negative) is stored exactly
    # at 0.25 = max / 8, where max / 7 would round most of it
    grid = (np.arange(-8, 8, dtype=np.float32) * 0.25)
    block = np.tile(grid, (1, 2))
    for scales_as in (np.float16, np.float32):
        q = quantize.quantize_int4(block, BLOCK, scales_as)
        assert q.scales.tolist() == [0.25]
        assert np.array_equal(quantize.dequantize(q).reshape(block.shape), block)


@pytest.mark.parametrize("scales_as", [np.float16, np.float32])
def test_round_trip_stores_the_nearest_levels_of_the_stored_scales(scales_as):
    """The file's integers are clip(rint(w / scale)) for the file's scales: dequantize (and every
    reader: integer times its block's scale) gives the weight back within half a step wherever
    that block's scale does not clip it, and the scales reproduce the same bytes."""
    w = weights(3)["laplace"]
    q = quantize.quantize_int4(w, BLOCK, scales_as)
    rows = w.reshape(-1, BLOCK)
    levels = np.clip(np.rint(rows / q.scales[:, None]), -8, 7).astype(np.int8)
    assert np.array_equal(quantize.unpack_int4(q.data, w.size).reshape(rows.shape), levels)
    back = quantize.dequantize(q)
    assert back.shape == rows.shape and np.array_equal(back, levels.astype(np.float32) * q.scales[:, None])
    step = q.scales[:, None]
    inside = (rows >= -8.5 * step) & (rows <= 7.5 * step)
    assert inside.mean() > 0.97  # Laplace blocks: ~1 % clipped
    assert np.all(np.abs(back - rows)[inside] <= (step / 2 * (1 + 1e-6) * np.ones_like(rows))[inside])
    again = quantize.quantize_int4(w, BLOCK, scales_as, scales=q.scales.astype(scales_as))
    assert np.array_equal(again.data, q.data) and np.array_equal(again.scales, q.scales)
    with pytest.raises(ValueError, match="scales for"):
        quantize.quantize_int4(w, BLOCK, scales_as, scales=q.scales[:-1])


def test_zero_tiny_and_non_finite_blocks_keep_their_scales():
    w = np.ones((6, BLOCK), np.float32)
    w[0] = 0.0  # all zero: scale 1 (float32) / float16's smallest normal, integers 0
    w[1] = 1e-7  # tinier than float16's normal steps: at least float16's smallest normal
    w[2, 3] = np.nan  # a NaN block keeps its NaN scale (the builder refuses it)
    w[3] = 5e5  # max / 7 is past float16's range, max / 8 is not: the scale stays infinite
    w[4, 5] = np.inf
    for scales_as, zero in ((np.float32, 1.0), (np.float16, np.finfo(np.float16).tiny)):
        q = quantize.quantize_int4(w, BLOCK, scales_as)
        assert q.scales[0] == np.float32(zero)
        with np.errstate(invalid="ignore"):  # the NaN and infinite blocks' 0 x inf
            assert np.all(quantize.dequantize(q)[0] == 0.0)
        assert np.isnan(q.scales[2]) and np.isinf(q.scales[4])
        assert q.scales[5] == np.float32(1 / 7) if scales_as == np.float32 else np.float16(1 / 7)
    half = quantize.quantize_int4(w, BLOCK, np.float16)
    assert half.scales[1] == np.float32(np.finfo(np.float16).tiny)
    assert np.isinf(half.scales[3])
    assert np.isfinite(quantize.quantize_int4(w, BLOCK, np.float32).scales[3])


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_recipe_layers_reuse_their_scales_and_store_what_the_writer_does(precision, monkeypatch):
    """The recipe stores a layer at int4 several times: the first searches its scales, the later
    ones reuse them, and each gives exactly what quantize_int4 (the writer's) gives."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 32, 3, padding=1)
    layer = weight_recipe.Layer("conv.weight", conv, quantize.WeightQuantization("int4"), precision)
    ohwi = weight_recipe.writer_layout(conv.weight)
    want = quantize.dequantize(quantize.quantize_int4(ohwi, BLOCK, quantize.scale_dtype(precision))).reshape(ohwi.shape)
    first = layer.weight_at("int4", BLOCK)
    assert torch.equal(first, weight_recipe.torch_layout(want))
    searches = []
    real = quantize._int4_scales
    monkeypatch.setattr(quantize, "_int4_scales", lambda *a: searches.append(1) or real(*a))
    assert torch.equal(layer.weight_at("int4", BLOCK), first)
    assert layer.noise_ratio("int8", "int4", BLOCK) > 0
    assert searches == []
    layer.weight_at("int4", 64)  # another block size is a search of its own
    assert len(searches) > 0
