"""`difflite generate` against diffusers' own PyTorch pipelines (same prompt, seed and weights):
txt2img with several schedulers, with and without classifier-free guidance, batch-1 and batch-2
UNet exports, img2img; the console script end to end; and the error paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from difflite.core.errors import BadInput

from support import ROOT
from support.cli import convert_side_by_side, difflite_command, run_difflite
from support.numerics import psnr
from support.torch_threads import one_torch_thread

HEIGHT, WIDTH = 64, 96  # non-square on purpose
PROMPT = "a photo of an astronaut riding a horse"
MIN_PSNR_DB = 30.0  # the requirement (fp32), for any model
# The tiny preset's random weights barely listen to the text: another prompt or no guidance still
# lands near 30 dB of the same picture. fp32 LiteRT vs PyTorch lands above 100 dB, so the tests
# hold the tiny preset to a bar that another prompt, seed, scheduler or guidance cannot reach.
TINY_PSNR_DB = 60.0
STEPS = 3


def difflite(*args) -> subprocess.CompletedProcess:
    return run_difflite(*args, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[int, Path]:
    """Two conversions of preset:tiny at 64x96 by the console script, side by side (builtins only,
    so no op library is needed): batch 1 with the VAE encoder, batch 2 (one UNet call for
    guidance) without it."""
    base = tmp_path_factory.mktemp("generate")
    out = {1: base / "b1", 2: base / "b2"}
    components = {1: "text_encoder,unet,vae_decoder,vae_encoder", 2: "text_encoder,unet,vae_decoder"}
    convert_side_by_side({f"--batch {batch}": ["preset:tiny", "-o", folder, "--height", HEIGHT, "--width", WIDTH,
                                                "--batch", batch, "--components", components[batch], "--no-fuse",
                                                "--json"] for batch, folder in out.items()})
    return out


@pytest.fixture(scope="module")
def lite(folders):
    from difflite.runtime.generate import LitePipeline

    return {batch: LitePipeline(folder) for batch, folder in folders.items()}


class Reference:
    """diffusers' StableDiffusionPipeline / StableDiffusionImg2ImgPipeline on the source torch
    modules of the output folder, results cached (batch 1 and 2 exports share a reference)."""

    def __init__(self, folder: Path):
        from difflite.folder.output_folder import OutputFolder
        from difflite.verify import load_source

        self.source = load_source(OutputFolder.read(folder), None, None)
        self.cache: dict = {}

    def pipeline(self, scheduler: str, img2img: bool, spacing: str | None):
        from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

        from difflite.diffusers_schedulers import diffusers_scheduler

        cls = StableDiffusionImg2ImgPipeline if img2img else StableDiffusionPipeline
        s = self.source
        pipe = cls(vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
                   scheduler=diffusers_scheduler(scheduler, s.scheduler_config, spacing), safety_checker=None,
                   feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def __call__(self, scheduler, steps, seed, guidance, prompt=PROMPT, image=None, strength=None, spacing=None):
        key = (scheduler, steps, seed, guidance, prompt, None if image is None else image.tobytes(), strength,
               spacing)
        if key not in self.cache:
            with one_torch_thread():
                kwargs = {"num_inference_steps": steps, "guidance_scale": guidance, "output_type": "np",
                          "generator": torch.Generator("cpu").manual_seed(seed)}
                if image is None:
                    result = self.pipeline(scheduler, False, spacing)(prompt, height=HEIGHT, width=WIDTH, **kwargs)
                else:
                    result = self.pipeline(scheduler, True, spacing)(prompt, image=image, strength=strength,
                                                                     **kwargs)
            self.cache[key] = result.images[0]
        return self.cache[key]


@pytest.fixture(scope="module")
def reference(folders) -> Reference:
    return Reference(folders[1])


def init_image(size=(WIDTH, HEIGHT), seed=0) -> Image.Image:
    """A smooth picture with some noise (the VAE sees structure, not only noise)."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin(x / 5.0) * np.cos(y / 7.0)], axis=-1)
    pixels = np.clip(base + 0.1 * rng.standard_normal((h, w, 3)), 0, 1)
    return Image.fromarray((pixels * 255).round().astype(np.uint8))


