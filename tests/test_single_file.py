"""difflite.compiler.single_file: original-format (LDM/CompVis/A1111) SD 1.x / 2.x checkpoints loaded
without --config (architecture, prediction type, EMA and tokenizer inferred), --vae, bad layouts."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

from difflite.compiler import single_file
from difflite.compiler.models import load_pipeline
from difflite.core.errors import BadInput

from support import ldm_layout as L
from support.cli import run_difflite as difflite

COMPONENTS = ("unet", "vae", "text_encoder")
# CLIP's ids as published tokenizations show them (e.g. Apple's ml-stable-diffusion tokenizer tests).
ASTRONAUT = ("a photo of an astronaut", [49406, 320, 1125, 539, 550, 18376, 49407])
ON_MARS = ("a photo of an astronaut riding a horse on mars",
           [49406, 320, 1125, 539, 550, 18376, 6765, 320, 4558, 525, 7496, 49407])


@pytest.fixture(scope="module")
def sd1() -> dict:
    return L.tiny_models("sd1")


@pytest.fixture(scope="module")
def sd2() -> dict:
    return L.tiny_models("sd2")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("single_file")


@pytest.fixture(scope="module")
def sd1_file(sd1, files) -> Path:
    return L.write_checkpoint(files / "tiny_sd1.safetensors", L.to_ldm(sd1, "sd1"))


@pytest.fixture(scope="module")
def sd1_pipe(sd1_file):
    return load_pipeline(str(sd1_file))


@pytest.fixture(scope="module")
def ema_unet(sd1):
    return L.perturbed_copy(sd1["unet"], seed=5)


@pytest.fixture(scope="module")
def sd1_ema_file(sd1, ema_unet, files) -> Path:
    return L.write_checkpoint(files / "tiny_sd1_ema.safetensors", L.to_ldm(sd1, "sd1", ema_unet=ema_unet),
                              dtype=torch.float16)


@pytest.fixture(scope="module")
def sd2_tensors(sd2) -> dict:
    return L.to_ldm(sd2, "sd2")


@pytest.fixture(scope="module")
def sd2_ckpt(sd2_tensors, files) -> Path:
    # An ordinary global_step: no evidence for the 512 model.
    return L.write_checkpoint(files / "tiny_sd2.ckpt", sd2_tensors, dtype=torch.bfloat16, global_step=12345)


@pytest.fixture(scope="module")
def sd2_pipe(sd2_ckpt):
    return load_pipeline(str(sd2_ckpt))


def _assert_weights(pipe, expected: dict) -> None:
    """Every tensor of every component equals `expected[name]` (a state dict) exactly."""
    for name in COMPONENTS:
        got = getattr(pipe, name).state_dict()
        assert got.keys() == expected[name].keys(), name
        for key, value in expected[name].items():
            assert got[key].dtype == torch.float32
            assert torch.equal(got[key], value), f"{name}.{key}"


def _stored(models: dict, dtype=torch.float32, **replace) -> dict:
    return {name: L.as_stored(replace.get(name, models[name]), dtype) for name in COMPONENTS}


@torch.no_grad()
def _same_outputs(pipe, reference: dict) -> None:
    """The loaded modules compute what the source modules compute (heads, activations, ...)."""
    ids = torch.tensor([ASTRONAUT[1] + [49407] * 70])
    context = reference["text_encoder"](ids).last_hidden_state
    assert torch.equal(pipe.text_encoder(ids).last_hidden_state, context)
    latent = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    args = (latent, torch.tensor([500.0]))
    expected = reference["unet"](*args, encoder_hidden_states=context).sample
    assert torch.equal(pipe.unet(*args, encoder_hidden_states=context).sample, expected)
    assert torch.equal(pipe.vae.decode(latent).sample, reference["vae"].decode(latent).sample)


def _reference(models: dict, dtype) -> dict:
    """Copies of the source models holding the weights as stored in `dtype`."""
    out = {}
    for name in COMPONENTS:
        out[name] = copy.deepcopy(models[name])
        out[name].load_state_dict(L.as_stored(models[name], dtype))
    return out


def _config_matches(pipe, models: dict, unet_keys=("sample_size", "upcast_attention")) -> None:
    for key in ("in_channels", "out_channels", "block_out_channels", "layers_per_block", "down_block_types",
                "up_block_types", "cross_attention_dim", "attention_head_dim", "use_linear_projection",
                "norm_num_groups", *unet_keys):
        assert pipe.unet.config[key] == models["unet"].config[key], key
    for key in ("block_out_channels", "layers_per_block", "latent_channels", "norm_num_groups"):
        assert pipe.vae.config[key] == models["vae"].config[key], key
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings", "hidden_act"):
        assert getattr(pipe.text_encoder.config, key) == getattr(models["text_encoder"].config, key), key


# ---- inference --------------------------------------------------------------------------------


def test_sd1_fp32_round_trip(sd1, sd1_file, sd1_pipe, files):
    before = sorted(p.name for p in files.iterdir())
    pipe = load_pipeline(str(sd1_file))
    assert sorted(p.name for p in files.iterdir()) == before  # loading writes nothing
    _assert_weights(pipe, _stored(sd1))
    _same_outputs(pipe, sd1)
    _config_matches(pipe, sd1)
    arch = pipe.details["architecture"]
    assert (arch["family"], arch["prediction_type"], arch["image_size"], arch["ema"]) == ("sd1", "epsilon", 512, False)
    assert arch["summary"].startswith("SD 1.x (CLIP text encoder") and "epsilon at 512x512" in arch["summary"]
    assert any("cond_stage_model.transformer." in r for r in arch["reasons"])
    assert any("8 heads" in r for r in arch["reasons"])
    assert pipe.scheduler_config["prediction_type"] == "epsilon"
    assert pipe.scheduler_config["_class_name"] == "PNDMScheduler"
    assert pipe.default_size == 512
    assert pipe.tokenizer.pad_token == "<|endoftext|>"
    assert pipe.source == str(sd1_file) and pipe.source_hash == sd1_pipe.source_hash


def test_sd1_fp16_with_ema_uses_the_ema_weights(sd1, ema_unet, sd1_ema_file):
    pipe = load_pipeline(str(sd1_ema_file))
    _assert_weights(pipe, _stored(sd1, torch.float16, unet=ema_unet))
    assert not torch.equal(pipe.unet.conv_in.weight, sd1["unet"].conv_in.weight.half().float())
    arch = pipe.details["architecture"]
    assert arch["ema"] is True and arch["summary"].endswith(", EMA weights")
    assert any("model_ema" in r and "EMA weights" in r for r in arch["reasons"])
    assert any("float16" in r for r in arch["reasons"])


def test_sd2_bf16_ckpt_defaults_to_v_prediction_at_768(sd2, sd2_pipe):
    pipe = sd2_pipe
    _assert_weights(pipe, _stored(sd2, torch.bfloat16))  # the unused last OpenCLIP resblock is dropped
    _same_outputs(pipe, _reference(sd2, torch.bfloat16))
    _config_matches(pipe, sd2)
    assert pipe.unet.config.sample_size == 96 and pipe.unet.config.upcast_attention is True
    assert pipe.unet.config.attention_head_dim == [1, 2] and pipe.unet.config.use_linear_projection is True
    assert pipe.text_encoder.config.num_hidden_layers == 3 and pipe.text_encoder.config.hidden_act == "gelu"
    assert pipe.default_size == 768 and pipe.vae.config.sample_size == 768
    arch = pipe.details["architecture"]
    assert (arch["family"], arch["prediction_type"], arch["image_size"], arch["ema"]) == ("sd2", "v_prediction", 768, False)
    assert "SD 2.x (OpenCLIP text encoder" in arch["summary"] and "v_prediction at 768x768" in arch["summary"]
    assert any("3 of 4 OpenCLIP resblocks" in r for r in arch["reasons"])
    assert any("bfloat16" in r for r in arch["reasons"])
    assert pipe.scheduler_config["prediction_type"] == "v_prediction"
    assert pipe.tokenizer.pad_token == "!" and pipe.tokenizer.pad_token_id == 0


def test_sd2_prediction_type_epsilon_means_512(sd2, sd2_ckpt, sd2_pipe):
    pipe = load_pipeline(str(sd2_ckpt), prediction_type="epsilon")
    _assert_weights(pipe, _stored(sd2, torch.bfloat16))
    assert pipe.unet.config.sample_size == 64 and not pipe.unet.config.upcast_attention
    assert pipe.default_size == 512
    assert pipe.scheduler_config["prediction_type"] == "epsilon"
    arch = pipe.details["architecture"]
    assert (arch["prediction_type"], arch["image_size"]) == ("epsilon", 512)
    assert "prediction: --prediction-type epsilon" in arch["reasons"]
    assert pipe.source_hash != sd2_pipe.source_hash  # the inferred configs are part of the hash


@pytest.mark.parametrize("name, extra, expected", [
    ("tiny-512-base.safetensors", {}, ("epsilon", 512, "file name")),
    ("tiny.ckpt", {"global_step": 875000}, ("epsilon", 512, "global_step 875000")),
    ("tiny-512.safetensors", {"v_pred": torch.tensor([])}, ("v_prediction", 768, "'v_pred' key")),
])
def test_sd2_512_evidence(sd2_tensors, tmp_path, name, extra, expected):
    tensors = {**sd2_tensors, **{k: v for k, v in extra.items() if isinstance(v, torch.Tensor)}}
    steps = {k: v for k, v in extra.items() if not isinstance(v, torch.Tensor)}
    path = L.write_checkpoint(tmp_path / name, tensors, dtype=torch.float16, **steps)
    pipe = load_pipeline(str(path))
    arch = pipe.details["architecture"]
    assert (arch["prediction_type"], arch["image_size"]) == expected[:2]
    assert pipe.scheduler_config["prediction_type"] == expected[0]
    assert pipe.default_size == expected[1]
    assert expected[2] in next(r for r in arch["reasons"] if r.startswith("prediction: "))


def test_sd1_prediction_type_override(sd1_file, sd1_pipe):
    pipe = load_pipeline(str(sd1_file), prediction_type="v_prediction")
    assert pipe.scheduler_config["prediction_type"] == "v_prediction" and pipe.default_size == 512
    assert pipe.details["architecture"]["prediction_type"] == "v_prediction"
    assert pipe.source_hash != sd1_pipe.source_hash


def test_config_folder_is_used_when_given(sd1_pipe, sd1_file, sd1_ema_file, sd1, ema_unet, tmp_path):
    folder = tmp_path / "configs"
    sd1_pipe.save_pretrained(folder)
    pipe = load_pipeline(str(sd1_file), config=str(folder))
    _assert_weights(pipe, _stored(sd1))
    assert "architecture" not in pipe.details
    assert pipe.tokenizer(ON_MARS[0]).input_ids == ON_MARS[1]
    ema = load_pipeline(str(sd1_ema_file), config=str(folder))
    _assert_weights(ema, _stored(sd1, torch.float16, unet=ema_unet))
    assert ema.details["ema"] is True


@pytest.mark.parametrize("preset, family, name", [
    ("sd15", "sd1", "v1-5-pruned.safetensors"),
    ("sd21", "sd2", "v2-1_512-ema-pruned.safetensors"),
    ("sd21-768", "sd2", "v2-1_768-ema-pruned.safetensors"),
])
def test_real_architectures_from_shapes(preset, family, name):
    """Full-size SD 1.5 / 2.1 layouts (meta tensors: shapes without data) give back the presets'
    configs, and weights for every tensor of models built from them."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from difflite.compiler.presets import preset_configs

    configs = preset_configs(preset)
    with torch.device("meta"):
        models = {"unet": UNet2DConditionModel.from_config(configs["unet"]),
                  "vae": AutoencoderKL.from_config(configs["vae"]),
                  "text_encoder": CLIPTextModel(CLIPTextConfig(**configs["text_encoder"]))}
    inferred, weights, arch = single_file.infer_architecture(Path(name), L.to_ldm(models, family))
    for part in COMPONENTS:
        expected = {**configs[part], **({"use_linear_projection": False} if preset == "sd15" and part == "unet" else {})}
        assert {k: inferred[part].get(k) for k in expected} == expected, part
        state = models[part].state_dict()
        assert {k: tuple(v.shape) for k, v in weights[part].items()} == {k: tuple(v.shape) for k, v in state.items()}
    assert inferred["scheduler"] == {**configs["scheduler"], "prediction_type": inferred["scheduler"]["prediction_type"]}
    assert arch["summary"] == {"sd15": "SD 1.x (CLIP ViT-L text encoder), epsilon at 512x512",
                               "sd21": "SD 2.x (OpenCLIP ViT-H text encoder), epsilon at 512x512",
                               "sd21-768": "SD 2.x (OpenCLIP ViT-H text encoder), v_prediction at 768x768"}[preset]


