"""Few-step and v-prediction generation against diffusers' pipelines on the same weights: an
LCM-distilled UNet (timestep_cond: the guidance scale as an embedding, no classifier-free
guidance), a v-prediction model (as preset:sd21-768), each through the console script's convert and
verify, then `generate` in process against diffusers at the parity bar of test_generate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_generate import (
    HEIGHT,
    MIN_PSNR_DB,
    PROMPT,
    TINY_PSNR_DB,
    WIDTH,
    Reference,
    difflite,
    psnr,
)

from difflite.core.errors import BadInput

COND_DIM = 24  # LCM-distilled SD 1.5 uses 256; any even width exercises the same path


def lcm_distilled_folder(folder: Path) -> Path:
    """preset:tiny with a UNet that has timestep conditioning (time_cond_proj_dim), saved as a
    diffusers folder whose scheduler is LCMScheduler, as LCM-distilled checkpoints ship."""
    from diffusers import UNet2DConditionModel

    from difflite.compiler.models import load_pipeline
    from difflite.compiler.presets import _perturb

    pipe = load_pipeline("preset:tiny")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        config = {k: v for k, v in pipe.unet.config.items() if not k.startswith("_")}
        unet = UNet2DConditionModel.from_config({**config, "time_cond_proj_dim": COND_DIM})
    _perturb(unet, 5)
    # the conditioning's projection is zero-initialised in LCM distillation's start; make it count
    with torch.no_grad():
        unet.time_embedding.cond_proj.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(6))
    pipe.unet = unet.eval()
    pipe.scheduler_config = {**pipe.scheduler_config, "_class_name": "LCMScheduler"}
    pipe.save_pretrained(folder)
    return folder


def convert(source, out: Path, *flags) -> Path:
    result = difflite("convert", source, "-o", out, "--height", HEIGHT, "--width", WIDTH, "--no-fuse",
                      "--components", "text_encoder,unet,vae_decoder", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def lcm_out(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("fewstep")
    return convert(lcm_distilled_folder(base / "lcm-src"), base / "lcm")


@pytest.fixture(scope="module")
def vpred_out(tmp_path_factory) -> Path:
    return convert("preset:tiny", tmp_path_factory.mktemp("vpred") / "out", "--prediction-type", "v_prediction")


def test_lcm_unet_has_a_timestep_cond_input_and_verifies(lcm_out):
    entry = json.loads((lcm_out / "manifest.json").read_text())["components"]["unet"]
    assert [i["name"] for i in entry["inputs"]] == ["sample", "timestep", "encoder_hidden_states", "timestep_cond"]
    assert entry["inputs"][3]["shape"] == [1, COND_DIM]
    result = difflite("verify", lcm_out, "--components", "unet", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["passed"]


@pytest.mark.parametrize("steps,guidance", [(4, 8.0), (2, 1.0), (1, 3.5)])
def test_lcm_distilled_matches_diffusers(lcm_out, steps, guidance):
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(lcm_out) as pipe:
        result = pipe(PROMPT, steps=steps, seed=11, guidance=guidance)
    expected = Reference(lcm_out)("default", steps, 11, guidance)
    assert expected.std() > 0.02
    value = psnr(result.image, expected)
    print(f"LCM-distilled {steps} steps, guidance {guidance}: PSNR {value:.1f} dB")
    assert value >= max(MIN_PSNR_DB, TINY_PSNR_DB)
    assert result.settings["scheduler"] == "LCMScheduler"
    assert result.settings["guidance_embedding"] and not result.settings["classifier_free_guidance"]
    assert result.settings["unet_calls"] == steps


def test_the_guidance_embedding_changes_the_picture(lcm_out):
    """The embedding is an input, not a constant: another scale gives another picture."""
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(lcm_out) as pipe:
        a = pipe(PROMPT, steps=2, seed=11, guidance=8.0).image
        b = pipe(PROMPT, steps=2, seed=11, guidance=2.0).image
    assert psnr(a, b) < TINY_PSNR_DB - 10


def test_lcm_unet_refuses_batch_2(lcm_out, tmp_path):
    """A batch-2 conditioned UNet would compute every step twice: refused before any work."""
    from difflite.runtime.generate import LitePipeline

    copy = tmp_path / "b2"
    shutil.copytree(lcm_out, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for spec in manifest["components"]["unet"]["inputs"]:
        spec["shape"][0] = 2
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInput, match="timestep_cond.*--batch 1"):
        LitePipeline(copy)(PROMPT, steps=2, guidance=8.0)


@pytest.mark.parametrize("scheduler,guidance,spacing", [
    ("euler", 7.5, None), ("dpm++-2m-karras", 7.5, None), ("ddim", 1.0, "trailing"), ("euler-a", 5.0, None),
])
def test_v_prediction_matches_diffusers(vpred_out, scheduler, guidance, spacing):
    from difflite.runtime.generate import LitePipeline

    source = json.loads((vpred_out / "manifest.json").read_text())["source"]
    assert source["prediction_type"] == "v_prediction"
    config = json.loads((vpred_out / "scheduler" / "scheduler_config.json").read_text())
    assert config["prediction_type"] == "v_prediction"
    with LitePipeline(vpred_out) as pipe:
        result = pipe(PROMPT, steps=3, seed=4, guidance=guidance, scheduler=scheduler, timestep_spacing=spacing)
    reference = Reference(vpred_out)
    assert reference.source.scheduler_config["prediction_type"] == "v_prediction"
    expected = reference(scheduler, 3, 4, guidance, spacing=spacing)
    value = psnr(result.image, expected)
    print(f"v_prediction {scheduler} guidance {guidance} spacing {spacing}: PSNR {value:.1f} dB")
    assert value >= max(MIN_PSNR_DB, TINY_PSNR_DB)


def test_v_prediction_is_not_epsilon(vpred_out):
    """The same weights read as epsilon give another picture: the prediction type reached the
    scheduler (the v-prediction parity above could not pass by accident)."""
    from difflite.runtime.generate import LitePipeline

    with LitePipeline(vpred_out) as pipe:
        v = pipe(PROMPT, steps=3, seed=4, guidance=7.5, scheduler="euler").image
        pipe.scheduler_config = {**pipe.scheduler_config, "prediction_type": "epsilon"}
        eps = pipe(PROMPT, steps=3, seed=4, guidance=7.5, scheduler="euler").image
    assert psnr(v, eps) < TINY_PSNR_DB - 10


def test_sd21_768_preset_is_v_prediction_at_768():
    from difflite.compiler.models import load_pipeline
    from difflite.compiler.presets import preset_configs

    configs = preset_configs("sd21-768")
    assert configs["scheduler"]["prediction_type"] == "v_prediction"
    assert configs["unet"]["upcast_attention"] and configs["unet"]["use_linear_projection"]
    assert configs["unet"]["sample_size"] * 8 == 768
    assert np.all(np.array(configs["unet"]["attention_head_dim"]) * 64 == np.array(configs["unet"]["block_out_channels"]))
    with pytest.raises(BadInput, match="unknown preset"):
        load_pipeline("preset:sd21-512")


def test_bench_runs_the_lcm_unet_once_a_step(lcm_out):
    result = difflite("bench", lcm_out, "--steps", 2, "--guidance", 8, "--runs", 1, "--warmup", 0, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    pipeline = json.loads(result.stdout)["pipeline"]
    assert pipeline["guidance"] is False
    assert pipeline["calls"] == pipeline["measured_calls"] == {"text_encoder": 1, "unet": 2, "vae_decoder": 1}
    assert any("timestep_cond" in note for note in pipeline["notes"])


# ---------------------------------------------------------------------------------------------
# The few-step setting: an LCM-LoRA merged at conversion, 4 LCM steps without guidance

# kohya layers with one alpha / rank for all (LCM-LoRA files use one alpha): diffusers' own loader,
# the independent reference here, applies a single alpha correctly.
LCM_LORA_LAYERS = [
    ("unet", f"{block}.{proj}", 4, 2.0)
    for block in ("down_blocks.0.attentions.0.transformer_blocks.0", "up_blocks.1.attentions.0.transformer_blocks.0")
    for proj in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "ff.net.2")
] + [("unet", "down_blocks.0.resnets.0.conv1", 4, 2.0), ("unet", "up_blocks.1.resnets.1.conv2", 4, 2.0),
     ("unet", "conv_in", 4, 2.0)]


@pytest.fixture(scope="module")
def lcm_lora(tmp_path_factory):
    from test_lora import write_kohya

    from difflite.compiler.models import load_pipeline

    folder = tmp_path_factory.mktemp("lcm-lora")
    path = folder / "lcm-lora.safetensors"
    write_kohya(load_pipeline("preset:tiny"), path, seed=8, layers=LCM_LORA_LAYERS)
    out = convert("preset:tiny", folder / "out", "--batch", "1", "--lora", f"{path}:0.9")
    return path, out


def diffusers_with_lora(lora_path: Path, scale: float):
    """diffusers' StableDiffusionPipeline on the unmerged preset, the LoRA loaded and fused by
    diffusers itself, with its LCMScheduler."""
    from diffusers import LCMScheduler, StableDiffusionPipeline

    from difflite.compiler.models import load_pipeline

    s = load_pipeline("preset:tiny")
    pipe = StableDiffusionPipeline(vae=s.vae, text_encoder=s.text_encoder, tokenizer=s.tokenizer, unet=s.unet,
                                   scheduler=LCMScheduler.from_config(s.scheduler_config), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.load_lora_weights(str(lora_path), adapter_name="lcm")
    pipe.fuse_lora(lora_scale=scale)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_lcm_lora_four_steps_match_diffusers(lcm_lora):
    from difflite.runtime.generate import LitePipeline

    path, out = lcm_lora
    with LitePipeline(out) as pipe:
        result = pipe(PROMPT, steps=4, seed=9, guidance=1.0, scheduler="lcm")
    reference = diffusers_with_lora(path, 0.9)
    with torch.no_grad():
        expected = reference(PROMPT, height=HEIGHT, width=WIDTH, num_inference_steps=4, guidance_scale=1.0,
                             generator=torch.Generator("cpu").manual_seed(9), output_type="np").images[0]
    value = psnr(result.image, expected)
    print(f"LCM-LoRA 4 steps: PSNR {value:.1f} dB")
    assert value >= max(MIN_PSNR_DB, TINY_PSNR_DB)
    assert result.settings["unet_calls"] == 4 and not result.settings["classifier_free_guidance"]
    # the LoRA matters: the same run on the preset without it lands far from this picture
    without = Reference(convert("preset:tiny", out.parent / "plain", "--batch", "1"))("lcm", 4, 9, 1.0)
    assert psnr(without, expected) < TINY_PSNR_DB - 10
