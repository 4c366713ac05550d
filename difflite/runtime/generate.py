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
- the stages run (img2img, inpainting: vae_encoder), text_encoder, unet, vae_decoder; the VAE
  encoder's stage runs before any draw from the generator, so loading each model just for its
  stage (low_memory) gives the same picture.

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
from difflite.folder.output_folder import OutputFolder, inpaint_channels
from difflite.folder.tokenizer import PromptTokenizer, clean_prompt
from difflite.runtime import inpaint
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

REQUIRED_COMPONENTS = ("text_encoder", "unet", "vae_decoder")
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
    """An output folder as a Stable Diffusion pipeline (txt2img, img2img and inpainting) on LiteRT.

    >>> pipe = LitePipeline("out/tiny")
    >>> result = pipe("a photo of an astronaut", steps=20, seed=0, guidance=7.5)
    >>> result.save("astronaut.png")
    >>> pipe("a red car", init_image="street.png", mask_image="car-mask.png").save("car.png")
    >>> pipe.set_loras(["style.safetensors:0.8", "detail.safetensors"])  # from the next picture on
    >>> pipe("a red car").save("styled.png")
    >>> pipe.set_loras([])  # the base model again
    >>> pipe.close()

    The models stay loaded across calls. With `low_memory`, each is loaded right before its
    stage and freed right after it ((img2img, inpainting: vae_encoder), text_encoder, unet, vae_decoder):
    one interpreter alive at a time, for the price of loading them again for every picture.
    """

    def __init__(self, out, backend: str = "cpu", threads: int | None = None, low_memory: bool = False,
                 fallback: str = "none"):
        from difflite.runtime.component import check_fallback

        check_fallback(fallback)
        self.out = Path(out)
        self.folder = OutputFolder.read(self.out)
        self.folder.require_sd()
        self.backend = backend
        # "cpu": a model the OpenCL backend cannot load runs on the CPU backend, and so does every
        # later one (fallback_reason says why, once, on stderr and in the settings)
        self.fallback = fallback
        self.fallback_reason: str | None = None
        self.threads = threads
        self.low_memory = low_memory
        for name in REQUIRED_COMPONENTS:
            if name not in self.folder.components:
                raise BadInput(f"{self.out / (name + '.tflite')}: not in this output folder "
                               f"(convert with --components {','.join(REQUIRED_COMPONENTS)})")
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
        if not self.tokenizer_dir.is_dir():
            raise BadInput(f"{self.tokenizer_dir}: missing (the output folder is incomplete: convert again)")
        if not config_path.is_file():
            raise BadInput(f"{config_path}: missing (the output folder is incomplete: convert again)")
        self.scheduler_config = read_json(config_path, what="scheduler config")
        if not isinstance(self.scheduler_config, dict):
            raise BadInput(f"{config_path}: not a scheduler config (expected a JSON object)")
        self._components: dict = {}
        self._tokenizer: PromptTokenizer | None = None
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
        self.lora_seconds = time.perf_counter() - start

    def lora_bytes(self) -> int:
        """Bytes the loaded models hold for run-time LoRAs (Component.lora_bytes), all together."""
        return sum(c.lora_bytes() for c in self._components.values())

    def _apply_loras(self, name: str, component) -> None:
        if component.lora.slots is not None:
            component.set_lora(self.loras.for_component(name))

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

    @property
    def tokenizer(self) -> PromptTokenizer:
        if self._tokenizer is None:
            start = time.perf_counter()
            vocabulary = self.folder.components["text_encoder"].token_vocabulary()
            self._tokenizer = PromptTokenizer(self.tokenizer_dir, self.text_length, vocabulary)
            self.load_seconds += time.perf_counter() - start
        return self._tokenizer

    def encode_prompt(self, text: str) -> np.ndarray:
        out = self.component("text_encoder")(input_ids=self.tokenizer(text))
        return out["last_hidden_state"].astype(np.float32)

    def predict_noise(self, sample: np.ndarray, t: float, cond: np.ndarray, uncond: np.ndarray | None,
                      extra: dict | None = None, controls: Sequence[tuple[Control, float]] = ()):
        """noise_pred for the [1,C,h,w] (already scaled) sample: [uncond, cond] when uncond is
        given (classifier-free guidance), else cond alone; returns one array per branch. A batch-2
        UNet only runs with guidance (_check_call). `extra`: further UNet inputs (timestep_cond);
        `controls`: (control, its weight at this step) for controlnet_0, controlnet_1, ..."""
        unet = self.component("unet")
        extra = extra or {}
        branches = [cond] if uncond is None else [uncond, cond]
        if self.unet_batch == 2:
            sample2 = np.concatenate([sample, sample])
            timestep = np.full((2,), t, dtype=np.float32)
            context = np.concatenate(branches)
            residuals = self.control_residuals(sample2, timestep, context, controls)
            noise = unet(sample=sample2, timestep=timestep, encoder_hidden_states=context, **residuals, **extra)
            return [noise["noise_pred"][0:1], noise["noise_pred"][1:2]]
        timestep = np.full((1,), t, dtype=np.float32)
        single = sample[0:1]
        return [unet(sample=single, timestep=timestep, encoder_hidden_states=c,
                     **self.control_residuals(single, timestep, c, controls), **extra)["noise_pred"]
                for c in branches]

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

    def __call__(self, prompt: str, negative_prompt: str = "", steps: int = 20, seed: int = 0,
                 guidance: float = 7.5, scheduler: str = "default", init_image=None, strength: float | None = None,
                 timestep_spacing: str | None = None, progress: Callable[[int, int], None] | None = None,
                 mask_image=None, controls: Sequence[ControlSpec | Control] = ()) -> GenerateResult:
        """txt2img; img2img with init_image; inpainting with init_image and mask_image (1 / white
        repaints). strength None: diffusers' default, 1.0 for inpainting, 0.8 for img2img.
        `controls`: one per ControlNet of the folder, in order (fewer leave the last ones out)."""
        inpainting = mask_image is not None
        img2img = init_image is not None and not inpainting
        if strength is None:
            strength = inpaint.default_strength(inpainting)
        prompt, negative_prompt = clean_prompt(prompt), clean_prompt(negative_prompt)
        self.check_inputs(init_image is not None, inpainting, len(controls))
        self._check_call(steps, guidance, init_image is not None, strength, seed, inpainting)
        # each control image at the UNet's batch, made once (the ControlNets run at that batch)
        controls = [replace(control, image=np.concatenate([control.image] * self.unet_batch))
                    for control in (prepare_control(c, i, self.height, self.width) for i, c in enumerate(controls))]
        timer = _Timer()
        started = time.perf_counter()
        loaded_before = self.load_seconds
        seconds_before, calls_before = self.controlnet_seconds, self.controlnet_calls
        start = time.perf_counter()
        sched = make_scheduler(scheduler, self.scheduler_config, timestep_spacing)
        timer.add("setup", start)
        cfg = guidance > 1.0 and self.timestep_cond_dim is None
        if not self.low_memory:
            for name in (*REQUIRED_COMPONENTS, *(("vae_encoder",) if init_image is not None else ()),
                         *(controlnet_name(i) for i in range(len(controls)))):
                self.component(name)
        self.tokenizer  # noqa: B018 (loaded here so that text_encoder times the model alone)
        image_in = load_init_image(init_image, self.height, self.width) if init_image is not None else None
        mask = inpaint.load_mask(mask_image, self.height, self.width) if inpainting else None

        generator = TorchGenerator(seed)
        sched.set_timesteps(steps)
        painting = None
        if init_image is not None:
            timesteps = img2img_timesteps(sched, steps, strength)
        else:
            timesteps = sched.timesteps
        if inpainting:
            latents, painting = self._inpaint_latents(image_in, mask, sched, timesteps, strength, generator, timer)
        elif img2img:
            latents = self._image_latents(image_in, sched, timesteps, generator, timer)
        else:
            latents = self._noise_latents(sched, generator)
        cond, uncond = self._encode_prompts(prompt, negative_prompt if cfg else None, timer)
        latents, unet_calls = self._denoise(latents, sched, timesteps, cond, uncond, guidance, generator,
                                            timer, progress, painting, controls)
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
            "prompt": prompt, "negative_prompt": negative_prompt, "steps": steps, "seed": int(seed),
            "guidance": guidance, "classifier_free_guidance": cfg, "scheduler": sched.class_name,
            "guidance_embedding": self.timestep_cond_dim is not None,
            "denoising_steps": total, "unet_batch": self.unet_batch, "unet_calls": unet_calls,
            "backend": self.backend, "fallback_reason": self.fallback_reason,
            "height": self.height, "width": self.width, "low_memory": self.low_memory,
            "img2img": img2img, "inpaint": inpainting,
            **({"strength": strength} if init_image is not None else {}),
            **({"inpainting_unet": self.inpainting_unet} if inpainting else {}),
            **({"controls": [{"scale": c.scale, "start": c.start, "end": c.end} for c in controls],
                "controlnet_calls": self.controlnet_calls - calls_before} if controls else {}),
            **({"timestep_spacing": timestep_spacing} if timestep_spacing else {}),
            **({"loras": self.loras.describe(), "lora_layers": self.loras.layer_counts()} if self.loras.specs else {}),
        }
        return GenerateResult(image=image, timings=timings, settings=settings, latents=latents)

    def check_inputs(self, init_image: bool, mask: bool, controls: int = 0) -> None:
        """What the folder can make from these pictures (before any is read): a mask needs the
        picture it repaints; a 9-channel (inpainting) UNet runs only with both."""
        if mask and not init_image:
            raise BadInput("--mask needs --init-image (the picture whose masked part is repainted)")
        if self.inpainting_unet and not mask:
            raise BadInput(f"{self.out / 'unet.tflite'}: an inpainting UNet ({inpaint_channels(self.channels)} input "
                           f"channels: latents, mask, masked picture's latents) runs only with --init-image and "
                           f"--mask; for text-to-image and img2img convert a text-to-image model")
        if controls:
            self.check_controls(controls, mask)

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

    def _encode_prompts(self, prompt: str, negative_prompt: str | None, timer: _Timer):
        """(cond, uncond); uncond is None without a negative prompt (no classifier-free guidance)."""
        with self.stage("text_encoder"):
            start = time.perf_counter()
            cond = self.encode_prompt(prompt)
            uncond = None if negative_prompt is None else self.encode_prompt(negative_prompt)
            timer.add("text_encoder", start)
        return cond, uncond

    def _denoise(self, latents: np.ndarray, sched, timesteps, cond, uncond, guidance: float,
                 generator: TorchGenerator, timer: _Timer, progress: Callable[[int, int], None] | None,
                 painting: inpaint.Inpainting | None = None, controls: Sequence[Control] = ()):
        """The scheduler loop; returns the final latents and the number of UNet calls. `painting`:
        inpainting's UNet input and blending (difflite.runtime.inpaint); `controls`: the
        ControlNets' (controlnet_0, ...), which run in the UNet's stage (timings: controlnet)."""
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
                noise_pred = noise[0] + np.float32(guidance) * (noise[1] - noise[0]) if cfg else noise[0]
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
@click.option("--guidance", default=7.5, show_default=True, type=float,
              help="Classifier-free guidance scale; <= 1 disables guidance. An LCM-distilled UNet (input "
                   "timestep_cond) takes it as an embedding instead, in one pass.")