# ---- tokenizer ----------------------------------------------------------------------------------


def test_clip_tokenizer_from_the_open_clip_merges(sd1_pipe, sd2_pipe, tmp_path):
    from transformers import CLIPTokenizer

    from difflite.folder.tokenizer import PromptTokenizer

    tok = sd1_pipe.tokenizer
    assert len(tok) == 49408
    assert tok.convert_ids_to_tokens([0, 255, 256, 49406, 49407]) == ["!", "Ń", "!</w>", "<|startoftext|>",
                                                                     "<|endoftext|>"]
    for prompt, ids in (ASTRONAUT, ON_MARS):
        assert tok(prompt).input_ids == ids
        assert sd2_pipe.tokenizer(prompt).input_ids == ids
    padded = sd2_pipe.tokenizer(ASTRONAUT[0], padding="max_length", max_length=77).input_ids
    assert padded == ASTRONAUT[1] + [0] * 70
    # The files convert writes load back as the same tokenizer, with transformers or without.
    sd1_pipe.save_tokenizer(tmp_path)
    reloaded = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert reloaded(ON_MARS[0]).input_ids == ON_MARS[1]
    ids = PromptTokenizer(tmp_path, 77)(ON_MARS[0])
    assert ids[0].tolist() == ON_MARS[1] + [49407] * (77 - len(ON_MARS[1]))


