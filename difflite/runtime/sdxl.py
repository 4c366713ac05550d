"""SDXL's conditioning, as diffusers 0.42.1's StableDiffusionXLPipeline and
StableDiffusionXLImg2ImgPipeline build it: the one place generate makes an SDXL UNet's inputs
beside the sample and timestep (difflite.runtime.generate runs them through its one loop).

- prompts (encode_prompt): text_encoder reads the prompt, text_encoder_2 the second prompt
  (prompt_2, the prompt where none is given); the context is both penultimate hidden states
  concatenated, text_embeds text_encoder_2's pooled projection. The unconditional branch (with
  classifier-free guidance) is zeros, context and text_embeds alike, when no negative prompt is
  given (None, not "") and the source pipeline has force_zeros_for_empty_prompt; else the negative
  prompt ("" when None) and negative_prompt_2 (the negative prompt when None or "").
- time ids (_get_add_time_ids): original_size + crops_coords_top_left + target_size, sizes as
  (height, width) and the crop as (top, left), both sizes the picture's by default. Text-to-image:
  the unconditional branch takes the negative ones only when both negative sizes are given (its
  crop then the negative crop), else the positive ones. Image-to-image: the negative sizes default
  to the positive ones and the unconditional ids take the positive crop (as diffusers writes
  them); a pipeline that requires_aesthetics_score (an SDXL refiner) takes original_size + crop +
  (aesthetic_score,) instead, and the negative sizes, crop and score for the unconditional branch.

NumPy only: no torch, diffusers or transformers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from difflite.core.errors import BadInput

CONTEXT = "encoder_hidden_states"
PENULTIMATE = "penultimate_hidden_state"  # both text encoders' output (compiler.export.PENULTIMATE)
TEXT_EMBEDS = "text_embeds"
TIME_IDS = "time_ids"
# diffusers' defaults: SDXL's guidance scale (StableDiffusionXLPipeline and its img2img and inpainting
# pipelines), img2img's and inpainting's strength (0.9999: the picture's latents noised at the first
# kept timestep, one step fewer than asked at 20), and the refiner's aesthetic scores
GUIDANCE = 5.0
IMG2IMG_STRENGTH = 0.3
INPAINT_STRENGTH = 0.9999
AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE = 6.0, 2.5
MAX_SIZE = 1 << 20  # a size or crop offset past this is no picture's (the UNet embeds them as floats)


def default_strength(inpainting: bool) -> float:
    """StableDiffusionXLInpaintPipeline's strength, else StableDiffusionXLImg2ImgPipeline's (an
    init image's; txt2img takes none)."""
    return INPAINT_STRENGTH if inpainting else IMG2IMG_STRENGTH


Size = tuple[int, int]


@dataclass(frozen=True)
class SizeConditioning:
    """SDXL's micro-conditioning, in diffusers' argument names: sizes (height, width) in pixels
    (None: the picture's), crops (top, left), and a refiner's aesthetic scores."""
    original_size: Size | None = None
    crops_coords_top_left: Size = (0, 0)
    target_size: Size | None = None
    negative_original_size: Size | None = None
    negative_crops_coords_top_left: Size = (0, 0)
    negative_target_size: Size | None = None
    aesthetic_score: float = AESTHETIC_SCORE
    negative_aesthetic_score: float = NEGATIVE_AESTHETIC_SCORE

    def check(self) -> None:
        for option, value in self.options().items():
            if value is None:
                continue
            if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise BadInput(f"{option} {value!r} must be two integers")
            low = 0 if "crop" in option else 1
            if not all(low <= v <= MAX_SIZE for v in value):
                raise BadInput(f"{option} {format_pair(value)}: each number must be in [{low}, {MAX_SIZE}]")
        for option, score in (("aesthetic_score", self.aesthetic_score),
                              ("negative_aesthetic_score", self.negative_aesthetic_score)):
            if not isinstance(score, (int, float)) or not math.isfinite(score):
                raise BadInput(f"{option} {score!r} must be a finite number")

    def options(self) -> dict[str, Size | None]:
        """The sizes by their command-line options."""
        return {"--original-size": self.original_size, "--crop": self.crops_coords_top_left,
                "--target-size": self.target_size, "--negative-original-size": self.negative_original_size,
                "--negative-crop": self.negative_crops_coords_top_left,
                "--negative-target-size": self.negative_target_size}

    def changed(self) -> list[str]:
        """The options that differ from diffusers' defaults (command-line names; the scores by
        their arguments' names)."""
        default = SizeConditioning()
        names = [option for option, value in self.options().items() if value != default.options()[option]]
        return names + [name for name in ("aesthetic_score", "negative_aesthetic_score")
                        if getattr(self, name) != getattr(default, name)]


def format_pair(value: Sequence[int]) -> str:
    return ",".join(str(v) for v in value)


def time_ids(sizes: SizeConditioning, height: int, width: int, img2img: bool,
             aesthetics: bool = False) -> tuple[list[float], list[float]]:
    """(positive, negative) time ids for a picture of height x width, as the text-to-image or the
    img2img pipeline builds them (module docstring)."""
    original = tuple(sizes.original_size or (height, width))
    target = tuple(sizes.target_size or (height, width))
    crop, negative_crop = tuple(sizes.crops_coords_top_left), tuple(sizes.negative_crops_coords_top_left)
    if not img2img:
        positive = [*original, *crop, *target]
        if sizes.negative_original_size is not None and sizes.negative_target_size is not None:
            return positive, [*sizes.negative_original_size, *negative_crop, *sizes.negative_target_size]
        return positive, positive
    negative_original = tuple(sizes.negative_original_size or original)
    negative_target = tuple(sizes.negative_target_size or target)
    if aesthetics:
        return ([*original, *crop, sizes.aesthetic_score],
                [*negative_original, *negative_crop, sizes.negative_aesthetic_score])
    return [*original, *crop, *target], [*negative_original, *crop, *negative_target]


@dataclass(frozen=True)
class Prompts:
    """The four prompts as diffusers takes them (None: not given)."""
    prompt: str
    prompt_2: str | None = None
    negative_prompt: str | None = None
    negative_prompt_2: str | None = None

    def texts(self, guided: bool, force_zeros: bool) -> tuple[list[str], list[str]]:
        """What text_encoder and text_encoder_2 read: the prompt's pair, then the negative pair
        where the unconditional branch is encoded (guided and not zeros)."""
        first, second = [self.prompt], [self.prompt_2 or self.prompt]
        if guided and not self.zero_negative(force_zeros):
            negative = self.negative_prompt or ""
            first.append(negative)
            second.append(self.negative_prompt_2 or negative)
        return first, second

    def zero_negative(self, force_zeros: bool) -> bool:
        return self.negative_prompt is None and force_zeros


def conditioning(prompts: Prompts, encode_1: Callable[[list[str]], list[np.ndarray]],
                 encode_2: Callable[[list[str]], list[tuple[np.ndarray, np.ndarray]]],
                 ids: tuple[list[float], list[float]], guided: bool,
                 force_zeros: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """(cond, uncond) UNet inputs (context, text_embeds, time_ids; uncond None without
    classifier-free guidance). encode_1: texts -> text_encoder's penultimate hidden states;
    encode_2: texts -> text_encoder_2's (penultimate hidden states, text_embeds); each called
    once, so that a model loaded for its stage alone is loaded once."""
    first, second = prompts.texts(guided, force_zeros)
    hidden_1, outputs_2 = encode_1(first), encode_2(second)
    branches = [{CONTEXT: np.concatenate([h1, h2], axis=-1).astype(np.float32),
                 TEXT_EMBEDS: np.asarray(pooled, dtype=np.float32),
                 TIME_IDS: np.asarray([ids_], dtype=np.float32)}
                for h1, (h2, pooled), ids_ in zip(hidden_1, outputs_2, ids)]
    cond = branches[0]
    if not guided:
        return cond, None
    if len(branches) == 2:
        return cond, branches[1]
    return cond, {CONTEXT: np.zeros_like(cond[CONTEXT]), TEXT_EMBEDS: np.zeros_like(cond[TEXT_EMBEDS]),
                  TIME_IDS: np.asarray([ids[1]], dtype=np.float32)}


def parse_pair(option: str, text: str | None) -> Size | None:
    """A command line's "A,B" (e.g. --original-size 1024,1024: height, width) as two integers."""
    if text is None:
        return None
    parts = str(text).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise BadInput(f"{option} {text!r}: give two integers as A,B") from None


__all__ = ["CONTEXT", "Prompts", "SizeConditioning", "conditioning", "parse_pair", "time_ids"]
