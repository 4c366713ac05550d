"""Control images for ControlNets (difflite/runtime/controlnet.py): read, edge-mapped and resized
as diffusers' StableDiffusionControlNetPipeline prepares them, and the step schedule of its
controlnet_keep."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from difflite.core.errors import BadInput
from difflite.runtime.controlnet import ControlSpec, add_residuals, canny_edges, control_image, step_weights
from support.numerics import rng


def _diffusers_control_image(image: Image.Image, height: int, width: int) -> np.ndarray:
    from diffusers.image_processor import VaeImageProcessor

    processor = VaeImageProcessor(vae_scale_factor=8, do_convert_rgb=True, do_normalize=False)
    return processor.preprocess(image, height=height, width=width).numpy()


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("size", [(64, 64), (96, 80), (37, 53)], ids=["same", "larger", "odd"])
def test_control_image_equals_the_pipelines_preprocessing(tmp_path, size):
    photo = _photo(*size)
    path = tmp_path / "control.png"
    photo.save(path)
    got = control_image(ControlSpec(path), 64, 64)
    want = _diffusers_control_image(photo, 64, 64)
    assert got.shape == want.shape == (1, 3, 64, 64) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_canny_marks_the_edges_of_a_square(tmp_path):
    pixels = np.zeros((64, 64, 3), np.uint8)
    pixels[16:48, 16:48] = 255
    path = tmp_path / "square.png"
    Image.fromarray(pixels).save(path)
    got = control_image(ControlSpec(path, preprocess="canny"), 64, 64)[0, 0]
    edges = got > 0.5
    border = np.zeros_like(edges)
    border[14:50, 14:50] = True
    border[18:46, 18:46] = False
    assert edges.any() and not edges[~border].any()  # edges lie on the square's outline only
    assert edges[14:50, 14:50].sum() >= 4 * 28  # and go all the way round
    assert np.array_equal(got, control_image(ControlSpec(path, preprocess="canny"), 64, 64)[0, 1])


def test_canny_thresholds_change_what_is_an_edge():
    ramp = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (64, 1, 3))
    steps = ramp.copy()
    steps[:, 32:] = np.clip(steps[:, 32:].astype(int) + 40, 0, 255).astype(np.uint8)  # one weak step
    image = Image.fromarray(steps)
    assert np.asarray(canny_edges(image, 10, 20)).any()
    assert not np.asarray(canny_edges(image, 500, 900)).any()


def test_step_weights_follow_start_end_and_scale():
    specs = [ControlSpec("a", scale=0.5), ControlSpec("b", scale=2.0, start=0.25, end=0.75)]
    weights = step_weights(specs, 8)
    assert [w[0] for w in weights] == [0.5] * 8
    # diffusers keeps step i where i/8 >= start and (i+1)/8 <= end
    assert [w[1] for w in weights] == [0, 0, 2.0, 2.0, 2.0, 2.0, 0, 0]


def test_residuals_add_scaled_in_order():
    r = rng(3)
    a = {"mid_residual": r.standard_normal((1, 4, 2, 2)).astype(np.float32)}
    b = {"mid_residual": r.standard_normal((1, 4, 2, 2)).astype(np.float32)}
    total = add_residuals(add_residuals(None, a, 0.5), b, 1.5)
    want = a["mid_residual"] * np.float32(0.5) + b["mid_residual"] * np.float32(1.5)
    np.testing.assert_array_equal(total["mid_residual"], want)


@pytest.mark.parametrize("spec, words", [
    (ControlSpec("x", scale=float("nan")), "--control-scale"),
    (ControlSpec("x", start=0.6, end=0.5), "--control-start"),
    (ControlSpec("x", end=1.5), "--control-end"),
    (ControlSpec("x", preprocess="depth"), "--control-preprocess"),
    (ControlSpec("x", canny_low=200, canny_high=100), "--canny-low"),
])
def test_out_of_range_settings_are_refused(spec, words):
    with pytest.raises(BadInput, match=words):
        spec.check(0)


def test_a_control_image_that_is_not_an_image_is_refused(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("not a picture")
    with pytest.raises(BadInput, match="--control-image"):
        control_image(ControlSpec(path), 64, 64)