def test_missing_open_clip_is_bad_input(sd1_file, monkeypatch):
    monkeypatch.setattr(single_file, "_open_clip_folders", lambda: [])
    message = _bad(sd1_file)
    assert "pip install --no-deps open_clip_torch" in message and "--config FOLDER" in message


def test_text_encoder_without_clip_vocabulary(sd1, tmp_path):
    tensors = L.to_ldm(sd1, "sd1")
    tensors[L.CLIP + "text_model.embeddings.token_embedding.weight"] = torch.randn(1000, 64)
    message = _bad(L.write_checkpoint(tmp_path / "vocab.safetensors", tensors))
    assert "1000 tokens" in message and "--config FOLDER" in message


# ---- refusals -----------------------------------------------------------------------------------


def _bad(path, named=None, **kwargs) -> str:
    """The BadInput message of loading `path`; one line naming `named` (default: `path`)."""
    with pytest.raises(BadInput) as info:
        load_pipeline(str(path), **kwargs)
    message = str(info.value)
    assert "\n" not in message and str(named or path) in message
    return message


def _depth_conditioned(t: dict, sd1: dict) -> None:
    """SD 2's depth-to-image UNet: the latents and a depth map, 5 input channels (an inpainting
    UNet's 9 are tests/test_inpaint.py's)."""
    key = L.UNET + "input_blocks.0.0.weight"
    t[key] = torch.randn(t[key].shape[0], 5, 3, 3)


