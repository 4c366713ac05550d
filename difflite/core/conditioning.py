"""The guidance-scale embedding of LCM-distilled UNets (config time_cond_proj_dim): the guidance
scale w enters the UNet as a sinusoidal embedding of (w - 1) * 1000 in its timestep_cond input,
as diffusers' LatentConsistencyModelPipeline.get_guidance_scale_embedding computes it."""

from __future__ import annotations

import math

import numpy as np

from difflite.core.errors import BadInput

# Far above any useful scale (diffusers' pipelines use 1 to about 20); much larger ones overflow
# the float32 latents into a picture of NaNs.
MAX_GUIDANCE = 100.0


def check_guidance(guidance: float, option: str = "--guidance") -> None:
    if not (math.isfinite(guidance) and 0.0 <= guidance <= MAX_GUIDANCE):
        raise BadInput(f"{option} {guidance!r} must be a number from 0 to {MAX_GUIDANCE:g}")


def guidance_embedding(guidance_scales, dim: int) -> np.ndarray:
    """[len(guidance_scales), dim] float32: sin then cos of (w - 1) * 1000 * 10000^(-i / (dim/2 - 1)),
    zero-padded to an odd dim."""
    w = (np.asarray(guidance_scales, dtype=np.float32).reshape(-1) - np.float32(1)) * np.float32(1000)
    half = dim // 2
    step = np.float32(np.log(10000.0) / (half - 1))
    frequencies = np.exp(np.arange(half, dtype=np.float32) * -step, dtype=np.float64).astype(np.float32)
    angles = w[:, None] * frequencies[None, :]
    embedding = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if dim % 2:
        embedding = np.pad(embedding, ((0, 0), (0, 1)))
    return embedding.astype(np.float32)


TIMESTEP_COND = "timestep_cond"

