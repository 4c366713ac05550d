"""The names ControlNet conversion and the runtime share: the ControlNet components
(`controlnet_0`, `controlnet_1`, ... in the order of convert's --controlnet), the control image
input, and the residuals a ControlNet outputs and a UNet converted with ControlNets takes as
extra inputs (diffusers' down_block_additional_residuals / mid_block_additional_residual)."""

from __future__ import annotations

import re

CONTROLNET_PREFIX = "controlnet_"
# The control image: [N, C, H, W] at the image size, values in [0, 1] (what diffusers' control
# image preprocessing gives: no normalisation to [-1, 1]), RGB.
CONTROL_IMAGE = "controlnet_cond"
CONTROL_IMAGE_RANGE = (0.0, 1.0)
DOWN_RESIDUAL_PREFIX = "down_residual_"
MID_RESIDUAL = "mid_residual"
_CONTROLNET = re.compile(rf"{CONTROLNET_PREFIX}(0|[1-9][0-9]{{0,3}})")
_DOWN_RESIDUAL = re.compile(rf"{DOWN_RESIDUAL_PREFIX}(0|[1-9][0-9]{{0,3}})")


def controlnet_name(index: int) -> str:
    return f"{CONTROLNET_PREFIX}{index}"


def controlnet_index(name: str) -> int | None:
    """N of a component named controlnet_N, else None."""
    match = _CONTROLNET.fullmatch(str(name))
    return int(match.group(1)) if match else None


def residual_names(down: int) -> tuple[str, ...]:
    """The residuals of a ControlNet with `down` down-block residuals (12 for SD 1.x / 2.x), in
    the order diffusers returns them: down_residual_0 .. down_residual_{down-1}, mid_residual."""
    return (*(f"{DOWN_RESIDUAL_PREFIX}{i}" for i in range(down)), MID_RESIDUAL)


def is_residual(name: str) -> bool:
    return name == MID_RESIDUAL or _DOWN_RESIDUAL.fullmatch(str(name)) is not None