def _depth_two(t: dict, sd1: dict) -> None:
    block = L.UNET + "input_blocks.1.1.transformer_blocks."
    for key in [k for k in t if k.startswith(block + "0.")]:
        t[block + "1." + key[len(block) + 2:]] = t[key].clone()


def _flat_conv_in(t: dict, sd1: dict) -> None:
    t[L.UNET + "input_blocks.0.0.weight"] = torch.zeros(3)


def _open_clip_text(t: dict, sd1: dict) -> None:
    """An SD 2.x text encoder on the SD 1.x UNet, whose 32 channels are no whole 64-wide head."""
    for key in [k for k in t if k.startswith(L.CLIP)]:
        del t[key]
    t.update(L.open_clip_to_ldm(sd1["text_encoder"]))


@pytest.mark.parametrize("change, expected", [
    (_depth_conditioned, "UNet with 5 input channels and 4 output channels is not supported"),
    (_depth_two, "UNet transformer depth 2"),
    (_flat_conv_in, "model.diffusion_model.input_blocks.0.0.weight has shape (3,), expected 4 dimensions"),
    (_open_clip_text, "SD 2.x UNet channels [32, 64] are not multiples of the head size 64"),
])
def test_unsupported_architectures(sd1, tmp_path, change, expected):
    tensors = L.to_ldm(sd1, "sd1")
    change(tensors, sd1)
    assert expected in _bad(L.write_checkpoint(tmp_path / "odd.safetensors", tensors))


def test_diffusers_keys_need_a_config(sd1_pipe, tmp_path):
    path = tmp_path / "diffusers.safetensors"
    single_file.save_single_file(sd1_pipe, path)
    assert "--config FOLDER" in _bad(path)


