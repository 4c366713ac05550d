"""Inpainting (`generate --init-image IMG --mask MASK`): diffusers' StableDiffusionInpaintPipeline
in NumPy, step for step, for the generate loop (difflite.runtime.generate) to run.

- the mask: diffusers' mask_processor (VaeImageProcessor with do_normalize=False,
  do_binarize=True, do_convert_grayscale=True): resized to the converted size like the picture
  (lanczos, in the file's own mode: an RGB or RGBA mask too), made grayscale ("L"), [0, 255] ->
  [0, 1], binarized at 0.5: 1 repaints, 0 keeps;
- the masked picture: the picture in [-1, 1] times (mask < 0.5), the repainted part 0 (gray);
- the mask at the latents' size: torch.nn.functional.interpolate's default, nearest (each
  latent takes the pixel at floor(i x pixels / latents) of each axis);
- a 9-channel (inpainting) UNet sees [scaled latents, mask, masked picture's latents] at every
  step (the latents 4 channels, the mask 1, the masked picture's 4);
- a 4-channel UNet repaints by blending: after each step the kept part is the picture's latents
  noised to the next timestep (none after the last), (1 - mask) x kept + mask x latents;
- the initial latents: pure noise times init_noise_sigma at strength 1.0 (diffusers' default
  there), else the picture's latents noised to the first kept timestep, as img2img;
- the generator draws in diffusers' order: the picture's posterior sample (strength < 1, or a
  4-channel UNet: prepare_latents encodes it then), the noise, the masked picture's posterior
  sample (prepare_mask_latents draws it for a 4-channel UNet too, which does not use it); then
  the schedulers' stochastic steps.

Nothing here imports torch or diffusers."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from difflite.core.errors import BadInput
from difflite.runtime.images import read_image
from difflite.runtime.noise import TorchGenerator

# diffusers' defaults: inpainting starts from pure noise, img2img re-noises the picture 0.8 of the way
DEFAULT_STRENGTH = {"inpaint": 1.0, "img2img": 0.8}
MASK_THRESHOLD = 0.5  # binarize: a value >= it repaints


def default_strength(inpaint: bool) -> float:
    return DEFAULT_STRENGTH["inpaint" if inpaint else "img2img"]


# ---------------------------------------------------------------------------------------------
# The mask


def fit_mask(mask, height: int, width: int):
    """The mask (a PIL image, or the path of one, read by difflite.runtime.images with its bounds
    and in its own mode) as a grayscale PIL image of (width, height): lanczos-resized in its own
    mode where it is not that size, then made grayscale, as diffusers' mask_processor does."""
    from PIL import Image

    where = "--mask"
    if isinstance(mask, (str, os.PathLike)):
        where = f"--mask {mask}"
        mask = read_image(mask, option="--mask", mode=None)
    try:
        if mask.size != (width, height):
            mask = mask.resize((width, height), resample=Image.Resampling.LANCZOS)
        return mask if mask.mode == "L" else mask.convert("L")
    except (OSError, ValueError) as exc:  # a mode PIL cannot resize or make grayscale
        raise BadInput(f"{where}: cannot make a grayscale mask of this {mask.mode} picture ({exc})") from exc


def load_mask(mask, height: int, width: int) -> np.ndarray:
    """The mask as float32 [1, 1, height, width]: 1 where the picture is repainted, 0 where it is kept."""
    values = np.asarray(fit_mask(mask, height, width)).astype(np.float32) / np.float32(255.0)
    return (values >= np.float32(MASK_THRESHOLD)).astype(np.float32)[None, None]


