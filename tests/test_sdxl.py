"""SDXL (issue 32, items 1 and 2): the presets' architecture (two text encoders, text_time
conditioning, transformer depth > 1), the SDXL wrapper modules against transformers / diffusers,
the conversion of preset:sdxl-tiny (its manifest's new inputs and outputs, the fusion counts),
verify against PyTorch, and bench (generate: tests/test_sdxl_generate.py). SDXL's diffusers folders, single files and LoRAs:
tests/test_sdxl_sources.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from support.cli import run_difflite

from difflite.compiler import convert, export
from difflite.compiler.presets import SDXL_TIME_IDS, build_preset, preset_configs
from difflite.core.errors import BadInput

SDXL_COMPONENTS = ["text_encoder", "text_encoder_2", "unet", "vae_decoder", "vae_encoder"]


@pytest.fixture(scope="module")
def sdxl_tiny():
    return build_preset("sdxl-tiny", 0)


@pytest.fixture(scope="module")
def sdxl_out(tmp_path_factory) -> Path:
    """The whole folder at the preset's size, exports shared through the tests' export cache
    (tests/conftest.py): test_sdxl_sources.py converts this same preset, and whichever module
    comes second reuses the other's exports."""
    out = tmp_path_factory.mktemp("sdxl") / "sdxl-tiny"
    convert.convert("preset:sdxl-tiny", out, convert.ConvertOptions(components=None),
                    export_cache_dir=os.environ.get("DIFFLITE_EXPORT_CACHE"))
    return out


def _consistent(configs: dict) -> None:
    """What makes configs SDXL-shaped: diffusers' StableDiffusionXLPipeline concatenates both
    encoders' penultimate hidden states as the context and feeds text_encoder_2's projection and
    6 time ids to the text_time embedding."""
    unet, te1, te2 = configs["unet"], configs["text_encoder"], configs["text_encoder_2"]
    assert unet["addition_embed_type"] == "text_time"
    assert unet["cross_attention_dim"] == te1["hidden_size"] + te2["hidden_size"]
    assert unet["projection_class_embeddings_input_dim"] == \
        te2["projection_dim"] + SDXL_TIME_IDS * unet["addition_time_embed_dim"]
    assert max(unet["transformer_layers_per_block"]) > 1 and unet["use_linear_projection"] is True
    assert configs["vae"]["scaling_factor"] == 0.13025
    assert configs["scheduler"]["_class_name"] == "EulerDiscreteScheduler"


def test_sdxl_tiny_architecture(sdxl_tiny):
    _consistent(preset_configs("sdxl-tiny"))
    pipe = sdxl_tiny
    assert pipe.family == "sdxl" and pipe.tokenizer_2 is not None
    assert type(pipe.text_encoder).__name__ == "CLIPTextModel"
    assert type(pipe.text_encoder_2).__name__ == "CLIPTextModelWithProjection"
    assert pipe.text_encoder.config.hidden_size != pipe.text_encoder_2.config.hidden_size
    # depth 2 at the second level (and the mid block), linear projections
    assert len(pipe.unet.down_blocks[1].attentions[0].transformer_blocks) == 2
    assert len(pipe.unet.mid_block.attentions[0].transformer_blocks) == 2
    assert isinstance(pipe.unet.down_blocks[1].attentions[0].proj_in, torch.nn.Linear)
    assert not hasattr(pipe.unet.down_blocks[0], "attentions")
    assert pipe.unet.add_embedding is not None
    assert pipe.default_size == 128
    # small enough that a conversion takes seconds
    assert sum(p.numel() for p in pipe.unet.parameters()) < 3_000_000


def test_sdxl_configs_are_sdxl_base():
    configs = preset_configs("sdxl")
    _consistent(configs)
    unet = configs["unet"]
    assert unet["block_out_channels"] == [320, 640, 1280] and unet["transformer_layers_per_block"] == [1, 2, 10]
    assert unet["attention_head_dim"] == [5, 10, 20] and unet["cross_attention_dim"] == 2048
    assert unet["projection_class_embeddings_input_dim"] == 2816 and unet["sample_size"] == 128
    assert (configs["text_encoder"]["hidden_size"], configs["text_encoder_2"]["hidden_size"]) == (768, 1280)
    # the parameter count of SDXL base's UNet, built on the meta device (no weights)
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        model = UNet2DConditionModel.from_config(unet)
    assert 2_560_000_000 < sum(p.numel() for p in model.parameters()) < 2_570_000_000


