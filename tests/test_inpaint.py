"""Inpainting (issue 33): UNets of 9 input channels (latents, mask, masked picture's latents)
convert from the presets, diffusers folders and original-format single files, fused and verified
as SD 1.5's; `generate --init-image IMG --mask MASK` against diffusers'
StableDiffusionInpaintPipeline on the same torch modules, with a 9-channel UNet and with a
4-channel one (latent blending); the command end to end; and the bad inputs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from difflite.core.errors import BadInput

from support import hostile_images
from support import ldm_layout as L
from support.cli import convert_side_by_side, run_difflite
from support.numerics import psnr
from support.torch_threads import one_torch_thread

HEIGHT, WIDTH = 64, 96  # non-square: a mask read across its axes would show
PROMPT = "a red car on a street"
STEPS = 4
MIN_PSNR_DB = 60.0  # fp32 LiteRT against PyTorch lands above 100 dB; another seed or mask far below
INPAINT_KINDS = ("groupnorm", "groupnorm_silu", "layernorm", "attention", "geglu")  # what the UNet holds


def picture(size=(WIDTH, HEIGHT), seed: int = 0) -> Image.Image:
    """A smooth RGB picture with some noise (the VAE sees structure)."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin(x / 5.0) * np.cos(y / 7.0)], axis=-1)
    return Image.fromarray((np.clip(base + 0.1 * rng.standard_normal((h, w, 3)), 0, 1) * 255).round().astype(np.uint8))


