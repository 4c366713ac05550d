"""`difflite generate`: run an output folder's .tflite files as a Stable Diffusion pipeline.

The loop mirrors diffusers' StableDiffusionPipeline / StableDiffusionImg2ImgPipeline step for
step, so the same prompt, seed and weights give the same picture as PyTorch:

- tokens: OUT/tokenizer's CLIP tokenizer, padding to max_length 77 with truncation
  (difflite.folder.tokenizer: the tokenizers library, without transformers);
- initial latents: the numbers of torch.Generator("cpu").manual_seed(seed) and diffusers'
  randn_tensor of (1, C, h, w) (difflite.runtime.noise, without torch) times the scheduler's
  init_noise_sigma (txt2img); img2img draws the VAE posterior sample (mean + std * eps) first and
  the add_noise noise second, from the same generator;
- the scheduler is the class of OUT/scheduler/scheduler_config.json or --scheduler, as NumPy ports
  of diffusers' schedulers (difflite.runtime.schedulers; diffusers itself only for a config no port
  covers); the loop uses scale_model_input and step as diffusers does, stochastic steps draw from
  the same generator;
- classifier-free guidance (guidance > 1): one UNet call on [uncond, cond] when the UNet was
  converted with batch 2, two calls with batch 1; without guidance (guidance <= 1, as few-step
  models run) one batch-1 call a step, and a batch-2 UNet is refused (it would compute every
  step twice);
- a UNet with timestep conditioning (LCM-distilled, input timestep_cond) takes the guidance
  scale as an embedding instead (difflite.core.conditioning), with no classifier-free guidance, as
  diffusers' pipelines run such a UNet: one batch-1 call a step;
- inpainting (init_image and mask_image) follows StableDiffusionInpaintPipeline: a 9-channel
  (inpainting) UNet sees the mask and the masked picture's latents, a 4-channel UNet repaints by
  blending the kept part back after each step (difflite.runtime.inpaint); a 9-channel UNet runs
  only so, as diffusers' text-to-image and img2img pipelines cannot run it;
- ControlNets (controls) follow StableDiffusionControlNetPipeline and its MultiControlNetModel:
  each ControlNet runs on the UNet's sample, timestep and prompt embeddings with its control image
  and adds scale x its residuals to the UNet's (difflite.runtime.controlnet: the control image, the
  start / end schedule); a ControlNet whose weight at a step is 0 is not run (its residuals would
  be zeros); a UNet converted with ControlNets gets zero residuals when no control is given;
- SDXL folders (latent.family "sdxl") run as StableDiffusionXLPipeline /
  StableDiffusionXLImg2ImgPipeline: both text encoders, the UNet's text_embeds and time ids
  (difflite.runtime.sdxl builds them, the one place), SDXL's defaults (guidance 5, img2img
  strength 0.3); the same loop, the UNet's extra inputs riding with each branch's context;
- guidance_rescale (> 0, with classifier-free guidance) rescales the guided prediction towards
  the text branch's standard deviation, as diffusers' rescale_noise_cfg;
- the stages run (img2img, inpainting: vae_encoder), text_encoder, (SDXL: text_encoder_2), unet,
  vae_decoder; the VAE encoder's stage runs before any draw from the generator, so loading each
  model just for its stage (low_memory) gives the same picture.

Neither torch, diffusers nor transformers is imported to make a picture from a folder that
`convert` wrote (only NumPy, the tokenizers library and LiteRT): a phone-sized process starts in
well under a second."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import click
import numpy as np

from difflite.core.conditioning import (
    TIMESTEP_COND,
    check_guidance,
    guidance_embedding,
)
from difflite.core.control import controlnet_name
from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json
from difflite.core.procmem import read_status, return_freed_heap
from difflite.folder.output_folder import OutputFolder, inpaint_channels
from difflite.folder.tokenizer import PromptTokenizer, clean_prompt
from difflite.runtime import inpaint, sdxl
from difflite.runtime.backend import CHOICES as BACKEND_CHOICES
from difflite.runtime.backend import HELP as BACKEND_HELP
from difflite.runtime.backend import choose as choose_backend
from difflite.runtime.controlnet import (
    CANNY_HIGH,
    CANNY_LOW,
    PREPROCESS,
    Control,
    ControlSpec,
    add_residuals,
    specs_from_options,
    step_weights,
)
from difflite.runtime.controlnet import prepare as prepare_control
from difflite.runtime.images import read_image
from difflite.runtime.loras import LoraPlan, plan_for_folder
from difflite.runtime.noise import TorchGenerator, check_seed
from difflite.runtime.schedulers import SCHEDULER_CHOICES, SPACINGS, make_scheduler
from difflite.runtime.sdxl import CONTEXT, PENULTIMATE, SizeConditioning

REQUIRED_COMPONENTS = ("text_encoder", "unet", "vae_decoder")
SDXL_REQUIRED_COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae_decoder")
GUIDANCE = 7.5  # difflite's default for SD 1.x / 2.x (SDXL: sdxl.GUIDANCE, diffusers' 5.0)
ENCODER_HINT = "convert with --components text_encoder,unet,vae_decoder,vae_encoder"


# ---------------------------------------------------------------------------------------------
# Schedulers


def img2img_timesteps(scheduler, steps: int, strength: float):
    """diffusers' StableDiffusionImg2ImgPipeline.get_timesteps (after set_timesteps)."""
    init_timestep = min(int(steps * strength), steps)
    t_start = max(steps - init_timestep, 0)
    timesteps = scheduler.timesteps[t_start * scheduler.order:]
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(t_start * scheduler.order)
    return timesteps


def guide(noise: Sequence[np.ndarray], guidance: float, rescale: float = 0.0) -> np.ndarray:
    """The prediction the scheduler steps with: noise = [cond] as it is, or [uncond, cond] guided
    (uncond + guidance x (cond - uncond)), then rescaled by `rescale` > 0 as diffusers'
    rescale_noise_cfg (towards the text branch's standard deviation, per sample)."""
    if len(noise) == 1:
        return noise[0]
    uncond, cond = noise
    guided = uncond + np.float32(guidance) * (cond - uncond)
    if rescale <= 0.0:
        return guided
    axes = tuple(range(1, cond.ndim))
    # torch's std: the unbiased estimate
    rescaled = guided * (cond.std(axis=axes, keepdims=True, ddof=1) / guided.std(axis=axes, keepdims=True, ddof=1))
    return (np.float32(rescale) * rescaled + np.float32(1.0 - rescale) * guided).astype(np.float32)