def test_sd_presets_stay_sd():
    configs = preset_configs("tiny")
    assert "text_encoder_2" not in configs and "addition_embed_type" not in configs["unet"]


def test_pooled_module_matches_transformers(sdxl_tiny):
    encoder = sdxl_tiny.text_encoder_2
    spec = export.component_spec(sdxl_tiny, "text_encoder_2", 128, 128)
    ids = spec.example_inputs[0]
    eos = encoder.config.eos_token_id
    no_eos = torch.where(ids == eos, torch.full_like(ids, 5), ids)
    two_eos = ids.clone()
    two_eos[0, 3] = eos
    with torch.no_grad():
        for batch in (ids, no_eos, two_eos, torch.cat([ids, two_eos])):
            hidden, embeds = spec.module(batch)
            want = encoder(batch, output_hidden_states=True)
            torch.testing.assert_close(embeds, want.text_embeds, rtol=0, atol=1e-6)
            torch.testing.assert_close(hidden, want.hidden_states[-2], rtol=0, atol=0)


def test_specs(sdxl_tiny):
    te1 = export.component_spec(sdxl_tiny, "text_encoder", 128, 128)
    assert te1.output_names == (export.PENULTIMATE,)
    with torch.no_grad():
        want = sdxl_tiny.text_encoder(te1.example_inputs[0], output_hidden_states=True).hidden_states[-2]
        torch.testing.assert_close(te1.module(*te1.example_inputs), want, rtol=0, atol=0)
    unet = export.component_spec(sdxl_tiny, "unet", 128, 128, batch=2)
    assert unet.input_names == ("sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids")
    assert [tuple(t.shape) for t in unet.example_inputs[3:]] == [(2, 24), (2, SDXL_TIME_IDS)]


def test_text_encoder_2_of_an_sd_pipeline_is_refused():
    with pytest.raises(BadInput, match="no text_encoder_2"):
        export.component_spec(build_preset("tiny", 0), "text_encoder_2", 64, 64)


def test_convert_writes_sdxl_folder(sdxl_out):
    names = sorted(p.name for p in sdxl_out.iterdir())
    assert names == ["manifest.json", "report.json", "scheduler", *(f"{c}.tflite" for c in SDXL_COMPONENTS[:2]),
                     "tokenizer", "tokenizer_2", "unet.tflite", "vae_decoder.tflite", "vae_encoder.tflite"]
    manifest = json.loads((sdxl_out / "manifest.json").read_text())
    assert list(manifest["components"]) == SDXL_COMPONENTS
    latent = manifest["latent"]
    assert latent["family"] == "sdxl" and latent["scaling_factor"] == 0.13025
    assert (latent["context_hidden"], latent["text_hidden"], latent["text_hidden_2"]) == (80, 32, 48)
    assert (latent["text_embeds"], latent["time_ids"]) == (24, SDXL_TIME_IDS)
    # diffusers' defaults for a source that does not say (a preset)
    assert (latent["force_zeros_for_empty_prompt"], latent["requires_aesthetics_score"]) == (True, False)

    def tensors(component, kind):
        return {t["name"]: t["shape"] for t in manifest["components"][component][kind]
                if not t["name"].startswith("lora_")}

    assert tensors("text_encoder", "outputs") == {"penultimate_hidden_state": [1, 77, 32]}
    assert tensors("text_encoder_2", "outputs") == {"penultimate_hidden_state": [1, 77, 48], "text_embeds": [1, 24]}
    assert tensors("unet", "inputs") == {"sample": [1, 16, 16, 4], "timestep": [1],
                                         "encoder_hidden_states": [1, 77, 80], "text_embeds": [1, 24],
                                         "time_ids": [1, SDXL_TIME_IDS]}
    assert json.loads((sdxl_out / "scheduler" / "scheduler_config.json").read_text())["_class_name"] == \
        "EulerDiscreteScheduler"