def mask(size=(WIDTH, HEIGHT), mode: str = "L", flip: bool = False) -> Image.Image:
    """White (repaint) on a band right of a third of the width and across the middle half of the
    height, black elsewhere; soft edges (values near 0.5) so binarizing them matters. RGB: the
    white in red and green only (grayscale 0.885); RGBA: a varying alpha too."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    inside = np.clip(np.minimum(x - w / 3, np.minimum(y - h / 4, 3 * h / 4 - y)) / 3 + 0.5, 0, 1)
    if flip:
        inside = 1 - inside
    gray = (inside * 255).round().astype(np.uint8)
    if mode == "L":
        return Image.fromarray(gray, "L")
    channels = [gray, gray, np.zeros_like(gray)]
    if mode == "RGBA":
        channels.append(((x / w) * 255).astype(np.uint8))
    return Image.fromarray(np.stack(channels, axis=-1), mode)


def difflite(*args) -> subprocess.CompletedProcess:
    return run_difflite(*args, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


# ---------------------------------------------------------------------------------------------
# The module's conversions: three at once, then the single file


CONVERSIONS = {
    # tiny-inpaint as convert makes it by default (its components chosen for an inpainting UNet)
    "inpaint": ["preset:tiny-inpaint", "--no-fuse"],
    "tiny": ["preset:tiny", "--no-fuse", "--components", "text_encoder,unet,vae_decoder,vae_encoder"],
    # the census and verify of the fused inpainting UNet
    "fused": ["preset:tiny-inpaint", "--components", "unet"],
}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inpaint")


@pytest.fixture(scope="module")
def folders(base) -> dict[str, Path]:
    out = {name: base / name for name in CONVERSIONS}
    convert_side_by_side({name: [*CONVERSIONS[name], "-o", out[name], "--height", HEIGHT, "--width", WIDTH, "--json"]
                          for name in CONVERSIONS}, first=("inpaint", "tiny"))  # "fused" reuses inpaint's UNet export
    return out


@pytest.fixture(scope="module")
def lite(folders):
    from difflite.runtime.generate import LitePipeline

    pipes = {name: LitePipeline(folders[name]) for name in ("inpaint", "tiny")}
    yield pipes
    for pipe in pipes.values():
        pipe.close()


class Reference:
    """diffusers' StableDiffusionInpaintPipeline on the source torch modules of an output folder
    (height and width given: it resizes the picture and the mask to them, as generate does)."""

    def __init__(self, folder: Path):
        from difflite.folder.output_folder import OutputFolder
        from difflite.verify import load_source

        self.source = load_source(OutputFolder.read(folder), None, None)

    def __call__(self, image, mask_image, scheduler: str, guidance: float, strength: float, seed: int = 5,
                 prompt: str = PROMPT) -> np.ndarray:
        from diffusers import StableDiffusionInpaintPipeline

        from difflite.diffusers_schedulers import diffusers_scheduler

        s = self.source
        pipe = StableDiffusionInpaintPipeline(
            vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
            scheduler=diffusers_scheduler(scheduler, s.scheduler_config), safety_checker=None,
            feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        with one_torch_thread():
            return pipe(prompt, image=image, mask_image=mask_image, height=HEIGHT, width=WIDTH, strength=strength,
                        num_inference_steps=STEPS, guidance_scale=guidance, output_type="np",
                        generator=torch.Generator("cpu").manual_seed(seed)).images[0]


@pytest.fixture(scope="module")
def reference(folders) -> dict[str, Reference]:
    return {name: Reference(folders[name]) for name in ("inpaint", "tiny")}


# ---------------------------------------------------------------------------------------------
# Conversion


def test_inpaint_presets_are_their_text_to_image_architectures_with_9_channels():
    from difflite.compiler.presets import PRESETS, preset_configs

    for name in ("sd15", "tiny", "sdxl", "sdxl-tiny"):
        assert f"{name}-inpaint" in PRESETS
        plain, inpaint = preset_configs(name), preset_configs(f"{name}-inpaint")
        assert inpaint["unet"] == {**plain["unet"], "in_channels": 9}
        assert {k: v for k, v in inpaint.items() if k != "unet"} == {k: v for k, v in plain.items() if k != "unet"}


def test_the_folder_says_its_unet_inpaints(folders):
    """convert's default components for an inpainting model include vae_encoder (generate --mask
    needs it); the manifest and the folder reader say the UNet takes 9 channels over 4-channel
    latents; a text-to-image folder says it does not."""
    from difflite.folder.output_folder import OutputFolder

    manifest = json.loads((folders["inpaint"] / "manifest.json").read_text())
    assert manifest["options"]["components"] == ["text_encoder", "unet", "vae_decoder", "vae_encoder"]
    assert (folders["inpaint"] / "vae_encoder.tflite").is_file()
    latent = manifest["latent"]
    assert (latent["channels"], latent["unet_channels"], latent["inpainting"]) == (4, 9, True)
    unet = manifest["components"]["unet"]
    assert unet["inputs"][0] == {"name": "sample", "shape": [1, HEIGHT // 8, WIDTH // 8, 9], "dtype": "float32",
                                 "layout": "NHWC"}
    assert unet["outputs"][0]["shape"] == [1, HEIGHT // 8, WIDTH // 8, 4]
    folder = OutputFolder.read(folders["inpaint"])
    assert folder.components["unet"].sample_channels == 9
    assert (folder.latent.channels, folder.latent.unet_channels, folder.latent.inpainting) == (4, 9, True)
    plain = OutputFolder.read(folders["tiny"])
    assert (plain.latent.unet_channels, plain.latent.inpainting) == (4, False)
    assert json.loads((folders["tiny"] / "manifest.json").read_text())["latent"]["inpainting"] is False


def test_the_fused_inpainting_unet_verifies_and_fuses_every_pattern(folders):
    """As for SD 1.5: every GroupNorm (with its SiLU), LayerNorm, attention and GEGLU of the
    9-channel UNet is a difflite custom op, and the file agrees with PyTorch within the fp32 bar."""
    report = json.loads((folders["fused"] / "report.json").read_text())
    unet = report["components"]["unet"]
    for kind in INPAINT_KINDS:
        counts = unet["fusion"][kind]
        assert counts["matched"] == counts["candidates"] > 0 and counts["custom_op"], (kind, counts)
    histogram = unet["op_histogram"]
    for op in ("difflite.GroupNorm", "difflite.Attention", "difflite.GeGLU"):
        assert histogram.get(op, 0) > 0, (op, histogram)
    assert not any(name in histogram for name in ("SOFTMAX", "GELU")), histogram
    run = difflite("verify", folders["fused"], "--backend", "cpu", "--seeds", "0,1", "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(run.stdout)
    assert data["passed"] and {c["component"] for c in data["checks"]} == {"unet"}
    assert all(c["relative_error"] <= 1e-3 for c in data["checks"]), data["checks"]


def test_a_diffusers_folder_with_a_9_channel_unet_loads(tmp_path):
    from difflite.compiler.models import load_pipeline, peek_configs

    preset = load_pipeline("preset:tiny-inpaint")
    preset.save_pretrained(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "model_index.json").read_text())["_class_name"] == \
        "StableDiffusionInpaintPipeline"
    assert peek_configs(str(tmp_path / "model"))[0]["in_channels"] == 9
    loaded = load_pipeline(str(tmp_path / "model"))
    assert loaded.inpainting and loaded.unet.config.in_channels == 9
    for key, value in preset.unet.state_dict().items():
        assert torch.equal(loaded.unet.state_dict()[key], value), key
    assert not load_pipeline("preset:tiny").inpainting


@pytest.mark.parametrize("preset, family, summary", [
    ("sd15-inpaint", "sd1", "SD 1.x inpainting (CLIP ViT-L text encoder), epsilon at 512x512"),
    # SD 2's inpainting model is the 512 epsilon one: no file name or global_step needs to say so
    ("sd21", "sd2", "SD 2.x inpainting (OpenCLIP ViT-H text encoder), epsilon at 512x512"),
])
def test_real_inpainting_architectures_from_shapes(preset, family, summary):
    """Full-size SD 1.5 / 2.x inpainting layouts (meta tensors) give back the presets' configs
    with 9 input channels, and weights for every tensor."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from difflite.compiler import single_file
    from difflite.compiler.presets import preset_configs

    configs = preset_configs(preset)
    configs["unet"]["in_channels"] = 9
    with torch.device("meta"):
        models = {"unet": UNet2DConditionModel.from_config(configs["unet"]),
                  "vae": AutoencoderKL.from_config(configs["vae"]),
                  "text_encoder": CLIPTextModel(CLIPTextConfig(**configs["text_encoder"]))}
    inferred, weights, arch = single_file.infer_architecture(Path("sd-inpainting.safetensors"),
                                                             L.to_ldm(models, family))
    assert inferred["unet"]["in_channels"] == 9 and inferred["unet"]["out_channels"] == 4
    assert inferred["scheduler"]["prediction_type"] == "epsilon"
    assert {k: tuple(v.shape) for k, v in weights["unet"].items()} == \
        {k: tuple(v.shape) for k, v in models["unet"].state_dict().items()}
    assert arch["inpainting"] and arch["summary"] == summary
    assert any("9 input channels" in reason and "inpainting" in reason for reason in arch["reasons"])