def check_guidance_rescale(rescale) -> None:
    if not isinstance(rescale, (int, float)) or isinstance(rescale, bool) or not 0.0 <= rescale <= 1.0:
        raise BadInput(f"--guidance-rescale {rescale!r} must be in [0, 1]")


# ---------------------------------------------------------------------------------------------
# Images


def load_init_image(image, height: int, width: int) -> np.ndarray:
    """diffusers' VaeImageProcessor.preprocess for one PIL image (or the path of one), resized to
    the converted size: RGB, lanczos resize to (width, height), [0,255] -> [-1,1], NCHW float32
    [1,3,H,W]."""
    array = np.asarray(fit_init_image(image, height, width)).astype(np.float32) / 255.0
    return np.ascontiguousarray((array * 2.0 - 1.0).transpose(2, 0, 1)[None])


def fit_init_image(image, height: int, width: int):
    """The picture (a PIL image, or a path read by difflite.runtime.images with its bounds) as an
    RGB PIL image of (width, height), lanczos-resized where it is not."""
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        image = read_image(image, option="--init-image")
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.LANCZOS)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def to_uint8(image: np.ndarray) -> np.ndarray:
    """[0,1] float HWC -> uint8 HWC, rounded as diffusers' numpy_to_pil does."""
    return (image * 255).round().astype(np.uint8)


