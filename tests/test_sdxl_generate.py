"""`difflite generate` on an SDXL folder (issue 32, item 6) against diffusers' own
StableDiffusionXLPipeline / StableDiffusionXLImg2ImgPipeline / StableDiffusionXLInpaintPipeline on
the same preset weights: txt2img with several schedulers, both prompts and negative prompts (and
the zero unconditional embeddings diffusers uses without one), non-default time ids, guidance
rescale, batch-1 and batch-2 UNets, img2img, inpainting with the base UNet and with a 9-channel
inpainting UNet, SDXL-Turbo-style unguided 1-2 step runs; --low-memory; the command line and its
refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from support.cli import convert_side_by_side, run_difflite
from support.numerics import psnr
from support.torch_threads import one_torch_thread

from difflite.core.errors import BadInput
from difflite.runtime.sdxl import SizeConditioning, time_ids

HEIGHT, WIDTH = 64, 96  # non-square: the time ids' (height, width) order shows
PROMPT = "a photo of an astronaut riding a horse"
TINY_PSNR_DB = 60.0  # as tests/test_generate.py: fp32 LiteRT vs PyTorch lands far above it
STEPS = 3
SDXL_COMPONENTS = "text_encoder,text_encoder_2,unet,vae_decoder"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """preset:sdxl-tiny at 64x96, builtins only (no op library): batch 1 with its default
    components (the VAE encoder among them), batch 2 without the VAE encoder; its 9-channel
    inpainting form (preset:sdxl-tiny-inpaint); and preset:tiny (SD 1.x) for the SDXL-only
    options' refusals. Converted side by side by the console script."""
    base = tmp_path_factory.mktemp("sdxl-generate")
    out = {1: base / "b1", 2: base / "b2", "sd": base / "sd", "inpaint": base / "inpaint"}
    size = ["--height", HEIGHT, "--width", WIDTH, "--no-fuse"]
    convert_side_by_side({
        "batch 1": ["preset:sdxl-tiny", "-o", out[1], *size],
        "batch 2": ["preset:sdxl-tiny", "-o", out[2], *size, "--batch", 2, "--components", SDXL_COMPONENTS],
        "sd": ["preset:tiny", "-o", out["sd"], "--height", 64, "--width", 64, "--no-fuse"],
        "inpaint": ["preset:sdxl-tiny-inpaint", "-o", out["inpaint"], *size],
    })
    return out


@pytest.fixture(scope="module")
def lite(folders):
    from difflite.runtime.generate import LitePipeline

    pipes = {batch: LitePipeline(folders[batch]) for batch in (1, 2)}
    yield pipes
    for pipe in pipes.values():
        pipe.close()