def test_an_inpainting_single_file_converts_and_verifies(base):
    """An original-format checkpoint whose model.diffusion_model.input_blocks.0.0.weight takes 9
    channels: its architecture inferred (the weights as written), converted with vae_encoder by
    default, and verified against PyTorch."""
    from difflite.compiler.models import load_pipeline

    models = L.tiny_models("sd1", seed=2, in_channels=9)
    tensors = L.to_ldm(models, "sd1")
    assert tensors[L.UNET + "input_blocks.0.0.weight"].shape[1] == 9
    path = L.write_checkpoint(base / "tiny-inpainting.safetensors", tensors)
    pipe = load_pipeline(str(path))
    assert pipe.inpainting and pipe.details["architecture"]["inpainting"]
    for name in ("unet", "vae", "text_encoder"):
        expected, got = models[name].state_dict(), getattr(pipe, name).state_dict()
        assert got.keys() == expected.keys(), name
        assert all(torch.equal(got[k], v) for k, v in expected.items()), name
    out = base / "single"
    run = difflite("convert", path, "-o", out, "--height", "64", "--width", "64")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "architecture: SD 1.x inpainting" in run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["components"] == ["text_encoder", "unet", "vae_decoder", "vae_encoder"]
    assert manifest["latent"]["unet_channels"] == 9 and manifest["source"]["architecture"]["inpainting"]
    verified = difflite("verify", out, "--backend", "cpu", "--seeds", "0", "--components", "unet,vae_encoder")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# Parity with diffusers