# ---------------------------------------------------------------------------------------------
# Parity


@pytest.mark.parametrize("scheduler,guidance,batch,spacing", [
    ("euler", 7.5, 1, None), ("ddim", 7.5, 1, None), ("dpm++", 7.5, 1, None), ("pndm", 7.5, 1, None),
    ("default", 7.5, 1, None), ("euler", 1.0, 1, None), ("dpm++", 1.0, 1, None),
    ("euler", 7.5, 2, None), ("ddim", 7.5, 2, None), ("dpm++", 7.5, 2, None), ("ddim", 1.0, 1, None),
    # stochastic steps (the generator's stream after the initial noise), Karras sigmas, few-step
    ("euler-a", 7.5, 1, None), ("dpm++-2m-karras", 7.5, 2, None), ("lcm", 1.0, 1, None),
    ("euler", 7.5, 1, "trailing"), ("ddim", 1.0, 1, "trailing"),
])
def test_txt2img_matches_diffusers(lite, reference, scheduler, guidance, batch, spacing):
    result = lite[batch](PROMPT, steps=STEPS, seed=3, guidance=guidance, scheduler=scheduler,
                         timestep_spacing=spacing)
    expected = reference(scheduler, STEPS, 3, guidance, spacing=spacing)
    assert result.image.shape == expected.shape == (HEIGHT, WIDTH, 3)
    assert expected.std() > 0.02, "the reference picture is flat: the parity check would mean nothing"
    value = psnr(result.image, expected)
    label = f"{scheduler} guidance {guidance} batch {batch} spacing {spacing}"
    print(f"txt2img {label}: PSNR {value:.1f} dB")
    assert value >= max(MIN_PSNR_DB, TINY_PSNR_DB), f"{label}: {value:.1f} dB"
    assert result.settings["classifier_free_guidance"] == (guidance > 1)
    calls_per_step = 2 if (guidance > 1 and batch == 1) else 1
    assert result.settings["unet_calls"] == calls_per_step * result.settings["denoising_steps"]


def test_the_check_can_fail(lite, reference):
    """Another seed, prompt, guidance or scheduler gives a picture far below the bar, so passing
    it means the same picture."""
    expected = reference("euler", STEPS, 3, 7.5)
    for kwargs in ({"seed": 4}, {"prompt": "a red car"}, {"guidance": 1.0}, {"scheduler": "ddim"}):
        args = {"prompt": PROMPT, "seed": 3, "guidance": 7.5, "scheduler": "euler", **kwargs}
        image = lite[1](args.pop("prompt"), steps=STEPS, **args).image
        assert psnr(image, expected) < TINY_PSNR_DB - 10, kwargs


@pytest.mark.parametrize("scheduler,strength,size", [
    ("euler", 0.6, (WIDTH, HEIGHT)), ("ddim", 0.75, (WIDTH, HEIGHT)), ("dpm++", 0.9, (70, 50)),
])
def test_img2img_matches_diffusers(lite, reference, scheduler, strength, size):
    picture = init_image(size)
    steps = 4
    result = lite[1]("a red car", steps=steps, seed=5, guidance=7.5, scheduler=scheduler, init_image=picture,
                     strength=strength)
    # difflite resizes to the converted size itself; diffusers' img2img keeps the given size
    resized = picture if size == (WIDTH, HEIGHT) else picture.resize((WIDTH, HEIGHT), Image.Resampling.LANCZOS)
    expected = reference(scheduler, steps, 5, 7.5, prompt="a red car", image=resized, strength=strength)
    value = psnr(result.image, expected)
    print(f"img2img {scheduler} strength {strength} size {size}: PSNR {value:.1f} dB")
    assert value >= max(MIN_PSNR_DB, TINY_PSNR_DB), f"img2img {scheduler} strength {strength}: PSNR {value:.1f} dB"
    assert result.settings["denoising_steps"] == min(int(steps * strength), steps)
    if strength > 0.75:
        return  # at high strength the tiny preset barely sees the init image
    other = lite[1]("a red car", steps=steps, seed=5, guidance=7.5, scheduler=scheduler,
                    init_image=init_image(size).transpose(Image.Transpose.FLIP_LEFT_RIGHT), strength=strength)
    assert psnr(other.image, expected) < TINY_PSNR_DB - 10


