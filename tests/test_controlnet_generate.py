"""ControlNets at generate (issue 33, item 2): `generate --control-image` against diffusers'
StableDiffusionControlNetPipeline (one ControlNet, and two as its MultiControlNetModel) and
StableDiffusionControlNetImg2ImgPipeline on the same torch modules, at >= 60 dB; the canny
preprocessing; and the bad inputs.

The folders: preset:tiny at 64x96 with two different ControlNets (preset:controlnet-tiny, and one
of another seed saved as a diffusers folder), --no-fuse (builtins only: the fused ControlNet is
checked against PyTorch by tests/test_controlnet.py), batch 1 with the VAE encoder and batch 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from difflite.core.errors import BadInput
from difflite.runtime.controlnet import ControlSpec, canny_edges

from support.cli import convert_side_by_side, run_difflite
from support.numerics import psnr
from support.torch_threads import one_torch_thread

HEIGHT, WIDTH = 64, 96  # non-square: a control image read across its axes would show
PROMPT = "a photo of an astronaut riding a horse"
STEPS = 3
MIN_PSNR_DB = 60.0  # fp32 LiteRT against PyTorch lands near 120 dB; another control image far below


def difflite(*args) -> subprocess.CompletedProcess:
    return run_difflite(*args, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


def edges(size=(WIDTH, HEIGHT), shift: int = 0) -> Image.Image:
    """A control picture: white outlines on black, as an edge detector gives."""
    image = Image.new("RGB", size)
    draw = ImageDraw.Draw(image)
    draw.ellipse((8 + shift, 6, 60 + shift, 54), outline="white", width=2)
    draw.line((0, 50, size[0], 30), fill="white", width=1)
    return image


def photo(size=(WIDTH + 31, HEIGHT + 17), seed: int = 0) -> Image.Image:
    """A picture of another size than the folder's, with shapes and some noise."""
    rng = np.random.default_rng(seed)
    pixels = np.full((size[1], size[0], 3), 60, np.uint8)
    pixels[20:60, 30:90] = (230, 200, 40)
    pixels = np.clip(pixels + rng.integers(-20, 20, pixels.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def second_controlnet(tmp_path_factory) -> Path:
    """preset:controlnet-tiny of another seed, saved as a diffusers ControlNetModel folder."""
    from difflite.compiler import controlnet, presets

    pipe = presets.build_preset("tiny", 0)
    model = controlnet.build(controlnet.read_source("preset:controlnet-tiny", 7), pipe, 7)
    folder = tmp_path_factory.mktemp("controlnet-seed-7")
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, second_controlnet) -> dict:
    """batch 1 (with the VAE encoder), batch 2, and one without ControlNets, converted side by side."""
    base = tmp_path_factory.mktemp("controlnet-generate")
    size = ("--height", str(HEIGHT), "--width", str(WIDTH), "--no-fuse")
    controlnets = ("--controlnet", "preset:controlnet-tiny", "--controlnet", str(second_controlnet))
    flags = {1: (*controlnets, "--components", "text_encoder,unet,vae_decoder,vae_encoder"),
             2: (*controlnets, "--batch", "2"),
             "plain": ("--components", "text_encoder,unet,vae_decoder")}
    # "plain" after the others: it reuses batch 1's text encoder and VAE decoder exports (its UNet,
    # without ControlNet residual inputs, is its own)
    convert_side_by_side({key: ["preset:tiny", "-o", base / str(key), *size, *extra] for key, extra in flags.items()},
                         first=(1, 2))
    return {key: base / str(key) for key in flags}


@pytest.fixture(scope="module")
def lite(folders):
    from difflite.runtime.generate import LitePipeline

    pipes = {key: LitePipeline(folders[key]) for key in (1, 2)}
    yield pipes
    for pipe in pipes.values():
        pipe.close()


class Reference:
    """diffusers' ControlNet pipelines on the folder's source torch modules (its recorded ControlNets)."""

    def __init__(self, folder: Path):
        from difflite.folder.output_folder import OutputFolder
        from difflite.verify import load_source

        self.source = load_source(OutputFolder.read(folder), None, None)
        assert len(self.source.controlnets) == 2

    def __call__(self, scheduler: str, guidance: float, images: list, scales: list, starts: list, ends: list,
                 init_image=None, strength: float = 0.8, seed: int = 0):
        from diffusers import StableDiffusionControlNetImg2ImgPipeline, StableDiffusionControlNetPipeline

        from difflite.diffusers_schedulers import diffusers_scheduler

        s = self.source
        single = len(images) == 1
        cls = StableDiffusionControlNetPipeline if init_image is None else StableDiffusionControlNetImg2ImgPipeline
        pipe = cls(vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
                   controlnet=s.controlnets[0] if single else list(s.controlnets[:len(images)]),
                   scheduler=diffusers_scheduler(scheduler, s.scheduler_config), safety_checker=None,
                   feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        kwargs = {"num_inference_steps": STEPS, "guidance_scale": guidance, "output_type": "np",
                  "generator": torch.Generator("cpu").manual_seed(seed),
                  "controlnet_conditioning_scale": scales[0] if single else scales,
                  "control_guidance_start": starts[0] if single else starts,
                  "control_guidance_end": ends[0] if single else ends}
        control = images[0] if single else images
        with one_torch_thread():
            if init_image is None:
                result = pipe(PROMPT, image=control, height=HEIGHT, width=WIDTH, **kwargs)
            else:
                result = pipe(PROMPT, image=init_image, control_image=control, strength=strength, **kwargs)
        return result.images[0]


@pytest.fixture(scope="module")
def reference(folders) -> Reference:
    return Reference(folders[1])


def lite_picture(pipe, scheduler, guidance, images, scales, starts, ends, **kwargs) -> np.ndarray:
    controls = [ControlSpec(image, scale, start, end) for image, scale, start, end in zip(images, scales, starts, ends)]
    return pipe(PROMPT, steps=STEPS, seed=0, guidance=guidance, scheduler=scheduler, controls=controls,
                **kwargs).image


# ---------------------------------------------------------------------------------------------
# Parity


@pytest.mark.parametrize("scheduler,guidance,batch", [
    ("euler-a", 7.5, 1), ("ddim", 7.5, 1), ("euler-a", 1.0, 1), ("ddim", 1.0, 1), ("default", 7.5, 2),
])
def test_one_controlnet_matches_diffusers(lite, reference, scheduler, guidance, batch):
    if guidance <= 1.0 and batch == 2:
        pytest.fail("a batch-2 UNet runs only with guidance")  # the cases above never ask for it
    args = ([edges()], [0.8], [0.0], [1.0])
    got = lite_picture(lite[batch], scheduler, guidance, *args)
    want = reference(scheduler, guidance, *args)
    assert got.shape == want.shape == (HEIGHT, WIDTH, 3)
    assert psnr(got, want) >= MIN_PSNR_DB


@pytest.mark.parametrize("scheduler,guidance,batch", [("euler-a", 7.5, 1), ("ddim", 1.0, 1), ("dpm++", 7.5, 2)])
def test_two_controlnets_match_multicontrolnet(lite, reference, scheduler, guidance, batch):
    """Each with its own image (one of another size), scale and steps: controlnet_1 acts over the
    middle of the steps only."""
    args = ([edges(), photo()], [0.7, 1.4], [0.0, 0.3], [1.0, 0.7])
    got = lite_picture(lite[batch], scheduler, guidance, *args)
    assert psnr(got, reference(scheduler, guidance, *args)) >= MIN_PSNR_DB


def test_img2img_with_a_controlnet_matches_diffusers(lite, reference):
    """At the folder's size (diffusers' img2img pipeline keeps the picture's own size)."""
    args = ([edges(shift=9)], [1.2], [0.0], [0.8])
    picture = photo(size=(WIDTH, HEIGHT), seed=3)
    got = lite_picture(lite[1], "euler-a", 7.5, *args, init_image=picture, strength=0.7)
    want = reference("euler-a", 7.5, *args, init_image=picture, strength=0.7)
    assert psnr(got, want) >= MIN_PSNR_DB


def test_the_check_can_fail(lite, reference):
    """Another control image (the same outlines 12 pixels over), or the ControlNets swapped, lands
    far below the bar (about 46 dB on the tiny preset; no control at all, about 28 dB)."""
    got = lite_picture(lite[1], "ddim", 7.5, [edges(shift=12)], [0.8], [0.0], [1.0])
    assert psnr(got, reference("ddim", 7.5, [edges()], [0.8], [0.0], [1.0])) < 50
    both = ([edges(), photo()], [0.7, 1.4], [0.0, 0.0], [1.0, 1.0])
    swapped = ([photo(), edges()], [1.4, 0.7], [0.0, 0.0], [1.0, 1.0])
    assert psnr(lite_picture(lite[1], "ddim", 7.5, *swapped), reference("ddim", 7.5, *both)) < 50


def test_zero_weight_runs_no_controlnet_and_equals_no_control(lite):
    pipe = lite[1]
    plain = pipe(PROMPT, steps=STEPS, seed=0, guidance=7.5, scheduler="ddim")
    zero = pipe(PROMPT, steps=STEPS, seed=0, guidance=7.5, scheduler="ddim", controls=[ControlSpec(edges(), 0.0)])
    np.testing.assert_array_equal(zero.latents, plain.latents)
    assert zero.settings["controlnet_calls"] == 0 and "controlnet_calls" not in plain.settings
    late = pipe(PROMPT, steps=STEPS, seed=0, guidance=7.5, scheduler="ddim",
                controls=[ControlSpec(edges(), 1.0, start=0.5)])
    # ddim, 3 steps: only the third (2/3 >= 0.5) starts at or after half; two branches
    assert late.settings["controlnet_calls"] == 2 and late.timings["controlnet"] > 0


# ---------------------------------------------------------------------------------------------
# The command


def test_cli_canny_equals_the_edge_map_given_as_it_is(folders, tmp_path):
    source = tmp_path / "photo.png"
    photo().save(source)
    edge_map = tmp_path / "edges.png"
    canny_edges(photo(), 50, 120).save(edge_map)
    common = ("generate", str(folders[1]), PROMPT, "--steps", "2", "--scheduler", "ddim", "--json")
    run = difflite(*common, "-o", str(tmp_path / "canny.png"), "--control-image", str(source),
                   "--control-preprocess", "canny", "--canny-low", "50", "--canny-high", "120")
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)["settings"]
    assert settings["controls"] == [{"scale": 1.0, "start": 0.0, "end": 1.0}] and settings["controlnet_calls"] == 4
    given = difflite(*common, "-o", str(tmp_path / "given.png"), "--control-image", str(edge_map))
    assert given.returncode == 0, given.stderr
    a, b = (np.asarray(Image.open(tmp_path / name)) for name in ("canny.png", "given.png"))
    np.testing.assert_array_equal(a, b)
    plain = difflite(*common, "-o", str(tmp_path / "plain.png"))
    assert plain.returncode == 0, plain.stderr
    assert not np.array_equal(a, np.asarray(Image.open(tmp_path / "plain.png")))


def test_cli_per_image_options(folders, tmp_path):
    image = tmp_path / "edges.png"
    edges().save(image)
    run = difflite("generate", str(folders[2]), PROMPT, "-o", str(tmp_path / "out.png"), "--steps", "2", "--json",
                   "--control-image", str(image), "--control-image", str(image), "--control-scale", "0.5",
                   "--control-scale", "2", "--control-end", "0.5")
    assert run.returncode == 0, run.stderr
    settings = json.loads(run.stdout)["settings"]
    assert settings["controls"] == [{"scale": 0.5, "start": 0.0, "end": 0.5}, {"scale": 2.0, "start": 0.0, "end": 0.5}]


BAD = {  # id: (folder key, extra arguments, words the one line holds)
    "no-controlnet-in-folder": ("plain", ["--control-image", "{edges}"], "has no ControlNet"),
    "more-images-than-controlnets": (1, ["--control-image", "{edges}"] * 3, "given 3 times"),
    "scale-count": (1, ["--control-image", "{edges}", "--control-image", "{edges}", "--control-image", "{edges}",
                        "--control-scale", "1", "--control-scale", "2"], "--control-scale given 2 times"),
    "option-without-image": (1, ["--control-scale", "0.5"], "--control-scale without --control-image"),
    "start-after-end": (1, ["--control-image", "{edges}", "--control-start", "0.6", "--control-end", "0.4"],
                        "--control-start 0.6"),
    "scale-not-finite": (1, ["--control-image", "{edges}", "--control-scale", "nan"], "--control-scale nan"),
    "canny-thresholds": (1, ["--control-image", "{edges}", "--control-preprocess", "canny", "--canny-low", "300",
                             "--canny-high", "100"], "--canny-low"),
    "not-an-image": (1, ["--control-image", "{text}"], "--control-image"),
    "missing-image": (1, ["--control-image", "{missing}"], "no such image file"),
    "with-mask": (1, ["--control-image", "{edges}", "--init-image", "{edges}", "--mask", "{edges}"],
                  "ControlNet inpainting"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line(folders, tmp_path, case):
    key, extra, words = BAD[case]
    (tmp_path / "notes.png").write_text("not a picture")
    edges().save(tmp_path / "edges.png")
    paths = {"edges": tmp_path / "edges.png", "text": tmp_path / "notes.png", "missing": tmp_path / "none.png"}
    output = tmp_path / "out.png"
    run = difflite("generate", str(folders[key]), PROMPT, "-o", str(output), "--steps", "2",
                   *[a.format(**paths) for a in extra])
    lines = [line for line in run.stderr.splitlines() if line.strip() and "XNNPACK" not in line]
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and words in lines[0], lines
    assert not output.exists() and not list(tmp_path.glob(".out.png.*"))



def test_api_refuses_before_running(lite):
    with pytest.raises(BadInput, match="given 3 times"):
        lite[1](PROMPT, steps=1, controls=[ControlSpec(edges())] * 3)
    with pytest.raises(BadInput, match="--control-end"):
        lite[1](PROMPT, steps=1, controls=[ControlSpec(edges(), end=1.5)])


def test_bench_measures_the_controlnets_and_runs_the_pipeline(folders):
    run = difflite("bench", str(folders[1]), "--steps", "2", "--runs", "2", "--warmup", "1", "--backend", "cpu",
                   "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout[run.stdout.index("{"):])
    assert {"controlnet_0", "controlnet_1", "unet"} <= set(data["components"])
    assert all(data["components"][n]["median_ms"] > 0 for n in ("controlnet_0", "controlnet_1"))
    assert data["pipeline"]["measured_ms"] > 0
