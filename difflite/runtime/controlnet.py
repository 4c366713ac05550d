"""ControlNets at run time, as diffusers' StableDiffusionControlNetPipeline (and its
MultiControlNetModel) runs them:

- a control image is read with the bounded image loader, optionally turned into an edge map
  (`canny`, OpenCV's Canny on the picture as read, before any resize, as diffusers' examples
  make their control images), resized to the converted size with lanczos and scaled to [0, 1]
  without normalising (the pipeline's control_image_processor);
- each ControlNet acts from `start` to `end` (fractions of the denoising steps; diffusers'
  controlnet_keep) at `scale` times its residuals;
- several ControlNets add their scaled residuals in the order given.

A ControlNet whose weight at a step is 0 is not run: its residuals would be exactly zero and
adding zeros changes nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from difflite.core.errors import BadInput
from difflite.runtime.images import read_image

PREPROCESS = ("none", "canny")
CANNY_LOW, CANNY_HIGH = 100.0, 200.0  # the thresholds of diffusers' ControlNet examples


@dataclass(frozen=True)
class ControlSpec:
    """One ControlNet's control for a picture: the image (a path, or an RGB PIL image) and how
    strongly and when it steers."""
    image: object
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0
    preprocess: str = "none"
    canny_low: float = CANNY_LOW
    canny_high: float = CANNY_HIGH

    def check(self, index: int) -> None:
        """BadInput naming the option of the index-th --control-image where a setting is out of
        range (diffusers raises ValueError for the same)."""
        where = f"--control-image #{index + 1}"
        if not math.isfinite(self.scale):
            raise BadInput(f"{where}: --control-scale {self.scale} must be a finite number")
        if not (0.0 <= self.start < self.end <= 1.0):
            raise BadInput(f"{where}: --control-start {self.start} and --control-end {self.end} must satisfy "
                           f"0 <= start < end <= 1")
        if self.preprocess not in PREPROCESS:
            raise BadInput(f"{where}: --control-preprocess {self.preprocess!r} must be one of "
                           f"{', '.join(PREPROCESS)}")
        if not (0.0 <= self.canny_low <= self.canny_high and math.isfinite(self.canny_high)):
            raise BadInput(f"{where}: --canny-low {self.canny_low} and --canny-high {self.canny_high} must satisfy "
                           f"0 <= low <= high")


def specs_from_options(images: Sequence, scales: Sequence[float] = (), starts: Sequence[float] = (),
                       ends: Sequence[float] = (), preprocesses: Sequence[str] = (), canny_low: float = CANNY_LOW,
                       canny_high: float = CANNY_HIGH) -> list[ControlSpec]:
    """generate's repeatable control options as one ControlSpec per --control-image: each of
    --control-scale / -start / -end / -preprocess given never (its default), once (for every image)
    or once per image, in the images' order."""
    settings = {"--control-scale": scales, "--control-start": starts, "--control-end": ends,
                "--control-preprocess": preprocesses}
    if not images:
        given = [option for option, values in settings.items() if values]
        if given:
            raise BadInput(f"{given[0]} without --control-image")
        return []
    for option, values in settings.items():
        if len(values) not in (0, 1, len(images)):
            raise BadInput(f"{option} given {len(values)} times for {len(images)} --control-image: give it once "
                           f"(for every image) or once per image")

    def pick(values: Sequence, index: int, default):
        return default if not values else values[0] if len(values) == 1 else values[index]

    return [ControlSpec(image, pick(scales, i, 1.0), pick(starts, i, 0.0), pick(ends, i, 1.0),
                        pick(preprocesses, i, "none"), canny_low, canny_high) for i, image in enumerate(images)]


@dataclass(frozen=True)
class Control:
    """A control ready to run: its image as the ControlNet takes it (control_image) and when and
    how strongly it acts."""
    image: np.ndarray  # float32 [1, 3, H, W] in [0, 1]
    scale: float = 1.0
    start: float = 0.0
    end: float = 1.0


def prepare(spec: ControlSpec | Control, index: int, height: int, width: int) -> Control:
    """The checked spec with its picture read, preprocessed and resized (a Control as it is)."""
    if isinstance(spec, Control):
        return spec
    spec.check(index)
    return Control(control_image(spec, height, width), spec.scale, spec.start, spec.end)


def control_image(spec: ControlSpec, height: int, width: int) -> np.ndarray:
    """The control image as the ControlNet takes it: float32 NCHW [1, 3, height, width] in [0, 1]."""
    from PIL import Image

    image = read_image(spec.image, option="--control-image") if not isinstance(spec.image, Image.Image) \
        else spec.image.convert("RGB")
    if spec.preprocess == "canny":
        image = canny_edges(image, spec.canny_low, spec.canny_high)
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.LANCZOS)
    array = np.asarray(image, dtype=np.float32) / np.float32(255.0)
    return np.ascontiguousarray(array.transpose(2, 0, 1)[None])


def canny_edges(image, low: float, high: float):
    """OpenCV's Canny edge map of an RGB PIL image, as a white-on-black RGB PIL image."""
    from PIL import Image

    try:
        import cv2
    except ImportError as exc:
        raise BadInput("--control-preprocess canny needs OpenCV (pip install opencv-python-headless)") from exc
    edges = cv2.Canny(np.asarray(image), low, high)
    return Image.fromarray(np.repeat(edges[:, :, None], 3, axis=2))


def step_weights(specs: list[ControlSpec] | list[Control], steps: int) -> list[list[float]]:
    """Per denoising step, each ControlNet's scale times whether it acts at that step
    (diffusers' controlnet_keep)."""
    weights = []
    for i in range(steps):
        keep = [1.0 - float(i / steps < s.start or (i + 1) / steps > s.end) for s in specs]
        weights.append([s.scale * k for s, k in zip(specs, keep)])
    return weights


def add_residuals(total: dict[str, np.ndarray] | None, residuals: dict[str, np.ndarray],
                  weight: float) -> dict[str, np.ndarray]:
    """`total` plus `weight` times one ControlNet's residuals (the first one's alone where
    `total` is None), in float32 as diffusers scales and sums them."""
    scaled = {name: np.asarray(value, dtype=np.float32) * np.float32(weight) for name, value in residuals.items()}
    if total is None:
        return scaled
    return {name: total[name] + scaled[name] for name in total}


__all__ = ["PREPROCESS", "Control", "ControlSpec", "add_residuals", "canny_edges", "control_image", "prepare",
           "specs_from_options", "step_weights"]