_ONE = torch.zeros(1)
_LAYOUTS = {
    "unknown": ({"foo.weight": _ONE, "bar.bias": _ONE}, "no 'model.diffusion_model.' UNet keys"),
    "ambiguous": ({L.UNET + "out.2.weight": _ONE, L.VAE + "encoder.conv_in.weight": _ONE,
                   L.CLIP + "text_model.x": _ONE, L.OPEN_CLIP + "token_embedding.weight": _ONE},
                  "ambiguous text encoder"),
    "sdxl": ({L.UNET + "out.2.weight": _ONE, L.VAE + "encoder.conv_in.weight": _ONE,
              "conditioner.embedders.1.model.token_embedding.weight": _ONE}, "SDXL"),
}


def test_no_text_encoder(tmp_path):
    path = L.write_checkpoint(tmp_path / "bare.safetensors", {L.UNET + "out.2.weight": _ONE,
                                                                L.VAE + "encoder.conv_in.weight": _ONE})
    message = _bad(path)
    assert "no text encoder" in message and "1 'model.diffusion_model.'" in message


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_bad_layouts_exit_2(layout, tmp_path):
    tensors, expected = _LAYOUTS[layout]
    path = L.write_checkpoint(tmp_path / f"{layout}.safetensors", tensors)
    out = tmp_path / "OUT"
    result = difflite("convert", path, "-o", out)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[difflite] ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr  # besides the progress log
    assert lines[0].startswith("difflite: error: ")
    assert str(path) in lines[0] and expected in lines[0] and "found" in lines[0]
    assert not out.exists()


# ---- --vae --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_vae():
    return L.tiny_models("sd1", seed=3)["vae"]


@pytest.mark.parametrize("name, prefix", [("vae.safetensors", ""), ("vae.ckpt", L.VAE)])
def test_vae_from_an_ldm_file(sd1, sd1_file, sd1_pipe, other_vae, tmp_path, name, prefix):
    path = L.write_checkpoint(tmp_path / name, L.vae_to_ldm(other_vae, prefix))
    pipe = load_pipeline(str(sd1_file), vae=str(path))
    _assert_weights(pipe, _stored(sd1, vae=other_vae))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert pipe.details["vae"] == {"path": str(path), "sha256": sha}
    assert pipe.source_hash != sd1_pipe.source_hash


def test_vae_from_a_diffusers_folder(sd1, sd1_file, sd1_pipe, other_vae, tmp_path):
    other_vae.save_pretrained(tmp_path / "vae")
    pipe = load_pipeline(str(sd1_file), vae=str(tmp_path / "vae"))
    _assert_weights(pipe, _stored(sd1, vae=other_vae))
    assert pipe.details["vae"]["path"] == str(tmp_path / "vae")
    assert pipe.source_hash != sd1_pipe.source_hash


def test_vae_of_another_shape_names_the_tensor(sd1_file, sd2, tmp_path):
    from diffusers import AutoencoderKL

    eight = AutoencoderKL.from_config({**L.TINY["sd1"]["vae"], "latent_channels": 8})  # the same tensors, other shapes
    path = L.write_checkpoint(tmp_path / "latent8.safetensors", L.vae_to_ldm(eight))
    message = _bad(sd1_file, named=path, vae=str(path))
    assert re.search(r": vae\.\S+ has shape \([0-9, ]+\), the config needs \([0-9, ]+\)$", message), message
    # Another block structure (the SD 2.x tiny VAE has one layer a block, not two): missing tensors.
    path = L.write_checkpoint(tmp_path / "fewer.safetensors", L.vae_to_ldm(sd2["vae"]))
    assert "missing" in _bad(sd1_file, named=path, vae=str(path))


# ---- end to end ---------------------------------------------------------------------------------


def test_convert_and_verify_without_config(sd1_file, tmp_path):
    out = tmp_path / "OUT"
    result = difflite("convert", sd1_file, "-o", out, "--components", "unet,text_encoder")
    assert result.returncode == 0, result.stderr
    assert "architecture: SD 1.x" in result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    arch = manifest["source"]["architecture"]
    assert arch["family"] == "sd1" and arch["image_size"] == 512 and arch["reasons"]
    assert manifest["source"]["config"] is None
    assert json.loads((out / "scheduler" / "scheduler_config.json").read_text())["prediction_type"] == "epsilon"
    from difflite.folder.tokenizer import PromptTokenizer

    assert PromptTokenizer(out / "tokenizer", 77)(ASTRONAUT[0])[0, :8].tolist() == ASTRONAUT[1] + [49407]
    verified = difflite("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