class Reference:
    """diffusers' SDXL pipelines on the output folder's source modules (preset:sdxl-tiny's seeded
    weights), results cached."""

    def __init__(self, folder: Path):
        from difflite.folder.output_folder import OutputFolder
        from difflite.verify import load_source

        self.source = load_source(OutputFolder.read(folder), None, None)
        assert self.source.family == "sdxl"
        self.cache: dict = {}

    def pipeline(self, scheduler: str, kind: str, spacing: str | None, force_zeros: bool):
        from diffusers import (
            StableDiffusionXLImg2ImgPipeline,
            StableDiffusionXLInpaintPipeline,
            StableDiffusionXLPipeline,
        )

        from difflite.diffusers_schedulers import diffusers_scheduler

        s = self.source
        cls = {"txt2img": StableDiffusionXLPipeline, "img2img": StableDiffusionXLImg2ImgPipeline,
               "inpaint": StableDiffusionXLInpaintPipeline}[kind]
        pipe = cls(vae=s.vae, text_encoder=s.text_encoder, text_encoder_2=s.text_encoder_2, tokenizer=s.tokenizer,
                   tokenizer_2=s.tokenizer_2, unet=s.unet,
                   scheduler=diffusers_scheduler(scheduler, s.scheduler_config, spacing, pipeline_fixes=False),
                   force_zeros_for_empty_prompt=force_zeros, add_watermarker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def __call__(self, scheduler="default", steps=STEPS, seed=3, guidance=5.0, spacing=None, force_zeros=True,
                 image=None, mask_image=None, **kwargs) -> np.ndarray:
        pictures = [None if p is None else p.tobytes().hex()[:64] for p in (image, mask_image)]
        key = json.dumps([scheduler, steps, seed, guidance, spacing, force_zeros, pictures, sorted(kwargs.items())],
                         default=str)
        if key not in self.cache:
            kind = "txt2img" if image is None else "img2img" if mask_image is None else "inpaint"
            if mask_image is not None:
                kwargs["mask_image"] = mask_image
            with one_torch_thread():
                pipe = self.pipeline(scheduler, kind, spacing, force_zeros)
                call = {"num_inference_steps": steps, "guidance_scale": guidance, "output_type": "np",
                        "generator": torch.Generator("cpu").manual_seed(seed), **kwargs}
                # img2img takes the picture's size; the others the model's default unless given
                sized = {} if kind == "img2img" else {"height": HEIGHT, "width": WIDTH}
                result = pipe(**({} if image is None else {"image": image}), **sized, **call)
            self.cache[key] = result.images[0]
        return self.cache[key]


@pytest.fixture(scope="module")
def reference(folders) -> Reference:
    return Reference(folders[1])


def init_image(seed=0) -> Image.Image:
    """A smooth picture with some noise at the converted size."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = np.stack([x / WIDTH, y / HEIGHT, 0.5 + 0.5 * np.sin(x / 5.0) * np.cos(y / 7.0)], axis=-1)
    pixels = np.clip(base + 0.1 * rng.standard_normal((HEIGHT, WIDTH, 3)), 0, 1)
    return Image.fromarray((pixels * 255).round().astype(np.uint8))


def ours_and_diffusers(kwargs: dict) -> tuple[dict, dict]:
    """The same call as LitePipeline and diffusers take it (SizeConditioning -> diffusers' names)."""
    ours, theirs = dict(kwargs), dict(kwargs)
    sizes = ours.get("sizes")
    if sizes is not None:
        del theirs["sizes"]
        theirs.update({k: v for k, v in sizes.__dict__.items() if v is not None and "aesthetic" not in k})
    for ours_name, their_name in (("guidance", "guidance_scale"),):
        if ours_name in theirs:
            theirs[their_name] = theirs.pop(ours_name)
    return ours, theirs


def check_parity(result, expected, label: str) -> float:
    assert result.image.shape == expected.shape == (HEIGHT, WIDTH, 3)
    assert expected.std() > 0.02, "the reference picture is flat: the parity check would mean nothing"
    value = psnr(result.image, expected)
    print(f"{label}: PSNR {value:.1f} dB")
    assert value >= TINY_PSNR_DB, f"{label}: {value:.1f} dB"
    return value


SIZES = SizeConditioning(original_size=(128, 160), crops_coords_top_left=(8, 24), target_size=(96, 64))
NEGATIVE_SIZES = SizeConditioning(negative_original_size=(32, 48), negative_crops_coords_top_left=(4, 0),
                                  negative_target_size=(64, 64))


# ---------------------------------------------------------------------------------------------
# Parity


TXT2IMG = {
    # no negative prompt: force_zeros_for_empty_prompt's zero unconditional embeddings
    "default": ("default", 1, {}),
    "euler-a prompt_2 negative": ("euler-a", 1, {"prompt_2": "an oil painting", "negative_prompt": "blurry"}),
    "dpm++-2m-karras negative_2 batch 2": ("dpm++-2m-karras", 2, {"negative_prompt": "blurry",
                                                                   "negative_prompt_2": "dark, grainy"}),
    # at guidance 12 the rescale moves the picture by ~37 dB (test_the_conditioning_matters)
    "ddim sizes rescale": ("ddim", 1, {"negative_prompt": "", "sizes": SIZES, "guidance_rescale": 0.7,
                                       "guidance": 12.0}),
    "euler negative sizes batch 2": ("euler", 2, {"negative_prompt": "blurry", "sizes": NEGATIVE_SIZES,
                                                  "guidance": 7.0}),
}


@pytest.mark.parametrize("case", list(TXT2IMG))
def test_txt2img_matches_diffusers(lite, reference, case):
    scheduler, batch, kwargs = TXT2IMG[case]
    ours, theirs = ours_and_diffusers(kwargs)
    result = lite[batch](PROMPT, steps=STEPS, seed=3, scheduler=scheduler, **ours)
    check_parity(result, reference(scheduler, prompt=PROMPT, **theirs), f"txt2img {case}")
    settings = result.settings
    assert settings["family"] == "sdxl" and settings["classifier_free_guidance"]
    assert settings["zero_negative_embeddings"] == ("negative_prompt" not in kwargs)
    assert settings["unet_calls"] == (2 if batch == 1 else 1) * STEPS
    assert settings["guidance"] == kwargs.get("guidance", 5.0)  # SDXL's default guidance


def test_time_ids_as_diffusers_builds_them():
    """(height, width) sizes; txt2img's negative ids only with both negative sizes; img2img's
    negative sizes default to the positive ones and take the positive crop; a refiner's
    aesthetic scores."""
    assert time_ids(SizeConditioning(), 64, 96, False) == ([64, 96, 0, 0, 64, 96],) * 2
    assert time_ids(SIZES, 64, 96, False) == ([128, 160, 8, 24, 96, 64],) * 2
    assert time_ids(NEGATIVE_SIZES, 64, 96, False) == ([64, 96, 0, 0, 64, 96], [32, 48, 4, 0, 64, 64])
    half = SizeConditioning(negative_original_size=(32, 48), negative_crops_coords_top_left=(4, 0))
    assert time_ids(half, 64, 96, False) == ([64, 96, 0, 0, 64, 96],) * 2
    assert time_ids(replace(NEGATIVE_SIZES, crops_coords_top_left=(2, 2)), 64, 96, True) == \
        ([64, 96, 2, 2, 64, 96], [32, 48, 2, 2, 64, 64])
    assert time_ids(replace(SIZES, negative_crops_coords_top_left=(4, 0)), 64, 96, True, aesthetics=True) == \
        ([128, 160, 8, 24, 6.0], [128, 160, 4, 0, 2.5])


@pytest.mark.parametrize("name", ["euler", "ddim"])
def test_sdxl_schedulers_take_the_config_as_it_is(name):
    """SDXL's pipelines do not apply StableDiffusionPipeline's steps_offset fix: a config of
    steps_offset 0 keeps it, in the NumPy port as in diffusers."""
    from difflite.compiler.presets import preset_configs
    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.runtime.schedulers import make_scheduler

    config = {**preset_configs("sdxl-tiny")["scheduler"], "steps_offset": 0}
    ours, theirs = make_scheduler(name, config, pipeline_fixes=False), diffusers_scheduler(name, config, None, False)
    fixed = make_scheduler(name, config)
    for scheduler in (ours, theirs, fixed):
        scheduler.set_timesteps(4)
    assert np.array_equal(ours.timesteps, theirs.timesteps.numpy())
    assert not np.array_equal(ours.timesteps, fixed.timesteps)


def test_the_conditioning_matters(lite, reference):
    """Another second prompt, time ids, empty-vs-no negative prompt or guidance rescale lands far
    below the bar: passing it means the same conditioning."""
    expected = reference("euler", prompt=PROMPT, negative_prompt="blurry")
    base = {"negative_prompt": "blurry", "scheduler": "euler", "steps": STEPS, "seed": 3}
    assert psnr(lite[1](PROMPT, **base).image, expected) >= TINY_PSNR_DB
    for change in ({"prompt_2": "a red car"}, {"negative_prompt_2": "sharp"}, {"negative_prompt": None},
                   {"sizes": SizeConditioning(original_size=(512, 768), crops_coords_top_left=(64, 128))}):
        image = lite[1](PROMPT, **{**base, **change}).image
        assert psnr(image, expected) < TINY_PSNR_DB - 10, change
    strong = {**base, "guidance": 12.0}
    assert psnr(lite[1](PROMPT, **strong).image, lite[1](PROMPT, guidance_rescale=0.7, **strong).image) < \
        TINY_PSNR_DB - 10


def test_without_force_zeros_the_empty_prompt_is_encoded(folders, reference):
    """A pipeline without force_zeros_for_empty_prompt (the manifest's flag) encodes "" instead."""
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(folders[1]) as pipe:
        pipe.sdxl = replace(pipe.sdxl, force_zeros_for_empty_prompt=False)
        result = pipe(PROMPT, steps=STEPS, seed=3, scheduler="euler")
    check_parity(result, reference("euler", prompt=PROMPT, force_zeros=False), "txt2img force_zeros off")
    assert result.settings["zero_negative_embeddings"] is False


@pytest.mark.parametrize("scheduler,strength,kwargs", [
    ("euler", 0.6, {"negative_prompt": "blurry", "prompt_2": "an oil painting"}),
    ("ddim", None, {"sizes": replace(SIZES, negative_original_size=(48, 48)), "guidance_rescale": 0.5}),
])
def test_img2img_matches_diffusers(lite, reference, scheduler, strength, kwargs):
    """StableDiffusionXLImg2ImgPipeline: strength None is its default, 0.3."""
    steps = 10 if strength is None else 5
    ours, theirs = ours_and_diffusers(kwargs)
    result = lite[1]("a red car", steps=steps, seed=5, scheduler=scheduler, init_image=init_image(),
                     strength=strength, **ours)
    expected = reference(scheduler, steps=steps, seed=5, image=init_image(), prompt="a red car",
                         strength=0.3 if strength is None else strength, **theirs)
    check_parity(result, expected, f"img2img {scheduler} strength {strength}")
    assert result.settings["strength"] == (0.3 if strength is None else strength)
    assert result.settings["denoising_steps"] == int(steps * result.settings["strength"])


def mask_image(rows=slice(20, 90), cols=slice(30, 150)) -> Image.Image:
    """White (repaint) over a rectangle, black (keep) elsewhere, at twice the converted size:
    resized like the picture."""
    mask = np.zeros((2 * HEIGHT, 2 * WIDTH), np.uint8)
    mask[rows, cols] = 255
    return Image.fromarray(mask, "L")


@pytest.mark.parametrize("scheduler,strength,kwargs", [
    ("euler", None, {}),
    ("ddim", 1.0, {"negative_prompt": "blurry", "prompt_2": "an oil painting"}),
    ("dpm++-2m-karras", 0.6, {"sizes": replace(SIZES, negative_original_size=(48, 48)), "guidance_rescale": 0.5}),
])
def test_inpainting_matches_diffusers(lite, reference, scheduler, strength, kwargs):
    """StableDiffusionXLInpaintPipeline with the base (4-channel) UNet: the kept part blended back
    after each step. strength None is its default, 0.9999 (the picture's latents noised, one step
    fewer); 1.0 starts from pure noise."""
    steps = 5
    ours, theirs = ours_and_diffusers(kwargs)
    result = lite[1]("a red car", steps=steps, seed=11, scheduler=scheduler, init_image=init_image(),
                     mask_image=mask_image(), strength=strength, **ours)
    expected = reference(scheduler, steps=steps, seed=11, image=init_image(), mask_image=mask_image(),
                         prompt="a red car", strength=0.9999 if strength is None else strength, **theirs)
    check_parity(result, expected, f"inpainting {scheduler} strength {strength}")
    assert result.settings["inpaint"] and result.settings["strength"] == (0.9999 if strength is None else strength)
    assert result.settings["denoising_steps"] == int(steps * result.settings["strength"])


@pytest.mark.parametrize("scheduler,strength", [("euler-a", None), ("dpm++-2m-karras", 1.0)])
def test_inpainting_unet_matches_diffusers(folders, scheduler, strength):
    """An SDXL inpainting model (a 9-channel UNet: latents, mask, masked picture's latents) as
    StableDiffusionXLInpaintPipeline runs it."""
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(folders["inpaint"]) as pipe:
        assert pipe.inpainting_unet
        result = pipe("a red car", steps=4, seed=6, scheduler=scheduler, init_image=init_image(),
                      mask_image=mask_image(), strength=strength, negative_prompt="blurry")
    expected = Reference(folders["inpaint"])(scheduler, steps=4, seed=6, image=init_image(), mask_image=mask_image(),
                                             prompt="a red car", negative_prompt="blurry",
                                             strength=0.9999 if strength is None else strength)
    check_parity(result, expected, f"9-channel inpainting {scheduler} strength {strength}")
    assert result.settings["inpainting_unet"]


def test_an_inpainting_unet_needs_the_picture_and_the_mask(folders, tmp_path):
    run = run_difflite("generate", folders["inpaint"], "a cat", "-o", tmp_path / "x.png", "--backend", "cpu")
    one_line_exit_2(run, "an inpainting UNet", "--init-image", "--mask")
    assert not (tmp_path / "x.png").exists()


def test_inpainting_keeps_the_unmasked_part(lite):
    """After the last step the kept part's latents are the picture's own (blended back, no noise
    left), whatever the prompt; the repainted part follows the prompt. The mask's edges fall on
    the latents' grid (16 pixels at twice the size: one latent), so the repainted latents are
    rows 2-5 and columns 3-8."""
    mask = mask_image(slice(32, 96), slice(48, 144))
    runs = [lite[1](prompt, steps=4, seed=2, init_image=init_image(), mask_image=mask)
            for prompt in ("a red car", "a green forest")]
    repaint = np.zeros(runs[0].latents.shape[-2:], bool)
    repaint[2:6, 3:9] = True
    kept = [run.latents[0][:, ~repaint] for run in runs]
    painted = [run.latents[0][:, repaint] for run in runs]
    assert np.array_equal(kept[0], kept[1])
    assert np.abs(painted[0] - painted[1]).mean() > 0.05


@pytest.mark.parametrize("steps", [1, 2])
def test_turbo_style_unguided_few_steps(lite, reference, steps):
    """SDXL-Turbo's recipe: guidance 0 (one batch-1 UNet call a step, no unconditional branch),
    euler-a with trailing timesteps, 1-2 steps."""
    result = lite[1](PROMPT, steps=steps, seed=9, guidance=0.0, scheduler="euler-a", timestep_spacing="trailing")
    check_parity(result, reference("euler-a", steps=steps, seed=9, guidance=0.0, spacing="trailing", prompt=PROMPT),
                 f"turbo {steps} steps")
    assert not result.settings["classifier_free_guidance"] and result.settings["unet_calls"] == steps
    assert "negative_time_ids" not in result.settings


def test_unguided_generation_refuses_a_batch_2_unet(lite):
    with pytest.raises(BadInput, match="batch 2"):
        lite[2](PROMPT, steps=1, guidance=0.0)


def test_sd_guidance_rescale_matches_diffusers(folders):
    """guidance_rescale runs in the one loop: SD 1.x's StableDiffusionPipeline takes it too."""
    from diffusers import StableDiffusionPipeline

    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.generate import LitePipeline
    from difflite.verify import load_source

    s = load_source(OutputFolder.read(folders["sd"]), None, None)
    pipe = StableDiffusionPipeline(vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
                                   scheduler=diffusers_scheduler("euler", s.scheduler_config), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    expected = pipe(PROMPT, height=64, width=64, num_inference_steps=STEPS, guidance_scale=12.0, guidance_rescale=0.7,
                    output_type="np", generator=torch.Generator("cpu").manual_seed(3)).images[0]
    with LitePipeline(folders["sd"]) as lite_sd:
        result = lite_sd(PROMPT, steps=STEPS, seed=3, guidance=12.0, guidance_rescale=0.7, scheduler="euler")
        plain = lite_sd(PROMPT, steps=STEPS, seed=3, guidance=12.0, scheduler="euler")
    value = psnr(result.image, expected)
    print(f"SD guidance rescale: PSNR {value:.1f} dB")
    assert value >= TINY_PSNR_DB and psnr(plain.image, expected) < TINY_PSNR_DB - 10
    assert result.settings["guidance_rescale"] == 0.7 and result.settings["family"] == "sd"


# ---------------------------------------------------------------------------------------------
# --low-memory: five models, one resident at a time, the same picture


@pytest.fixture
def loads(monkeypatch):
    """Each Component's load and free, in order, and the most open at once."""
    from types import SimpleNamespace

    from difflite.runtime.component import Component

    log = SimpleNamespace(events=[], open=set(), peak=0)
    init, close = Component.__init__, Component.close

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        log.events.append(("load", self.path.stem))
        log.open.add(id(self))
        log.peak = max(log.peak, len(log.open))

    def tracked_close(self):
        if id(self) in log.open:
            log.events.append(("free", self.path.stem))
            log.open.discard(id(self))
        close(self)

    monkeypatch.setattr(Component, "__init__", tracked_init)
    monkeypatch.setattr(Component, "close", tracked_close)
    return log


def test_low_memory_holds_one_model_at_a_time(folders, lite, loads):
    from difflite.runtime.generate import LitePipeline

    kwargs = {"negative_prompt": "blurry", "prompt_2": "an oil painting", "steps": 2, "seed": 4,
              "init_image": init_image(), "strength": 0.5}
    with LitePipeline(folders[1], low_memory=True) as low:
        got = low(PROMPT, **kwargs)
    order = ["vae_encoder", "text_encoder", "text_encoder_2", "unet", "vae_decoder"]
    assert loads.events == [event for name in order for event in (("load", name), ("free", name))]
    assert loads.peak == 1
    want = lite[1](PROMPT, **kwargs)
    assert np.array_equal(want.latents, got.latents) and np.array_equal(want.image, got.image)
    assert want.settings == {**got.settings, "low_memory": False}


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_end_to_end(folders, lite, tmp_path):
    target = tmp_path / "castle.png"
    run = run_difflite("generate", folders[1], "a castle", "-o", target, "--steps", "2", "--seed", "7",
                       "--scheduler", "euler-a", "--prompt-2", "oil painting", "--negative-prompt", "blurry",
                       "--negative-prompt-2", "dark", "--original-size", "128,160", "--crop", "8,24",
                       "--target-size", "96,64", "--guidance-rescale", "0.7", "--backend", "cpu", "--json",
                       env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)["settings"]
    assert settings["time_ids"] == [128, 160, 8, 24, 96, 64] and settings["guidance"] == 5.0
    assert (settings["prompt_2"], settings["negative_prompt_2"]) == ("oil painting", "dark")
    with Image.open(target) as png:
        assert png.size == (WIDTH, HEIGHT)
        pixels = np.asarray(png)
    expected = lite[1]("a castle", steps=2, seed=7, scheduler="euler-a", prompt_2="oil painting",
                       negative_prompt="blurry", negative_prompt_2="dark", sizes=SIZES, guidance_rescale=0.7)
    assert np.array_equal(pixels, expected.uint8)


def test_cli_inpainting(folders, lite, tmp_path):
    """`generate --init-image --mask` on an SDXL folder: diffusers' inpainting default strength, the
    same picture as the pipeline's."""
    picture, mask, target = tmp_path / "in.png", tmp_path / "mask.png", tmp_path / "out.png"
    init_image().save(picture)
    mask_image().save(mask)
    run = run_difflite("generate", folders[1], "a red car", "-o", target, "--steps", "3", "--seed", "4",
                       "--init-image", picture, "--mask", mask, "--backend", "cpu", "--json",
                       env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)["settings"]
    assert settings["inpaint"] and settings["strength"] == 0.9999 and settings["denoising_steps"] == 2
    expected = lite[1]("a red car", steps=3, seed=4, init_image=init_image(), mask_image=mask_image())
    with Image.open(target) as png:
        assert np.array_equal(np.asarray(png), expected.uint8)


def one_line_exit_2(run, *words) -> None:
    assert run.returncode == 2, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), run.stderr


@pytest.mark.parametrize("args,words", [
    (["--prompt-2", "x"], ["--prompt-2 is SDXL's", "SD 1.x / 2.x folder"]),
    (["--negative-prompt-2", "x"], ["--negative-prompt-2 is SDXL's"]),
    (["--original-size", "512,512"], ["--original-size is SDXL's"]),
])
def test_sdxl_options_on_an_sd_folder_are_refused(folders, tmp_path, args, words):
    run = run_difflite("generate", folders["sd"], "a cat", "-o", tmp_path / "x.png", *args, "--backend", "cpu")
    one_line_exit_2(run, *words)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args,words", [
    (["--original-size", "512"], ["--original-size '512'", "two integers"]),
    (["--crop", "a,b"], ["--crop 'a,b'"]),
    (["--target-size", "0,64"], ["--target-size 0,64", "[1, "]),
    (["--crop", "-1,0"], ["--crop -1,0", "[0, "]),
    (["--guidance-rescale", "1.5"], ["--guidance-rescale 1.5", "[0, 1]"]),
    (["--mask", "m.png"], ["--mask needs --init-image"]),
])
def test_bad_sdxl_options_are_refused(folders, tmp_path, args, words):
    run = run_difflite("generate", folders[1], "a cat", "-o", tmp_path / "x.png", *args, "--backend", "cpu")
    one_line_exit_2(run, *words)