@pytest.mark.parametrize("unet, scheduler, guidance, strength", [
    # 9-channel UNet: PNDM (the config's), DDIM, Euler ancestral (draws at every step), DPM++
    ("inpaint", "default", 7.5, 1.0), ("inpaint", "default", 7.5, 0.6), ("inpaint", "euler-a", 7.5, 1.0),
    ("inpaint", "euler-a", 1.0, 0.75), ("inpaint", "ddim", 1.0, 1.0), ("inpaint", "dpm++", 7.5, 0.8),
    # 4-channel UNet: latent blending after each step
    ("tiny", "default", 7.5, 1.0), ("tiny", "default", 1.0, 0.6), ("tiny", "euler-a", 7.5, 0.75),
    ("tiny", "euler-a", 1.0, 1.0), ("tiny", "ddim", 7.5, 1.0), ("tiny", "euler", 7.5, 0.8),
])
def test_inpainting_matches_diffusers(lite, reference, unet, scheduler, guidance, strength):
    image, repaint = picture(), mask()
    result = lite[unet](PROMPT, steps=STEPS, seed=5, guidance=guidance, scheduler=scheduler, init_image=image,
                        mask_image=repaint, strength=strength)
    expected = reference[unet](image, repaint, scheduler, guidance, strength)
    assert result.image.shape == expected.shape == (HEIGHT, WIDTH, 3)
    assert expected.std() > 0.02, "the reference picture is flat: the parity check would mean nothing"
    value = psnr(result.image, expected)
    label = f"{unet} {scheduler} guidance {guidance} strength {strength}"
    print(f"inpaint {label}: PSNR {value:.1f} dB")
    assert value >= MIN_PSNR_DB, f"{label}: {value:.1f} dB"
    settings = result.settings
    assert settings["inpaint"] and not settings["img2img"] and settings["strength"] == strength
    assert settings["inpainting_unet"] == (unet == "inpaint")


@pytest.mark.parametrize("unet", ["inpaint", "tiny"])
def test_the_check_can_fail(lite, reference, unet):
    """Another mask, another seed or no mask at all (img2img) lands far below the bar, so passing
    it means the same picture."""
    image, repaint = picture(), mask()
    expected = reference[unet](image, repaint, "euler-a", 7.5, 0.75)
    others = [{"mask_image": mask(flip=True)}, {"seed": 6}]
    if unet == "tiny":
        others.append({"mask_image": None})  # img2img of the same picture
    for change in others:
        kwargs = {"seed": 5, "init_image": image, "mask_image": repaint, **change}
        got = lite[unet](PROMPT, steps=STEPS, guidance=7.5, scheduler="euler-a", strength=0.75, **kwargs).image
        value = psnr(got, expected)
        print(f"{unet} {change}: {value:.1f} dB")
        assert value < MIN_PSNR_DB - 10, change


@pytest.mark.parametrize("mode, picture_size, mask_size", [
    ("RGB", (WIDTH, HEIGHT), (48, 32)), ("RGBA", (80, 50), (120, 80)), ("L", (150, 100), (200, 130)),
])
def test_masks_of_any_size_and_colour_are_read_as_diffusers_reads_them(lite, reference, tmp_path, mode,
                                                                      picture_size, mask_size):
    """Files, as the command reads them: the picture and the mask are each resized to the
    converted size (lanczos, the mask in its own mode), the mask made grayscale and binarized."""
    image_path, mask_path = tmp_path / "picture.png", tmp_path / f"mask-{mode}.png"
    picture(picture_size).save(image_path)
    mask(mask_size, mode).save(mask_path)
    with Image.open(image_path) as image, Image.open(mask_path) as repaint:
        assert repaint.mode == mode
        expected = reference["inpaint"](image, repaint, "ddim", 7.5, 1.0)
    result = lite["inpaint"](PROMPT, steps=STEPS, seed=5, guidance=7.5, scheduler="ddim", init_image=image_path,
                             mask_image=mask_path)
    value = psnr(result.image, expected)
    print(f"inpaint mask {mode} {mask_size}, picture {picture_size}: PSNR {value:.1f} dB")
    assert value >= MIN_PSNR_DB, f"{mode}: {value:.1f} dB"


