"""Run-time LoRAs end to end (issue 34): one conversion with slots, LoRA files chosen per picture
(`generate --lora`, `LitePipeline.set_loras`), against the same LoRAs baked in by `convert --lora`
and against diffusers' own `load_lora_weights`; fp32, fp16, int8 and int4 weights, fused files on
the op library's CPU and OpenCL (PoCL) backends and `--no-fuse` files; switching in one process;
bad files refused with one line, the loaded base unharmed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from difflite.compiler.models import load_pipeline
from difflite.core.errors import BadInput

from support.cli import convert_side_by_side, run_difflite
from support.lora_files import DIFFUSERS, KOHYA, KOHYA_SLOTS, METADATA, write_diffusers, write_kohya
from support.numerics import psnr

SIZE = 64
STEPS = 4
SEED = 5
PROMPT = "a watercolor of a lighthouse"
COMPONENTS = "text_encoder,unet,vae_decoder"
FP32_DB, FP16_DB = 50.0, 40.0  # the bars: run-time against baked-in pictures
QUANTIZED_DB = {"int8": 30.0, "int4": 25.0}  # the bases' own picture bars against fp32 files


@pytest.fixture(scope="module")
def loras(tmp_path_factory) -> dict[str, Path]:
    """A kohya file (float16, per-layer alphas) and a PEFT file (lora_adapter_metadata) over
    slotted layers of the UNet and the text encoder; LoCon and SD 2.x-shaped files for refusals."""
    base = tmp_path_factory.mktemp("lora_files")
    pipe = load_pipeline("preset:tiny")
    paths = {"kohya": base / "kohya.safetensors", "peft": base / "peft.safetensors",
             "locon": base / "locon.safetensors"}
    write_kohya(pipe, paths["kohya"], seed=11, layers=KOHYA_SLOTS)
    write_diffusers(pipe, paths["peft"], seed=12, style="peft", metadata=METADATA, layers=DIFFUSERS)
    write_kohya(pipe, paths["locon"], seed=13, layers=KOHYA)  # resnet 3x3 convolutions: no slot
    return paths


CONVERSIONS = {  # name: convert flags beyond the model, size and components
    "slots": [],
    "nofuse": ["--no-fuse", "--lora-slots", "auto"],
    "fp16": ["--precision", "fp16"],
    "int8": ["--precision", "fp16", "--weights", "int8"],
    "int4": ["--precision", "fp16", "--weights", "int4"],
    "base": ["--lora-slots", "none"],
    "baked": ["--lora-slots", "none", "--lora", "{kohya}:0.8"],
    "baked2": ["--lora-slots", "none", "--lora", "{kohya}:0.7", "--lora", "{peft}:-0.3"],
}


# The conversions with exports of their own (the others take slots' from the export cache: the LoRA
# slots, precision and weights are applied after the export); converted first.
EXPORTS = ("slots", "baked", "baked2")


@pytest.fixture(scope="module")
def folders(loras, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("lora_runtime")
    out = {name: base / name for name in CONVERSIONS}
    convert_side_by_side({name: ["preset:tiny", *[a.format(**{k: str(v) for k, v in loras.items()}) for a in args],
                                 "-o", out[name], "--height", SIZE, "--width", SIZE, "--components", COMPONENTS,
                                 "--json"]
                          for name, args in CONVERSIONS.items()}, first=EXPORTS)
    return out


def picture(folder: Path, loras=(), backend: str = "cpu") -> np.ndarray:
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(folder, backend=backend) as pipe:
        pipe.set_loras(loras)
        return pipe(PROMPT, steps=STEPS, seed=SEED, guidance=7.5).image


@pytest.fixture(scope="module")
def baked(folders) -> dict[str, np.ndarray]:
    return {name: picture(folders[name]) for name in ("base", "baked", "baked2")}


@pytest.mark.parametrize("name", ["slots", "nofuse"])
def test_a_run_time_lora_gives_the_baked_in_picture(folders, loras, baked, name):
    got = picture(folders[name], [f"{loras['kohya']}:0.8"])
    value = psnr(got, baked["baked"])
    print(f"{name}: run-time kohya LoRA against convert --lora: {value:.1f} dB")
    assert value >= FP32_DB
    assert psnr(baked["base"], baked["baked"]) < FP32_DB - 10  # the LoRA matters


def test_two_loras_add_as_diffusers_adds_them(folders, loras, baked):
    got = picture(folders["slots"], [f"{loras['kohya']}:0.7", (loras["peft"], -0.3)])
    value = psnr(got, baked["baked2"])
    print(f"two run-time LoRAs against both baked in: {value:.1f} dB")
    assert value >= FP32_DB


def test_scale_zero_and_no_lora_are_the_base_model_exactly(folders, loras, baked):
    none = picture(folders["slots"])
    assert np.array_equal(picture(folders["slots"], [f"{loras['kohya']}:0"]), none)
    assert psnr(none, baked["base"]) >= 100  # the same weights without slots


def test_diffusers_load_lora_weights_gives_the_same_picture(folders, loras):
    """On the PEFT file: diffusers 0.42 loads a kohya file's per-layer alphas wrongly (most layers
    get the most common alpha: compiler/lora.py's doc), which difflite does not copy."""
    from diffusers import PNDMScheduler, StableDiffusionPipeline

    s = load_pipeline("preset:tiny")
    pipe = StableDiffusionPipeline(vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
                                   scheduler=PNDMScheduler.from_config(s.scheduler_config), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.load_lora_weights(str(loras["peft"]), adapter_name="style")
    pipe.set_adapters(["style"], adapter_weights=[0.8])
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        expected = pipe(PROMPT, height=SIZE, width=SIZE, num_inference_steps=STEPS, guidance_scale=7.5,
                        generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").images[0]
    value = psnr(picture(folders["slots"], [f"{loras['peft']}:0.8"]), expected)
    print(f"run-time LoRA against diffusers' load_lora_weights: {value:.1f} dB")
    assert value >= FP32_DB


@pytest.mark.parametrize("name", ["fp16", "int8", "int4"])
def test_run_time_loras_on_fp16_and_quantized_bases(folders, loras, baked, name):
    got = picture(folders[name], [f"{loras['kohya']}:0.8"])
    value = psnr(got, baked["baked"])
    bar = FP16_DB if name == "fp16" else QUANTIZED_DB[name]
    print(f"{name} base, run-time LoRA, against the fp32 baked-in picture: {value:.1f} dB (bar {bar})")
    assert value >= bar


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_opencl_backend_applies_the_lora(folders, loras, baked, tmp_path, precision):
    folder = folders["slots" if precision == "fp32" else "fp16"]
    out = tmp_path / "opencl.png"
    result = run_difflite("generate", folder, PROMPT, "-o", out, "--steps", STEPS, "--seed", SEED, "--backend",
                          "opencl", "--lora", f"{loras['kohya']}:0.8", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["backend"] == "opencl"
    assert report["settings"]["loras"][0]["scale"] == 0.8
    got = np.asarray(Image.open(out), np.float64) / 255.0
    value = psnr(got, baked["baked"])
    print(f"OpenCL (PoCL) {precision}: {value:.1f} dB")
    assert value >= (35.0 if precision == "fp32" else FP16_DB - 5)  # an 8-bit PNG against a float picture


def test_switching_in_one_process_changes_no_base_weight(folders, loras, baked):
    from difflite.runtime.generate import LitePipeline
    from difflite.runtime.loras import plan_for_folder

    with LitePipeline(folders["slots"]) as pipe:
        def draw():
            return pipe(PROMPT, steps=STEPS, seed=SEED, guidance=7.5).image

        base = draw()
        pipe.set_loras([f"{loras['kohya']}:0.8"])
        styled = draw()
        unet = pipe.component("unet")
        # the library holds the factors once (float32 on the CPU backend), nothing per base weight,
        # and the pipeline keeps no copy of its own once the loaded models have taken them
        held = plan_for_folder(pipe.folder, [f"{loras['kohya']}:0.8"]).held_bytes()
        assert held > 0 and pipe.lora_bytes() == held and pipe.loras.held_bytes() == 0
        pipe.set_loras([(loras["peft"], 1.0)])
        other = draw()
        pipe.set_loras([])
        assert np.array_equal(draw(), base) and pipe.lora_bytes() == 0
        pipe.set_loras([f"{loras['kohya']}:0.8"])
        assert np.array_equal(draw(), styled)
        with pytest.raises(BadInput, match="locon.safetensors"):
            pipe.set_loras([loras["locon"]])
        assert np.array_equal(draw(), styled)  # a refused file leaves the active LoRAs in place
        assert pipe.component("unet") is unet  # never reloaded
    assert psnr(styled, baked["baked"]) >= FP32_DB
    assert psnr(other, styled) < FP32_DB - 10


def test_a_model_loaded_again_reads_its_loras_again(folders, loras, baked, tmp_path):
    """The pipeline keeps no factors once the models hold them: a released UNet that loads again
    takes them from the files (same picture), and refuses a file changed in between."""
    import shutil

    from difflite.runtime.generate import LitePipeline

    lora_file = tmp_path / "style.safetensors"
    shutil.copy(loras["kohya"], lora_file)
    with LitePipeline(folders["slots"]) as pipe:
        pipe.set_loras([f"{lora_file}:0.8"])
        first = pipe(PROMPT, steps=STEPS, seed=SEED, guidance=7.5).image
        assert pipe.loras.held_bytes() == 0
        pipe.release("unet")
        assert np.array_equal(pipe(PROMPT, steps=STEPS, seed=SEED, guidance=7.5).image, first)
        pipe.release("unet")
        shutil.copy(loras["peft"], lora_file)
        with pytest.raises(BadInput, match="style.safetensors: changed on disk"):
            pipe.component("unet")
    assert psnr(first, baked["baked"]) >= FP32_DB


@pytest.fixture(scope="module")
def bad_loras(loras, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name: (file, what the one line says)."""
    base = tmp_path_factory.mktemp("bad_loras")
    from safetensors.torch import save_file

    sd2 = base / "sd2.safetensors"  # cross-attention from 1024 (OpenCLIP) where this model has 32
    key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 1024), f"{key}.lora_up.weight": torch.zeros(32, 4)}, sd2)
    big = base / "rank200.safetensors"
    key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
    save_file({f"{key}.lora_down.weight": torch.ones(200, 32), f"{key}.lora_up.weight": torch.ones(32, 200)}, big)
    truncated = base / "truncated.safetensors"
    truncated.write_bytes(loras["kohya"].read_bytes()[:-100])
    pickled = base / "lora.ckpt"
    pickled.write_bytes(pickle.dumps({"lora_unet_x.lora_down.weight": [0.0]}))
    return {"sd2": (sd2, "another architecture"), "rank": (big, "rank"), "locon": (loras["locon"], "slot"),
            "truncated": (truncated, "truncated.safetensors"), "pickle": (pickled, ".safetensors")}


@pytest.mark.parametrize("case", ["sd2", "rank", "locon", "truncated", "pickle"])
def test_bad_lora_files_exit_2_with_one_line(folders, bad_loras, tmp_path, case):
    path, said = bad_loras[case]
    out = tmp_path / "never.png"
    result = run_difflite("generate", folders["slots"], PROMPT, "-o", out, "--steps", 1, "--lora", path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("difflite: error:"), result.stderr
    assert str(path.name) in lines[0] and said in lines[0], lines[0]
    assert not out.exists()


def test_a_folder_without_slots_refuses_a_run_time_lora(folders, loras, tmp_path):
    result = run_difflite("generate", folders["base"], PROMPT, "-o", tmp_path / "x.png", "--steps", 1, "--lora",
                          loras["kohya"])
    assert result.returncode == 2
    assert "without LoRA slots" in result.stderr