def test_a_missing_text_encoder_2_is_named(folders, tmp_path):
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(folders[2], broken)
    (broken / "text_encoder_2.tflite").unlink()
    run = run_difflite("generate", broken, "a cat", "-o", tmp_path / "x.png", "--backend", "cpu")
    one_line_exit_2(run, "text_encoder_2.tflite")


@pytest.mark.parametrize("batch", [1, 2])
def test_bench_runs_sdxl(folders, batch):
    """bench times every component and runs one guided picture through both text encoders, the
    UNet (with text_embeds and time_ids) and the VAE decoder: the calls it made are the plan's."""
    run = run_difflite("bench", folders[batch], "--backend", "cpu", "--runs", 1, "--warmup", 0, "--steps", 2, "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert {"text_encoder", "text_encoder_2", "unet", "vae_decoder"} <= set(report["components"])
    pipeline = report["pipeline"]
    assert pipeline["calls"]["text_encoder_2"] == pipeline["calls"]["text_encoder"] >= 1
    assert pipeline["calls"]["unet"] == 2 * (2 // batch)  # guided: both branches, a batch-2 UNet in one call
    assert pipeline["measured_ms"] > 0 and pipeline["measured_calls"] == pipeline["calls"]
    assert pipeline["sum_of_medians_ms"] > 0