def test_the_mask_at_latent_size_is_torch_nearest_interpolation():
    from difflite.runtime.inpaint import latent_mask

    pixels = (np.random.default_rng(0).random((1, 1, 40, 56)) > 0.5).astype(np.float32)
    for size in ((5, 7), (40, 56), (6, 9), (13, 17)):
        expected = torch.nn.functional.interpolate(torch.from_numpy(pixels), size=size).numpy()
        np.testing.assert_array_equal(latent_mask(pixels, *size), expected)


# ---------------------------------------------------------------------------------------------
# The command


def test_cli_inpaints_with_a_9_channel_unet(folders, lite, tmp_path):
    """The console script writes the in-process pipeline's picture; --strength defaults to 1.0
    with --mask (diffusers' inpainting default), and the JSON says it inpainted."""
    image_path, mask_path, target = tmp_path / "in.png", tmp_path / "mask.png", tmp_path / "out" / "car.png"
    picture((80, 60)).save(image_path)
    mask((80, 60)).save(mask_path)
    target.parent.mkdir()
    run = difflite("generate", folders["inpaint"], PROMPT, "-o", target, "--init-image", image_path, "--mask",
                   mask_path, "--steps", "2", "--seed", "3", "--scheduler", "euler-a", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    settings = json.loads(run.stdout)["settings"]
    assert settings["inpaint"] and settings["inpainting_unet"] and settings["strength"] == 1.0
    assert not settings["img2img"] and str(mask_path) not in run.stdout
    with Image.open(target) as png:
        assert png.format == "PNG" and png.size == (WIDTH, HEIGHT)
        pixels = np.asarray(png)
    expected = lite["inpaint"](PROMPT, steps=2, seed=3, scheduler="euler-a", init_image=image_path,
                               mask_image=mask_path).uint8
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["car.png"], "temporary files left behind"


def invoke(*args):
    """The command in process (click's runner): (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from difflite.cli import main

    run = CliRunner().invoke(main, [str(a) for a in args])
    return run.exit_code, run.stdout, run.stderr


def test_cli_inpaints_with_a_4_channel_unet(folders, lite, tmp_path):
    image_path, mask_path, target = tmp_path / "in.png", tmp_path / "mask.png", tmp_path / "out.png"
    picture().save(image_path)
    mask().save(mask_path)
    code, stdout, stderr = invoke("generate", folders["tiny"], PROMPT, "-o", target, "--init-image", image_path,
                                  "--mask", mask_path, "--steps", "3", "--strength", "0.7", "--scheduler", "ddim",
                                  "--json")
    assert code == 0, stderr
    settings = json.loads(stdout)["settings"]
    assert settings["inpaint"] and settings["inpainting_unet"] is False and settings["strength"] == 0.7
    with Image.open(target) as png:
        pixels = np.asarray(png)
    expected = lite["tiny"](PROMPT, steps=3, strength=0.7, scheduler="ddim", init_image=image_path,
                            mask_image=mask_path).uint8
    assert np.array_equal(pixels, expected)


def test_generate_help_documents_the_mask():
    code, stdout, _ = invoke("generate", "--help")
    assert code == 0
    text = " ".join(stdout.split())
    assert "--mask PATH" in text and "Inpainting, with --init-image" in text and "binarized at 0.5" in text
    assert "1.0 with --mask" in text and "default: 0.8" in text
    code, stdout, _ = invoke("convert", "--help")
    assert "9-channel UNet) vae_encoder too" in " ".join(stdout.split())


def test_bench_runs_an_inpainting_unet(folders):
    """bench's measured pipeline run feeds the 9-channel UNet its extra channels."""
    run = difflite("bench", folders["inpaint"], "--backend", "cpu", "--runs", "1", "--warmup", "0", "--steps", "2",
                   "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    pipeline = json.loads(run.stdout)["pipeline"]
    assert pipeline["measured_ms"] > 0 and pipeline["measured_calls"]["unet"] == 4, pipeline


def test_low_memory_inpaints_the_same_latents(folders):
    from difflite.runtime.generate import LitePipeline

    kwargs = {"steps": 2, "seed": 4, "scheduler": "euler-a", "init_image": picture(), "mask_image": mask(),
              "strength": 0.75}
    for name in ("inpaint", "tiny"):
        with LitePipeline(folders[name]) as default, LitePipeline(folders[name], low_memory=True) as low:
            want, got = default(PROMPT, **kwargs), low(PROMPT, **kwargs)
            assert np.array_equal(want.latents, got.latents), name


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming the culprit, nothing written


def without_vae_encoder(folder: Path, tmp_path: Path) -> Path:
    """A copy of the folder as `convert --components text_encoder,unet,vae_decoder` writes it."""
    copy = Path(shutil.copytree(folder, tmp_path / f"{folder.name}-no-encoder"))
    (copy / "vae_encoder.tflite").unlink()
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["components"]["vae_encoder"]
    manifest["options"]["components"].remove("vae_encoder")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def refused(*args, culprit: str, reason: str) -> None:
    """The command exits 2 with one error line naming the culprit and the reason."""
    code, stdout, stderr = invoke(*args)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, stdout, stderr)
    assert lines[0].startswith("difflite: error: ") and culprit in lines[0] and reason in lines[0], lines[0]


@pytest.fixture
def pictures(tmp_path):
    image_path, mask_path = tmp_path / "in.png", tmp_path / "mask.png"
    picture().save(image_path)
    mask().save(mask_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "bomb.png").write_bytes(hostile_images.decompression_bomb())
    return tmp_path


@pytest.mark.parametrize("folder, extra, culprit, reason", [
    ("inpaint", ["--mask", "{t}/mask.png"], "--mask", "needs --init-image"),
    ("tiny", ["--mask", "{t}/mask.png"], "--mask", "needs --init-image"),
    ("inpaint", ["--init-image", "{t}/in.png", "--mask", "{t}/notes.txt"], "--mask {t}/notes.txt",
     "cannot identify"),
    ("tiny", ["--init-image", "{t}/in.png", "--mask", "{t}/nothing.png"], "--mask {t}/nothing.png",
     "no such image file"),
    ("inpaint", ["--init-image", "{t}/in.png", "--mask", "{t}/bomb.png"], "--mask {t}/bomb.png",
     "100000 x 100000 pixels"),
    ("inpaint", ["--init-image", "{t}/in.png", "--mask", "{t}/mask.png", "--strength", "0"], "--strength 0.0",
     "(0, 1]"),
    # a 9-channel UNet runs only with a mask (diffusers' text-to-image pipelines cannot run it either)
    ("inpaint", [], "unet.tflite", "an inpainting UNet (9 input channels"),
    ("inpaint", ["--init-image", "{t}/in.png"], "unet.tflite", "runs only with --init-image and --mask"),
], ids=["no-init-image-9", "no-init-image-4", "mask-not-an-image", "mask-missing", "mask-bomb", "strength-0",
        "txt2img-on-9-channels", "img2img-on-9-channels"])
def test_bad_inputs(folders, pictures, folder, extra, culprit, reason):
    target = pictures / "x.png"
    values = {"t": pictures}
    refused("generate", folders[folder], PROMPT, "-o", target, "--steps", "2",
            *(a.format(**values) for a in extra), culprit=culprit.format(**values), reason=reason)
    assert not target.exists()


@pytest.mark.parametrize("name", ["inpaint", "tiny"])
def test_a_mask_needs_the_vae_encoder(folders, pictures, tmp_path, name):
    folder = without_vae_encoder(folders[name], tmp_path)
    target = pictures / "x.png"
    refused("generate", folder, PROMPT, "-o", target, "--init-image", pictures / "in.png", "--mask",
            pictures / "mask.png", culprit="vae_encoder.tflite",
            reason="inpainting needs it: convert with --components text_encoder,unet,vae_decoder,vae_encoder")
    assert not target.exists()


def test_the_python_api_refuses_as_the_command(lite):
    with pytest.raises(BadInput, match="--mask needs --init-image"):
        lite["tiny"](PROMPT, steps=2, mask_image=mask())
    with pytest.raises(BadInput, match="an inpainting UNet"):
        lite["inpaint"](PROMPT, steps=2)
    with pytest.raises(BadInput, match="no denoising step"):
        lite["inpaint"](PROMPT, steps=2, init_image=picture(), mask_image=mask(), strength=0.2)