@click.option("--negative-prompt", default="", show_default=True, help="The unconditional prompt.")
@click.option("--scheduler", "scheduler", type=click.Choice(SCHEDULER_CHOICES), default="default", show_default=True,
              help="default = the class in OUT/scheduler/scheduler_config.json; euler-a and lcm draw noise at "
                   "every step from the seed's generator.")
@click.option("--timestep-spacing", type=click.Choice(SPACINGS), default=None,
              help="Override the config's timestep spacing (trailing for Turbo-style few-step models).")
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
                   "masked picture; a text-to-image UNet repaints by blending the kept part back after each step. "
                   "Needs OUT/vae_encoder.tflite.")
@click.option("--strength", default=None, type=float,
              help="img2img and inpainting: how much of the picture is re-noised, in (0, 1] [default: 0.8; 1.0 "
                   "with --mask, starting from pure noise: diffusers' defaults].")
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
                   "right after (vae_encoder, text_encoder, unet, vae_decoder), so one is resident at a time "
                   "instead of all three, for phones that cannot hold them together (the ControlNets run beside "
                   "the UNet, in its stage). Every picture then pays the loading (timings: load); the picture is "
                   "the same.")
@click.option("--json", "as_json", is_flag=True, help="Print the settings and timings as JSON.")
def generate_command(out, prompt, output, steps, seed, guidance, negative_prompt, scheduler, timestep_spacing,
                     backend, fallback, init_image, mask, strength, control_images, control_scales, control_starts,
                     control_ends, control_preprocesses, canny_low, canny_high, loras, low_memory, as_json):
    """Make a picture from PROMPT with the .tflite files in OUT (txt2img, img2img with
    --init-image, inpainting with --init-image and --mask, steered by ControlNets with
    --control-image), the same picture diffusers' PyTorch pipeline makes from the same weights."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    output = check_writable(output)
    choice = choose_backend(backend)
    pipe = LitePipeline(out, backend=choice.backend, low_memory=low_memory, fallback=fallback)
    specs = specs_from_options(control_images, control_scales, control_starts, control_ends, control_preprocesses,
                               canny_low, canny_high)
    pipe.check_inputs(init_image is not None, mask is not None, len(specs))
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
                      timestep_spacing=timestep_spacing, progress=progress, controls=controls)
    path = result.save(output)
    if as_json:
        click.echo(json.dumps({"output": str(path), "settings": result.settings, "timings": result.timings,
                               "backend_choice": choice.as_dict()},
                              indent=2, sort_keys=True))
    else:
        t = result.timings
        click.echo(f"wrote {path} ({result.settings['width']}x{result.settings['height']}, "
                   f"{result.settings['scheduler']}, {result.settings['denoising_steps']} steps) in "
                   f"{t['total']:.1f} s (UNet {t['unet']:.1f} s, {t['unet_per_step']:.2f} s/step)")


__all__ = [
    "GenerateResult",
    "LitePipeline",
    "generate",
    "generate_command",
    "load_init_image",
    "save_png",
]