def masked_picture(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The picture ([1, 3, H, W] in [-1, 1]) with the repainted part 0: image * (mask < 0.5)."""
    return image * (mask < np.float32(MASK_THRESHOLD))


def latent_mask(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """torch.nn.functional.interpolate(mask, size=(height, width)), mode "nearest"."""
    rows = _nearest(mask.shape[2], height)
    cols = _nearest(mask.shape[3], width)
    return np.ascontiguousarray(mask[:, :, rows][:, :, :, cols])


def _nearest(size_in: int, size_out: int) -> np.ndarray:
    """The source index of each output index: floor(i x scale) in float32, scale = in / out, as
    PyTorch's nearest interpolation computes it."""
    scale = np.float32(size_in) / np.float32(size_out)
    index = np.floor(np.arange(size_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(index, size_in - 1)


# ---------------------------------------------------------------------------------------------
# The latents


@dataclass
class Inpainting:
    """What the denoising loop adds for inpainting: the mask at the latents' size and either the
    masked picture's latents (a 9-channel UNet's input) or the picture's latents and the noise
    (a 4-channel UNet's blending)."""
    mask: np.ndarray  # [1, 1, h, w], 1 where repainted
    masked_latents: np.ndarray | None = None  # 9-channel UNet
    image_latents: np.ndarray | None = None  # 4-channel UNet
    noise: np.ndarray | None = None  # 4-channel UNet

    @property
    def unet_inpaints(self) -> bool:
        return self.masked_latents is not None

    def unet_sample(self, sample: np.ndarray) -> np.ndarray:
        """The UNet's input for the scaled latents: with a 9-channel UNet the latents, the mask and
        the masked picture's latents along the channels; else the latents."""
        if not self.unet_inpaints:
            return sample
        return np.concatenate([sample, self.mask, self.masked_latents], axis=1)

    def after_step(self, latents: np.ndarray, sched, timesteps, i: int) -> np.ndarray:
        """With a 4-channel UNet, the kept part back from the picture after step i (noised to the
        next timestep, the picture's own latents after the last step); else the latents."""
        if self.unet_inpaints:
            return latents
        kept = self.image_latents
        if i < len(timesteps) - 1:
            kept = np.asarray(sched.add_noise(kept, self.noise, timesteps[i + 1:i + 2]), dtype=np.float32)
        return (np.float32(1) - self.mask) * kept + self.mask * latents


Encode = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # picture -> scaled (mean, std)


def prepare(encode: Encode, image: np.ndarray, mask: np.ndarray, shape: tuple[int, int, int, int],
            unet_inpaints: bool, sched, timesteps, strength: float,
            generator: TorchGenerator) -> tuple[np.ndarray, Inpainting]:
    """diffusers' prepare_latents and prepare_mask_latents: the initial latents of `shape` and the
    Inpainting of the loop. `image` [1, 3, H, W] in [-1, 1], `mask` [1, 1, H, W] (load_mask);
    `encode` runs the VAE encoder (deterministic: both pictures are encoded before any draw)."""
    strength_max = strength == 1.0
    uses_picture = not unet_inpaints or not strength_max
    picture = encode(image) if uses_picture else None
    masked = encode(masked_picture(image, mask)) if unet_inpaints else None

    image_latents = posterior_sample(*picture, generator) if uses_picture else None
    noise = generator.randn(shape)
    if strength_max:
        latents = noise * np.float32(sched.init_noise_sigma)
    else:
        latents = np.asarray(sched.add_noise(image_latents, noise, timesteps[:1]), dtype=np.float32)
    if unet_inpaints:
        masked_latents = posterior_sample(*masked, generator)
    else:
        generator.randn(shape)  # diffusers encodes the masked picture all the same: its draw
        masked_latents = None
    small_mask = latent_mask(mask, shape[2], shape[3])
    if unet_inpaints:
        return latents, Inpainting(small_mask, masked_latents=masked_latents)
    return latents, Inpainting(small_mask, image_latents=image_latents, noise=noise)


def posterior_sample(mean: np.ndarray, std: np.ndarray, generator: TorchGenerator) -> np.ndarray:
    """retrieve_latents(sample_mode="sample") of the VAE encoder's scaled distribution."""
    return mean + std * generator.randn(mean.shape)


__all__ = ["DEFAULT_STRENGTH", "Inpainting", "default_strength", "fit_mask", "latent_mask", "load_mask",
           "masked_picture", "posterior_sample", "prepare"]