def check_writable(path) -> Path:
    """Fail before any work when the picture could not be written."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{path}: is a folder, give an image file name")
    from difflite.folder.manifest import check_can_write

    check_can_write(path, path.parent if str(path.parent) else Path("."), "cannot write")
    return path


def save_png(image: np.ndarray, path) -> Path:
    """Write a uint8 HWC picture as PNG atomically (a temporary name in the same folder, then a
    rename): an interrupted run leaves no partial file."""
    from PIL import Image

    path = check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            Image.fromarray(image).save(f, format="PNG")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise BadInput(f"{path}: cannot write ({exc.strerror or exc})") from exc
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# The pipeline


@dataclass
class GenerateResult:
    image: np.ndarray  # float32 [H, W, 3] in [0, 1] ((decoded / 2 + 0.5).clamp(0, 1))
    timings: dict  # seconds per stage
    settings: dict  # what was run (scheduler class, steps, UNet calls, ...)
    latents: np.ndarray | None = None  # the final latents [1, C, h, w]
    # per stage, in order: the process's peak resident MB so far and its resident MB after the
    # stage (with low_memory: after freeing its model), from /proc; {} where /proc has neither
    memory: dict = field(default_factory=dict)

    @property
    def uint8(self) -> np.ndarray:
        return to_uint8(self.image)

    def save(self, path) -> Path:
        return save_png(self.uint8, path)


@dataclass
class _Timer:
    seconds: dict = field(default_factory=dict)

    def add(self, key: str, start: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start


class LitePipeline:
    """An output folder as a Stable Diffusion pipeline (txt2img, img2img and inpainting, SD and
    SDXL) on LiteRT.

    >>> pipe = LitePipeline("out/tiny")
    >>> result = pipe("a photo of an astronaut", steps=20, seed=0, guidance=7.5)
    >>> result.save("astronaut.png")
    >>> pipe("a red car", init_image="street.png", mask_image="car-mask.png").save("car.png")
    >>> pipe.set_loras(["style.safetensors:0.8", "detail.safetensors"])  # from the next picture on
    >>> pipe("a red car").save("styled.png")
    >>> pipe.set_loras([])  # the base model again
    >>> xl = LitePipeline("out/sdxl")  # SDXL: a second prompt, size conditioning, guidance rescale
    >>> xl("a castle", prompt_2="oil painting", negative_prompt="blurry", guidance_rescale=0.7,
    ...    sizes=SizeConditioning(original_size=(512, 512), crops_coords_top_left=(0, 64)))
    >>> pipe.close()

    The models stay loaded across calls. With `low_memory`, each is loaded right before its
    stage and freed right after it ((img2img, inpainting: vae_encoder), text_encoder, (SDXL:
    text_encoder_2), unet, vae_decoder): one interpreter alive at a time, for the price of loading
    them again for every picture.
    """

    def __init__(self, out, backend: str = "cpu", threads: int | None = None, low_memory: bool = False,
                 fallback: str = "none"):
        from difflite.runtime.component import check_fallback

        check_fallback(fallback)
        self.out = Path(out)
        self.folder = OutputFolder.read(self.out)
        self.folder.check_family()
        # an SDXL folder: its conditioning (difflite.runtime.sdxl); None for SD 1.x / 2.x
        self.sdxl = self.folder.sdxl
        self.required = SDXL_REQUIRED_COMPONENTS if self.sdxl is not None else REQUIRED_COMPONENTS
        self.backend = backend
        # "cpu": a model the OpenCL backend cannot load runs on the CPU backend, and so does every
        # later one (fallback_reason says why, once, on stderr and in the settings)
        self.fallback = fallback
        self.fallback_reason: str | None = None
        self.threads = threads
        self.low_memory = low_memory
        self._memory: dict = {}  # the picture being made's per-stage memory (GenerateResult.memory)
        for name in self.required:
            if name not in self.folder.components:
                raise BadInput(f"{self.out / (name + '.tflite')}: not in this output folder "
                               f"(convert with --components {','.join(self.required)})")
        latent = self.folder.latent
        self.channels, self.latent_height, self.latent_width = latent.channels, latent.height, latent.width
        self.height, self.width, self.text_length = latent.image_height, latent.image_width, latent.text_length
        unet = self.folder.components["unet"]
        # a 9-channel UNet (latents, mask, masked picture's latents) runs only for inpainting
        self.inpainting_unet = latent.inpainting
        if latent.unet_channels != self.channels and not self.inpainting_unet:
            raise BadInput(f"{unet.path}: a UNet of {latent.unet_channels} input channels (difflite runs "
                           f"{self.channels}, text-to-image, or {inpaint_channels(self.channels)}, inpainting)")
        self.unet_batch = unet.batch
        if self.unet_batch not in (1, 2):
            raise BadInput(f"{unet.path}: batch {self.unet_batch} (difflite runs batch 1 or 2)")
        self.timestep_cond_dim = unet.timestep_cond_dim
        self.tokenizer_dir = self.out / "tokenizer"
        config_path = self.out / "scheduler" / "scheduler_config.json"
        for folder in (self.tokenizer_dir, *((self.out / "tokenizer_2",) if self.sdxl is not None else ())):
            if not folder.is_dir():
                raise BadInput(f"{folder}: missing (the output folder is incomplete: convert again)")
        if self.sdxl is not None:
            self._check_sdxl_unet(unet)
        if not config_path.is_file():
            raise BadInput(f"{config_path}: missing (the output folder is incomplete: convert again)")
        self.scheduler_config = read_json(config_path, what="scheduler config")
        if not isinstance(self.scheduler_config, dict):
            raise BadInput(f"{config_path}: not a scheduler config (expected a JSON object)")
        self._components: dict = {}
        self._tokenizers: dict[str, PromptTokenizer] = {}
        self.load_seconds = 0.0
        self.controlnet_seconds, self.controlnet_calls = 0.0, 0
        self._zero_residuals: dict | None = None
        self.loras = LoraPlan()
        self.lora_seconds = 0.0  # the last set_loras: reading the files and applying them

    def set_loras(self, loras: Sequence) -> None:
        """Apply these LoRAs to the pictures made from now on, in place of the active ones: each a
        "FILE[:SCALE]", a (path, scale) pair or a core.lora.LoraSpec; [] is the base model. Needs a
        folder converted with LoRA slots (convert --lora-slots, the default). Every file is read and
        checked against the folder before anything changes: a BadInput (naming the file) leaves
        the active LoRAs and the loaded models as they were. The base weights are never touched
        or reloaded: the loaded models take the new factors at once, the others when they load."""
        start = time.perf_counter()
        plan = plan_for_folder(self.folder, loras)
        previous, self.loras = self.loras, plan
        applied = []
        try:
            for name, component in self._components.items():
                self._apply_loras(name, component)
                applied.append(name)
        except BadInput:
            self.loras = previous
            for name in applied:
                self._apply_loras(name, self._components[name])
            raise
        finally:
            return_freed_heap()  # the files' float32 read-out: the op library holds the factors now
        self.lora_seconds = time.perf_counter() - start

    def lora_bytes(self) -> int:
        """Bytes the loaded models hold for run-time LoRAs (Component.lora_bytes), all together."""
        return sum(c.lora_bytes() for c in self._components.values())

    def _apply_loras(self, name: str, component) -> None:
        """Hand `component` its factors (the plan forgets them: the op library's copy is the one
        kept, and the files are read again if this model loads again)."""
        if component.lora.slots is None:
            return
        component.set_lora(self.loras.take(name), source=self.loras.source(name))
        if self.loras.specs:
            return_freed_heap()

    # -- parts, loaded on first use ------------------------------------------------------------

    @property
    def has_vae_encoder(self) -> bool:
        entry = self.folder.components.get("vae_encoder")
        return entry is not None and entry.path.is_file()

    def component(self, name: str):
        if name not in self._components:
            from difflite.runtime.component import open_component

            hint = f"img2img and inpainting need it: {ENCODER_HINT}" if name == "vae_encoder" else "convert again"
            entry = self.folder.component(name, hint)
            start = time.perf_counter()
            component = open_component(entry, self.backend, self.folder.precision, self.folder.weights,
                                       threads=self.threads, fallback=self.fallback, on_fallback=self._fell_back)
            self._apply_loras(name, component)
            self._components[name] = component
            self.load_seconds += time.perf_counter() - start
        return self._components[name]

    def _fell_back(self, reason: str) -> None:
        """A component moved to the CPU backend (at load or while running): so do the later ones;
        said once."""
        if self.fallback_reason is None:
            backend, self.backend, self.fallback_reason = self.backend, "cpu", reason
            print(f"difflite: warning: the {backend} backend cannot run this model, so the CPU backend runs it "
                  f"(--fallback cpu): {reason}", file=sys.stderr)

    def release(self, name: str) -> None:
        """Free a loaded component (the time it takes counts as load time)."""
        component = self._components.pop(name, None)
        if component is not None:
            start = time.perf_counter()
            component.close()
            self.load_seconds += time.perf_counter() - start

    def close(self) -> None:
        for name in list(self._components):
            self.release(name)

    def __enter__(self) -> LitePipeline:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @contextmanager
    def stage(self, name: str) -> Iterator:
        """The component of one stage: loaded if it is not, freed at the end with low_memory."""
        component = self.component(name)
        try:
            yield component
        finally:
            if self.low_memory:
                self.release(name)
            self._note_memory(name)

    def _note_memory(self, stage: str) -> None:
        """The process's high-water mark after `stage` (it rises in the stage that sets the peak:
        VmHWM is never lowered here, so other tools' readings of it stay true) and what stays."""
        status = read_status()
        if "VmHWM" in status and "VmRSS" in status:
            self._memory[stage] = {"peak_rss_mb": round(status["VmHWM"], 1), "rss_after_mb": round(status["VmRSS"], 1)}

    @property
    def tokenizer(self) -> PromptTokenizer:
        return self.tokenizer_of("text_encoder")

    def tokenizer_of(self, encoder: str) -> PromptTokenizer:
        """The tokenizer of text_encoder (OUT/tokenizer) or text_encoder_2 (OUT/tokenizer_2), its
        ids checked against that encoder's token table; loaded once."""
        if encoder not in self._tokenizers:
            start = time.perf_counter()
            vocabulary = self.folder.components[encoder].token_vocabulary()
            folder = self.tokenizer_dir if encoder == "text_encoder" else self.out / "tokenizer_2"
            self._tokenizers[encoder] = PromptTokenizer(folder, self.text_length, vocabulary)
            self.load_seconds += time.perf_counter() - start
        return self._tokenizers[encoder]

    def encode_prompt(self, text: str) -> np.ndarray:
        """text_encoder's hidden states of `text` (SD: the last layer's; SDXL: the penultimate)."""
        out = self.component("text_encoder")(input_ids=self.tokenizer(text))
        name = "last_hidden_state" if self.sdxl is None else PENULTIMATE
        return out[name].astype(np.float32)

    def encode_prompt_2(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """SDXL's text_encoder_2 on `text`: (penultimate hidden states, text_embeds)."""
        out = self.component("text_encoder_2")(input_ids=self.tokenizer_of("text_encoder_2")(text))
        return out[PENULTIMATE].astype(np.float32), out[sdxl.TEXT_EMBEDS].astype(np.float32)

    def predict_noise(self, sample: np.ndarray, t: float, cond: dict[str, np.ndarray],
                      uncond: dict[str, np.ndarray] | None, extra: dict | None = None,
                      controls: Sequence[tuple[Control, float]] = ()):
        """noise_pred for the [1,C,h,w] (already scaled) sample: [uncond, cond] when uncond is
        given (classifier-free guidance), else cond alone; returns one array per branch. A branch
        is its UNet inputs: encoder_hidden_states (SDXL: text_embeds and time_ids too). A batch-2
        UNet only runs with guidance (_check_call). `extra`: further UNet inputs (timestep_cond);
        `controls`: (control, its weight at this step) for controlnet_0, controlnet_1, ..."""
        unet = self.component("unet")
        extra = extra or {}
        branches = [cond] if uncond is None else [uncond, cond]
        if self.unet_batch == 2:
            sample2 = np.concatenate([sample, sample])
            timestep = np.full((2,), t, dtype=np.float32)
            inputs = {name: np.concatenate([branch[name] for branch in branches]) for name in cond}
            residuals = self.control_residuals(sample2, timestep, inputs[CONTEXT], controls)
            noise = unet(sample=sample2, timestep=timestep, **inputs, **residuals, **extra)
            return [noise["noise_pred"][0:1], noise["noise_pred"][1:2]]
        timestep = np.full((1,), t, dtype=np.float32)
        single = sample[0:1]
        return [unet(sample=single, timestep=timestep, **branch,
                     **self.control_residuals(single, timestep, branch[CONTEXT], controls), **extra)["noise_pred"]
                for branch in branches]

    def control_residuals(self, sample: np.ndarray, timestep: np.ndarray, context: np.ndarray,
                          controls: Sequence[tuple[Control, float]]) -> dict[str, np.ndarray]:
        """The residuals the UNet adds: the sum over the ControlNets of weight x residuals (diffusers'
        MultiControlNetModel), those of weight 0 not run; zeros where none runs; {} for a UNet
        converted without ControlNets. The ControlNets' time and calls go to controlnet_seconds /
        controlnet_calls."""
        total = None
        for index, (control, weight) in enumerate(controls):
            if weight == 0:
                continue
            start = time.perf_counter()
            residuals = self.component(controlnet_name(index))(
                sample=sample, timestep=timestep, encoder_hidden_states=context, controlnet_cond=control.image)
            total = add_residuals(total, residuals, weight)
            self.controlnet_seconds += time.perf_counter() - start
            self.controlnet_calls += 1
        return self.zero_control_residuals() if total is None else total

    def zero_control_residuals(self) -> dict[str, np.ndarray]:
        """A UNet converted with ControlNets takes their residuals: zeros (made once), the UNet
        without ControlNet, when no control image is given; none for other UNets."""
        if self._zero_residuals is None:
            unet = self.folder.components["unet"]
            self._zero_residuals = {spec.name: np.zeros(spec.onnx_shape, spec.dtype)
                                    for spec in unet.control_residuals}
        return self._zero_residuals

    # -- the loop ------------------------------------------------------------------------------

    def __call__(self, prompt: str, negative_prompt: str | None = None, steps: int = 20, seed: int = 0,
                 guidance: float | None = None, scheduler: str = "default", init_image=None,
                 strength: float | None = None, timestep_spacing: str | None = None,
                 progress: Callable[[int, int], None] | None = None, mask_image=None,
                 controls: Sequence[ControlSpec | Control] = (), guidance_rescale: float = 0.0,
                 prompt_2: str | None = None, negative_prompt_2: str | None = None,
                 sizes: SizeConditioning | None = None) -> GenerateResult:
        """txt2img; img2img with init_image; inpainting with init_image and mask_image (1 / white
        repaints). None takes diffusers' defaults: guidance 7.5 (SDXL 5.0); strength 1.0 for
        inpainting, 0.8 for img2img (SDXL 0.3); the negative prompt "" (SDXL: zero embeddings where
        the folder's pipeline forces them). `controls`: one per ControlNet of the folder, in order
        (fewer leave the last ones out). SDXL only: prompt_2 and negative_prompt_2 (text_encoder_2's,
        the first ones where None) and `sizes` (its time ids)."""
        inpainting = mask_image is not None
        img2img = init_image is not None and not inpainting
        xl = self.sdxl is not None
        if guidance is None:
            guidance = sdxl.GUIDANCE if xl else GUIDANCE
        if strength is None:
            strength = sdxl.default_strength(inpainting) if xl else inpaint.default_strength(inpainting)
        prompts = sdxl.Prompts(*(None if text is None else clean_prompt(text)
                                 for text in (prompt, prompt_2, negative_prompt, negative_prompt_2)))
        sizes = sizes or SizeConditioning()
        self.check_inputs(init_image is not None, inpainting, len(controls), prompts, sizes)
        self._check_call(steps, guidance, init_image is not None, strength, seed, inpainting)
        check_guidance_rescale(guidance_rescale)
        # each control image at the UNet's batch, made once (the ControlNets run at that batch)
        controls = [replace(control, image=np.concatenate([control.image] * self.unet_batch))
                    for control in (prepare_control(c, i, self.height, self.width) for i, c in enumerate(controls))]
        timer = _Timer()
        self._memory = {}
        started = time.perf_counter()
        loaded_before = self.load_seconds
        seconds_before, calls_before = self.controlnet_seconds, self.controlnet_calls
        start = time.perf_counter()
        # SDXL's pipelines take the scheduler config as it is (no StableDiffusionPipeline fixes)
        sched = make_scheduler(scheduler, self.scheduler_config, timestep_spacing, pipeline_fixes=not xl)
        timer.add("setup", start)
        cfg = guidance > 1.0 and self.timestep_cond_dim is None
        if not self.low_memory:
            for name in (*self.required, *(("vae_encoder",) if init_image is not None else ()),
                         *(controlnet_name(i) for i in range(len(controls)))):
                self.component(name)
        for encoder in self.required[:2 if xl else 1]:  # loaded here so that each encoder times its model alone
            self.tokenizer_of(encoder)
        image_in = load_init_image(init_image, self.height, self.width) if init_image is not None else None
        mask = inpaint.load_mask(mask_image, self.height, self.width) if inpainting else None

        generator = TorchGenerator(seed)
        sched.set_timesteps(steps)
        painting = None
        if init_image is not None:
            timesteps = img2img_timesteps(sched, steps, strength)
        else:
            timesteps = sched.timesteps
            if xl and hasattr(sched, "set_begin_index"):
                sched.set_begin_index(0)  # as StableDiffusionXLPipeline (a repeated first timestep counts as step 0)
        if inpainting:
            latents, painting = self._inpaint_latents(image_in, mask, sched, timesteps, strength, generator, timer)
        elif img2img:
            latents = self._image_latents(image_in, sched, timesteps, generator, timer)
        else:
            latents = self._noise_latents(sched, generator)
        ids = sdxl.time_ids(sizes, self.height, self.width, init_image is not None,
                            self.sdxl.requires_aesthetics_score) if xl else None
        cond, uncond = self._encode_prompts(prompts, cfg, ids, timer)
        latents, unet_calls = self._denoise(latents, sched, timesteps, cond, uncond, guidance, generator,
                                            timer, progress, painting, controls, guidance_rescale)
        image = self._decode(latents, timer)

        total = len(timesteps)
        timings = {k: round(v, 4) for k, v in timer.seconds.items()}
        if controls:
            timings["controlnet"] = round(self.controlnet_seconds - seconds_before, 4)
        timings["unet_per_step"] = round(timer.seconds["unet"] / max(total, 1), 4)
        # loading (and with low_memory freeing) the interpreters, the tokenizer the first time
        timings["load"] = round(self.load_seconds - loaded_before, 4)
        timings["total"] = round(time.perf_counter() - started, 4)
        if self.loras.specs:
            timings["lora_switch"] = round(self.lora_seconds, 4)  # the last set_loras, before this picture
        settings = {
            "prompt": prompts.prompt,
            "negative_prompt": prompts.negative_prompt if xl else prompts.negative_prompt or "",
            "steps": steps, "seed": int(seed),
            "guidance": guidance, "classifier_free_guidance": cfg, "scheduler": sched.class_name,
            "guidance_embedding": self.timestep_cond_dim is not None,
            "denoising_steps": total, "unet_batch": self.unet_batch, "unet_calls": unet_calls,
            "backend": self.backend, "fallback_reason": self.fallback_reason,
            "height": self.height, "width": self.width, "low_memory": self.low_memory,
            "img2img": img2img, "inpaint": inpainting, "family": self.folder.family,
            **({"guidance_rescale": guidance_rescale} if guidance_rescale else {}),
            **({"strength": strength} if init_image is not None else {}),
            **({"inpainting_unet": self.inpainting_unet} if inpainting else {}),
            **({"controls": [{"scale": c.scale, "start": c.start, "end": c.end} for c in controls],
                "controlnet_calls": self.controlnet_calls - calls_before} if controls else {}),
            **({"timestep_spacing": timestep_spacing} if timestep_spacing else {}),
            **({"loras": self.loras.describe(), "lora_layers": self.loras.layer_counts()} if self.loras.specs else {}),
            **(self._sdxl_settings(prompts, ids, cfg) if xl else {}),
        }
        return GenerateResult(image=image, timings=timings, settings=settings, latents=latents, memory=self._memory)

    def _sdxl_settings(self, prompts: sdxl.Prompts, ids, cfg: bool) -> dict:
        zeros = cfg and prompts.zero_negative(self.sdxl.force_zeros_for_empty_prompt)
        return {"prompt_2": prompts.prompt_2, "negative_prompt_2": prompts.negative_prompt_2,
                "time_ids": ids[0], **({"negative_time_ids": ids[1]} if cfg else {}),
                "zero_negative_embeddings": zeros}

    def check_inputs(self, init_image: bool, mask: bool, controls: int = 0, prompts: sdxl.Prompts | None = None,
                     sizes: SizeConditioning | None = None) -> None:
        """What the folder can make from these pictures and options (before any picture is read): a
        mask needs the picture it repaints; a 9-channel (inpainting) UNet runs only with both; the
        second prompts and size conditioning are SDXL's."""
        if mask and not init_image:
            raise BadInput("--mask needs --init-image (the picture whose masked part is repainted)")
        if self.inpainting_unet and not mask:
            raise BadInput(f"{self.out / 'unet.tflite'}: an inpainting UNet ({inpaint_channels(self.channels)} input "
                           f"channels: latents, mask, masked picture's latents) runs only with --init-image and "
                           f"--mask; for text-to-image and img2img convert a text-to-image model")
        if self.sdxl is None:
            self._check_sd_options(prompts, sizes)
        else:
            self._check_sdxl_options(init_image, mask, controls, sizes)
        if controls:
            self.check_controls(controls, mask)

    def _check_sd_options(self, prompts: sdxl.Prompts | None, sizes: SizeConditioning | None) -> None:
        """SDXL's options on an SD 1.x / 2.x folder: refused, naming the first."""
        given = []
        if prompts is not None:
            given += [option for option, value in (("--prompt-2", prompts.prompt_2),
                                                   ("--negative-prompt-2", prompts.negative_prompt_2))
                      if value is not None]
        if sizes is not None:
            given += sizes.changed()
        if given:
            raise BadInput(f"{given[0]} is SDXL's (its second text encoder and size conditioning), but {self.out} "
                           f"is an SD 1.x / 2.x folder")

    def _check_sdxl_options(self, init_image: bool, mask: bool, controls: int, sizes: SizeConditioning | None) -> None:
        if controls:
            raise BadInput(f"--control-image: {self.out} is an SDXL folder, and SDXL ControlNets are not supported yet")
        if sizes is not None:
            sizes.check()
        aesthetics = self.sdxl.requires_aesthetics_score
        if aesthetics and not init_image:
            raise BadInput(f"{self.out}: its pipeline requires_aesthetics_score (an SDXL refiner): it runs "
                           f"img2img only (--init-image)")
        want = 5 if aesthetics else 6  # original size, crop, then the aesthetic score or the target size
        if self.sdxl.time_ids != want:
            raise BadInput(f"{self.out / 'unet.tflite'}: takes {self.sdxl.time_ids} time ids, but this pipeline "
                           f"makes {want} (requires_aesthetics_score is {str(aesthetics).lower()} in the manifest)")

    def _check_sdxl_unet(self, unet) -> None:
        """An SDXL UNet takes text_embeds [B, projection] and time_ids [B, n] beside its context."""
        embeds, ids = unet.input(sdxl.TEXT_EMBEDS), unet.input(sdxl.TIME_IDS)
        if embeds is None or ids is None or len(embeds.shape) != 2 or len(ids.shape) != 2 or \
                (embeds.shape[1], ids.shape[1]) != (self.sdxl.text_embeds, self.sdxl.time_ids):
            raise BadInput(f"{unet.path}: an SDXL UNet takes text_embeds [batch, {self.sdxl.text_embeds}] and "
                           f"time_ids [batch, {self.sdxl.time_ids}], as the manifest says (convert again)")

    def check_controls(self, count: int, mask: bool) -> None:
        """`count` control images need as many ControlNets in the folder (one image each, in order)."""
        have = len(self.folder.controlnets)
        if not have:
            raise BadInput(f"{self.out}: --control-image, but this folder has no ControlNet (convert with "
                           f"--controlnet CN)")
        if count > have:
            raise BadInput(f"--control-image given {count} times, but {self.out} has {have} ControlNet"
                           f"{'s' if have > 1 else ''} (one control image per ControlNet, in order)")
        if mask:
            raise BadInput("--control-image with --mask: ControlNet inpainting is not supported (yet); use one of them")

    def check_encoder(self, mask: bool) -> None:
        if not self.has_vae_encoder:
            what = "inpainting" if mask else "img2img"
            raise BadInput(f"{self.out / 'vae_encoder.tflite'}: missing ({what} needs it: {ENCODER_HINT})")

    def _check_call(self, steps, guidance, img2img: bool, strength, seed, mask: bool = False) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise BadInput(f"--steps {steps!r} must be a positive integer")
        # as diffusers' schedulers: no more steps than the timesteps the model was trained on
        trained = self.scheduler_config.get("num_train_timesteps", 1000)
        if steps > trained:
            raise BadInput(f"--steps {steps} must be at most {trained} (the scheduler's num_train_timesteps)")
        check_guidance(guidance)
        check_seed(seed)
        if not (0.0 < strength <= 1.0):
            raise BadInput(f"--strength {strength!r} must be in (0, 1]")
        if self.timestep_cond_dim is not None and self.unet_batch == 2:
            raise BadInput(f"{self.out / 'unet.tflite'}: batch 2, but this UNet takes the guidance scale as an "
                           f"embedding (timestep_cond, LCM-distilled) and runs without classifier-free guidance: "
                           f"convert with --batch 1")
        if guidance <= 1.0 and self.unet_batch == 2:
            raise BadInput(f"{self.out / 'unet.tflite'}: batch 2 (converted for classifier-free guidance), but "
                           f"--guidance {guidance} <= 1 runs without it: convert with --batch 1 for unguided "
                           f"(few-step) generation, or pass --guidance > 1")
        if not img2img:
            return
        if min(int(steps * strength), steps) < 1:
            raise BadInput(f"--strength {strength} x --steps {steps} leaves no denoising step")
        self.check_encoder(mask)

    def _noise_latents(self, sched, generator: TorchGenerator) -> np.ndarray:
        """txt2img: diffusers' prepare_latents."""
        shape = (1, self.channels, self.latent_height, self.latent_width)
        return generator.randn(shape) * np.float32(sched.init_noise_sigma)

    def _image_latents(self, image_in: np.ndarray, sched, timesteps, generator: TorchGenerator,
                       timer: _Timer) -> np.ndarray:
        """img2img: the VAE posterior sample of the picture, noised to the first kept timestep."""
        with self.stage("vae_encoder") as encoder:
            mean, std = _encode_picture(encoder, image_in, timer)
        # retrieve_latents(sample_mode="sample"): the posterior sample draws first ...
        init_latents = inpaint.posterior_sample(mean, std, generator)
        # ... then the noise for add_noise at the first kept timestep.
        noise = generator.randn(init_latents.shape)
        return sched.add_noise(init_latents, noise, timesteps[:1])

    def _inpaint_latents(self, image_in: np.ndarray, mask: np.ndarray, sched, timesteps, strength: float,
                         generator: TorchGenerator, timer: _Timer) -> tuple[np.ndarray, inpaint.Inpainting]:
        """Inpainting: the initial latents and what the loop adds (difflite.runtime.inpaint)."""
        with self.stage("vae_encoder") as encoder:
            shape = (1, self.channels, self.latent_height, self.latent_width)
            return inpaint.prepare(lambda picture: _encode_picture(encoder, picture, timer), image_in, mask, shape, self.inpainting_unet, sched, timesteps, strength,
                                   generator)

    def _encode_prompts(self, prompts: sdxl.Prompts, cfg: bool, ids, timer: _Timer):
        """(cond, uncond): each branch's UNet inputs besides the sample and timestep; uncond is None
        without classifier-free guidance. SD: the text encoder's context of the prompt and of the
        negative prompt ("" where None). SDXL: difflite.runtime.sdxl.conditioning with `ids` (the
        time ids), each text encoder loaded for its stage once."""
        if self.sdxl is None:
            texts = [prompts.prompt, *([prompts.negative_prompt or ""] if cfg else [])]
            contexts = self._run_encoder("text_encoder", self.encode_prompt, texts, timer)
            branches = [{CONTEXT: context} for context in contexts]
            return branches[0], branches[1] if cfg else None
        return sdxl.conditioning(prompts, lambda texts: self._run_encoder("text_encoder", self.encode_prompt, texts, timer),
                                 lambda texts: self._run_encoder("text_encoder_2", self.encode_prompt_2, texts, timer),
                                 ids, cfg, self.sdxl.force_zeros_for_empty_prompt)

    def _run_encoder(self, name: str, encode: Callable, texts: Sequence[str], timer: _Timer) -> list:
        """encode(text) for each text in the stage of the text encoder `name`, timed under its name."""
        with self.stage(name):
            start = time.perf_counter()
            outputs = [encode(text) for text in texts]
            timer.add(name, start)
        return outputs

    def _denoise(self, latents: np.ndarray, sched, timesteps, cond, uncond, guidance: float,
                 generator: TorchGenerator, timer: _Timer, progress: Callable[[int, int], None] | None,
                 painting: inpaint.Inpainting | None = None, controls: Sequence[Control] = (),
                 guidance_rescale: float = 0.0):
        """The scheduler loop; returns the final latents and the number of UNet calls. cond and
        uncond: each branch's UNet inputs (predict_noise); `painting`: inpainting's UNet input and
        blending (difflite.runtime.inpaint); `controls`: the ControlNets' (controlnet_0, ...), which
        run in the UNet's stage (timings: controlnet); guidance_rescale: guide's."""
        cfg = uncond is not None
        unet_seconds, unet_calls = 0.0, 0
        extra = {}
        if self.timestep_cond_dim is not None:
            extra[TIMESTEP_COND] = guidance_embedding([guidance] * self.unet_batch, self.timestep_cond_dim)
        weights = step_weights(controls, len(timesteps))
        with ExitStack() as stages:
            stages.enter_context(self.stage("unet"))
            for index in range(len(controls)):
                stages.enter_context(self.stage(controlnet_name(index)))
            for i, t in enumerate(timesteps):
                # scale_model_input is elementwise: scaling the latents once is scaling [latents] * 2
                sample = np.asarray(sched.scale_model_input(latents, t), dtype=np.float32)
                if painting is not None:
                    sample = painting.unet_sample(sample)
                start, control_before = time.perf_counter(), self.controlnet_seconds
                noise = self.predict_noise(sample, float(t), cond, uncond, extra, list(zip(controls, weights[i])))
                unet_seconds += time.perf_counter() - start - (self.controlnet_seconds - control_before)
                unet_calls += 1 if (self.unet_batch == 2 or not cfg) else 2
                noise = [np.asarray(n, dtype=np.float32) for n in noise]
                noise_pred = guide(noise, guidance, guidance_rescale)
                latents = np.asarray(sched.step(noise_pred, t, latents, generator=generator), dtype=np.float32)
                if painting is not None:
                    latents = painting.after_step(latents, sched, timesteps, i)
                if progress is not None:
                    progress(i + 1, len(timesteps))
        timer.seconds["unet"] = unet_seconds
        return latents, unet_calls

    def _decode(self, latents: np.ndarray, timer: _Timer) -> np.ndarray:
        """The VAE decoder's picture as float32 HWC in [0, 1]."""
        with self.stage("vae_decoder") as decoder:
            start = time.perf_counter()
            decoded = decoder(latent=latents)["image"]
            timer.add("vae_decoder", start)
        image = np.clip(np.asarray(decoded, dtype=np.float32) / np.float32(2) + np.float32(0.5), 0.0, 1.0)
        return np.ascontiguousarray(image[0].transpose(1, 2, 0))


def _encode_picture(encoder, picture: np.ndarray, timer: _Timer) -> tuple[np.ndarray, np.ndarray]:
    """The VAE encoder's scaled posterior (mean, std) of a [1, 3, H, W] picture in [-1, 1], timed."""
    start = time.perf_counter()
    encoded = encoder(image=picture)
    timer.add("vae_encoder", start)
    return (np.asarray(encoded["latent_mean"], dtype=np.float32),
            np.asarray(encoded["latent_std"], dtype=np.float32))


def generate(out, prompt: str, output=None, backend: str = "cpu", low_memory: bool = False, loras: Sequence = (),
             **kwargs) -> GenerateResult:
    """One picture from an output folder (with run-time `loras`, as LitePipeline.set_loras takes
    them); writes it to `output` (PNG) when given."""
    if output is not None:
        check_writable(output)
    with LitePipeline(out, backend=backend, low_memory=low_memory) as pipe:
        pipe.set_loras(loras)
        result = pipe(prompt, **kwargs)
    if output is not None:
        result.save(output)
    return result


# ---------------------------------------------------------------------------------------------
# The command


@click.command("generate")
@click.argument("out", type=click.Path())
@click.argument("prompt")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The PNG to write (written atomically).")
@click.option("--steps", default=20, show_default=True, type=int, help="Number of inference steps.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of torch.Generator('cpu') for the initial noise, as diffusers draws it.")
@click.option("--guidance", default=None, type=float,
              help="Classifier-free guidance scale; <= 1 disables guidance (one batch-1 UNet call a step, as "
                   "SDXL-Turbo runs with 0). An LCM-distilled UNet (input timestep_cond) takes it as an embedding "
                   "instead, in one pass. [default: 7.5; SDXL 5.0, diffusers' default]")
@click.option("--guidance-rescale", default=0.0, show_default=True, type=float,
              help="With guidance > 1: rescale the guided prediction towards the prompt's standard deviation by "
                   "this fraction in [0, 1], as diffusers' guidance_rescale (against over-exposure; 0.7 is the "
                   "paper's value); no effect without guidance.")
@click.option("--negative-prompt", default=None,
              help="The unconditional prompt [default: none, the empty prompt; SDXL: zero embeddings where the "
                   "source pipeline has force_zeros_for_empty_prompt (SDXL base's, diffusers' default), else the "
                   "empty prompt].")
@click.option("--prompt-2", default=None,
              help="SDXL: text_encoder_2's prompt [default: PROMPT].")
@click.option("--negative-prompt-2", default=None,
              help="SDXL: text_encoder_2's unconditional prompt [default: --negative-prompt].")
@click.option("--original-size", default=None, metavar="H,W",
              help="SDXL: the size conditioning's original size, height first, as diffusers' original_size "
                   "[default: the picture's size].")
@click.option("--crop", default="0,0", show_default=True, metavar="TOP,LEFT",
              help="SDXL: the crop conditioning's top-left corner (diffusers' crops_coords_top_left).")
@click.option("--target-size", default=None, metavar="H,W",
              help="SDXL: the target size conditioning, height first [default: the picture's size].")
@click.option("--negative-original-size", default=None, metavar="H,W",
              help="SDXL: the unconditional branch's original size (txt2img: used with --negative-target-size; "
                   "img2img: default --original-size).")
@click.option("--negative-crop", default="0,0", show_default=True, metavar="TOP,LEFT",
              help="SDXL: the unconditional branch's crop (txt2img, with both negative sizes; img2img takes "
                   "--crop there, as diffusers does).")
@click.option("--negative-target-size", default=None, metavar="H,W",
              help="SDXL: the unconditional branch's target size (txt2img: used with --negative-original-size; "
                   "img2img: default --target-size).")
@click.option("--scheduler", "scheduler", type=click.Choice(SCHEDULER_CHOICES), default="default", show_default=True,
              help="default = the class in OUT/scheduler/scheduler_config.json; euler-a and lcm draw noise at "
                   "every step from the seed's generator.")
@click.option("--timestep-spacing", type=click.Choice(SPACINGS), default=None,
              help="Override the config's timestep spacing (trailing for Turbo-style few-step models; default: "
                   "OUT/scheduler/scheduler_config.json's).")
@click.option("--backend", type=click.Choice(BACKEND_CHOICES), default="auto", show_default=True,
              help=BACKEND_HELP)
@click.option("--fallback", type=click.Choice(["none", "cpu"]), default="none", show_default=True,
              help="Where the GPU backend cannot run a model (no OpenCL or no GPU, a kernel that does not build, "
                   "memory the device refuses; for litert-gpu a file it does not load): none fails with exit 2 "
                   "and the reason; cpu warns with the reason and runs on the CPU backend.")
@click.option("--init-image", type=click.Path(), default=None,
              help="img2img: start from this picture, resized to the converted size (needs OUT/vae_encoder.tflite).")
@click.option("--mask", type=click.Path(), default=None,
              help="Inpainting, with --init-image: repaint the picture where this mask is white and keep it where "
                   "it is black, as diffusers' StableDiffusionInpaintPipeline: the mask is resized to the "
                   "converted size like the picture (any size: lanczos), made grayscale (an RGB or RGBA mask too) "
                   "and binarized at 0.5. An inpainting model's UNet (9 input channels) sees the mask and the "
                   "masked picture; a text-to-image UNet repaints by blending the kept part back after each step "
                   "(SDXL: as StableDiffusionXLInpaintPipeline). Needs OUT/vae_encoder.tflite.")
@click.option("--strength", default=None, type=float,
              help="img2img and inpainting: how much of the picture is re-noised, in (0, 1] [default: 0.8; 1.0 "
                   "with --mask, starting from pure noise; SDXL 0.3, and 0.9999 with --mask: diffusers' defaults].")
@click.option("--control-image", "control_images", multiple=True, type=click.Path(),
              help="ControlNet: steer the picture by this image (an edge map, a pose, a depth map...), one per "
                   "ControlNet of OUT (convert --controlnet), in order; repeatable. Resized to the converted size "
                   "(lanczos) and scaled to [0, 1], as diffusers' StableDiffusionControlNetPipeline does; several "
                   "ControlNets add their residuals (MultiControlNet).")
@click.option("--control-scale", "control_scales", multiple=True, type=float,
              help="ControlNet conditioning scale [default: 1.0]; once for every --control-image or once per image.")
@click.option("--control-start", "control_starts", multiple=True, type=float,
              help="The fraction of the steps at which a ControlNet starts acting [default: 0.0]; once or per "
                   "image.")
@click.option("--control-end", "control_ends", multiple=True, type=float,
              help="The fraction of the steps after which a ControlNet stops acting [default: 1.0]; once or per "
                   "image.")
@click.option("--control-preprocess", "control_preprocesses", multiple=True, type=click.Choice(PREPROCESS),
              help="none: the control image as given; canny: its edge map (OpenCV's Canny with --canny-low / "
                   "--canny-high, on the image as read) [default: none]; once or per image.")
@click.option("--canny-low", default=CANNY_LOW, show_default=True, type=float,
              help="--control-preprocess canny: the lower hysteresis threshold.")
@click.option("--canny-high", default=CANNY_HIGH, show_default=True, type=float,
              help="--control-preprocess canny: the upper hysteresis threshold.")
@click.option("--lora", "loras", multiple=True, metavar="FILE[:SCALE]",
              help="Apply a LoRA (diffusers/PEFT or kohya/A1111 .safetensors) at run time, scaled by SCALE (default "
                   "1.0); repeatable, several add up. OUT must have LoRA slots (convert --lora-slots, the "
                   "default) and the LoRA's rank, summed over the LoRAs given, at most its --lora-rank; the "
                   "base weights are not changed (for baking a LoRA in, see convert --lora).")
@click.option("--low-memory", is_flag=True,
              help="Trade load time for peak memory: load each model right before its stage and free it "
                   "right after (vae_encoder, text_encoder, text_encoder_2 for SDXL, unet, vae_decoder), so one is "
                   "resident at a time instead of all of them, for phones that cannot hold them together (the "
                   "ControlNets run beside the UNet, in its stage). Every picture then pays the loading "
                   "(timings: load); the picture is the same.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the settings, timings and memory (the peak resident MB after each stage) as JSON.")
def generate_command(out, prompt, output, steps, seed, guidance, guidance_rescale, negative_prompt, prompt_2,
                     negative_prompt_2, original_size, crop, target_size, negative_original_size, negative_crop,
                     negative_target_size, scheduler, timestep_spacing, backend, fallback, init_image, mask, strength,
                     control_images, control_scales, control_starts, control_ends, control_preprocesses, canny_low,
                     canny_high, loras, low_memory, as_json):
    """Make a picture from PROMPT with the .tflite files in OUT (txt2img, img2img with
    --init-image, inpainting with --init-image and --mask, steered by ControlNets with
    --control-image; an SDXL folder: txt2img, img2img and inpainting, with --prompt-2 and the
    size conditioning), the same picture diffusers' PyTorch pipeline makes from the same weights."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    output = check_writable(output)
    sizes = SizeConditioning(*(sdxl.parse_pair(option, text) for option, text in (
        ("--original-size", original_size), ("--crop", crop), ("--target-size", target_size),
        ("--negative-original-size", negative_original_size), ("--negative-crop", negative_crop),
        ("--negative-target-size", negative_target_size))))
    choice = choose_backend(backend)
    pipe = LitePipeline(out, backend=choice.backend, low_memory=low_memory, fallback=fallback)
    specs = specs_from_options(control_images, control_scales, control_starts, control_ends, control_preprocesses,
                               canny_low, canny_high)
    pipe.check_inputs(init_image is not None, mask is not None, len(specs),
                      sdxl.Prompts(prompt, prompt_2, negative_prompt, negative_prompt_2), sizes)
    # the pictures are read (and refused) before any model loads; only their resized copies are kept
    if init_image is not None:
        init_image = fit_init_image(init_image, pipe.height, pipe.width)
    if mask is not None:
        mask = inpaint.fit_mask(mask, pipe.height, pipe.width)
    controls = [prepare_control(spec, i, pipe.height, pipe.width) for i, spec in enumerate(specs)]
    if init_image is not None:
        pipe.check_encoder(mask is not None)
    pipe.set_loras(loras)  # every file read and checked before any model loads
    console = Console(stderr=True)
    with pipe, Progress(TextColumn("[difflite] denoising"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("denoising", total=None)

        def progress(done, total):
            if done == 1 and not as_json:  # said once the inputs are checked and the models load (--json: recorded)
                console.print(choice.line(), markup=False, highlight=False, soft_wrap=True)
            bar.update(task, completed=done, total=total)

        result = pipe(prompt, negative_prompt=negative_prompt, steps=steps, seed=seed, guidance=guidance,
                      scheduler=scheduler, init_image=init_image, mask_image=mask, strength=strength,
                      timestep_spacing=timestep_spacing, progress=progress, controls=controls,
                      guidance_rescale=guidance_rescale, prompt_2=prompt_2, negative_prompt_2=negative_prompt_2,
                      sizes=sizes)
    path = result.save(output)
    if as_json:
        click.echo(json.dumps({"output": str(path), "settings": result.settings, "timings": result.timings,
                               "memory_mb": result.memory, "backend_choice": choice.as_dict()},
                              indent=2, sort_keys=True))
    else:
        t = result.timings
        click.echo(f"wrote {path} ({result.settings['width']}x{result.settings['height']}, "
                   f"{result.settings['scheduler']}, {result.settings['denoising_steps']} steps) in "
                   f"{t['total']:.1f} s (UNet {t['unet']:.1f} s, {t['unet_per_step']:.2f} s/step)")


__all__ = [
    "GenerateResult",
    "LitePipeline",
    "SizeConditioning",
    "generate",
    "generate_command",
    "load_init_image",
    "save_png",
]