def test_progress_and_timings(lite):
    seen = []
    result = lite[2](PROMPT, steps=2, seed=0, guidance=7.5, scheduler="ddim", progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2), (2, 2)]
    for key in ("text_encoder", "unet", "unet_per_step", "vae_decoder", "total"):
        assert result.timings[key] >= 0, key
    assert result.settings["unet_batch"] == 2 and result.settings["scheduler"] == "DDIMScheduler"


# ---------------------------------------------------------------------------------------------
# The console script


def test_cli_end_to_end(folders, lite, tmp_path):
    target = tmp_path / "pictures" / "astronaut.png"
    target.parent.mkdir()
    run = difflite("generate", folders[1], PROMPT, "-o", target, "--steps", "2", "--seed", "7", "--scheduler",
                   "dpm++", "--guidance", "5", "--negative-prompt", "blurry", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["output"] == str(target)
    assert data["settings"]["scheduler"] == "DPMSolverMultistepScheduler"
    assert data["timings"]["unet"] > 0 and data["timings"]["total"] > 0
    with Image.open(target) as png:
        assert png.format == "PNG" and png.size == (WIDTH, HEIGHT) and png.mode == "RGB"
        pixels = np.asarray(png)
    expected = lite[1](PROMPT, negative_prompt="blurry", steps=2, seed=7, guidance=5.0, scheduler="dpm++").uint8
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["astronaut.png"], "temporary files left behind"


def test_cli_img2img_in_process(folders, lite, tmp_path):
    """The command's img2img path through click (in process: no second interpreter start)."""
    from click.testing import CliRunner

    from difflite.cli import main

    source = tmp_path / "in.png"
    init_image((80, 48)).save(source)
    target = tmp_path / "out.png"
    run = CliRunner().invoke(main, ["generate", str(folders[1]), "a red car", "-o", str(target), "--steps", "2",
                                    "--init-image", str(source), "--strength", "0.5", "--scheduler", "euler"])
    assert run.exit_code == 0, run.output
    assert "wrote" in run.output
    with Image.open(target) as png:
        pixels = np.asarray(png)
    expected = lite[1]("a red car", steps=2, scheduler="euler", init_image=source, strength=0.5).uint8
    assert np.array_equal(pixels, expected)


def smooth_picture(width: int, height: int) -> Image.Image:
    """A gradient with waves: quick to make and to compress at any size."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin(x / 50.0) * np.cos(y / 70.0)], axis=-1)
    return Image.fromarray((pixels * 255).round().astype(np.uint8))


def peak_mb_of_generate(*args):
    """`difflite generate ARGS` in a fresh process (difflite.core.childmem): its run, with its own
    peak resident set in MB."""
    from support import child_env

    from difflite.core.childmem import measure_command

    return measure_command([sys.executable, "-m", "difflite", "generate", *map(str, args)], cwd=ROOT,
                           env=child_env(TF_CPP_MIN_LOG_LEVEL="2"))


LARGE_PICTURE = (4000, 3000)  # 12 Mpx: a camera's photo
DECODED_MB = LARGE_PICTURE[0] * LARGE_PICTURE[1] * 4 / 2**20  # PIL holds RGB in 4 bytes a pixel


def test_cli_img2img_from_a_large_picture_in_bounded_memory(folders, lite, tmp_path):
    """A legal 4000 x 3000 PNG is read (through the bounded loader) and resized to the model's
    96 x 64 before any model loads: the command's peak memory stays within two decoded copies of
    the picture of the same command on a picture of the model's own size, and the picture made
    is the one the pipeline makes from the same file in process."""
    large, small = tmp_path / "large.png", tmp_path / "small.png"
    smooth_picture(*LARGE_PICTURE).save(large)
    smooth_picture(WIDTH, HEIGHT).save(small)
    options = ("--steps", "2", "--strength", "0.5", "--scheduler", "euler")
    peaks = {}
    for name, source in (("small", small), ("large", large)):
        run = peak_mb_of_generate(folders[1], "a red car", "-o", tmp_path / f"{name}-out.png",
                                  "--init-image", source, *options)
        assert run.returncode == 0, run.stderr[-3000:]
        peaks[name] = run.peak_rss_mb
    assert peaks["large"] <= peaks["small"] + 2 * DECODED_MB, peaks
    with Image.open(tmp_path / "large-out.png") as png:
        pixels = np.asarray(png)
    expected = lite[1]("a red car", steps=2, scheduler="euler", init_image=large, strength=0.5).uint8
    assert np.array_equal(pixels, expected)


def test_cli_img2img_needs_the_vae_encoder(folders, tmp_path):
    source = tmp_path / "in.png"
    init_image().save(source)
    run = difflite("generate", folders[2], "a red car", "-o", tmp_path / "x.png", "--init-image", source)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "vae_encoder.tflite" in lines[0] and "--components" in lines[0], run.stderr
    assert not (tmp_path / "x.png").exists()


def test_cli_missing_folder_and_unwritable_output(folders, tmp_path):
    missing = tmp_path / "nowhere"
    run = difflite("generate", missing, "x", "-o", tmp_path / "x.png")
    assert run.returncode == 2 and str(missing) in run.stderr and len(run.stderr.strip().splitlines()) == 1
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    run = difflite("generate", folders[1], "x", "-o", blocker / "x.png", "--steps", "1")
    assert run.returncode == 2 and "file.txt" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_unguided_generation_refuses_a_batch_2_unet(folders, lite, tmp_path):
    """guidance <= 1 (few-step models) runs a batch-1 UNet once a step; a UNet converted with
    batch 2 for guidance would compute every step twice, so generate says what to convert instead,
    before loading anything and without writing the picture."""
    target = tmp_path / "x.png"
    run = difflite("generate", folders[2], "x", "-o", target, "--steps", "1", "--guidance", "1")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "unet.tflite" in run.stderr and "--batch 1" in run.stderr and "Traceback" not in run.stderr
    assert not target.exists()
    result = lite[1](PROMPT, steps=1, guidance=1.0)
    assert result.settings["unet_calls"] == 1 and not result.settings["classifier_free_guidance"]


# ---------------------------------------------------------------------------------------------
# Errors through the Python API


def test_missing_component_and_bad_options(folders, lite, tmp_path):
    from difflite.runtime.generate import LitePipeline, generate, save_png

    broken = tmp_path / "broken"
    shutil.copytree(folders[2], broken)
    (broken / "unet.tflite").unlink()
    with pytest.raises(BadInput, match="unet.tflite"):
        LitePipeline(broken)
    with pytest.raises(BadInput, match="vae_encoder.tflite"):
        lite[2]("x", steps=2, init_image=init_image())
    with pytest.raises(BadInput, match="--steps"):
        lite[1]("x", steps=0)
    with pytest.raises(BadInput, match="--strength"):
        lite[1]("x", steps=2, init_image=init_image(), strength=1.5)
    with pytest.raises(BadInput, match="no denoising step"):
        lite[1]("x", steps=2, init_image=init_image(), strength=0.2)
    with pytest.raises(BadInput, match="missing.png"):
        lite[1]("x", steps=2, init_image=tmp_path / "missing.png")
    with pytest.raises(BadInput, match="is a folder"):
        generate(folders[1], "x", output=tmp_path, steps=1)
    with pytest.raises(BadInput, match="no such folder"):
        LitePipeline(tmp_path / "nowhere")
    save_png(np.zeros((4, 6, 3), np.uint8), tmp_path / "deeper" / "ok.png")
    assert (tmp_path / "deeper" / "ok.png").is_file()


def test_scheduler_choice_follows_the_config(folders, tmp_path, monkeypatch):
    from difflite import diffusers_schedulers
    from difflite.diffusers_schedulers import diffusers_scheduler
    from difflite.runtime import schedulers
    from difflite.runtime.schedulers import make_scheduler

    monkeypatch.setattr(schedulers, "_fallback", diffusers_schedulers.build)  # as the command wires it

    config = json.loads((folders[1] / "scheduler" / "scheduler_config.json").read_text())
    assert make_scheduler("default", config).class_name == config["_class_name"]
    assert make_scheduler("dpm++", config).class_name == "DPMSolverMultistepScheduler"
    dpm = diffusers_scheduler("dpm++", config)
    assert dpm.config.algorithm_type == "dpmsolver++"
    legacy = diffusers_scheduler("ddim", {**config, "steps_offset": 0, "clip_sample": True})
    assert legacy.config.steps_offset == 1 and legacy.config.clip_sample is False  # as diffusers' pipeline
    with pytest.raises(BadInput, match="not a diffusers scheduler"):
        make_scheduler("default", {**config, "_class_name": "NoSuchScheduler"})


def test_a_picture_needs_neither_torch_nor_diffusers(folders, lite):
    """The whole txt2img and img2img loop in a fresh process imports none of torch, diffusers or
    transformers, and makes the picture the in-process pipeline makes."""
    script = (
        "import sys, numpy as np\n"
        "from difflite.runtime.generate import LitePipeline\n"
        f"pipe = LitePipeline({str(folders[1])!r})\n"
        f"a = pipe({PROMPT!r}, steps=2, seed=11, scheduler='euler-a').uint8\n"
        "heavy = sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "np.save(sys.argv[1], a)\n"
    )
    target = folders[1].parent / "no_torch.npy"
    run = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = lite[1](PROMPT, steps=2, seed=11, scheduler="euler-a").uint8
    np.testing.assert_array_equal(np.load(target), expected)


# ---------------------------------------------------------------------------------------------
# --low-memory: one model resident at a time, the same picture


LOW_MEMORY_ORDER = [("load", "text_encoder"), ("free", "text_encoder"), ("load", "unet"), ("free", "unet"),
                    ("load", "vae_decoder"), ("free", "vae_decoder")]


@pytest.fixture
def tracked(monkeypatch):
    """Every Component made during the test: the loads and frees in order, the most open at once,
    and weak references to their interpreters (dead once the models are really freed)."""
    import weakref
    from types import SimpleNamespace

    from difflite.runtime.component import Component

    log = SimpleNamespace(events=[], peak=0, made=weakref.WeakSet(), interpreters=[])
    init, close = Component.__init__, Component.close

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        log.made.add(self)
        log.interpreters.append(weakref.ref(self.interpreter))
        log.events.append(("load", self.path.stem))
        log.peak = max(log.peak, sum(not c.closed for c in log.made))

    def tracked_close(self):
        if not self.closed:
            log.events.append(("free", self.path.stem))
        close(self)

    monkeypatch.setattr(Component, "__init__", tracked_init)
    monkeypatch.setattr(Component, "close", tracked_close)
    log.open = lambda: [c for c in log.made if not c.closed]
    log.interpreters_alive = lambda: sum(ref() is not None for ref in log.interpreters)
    return log


def test_low_memory_holds_one_model_at_a_time(folders, tracked):
    from difflite.runtime.generate import LitePipeline

    pipe = LitePipeline(folders[1], low_memory=True)
    result = pipe(PROMPT, steps=2, seed=1, scheduler="euler")
    assert tracked.events == LOW_MEMORY_ORDER
    assert tracked.peak == 1 and tracked.open() == [] and tracked.interpreters_alive() == 0
    assert result.settings["low_memory"] is True and result.timings["load"] > 0

    tracked.events.clear()
    pipe("a red car", steps=2, seed=1, scheduler="euler", init_image=init_image(), strength=0.5)
    assert tracked.events == [("load", "vae_encoder"), ("free", "vae_encoder"), *LOW_MEMORY_ORDER]
    assert tracked.peak == 1 and tracked.open() == [] and tracked.interpreters_alive() == 0


def test_default_keeps_the_models_until_close(folders, tracked):
    """The counter can see more than one model: the default pipeline keeps all of them."""
    from difflite.runtime.generate import LitePipeline

    pipe = LitePipeline(folders[1])
    pipe(PROMPT, steps=2, seed=1, scheduler="euler")
    pipe(PROMPT, steps=2, seed=2, scheduler="euler")
    assert sorted(tracked.events) == [("load", n) for n in ("text_encoder", "unet", "vae_decoder")]
    assert tracked.peak == 3 and len(tracked.open()) == 3
    pipe.close()
    assert tracked.open() == [] and tracked.interpreters_alive() == 0
    pipe.close()


def test_low_memory_gives_the_same_latents(folders):
    from difflite.runtime.generate import LitePipeline

    kwargs = [{"scheduler": "dpm++"}, {"scheduler": "euler", "guidance": 1.0},
              {"scheduler": "ddim", "init_image": init_image(), "strength": 0.5}]
    with LitePipeline(folders[1]) as default, LitePipeline(folders[1], low_memory=True) as low:
        for kw in kwargs:
            want, got = default(PROMPT, steps=2, seed=4, **kw), low(PROMPT, steps=2, seed=4, **kw)
            assert np.array_equal(want.latents, got.latents), kw
            assert np.array_equal(want.image, got.image), kw
            assert want.settings == {**got.settings, "low_memory": False}


def test_cli_low_memory_writes_the_same_png(folders, tmp_path):
    from click.testing import CliRunner

    from difflite.cli import main

    reports = {}
    for flags in ([], ["--low-memory"]):
        target = tmp_path / f"{len(flags)}.png"
        run = CliRunner().invoke(main, ["generate", str(folders[1]), PROMPT, "-o", str(target), "--steps", "2",
                                        "--seed", "9", "--scheduler", "euler", "--json", *flags])
        assert run.exit_code == 0, run.output
        reports[bool(flags)] = json.loads(run.output)
    assert (tmp_path / "0.png").read_bytes() == (tmp_path / "1.png").read_bytes()
    for low_memory, report in reports.items():
        assert report["settings"]["low_memory"] is low_memory
        assert report["timings"]["load"] > 0
    assert reports[False]["timings"].keys() == reports[True]["timings"].keys()
    help_text = CliRunner().invoke(main, ["generate", "--help"]).output
    assert "--low-memory" in help_text and "peak memory" in help_text


@pytest.mark.parametrize("flags", [[], ["--low-memory"]], ids=["default", "low-memory"])
def test_cli_json_reports_the_memory_after_each_stage(folders, tmp_path, flags):
    """--json's memory_mb: per stage, in the order they ran, the process's peak resident MB so far
    (never falling) and what stayed resident after it; the last stage's peak is the process's own
    peak (its ru_maxrss, through difflite.core.childmem: only the PNG's encoding and the report
    come after it)."""
    run = peak_mb_of_generate(folders[1], PROMPT, "-o", tmp_path / "out.png", "--steps", "2", "--json", *flags)
    assert run.returncode == 0, run.stderr[-3000:]
    process_peak = run.peak_rss_mb
    memory = json.loads(run.stdout)["memory_mb"]
    assert list(memory) == ["text_encoder", "unet", "vae_decoder"], memory
    peaks = [stage["peak_rss_mb"] for stage in memory.values()]
    assert peaks == sorted(peaks) and peaks[0] > 0, memory
    assert all(stage["rss_after_mb"] <= stage["peak_rss_mb"] for stage in memory.values()), memory
    # generate rounds to 0.1 MB; the kernel's RSS counters are per-CPU batched, so the VmHWM read
    # inside and the ru_maxrss taken at exit may differ by a fraction of a MB (seen: 0.07 MB)
    assert 0.9 * process_peak <= peaks[-1] <= 1.005 * process_peak + 0.05, (memory, process_peak)


def test_closed_component(folders):
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.component import Component

    component = Component(OutputFolder.read(folders[1]).components["text_encoder"])
    ids = np.zeros((1, 77), np.int32)
    assert component(input_ids=ids)["last_hidden_state"].shape[0] == 1
    component.close()
    component.close()
    assert component.closed and component.delegate_stats() == {}
    with pytest.raises(RuntimeError, match="closed"):
        component(input_ids=ids)


# ---------------------------------------------------------------------------------------------
# The OpenCL delegate's stats file (stats_path) goes with its Component


STATS_SCRIPT = """
import gc, sys
import numpy as np
from difflite.folder.output_folder import OutputFolder
from difflite.runtime.component import Component

entry = OutputFolder.read(sys.argv[1]).components["text_encoder"]

def run():
    component = Component(entry, backend="opencl")
    component(input_ids=np.zeros((1, 77), np.int32))
    assert component.delegate_stats().get("nodes_claimed"), "the delegate wrote no stats"
    assert component.stats_path.is_file()
    return component

closed = run()
closed.close()
assert not closed.stats_path.exists(), "close() left the stats file"
dropped = run()
path = dropped.stats_path
del dropped
gc.collect()
assert not path.exists(), "garbage collection left the stats file"
kept = run()  # alive at exit
print("ok")
"""


def opencl_env(tmp: Path) -> dict:
    from support.oplib_helpers import build_oplib

    return {**os.environ, "TMPDIR": str(tmp), "DIFFLITE_OPLIB": str(build_oplib()), "TF_CPP_MIN_LOG_LEVEL": "2"}


def stats_files(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("difflite-stats-*"))


def test_component_removes_its_stats_file(folders, tmp_path):
    """The OpenCL backend writes the file: close(), garbage collection and the interpreter's exit
    each remove it."""
    env = opencl_env(tmp_path)
    run = subprocess.run([sys.executable, "-c", STATS_SCRIPT, str(folders[2])], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
    assert stats_files(tmp_path) == []


@pytest.mark.parametrize("flags", [[], ["--low-memory"]], ids=["default", "low-memory"])
def test_cli_leaves_no_stats_file(folders, tmp_path, flags):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = subprocess.run([*difflite_command(), "generate", str(folders[2]), PROMPT, "-o", str(tmp_path / "x.png"),
                          "--steps", "1", "--backend", "opencl", "--json", *flags], capture_output=True, text=True,
                         cwd=ROOT, env=opencl_env(tmp), check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["settings"]["low_memory"] is bool(flags)
    assert stats_files(tmp) == []


def test_opencl_fallback_none_fails_cleanly_and_cpu_warns_and_runs(folders, lite, tmp_path):
    """No OpenCL platform (an empty ICD folder): --backend opencl fails with exit 2 and the reason
    on one line, writing nothing; with --fallback cpu it says why once and makes the CPU backend's
    picture."""
    icd = tmp_path / "no-icd"
    icd.mkdir()
    env = {**os.environ, "OCL_ICD_VENDORS": str(icd)}
    target = tmp_path / "out.png"
    base = [*difflite_command(), "generate", str(folders[1]), PROMPT, "-o", str(target), "--steps", "2",
            "--seed", "3", "--backend", "opencl"]
    failed = subprocess.run(base, capture_output=True, text=True, env=env, cwd=ROOT)
    assert failed.returncode == 2, failed.stderr
    lines = [line for line in failed.stderr.splitlines() if line.startswith("difflite: error:")]
    assert len(lines) == 1 and "no OpenCL platform" in lines[0], failed.stderr
    assert "Traceback" not in failed.stderr and not target.exists()
    ran = subprocess.run([*base, "--fallback", "cpu", "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("difflite: warning:")]
    assert len(warnings) == 1 and "--fallback cpu" in warnings[0] and "no OpenCL platform" in warnings[0], ran.stderr
    settings = json.loads(ran.stdout)["settings"]
    assert settings["backend"] == "cpu" and "no OpenCL platform" in settings["fallback_reason"]
    with Image.open(target) as png:
        pixels = np.asarray(png)
    expected = lite[1](PROMPT, steps=2, seed=3).uint8
    assert np.array_equal(pixels, expected)


# DIFFLITE_CL_FAULT (custom_ops/delegate/opencl/cl_loader.cc) makes PoCL fail as a broken device
# would: a program that does not build, a buffer the device refuses, a kernel launch that fails
# while the model runs (binary_rows: elementwise ops, launched only at Invoke).
DEVICE_FAULTS = {"build": ("cannot load", "CL_BUILD_PROGRAM_FAILURE"),
                 "alloc:2": ("cannot load", "CL_MEM_OBJECT_ALLOCATION_FAILURE"),
                 "enqueue:binary_rows": ("failed while running", "CL_OUT_OF_RESOURCES")}


@pytest.mark.parametrize("fault", DEVICE_FAULTS)
def test_opencl_device_faults_fail_cleanly(folders, tmp_path, fault):
    """Each fault: exit 2 with one line naming the model, what failed and the driver's code; no
    traceback, no picture."""
    when, code = DEVICE_FAULTS[fault]
    target = tmp_path / "out.png"
    run = subprocess.run([*difflite_command(), "generate", str(folders[1]), PROMPT, "-o", str(target), "--steps", "2",
                          "--seed", "3", "--backend", "opencl"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "DIFFLITE_CL_FAULT": fault})
    errors = [line for line in run.stderr.splitlines() if line.startswith("difflite: error:")]
    assert run.returncode == 2 and len(errors) == 1, run.stderr[-3000:]
    assert ".tflite" in errors[0] and when in errors[0] and code in errors[0], errors
    assert "Traceback" not in run.stderr and not target.exists()


def test_opencl_trace_names_every_launch_and_changes_nothing(folders, tmp_path):
    """DIFFLITE_CL_TRACE=1 (cl_loader.cc): every buffer's creation and release and every kernel
    launch, by kernel name and sizes, on stderr; the picture is the untraced one."""
    pictures, traces = {}, {}
    for traced in (False, True):
        target = tmp_path / f"out_{traced}.png"
        env = {**os.environ, **({"DIFFLITE_CL_TRACE": "1"} if traced else {})}
        run = subprocess.run([*difflite_command(), "generate", str(folders[1]), PROMPT, "-o", str(target), "--steps",
                              "2", "--seed", "3", "--backend", "opencl"], capture_output=True, text=True, cwd=ROOT,
                             env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        traces[traced] = [line for line in run.stderr.splitlines() if line.startswith("difflite-cl: ")]
        with Image.open(target) as png:
            pictures[traced] = np.asarray(png)
    assert traces[False] == [] and np.array_equal(pictures[True], pictures[False])
    launches = [line.split()[2] for line in traces[True] if line.split()[1] == "launch"]
    assert {"binary_rows", "gemm_rows", "conv2d_rows"} <= set(launches), sorted(set(launches))
    kinds = {line.split()[1] for line in traces[True]}
    assert {"create", "release", "launch"} <= kinds, kinds


def test_opencl_fault_mid_run_falls_back_to_the_cpu_picture(folders, lite, tmp_path):
    """A kernel launch failing while the text encoder runs, with --fallback cpu: one warning naming
    the reason, the call and every later model on the CPU backend, and the CPU backend's picture."""
    target = tmp_path / "out.png"
    run = subprocess.run([*difflite_command(), "generate", str(folders[1]), PROMPT, "-o", str(target), "--steps", "2",
                          "--seed", "3", "--backend", "opencl", "--fallback", "cpu", "--json"], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "DIFFLITE_CL_FAULT": "enqueue:binary_rows"})
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if line.startswith("difflite: warning:")]
    assert len(warnings) == 1 and "failed while running" in warnings[0] and "CL_OUT_OF_RESOURCES" in warnings[0]
    settings = json.loads(run.stdout)["settings"]
    assert settings["backend"] == "cpu" and "CL_OUT_OF_RESOURCES" in settings["fallback_reason"]
    with Image.open(target) as png:
        assert np.array_equal(np.asarray(png), lite[1](PROMPT, steps=2, seed=3).uint8)


def test_four_generate_processes_at_once_share_one_folder_and_one_program_cache(folders):
    """benchmarks/concurrent_generate.py: 4 `generate --backend opencl` processes start together on
    one output folder with one fresh program cache, then one more alone: all succeed with the same
    picture, the lone run finds every program stored (it adds no entry), nothing temporary is left
    in the cache, no stats file in the temporary directory."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "concurrent_generate.py"), str(folders[1]),
                          "--processes", "4", "--steps", "2"], capture_output=True, text=True, cwd=ROOT)
    result = json.loads(run.stdout)
    assert run.returncode == 0 and result["ok"], (run.stdout[-3000:], run.stderr[-2000:])
    assert [row["returncode"] for row in result["together"]] == [0, 0, 0, 0] and result["pictures_identical"]
    assert result["cache_after_together"]["entries"] > 5
    assert result["cache_after_alone"] == result["cache_after_together"] and not result["stats_files_left"]