def test_sdxl_fusion_counts(sdxl_out):
    """Every candidate of the SD 1.5 kinds is fused: 12 transformer blocks (2 + 2 in the down block,
    2 in the mid block, 3 x 2 in the up block) of 2 attentions, a GEGLU and 3 LayerNorms each."""
    fusion = {name: report["fusion"] for name, report in
              json.loads((sdxl_out / "report.json").read_text())["components"].items()}
    for name, kinds in fusion.items():
        for kind in ("attention", "gelu", "geglu", "groupnorm", "groupnorm_silu", "layernorm"):
            assert kinds[kind]["matched"] == kinds[kind]["candidates"], (name, kind)
    unet = fusion["unet"]
    assert (unet["attention"]["matched"], unet["geglu"]["matched"], unet["layernorm"]["matched"]) == (24, 12, 36)
    # text_encoder stops before its last layer; text_encoder_2 runs all 3 and its final layer norm
    assert (fusion["text_encoder"]["attention"]["matched"], fusion["text_encoder"]["layernorm"]["matched"]) == (2, 4)
    assert (fusion["text_encoder_2"]["attention"]["matched"], fusion["text_encoder_2"]["layernorm"]["matched"]) == (3, 7)


def test_verify_passes_against_pytorch(sdxl_out, lib):
    from difflite.verify import verify

    checks = verify(sdxl_out, seeds=(0,))
    assert {(c.component, c.output) for c in checks} == {
        ("text_encoder", "penultimate_hidden_state"), ("text_encoder_2", "penultimate_hidden_state"),
        ("text_encoder_2", "text_embeds"), ("unet", "noise_pred"), ("vae_decoder", "image"),
        ("vae_encoder", "latent_mean"), ("vae_encoder", "latent_std")}
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]


def test_bench_runs_the_fused_sdxl_folder(sdxl_out, lib):
    """The fused folder's custom ops on the op library's CPU backend, one picture's pipeline run
    included (the unfused folders: tests/test_sdxl_generate.py)."""
    result = run_difflite("bench", sdxl_out, "--backend", "cpu", "--runs", 1, "--warmup", 0, "--steps", 1, "--json")
    assert result.returncode == 0, result.stderr
    pipeline = json.loads(result.stdout)["pipeline"]
    assert pipeline["measured_calls"] == pipeline["calls"] and pipeline["calls"]["text_encoder_2"] >= 1


def test_generate_runs_sdxl(sdxl_out, lib, tmp_path):
    """The fused folder (op library ops) generates too; parity: tests/test_sdxl_generate.py."""
    result = run_difflite("generate", sdxl_out, "a cat", "-o", tmp_path / "x.png", "--steps", "2", "--json",
                          "--backend", "cpu", env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)["settings"]
    assert settings["family"] == "sdxl" and settings["time_ids"] == [128, 128, 0, 0, 128, 128]
    assert (tmp_path / "x.png").is_file()


def test_sd_folder_with_a_text_time_unet_is_refused_cleanly(tmp_path):
    """An SDXL UNet config in a folder without text_encoder_2: one line, not a pipeline without its
    second text encoder (SDXL folders themselves: tests/test_sdxl_sources.py)."""
    tiny = build_preset("tiny", 0)
    tiny.save_pretrained(tmp_path / "f")
    config_path = tmp_path / "f" / "unet" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "addition_embed_type": "text_time"}))
    from difflite.compiler.models import load_pipeline

    with pytest.raises(BadInput, match="text_encoder_2/config.json: missing \\(an SDXL folder's second text encoder"):
        load_pipeline(str(tmp_path / "f"))


def test_sdxl_pipeline_saves_as_an_sdxl_folder(sdxl_tiny, tmp_path):
    sdxl_tiny.save_pretrained(tmp_path / "f")
    index = json.loads((tmp_path / "f" / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline" and (tmp_path / "f" / "tokenizer_2").is_dir()
