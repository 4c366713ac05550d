"""SDXL sources (issue 32, item 1): diffusers SDXL folders (StableDiffusionXLPipeline's layout,
loaded and saved), original-format SDXL base single files (the architecture inferred from the
shapes), the refiner and inpainting refused in one line, and SDXL LoRAs merged at conversion
(kohya lora_unet_ / lora_te1_ / lora_te2_ and diffusers names) against diffusers' own
load_lora_weights + fuse_lora. Everything on preset:sdxl-tiny; each source converts once."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from difflite.compiler import convert, single_file
from difflite.compiler.models import load_pipeline
from difflite.compiler.presets import build_preset, preset_configs
from difflite.core.errors import BadInput

from support import ldm_layout as L
from support.cli import run_difflite

SDXL_MODELS = ("text_encoder", "text_encoder_2", "unet", "vae")
TFLITES = ("text_encoder", "text_encoder_2", "unet", "vae_decoder")


@pytest.fixture(scope="module")
def sdxl_tiny():
    return build_preset("sdxl-tiny", 0)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sdxl_sources")


@pytest.fixture(scope="module")
def folder(sdxl_tiny, files) -> Path:
    sdxl_tiny.save_pretrained(files / "sdxl-tiny")
    return files / "sdxl-tiny"


@pytest.fixture(scope="module")
def single(sdxl_tiny, files) -> Path:
    return L.write_checkpoint(files / "sdxl-tiny.safetensors", L.sdxl_to_ldm(sdxl_tiny))


def _convert(model: str, out: Path, **kwargs) -> Path:
    """The whole folder (every SDXL component), exports shared through the tests' export cache:
    the same weights export once."""
    convert.convert(model, out, convert.ConvertOptions(components=None),
                    export_cache_dir=os.environ.get("DIFFLITE_EXPORT_CACHE"), **kwargs)
    return out


@pytest.fixture(scope="module")
def preset_out(files) -> Path:
    return _convert("preset:sdxl-tiny", files / "out-preset")


def _same_weights(pipe, reference) -> None:
    for name in SDXL_MODELS:
        got, want = getattr(pipe, name).state_dict(), getattr(reference, name).state_dict()
        assert got.keys() == want.keys(), name
        for key, value in want.items():
            assert got[key].dtype == torch.float32 and torch.equal(got[key], value), f"{name}.{key}"


def _config(model) -> dict:
    config = model.config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {k: v for k, v in config.items() if not k.startswith("_") and k not in ("transformers_version", "dtype", "architectures")}


def _same_configs(pipe, reference) -> None:
    for name in SDXL_MODELS:
        assert _config(getattr(pipe, name)) == _config(getattr(reference, name)), name
    assert pipe.scheduler_config == reference.scheduler_config


def _same_tflites(out: Path, reference: Path) -> None:
    """The same .tflite files byte for byte (the manifests differ in their source only)."""
    for name in TFLITES:
        assert (out / f"{name}.tflite").read_bytes() == (reference / f"{name}.tflite").read_bytes(), name
    for tokenizer in ("tokenizer", "tokenizer_2"):
        assert (out / tokenizer / "tokenizer.json").read_bytes() == \
            (reference / tokenizer / "tokenizer.json").read_bytes()
    manifest, want = (json.loads((f / "manifest.json").read_text()) for f in (out, reference))
    assert manifest["latent"] == want["latent"] and list(manifest["components"]) == list(want["components"])


# ---- diffusers folders ---------------------------------------------------------------------------


def test_sdxl_pipeline_saves_as_a_diffusers_folder(folder):
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["model_index.json", "scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
                     "unet", "vae"]
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline"
    assert index["text_encoder_2"] == ["transformers", "CLIPTextModelWithProjection"]
    assert index["tokenizer_2"] == ["transformers", "CLIPTokenizer"]
    # diffusers' own pipeline loads it
    from diffusers import StableDiffusionXLPipeline

    assert type(StableDiffusionXLPipeline.from_pretrained(str(folder))).__name__ == "StableDiffusionXLPipeline"


def test_sdxl_folder_loads(folder, sdxl_tiny):
    pipe = load_pipeline(str(folder))
    assert pipe.family == "sdxl" and type(pipe.text_encoder_2).__name__ == "CLIPTextModelWithProjection"
    _same_weights(pipe, sdxl_tiny)
    _same_configs(pipe, sdxl_tiny)
    assert pipe.tokenizer_2.get_vocab() == sdxl_tiny.tokenizer_2.get_vocab()
    # the hash covers text_encoder_2's weights
    weights = folder / "text_encoder_2" / "model.safetensors"
    original = weights.read_bytes()
    try:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        tensors["text_projection.weight"] = tensors["text_projection.weight"] * 2
        save_file(tensors, str(weights))
        assert load_pipeline(str(folder)).source_hash != pipe.source_hash
    finally:
        weights.write_bytes(original)


def test_sdxl_folder_converts_as_the_preset(folder, files, preset_out):
    out = _convert(str(folder), files / "out-folder")
    _same_tflites(out, preset_out)
    assert json.loads((out / "manifest.json").read_text())["source"]["model"] == str(folder)


# ---- original-format single files ----------------------------------------------------------------


def test_sdxl_single_file_round_trips_the_preset(single, sdxl_tiny):
    pipe = load_pipeline(str(single))
    assert pipe.family == "sdxl"
    _same_weights(pipe, sdxl_tiny)
    _same_configs(pipe, sdxl_tiny)
    assert pipe.tokenizer.get_vocab() == pipe.tokenizer_2.get_vocab() == sdxl_tiny.tokenizer.get_vocab()
    arch = pipe.details["architecture"]
    assert arch["family"] == "sdxl" and arch["image_size"] == 128 and arch["prediction_type"] == "epsilon"
    assert arch["summary"] == "SDXL (preset:sdxl-tiny's architecture), epsilon at 128x128"
    assert "transformer depth per level [1, 2] (the mid block 2)" in arch["reasons"]
    assert "added embedding: projection 24 + 6 time ids x 8" in arch["reasons"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_sdxl_inpainting_sources_load_as_the_preset(kind, files):
    """An SDXL inpainting model (a 9-channel UNet) as a single file or a diffusers folder: the
    preset's weights and configs, inferred as inpainting (the file) or saved as diffusers'
    StableDiffusionXLInpaintPipeline (the folder)."""
    reference = build_preset("sdxl-tiny-inpaint", 0)
    if kind == "file":
        source = L.write_checkpoint(files / "sdxl-tiny-inpaint.safetensors", L.sdxl_to_ldm(reference))
    else:
        source = files / "sdxl-tiny-inpaint"
        reference.save_pretrained(source)
        assert json.loads((source / "model_index.json").read_text())["_class_name"] == \
            "StableDiffusionXLInpaintPipeline"
    pipe = load_pipeline(str(source))
    assert pipe.family == "sdxl" and pipe.inpainting
    _same_weights(pipe, reference)
    _same_configs(pipe, reference)
    if kind == "file":
        arch = pipe.details["architecture"]
        assert arch["inpainting"] and arch["summary"] == "SDXL (preset:sdxl-tiny-inpaint's architecture), epsilon at 128x128"
        assert "UNet: 9 input channels (latents 4, mask 1, masked picture's latents 4): inpainting" in arch["reasons"]


def test_sdxl_single_file_converts_and_verifies_as_the_preset(single, files, preset_out, lib):
    from difflite.verify import verify

    out = _convert(str(single), files / "out-single")
    _same_tflites(out, preset_out)
    source = json.loads((out / "manifest.json").read_text())["source"]
    assert source["architecture"]["summary"].startswith("SDXL (preset:sdxl-tiny's architecture)")
    checks = verify(out, seeds=(0,))  # the file read again as verify's PyTorch reference
    components = json.loads((out / "manifest.json").read_text())["components"]
    assert {c.component for c in checks} == set(components) and all(c.passed for c in checks), \
        [c for c in checks if not c.passed]


def test_sdxl_base_shapes_give_sdxl_base_configs():
    """SDXL base's full-size architecture (built on the meta device: no weights) written as a file's
    state dict is inferred back to preset:sdxl's configs."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    configs = preset_configs("sdxl")
    ids = {"bos_token_id": 49406, "eos_token_id": 49407}
    with torch.device("meta"):
        pipe = type("Pipe", (), {})()
        pipe.unet = UNet2DConditionModel.from_config(configs["unet"])
        pipe.vae = AutoencoderKL.from_config(configs["vae"])
        pipe.text_encoder = CLIPTextModel(CLIPTextConfig(**configs["text_encoder"], **ids))
        pipe.text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**configs["text_encoder_2"], **ids))
    inferred, weights, arch = single_file.infer_architecture(Path("sd_xl_base_1.0.safetensors"), L.sdxl_to_ldm(pipe))
    for name in ("unet", "vae", "text_encoder", "text_encoder_2", "scheduler"):
        assert {k: inferred[name][k] for k in configs[name]} == configs[name], name
    assert (inferred["text_encoder"]["pad_token_id"], inferred["text_encoder_2"]["pad_token_id"]) == (49407, 0)
    assert arch["summary"] == "SDXL (preset:sdxl's architecture), epsilon at 1024x1024"
    assert arch["tokenizer"] == "clip"
    for name in SDXL_MODELS:
        assert weights[name].keys() == getattr(pipe, name).state_dict().keys(), name


# An SDXL base of CLIP's vocabulary and 64-wide heads that is no preset: heads by SDXL's rule,
# CLIP's tokenizers (open_clip_torch's BPE merges).
_OWN = {
    "unet": {**preset_configs("sdxl-tiny")["unet"], "block_out_channels": [64, 128], "attention_head_dim": [1, 2],
             "cross_attention_dim": 128, "projection_class_embeddings_input_dim": 32 + 6 * 8,
             "transformer_layers_per_block": [1, 3], "norm_num_groups": 32},
    "text_encoder": {**preset_configs("sdxl-tiny")["text_encoder"], "vocab_size": 49408, "hidden_size": 64,
                     "num_attention_heads": 1, "intermediate_size": 128, "num_hidden_layers": 2},
    "text_encoder_2": {**preset_configs("sdxl-tiny")["text_encoder_2"], "vocab_size": 49408, "hidden_size": 64,
                       "num_attention_heads": 1, "intermediate_size": 128, "num_hidden_layers": 2,
                       "projection_dim": 32},
}


def test_sdxl_file_of_no_preset(tmp_path, sdxl_tiny):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    ids = {"bos_token_id": 49406, "eos_token_id": 49407}
    source = copy.copy(sdxl_tiny)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        source.unet = UNet2DConditionModel.from_config(_OWN["unet"]).eval()
        # 32 norm groups, as every SD VAE (the one VAE field no weight holds)
        source.vae = AutoencoderKL.from_config({**L.TINY["sd1"]["vae"], "scaling_factor": 0.13025}).eval()
        source.text_encoder = CLIPTextModel(CLIPTextConfig(**_OWN["text_encoder"], **ids, pad_token_id=49407))
        source.text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**_OWN["text_encoder_2"], **ids,
                                                                           pad_token_id=0))
    pipe = load_pipeline(str(L.write_checkpoint(tmp_path / "own.safetensors", L.sdxl_to_ldm(source))))
    _same_weights(pipe, source)
    assert pipe.unet.config.attention_head_dim == [1, 2] and pipe.unet.config.transformer_layers_per_block == [1, 3]
    assert pipe.unet.config.sample_size == 128 and pipe.default_size == 1024
    assert pipe.vae.config.scaling_factor == 0.13025
    assert (pipe.tokenizer.pad_token, pipe.tokenizer_2.pad_token) == ("<|endoftext|>", "!")
    assert pipe.tokenizer("a photo of an astronaut").input_ids == [49406, 320, 1125, 539, 550, 18376, 49407]
    arch = pipe.details["architecture"]
    assert arch["summary"] == "SDXL base (CLIP ViT-L + OpenCLIP ViT-bigG), epsilon at 1024x1024"
    assert "heads = channels / 64 = [1, 2] (SDXL)" in arch["reasons"]


# ---- refusals ------------------------------------------------------------------------------------


def _refiner_file(t: dict) -> None:
    """The refiner's layout: OpenCLIP alone, as embedder 0."""
    for key in list(t):
        if key.startswith(L.SDXL_CLIP):
            del t[key]
        elif key.startswith(L.SDXL_OPEN_CLIP):
            t["conditioner.embedders.0.model." + key.removeprefix(L.SDXL_OPEN_CLIP)] = t.pop(key)


def _seven_channels_file(t: dict) -> None:
    key = L.UNET + "input_blocks.0.0.weight"
    t[key] = torch.zeros(t[key].shape[0], 7, 3, 3)


def _five_time_ids(t: dict) -> None:
    key = L.UNET + "label_emb.0.0.weight"
    t[key] = torch.zeros(t[key].shape[0], 24 + 5 * 8)


def _no_open_clip(t: dict) -> None:
    for key in [k for k in t if k.startswith(L.SDXL_OPEN_CLIP)]:
        del t[key]


def _mid_depth(t: dict) -> None:
    block = L.UNET + "middle_block.1.transformer_blocks."
    for key in [k for k in t if k.startswith(block + "1.")]:
        del t[key]


@pytest.mark.parametrize("change, expected", [
    (_refiner_file, "an SDXL refiner (OpenCLIP alone as 'conditioner.embedders.0.model.', aesthetic-score time ids) "
                    "is not supported"),
    (_seven_channels_file, "UNet with 7 input channels and 4 output channels is not supported"),
    (_five_time_ids, "the UNet's added embedding takes 64 features: text_encoder_2's projection 24 and 40 more, "
                     "not 6 whole time ids"),
    (_no_open_clip, "an SDXL checkpoint without its 'conditioner.embedders.1.model.' text encoder"),
    (_mid_depth, "UNet mid-block transformer depth 1 is not its last level's 2"),
])
def test_sdxl_files_refused(sdxl_tiny, tmp_path, change, expected):
    tensors = L.sdxl_to_ldm(sdxl_tiny)
    change(tensors)
    path = L.write_checkpoint(tmp_path / "odd.safetensors", tensors)
    with pytest.raises(BadInput) as info:
        load_pipeline(str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and expected in message, message


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _refiner_folder(f: Path) -> None:
    _edit_json(f / "model_index.json", text_encoder=[None, None], tokenizer=[None, None],
               _class_name="StableDiffusionXLImg2ImgPipeline", requires_aesthetics_score=True)


def _refiner_time_ids(f: Path) -> None:
    _edit_json(f / "unet" / "config.json", projection_class_embeddings_input_dim=24 + 5 * 8)


def _seven_channels_folder(f: Path) -> None:
    _edit_json(f / "unet" / "config.json", in_channels=7)


def _no_text_encoder_2(f: Path) -> None:
    import shutil

    shutil.rmtree(f / "text_encoder_2")


@pytest.mark.parametrize("change, expected", [
    (_refiner_folder, "an SDXL refiner (no text_encoder: OpenCLIP's text_encoder_2 only, aesthetic-score time ids) "
                      "is not supported"),
    (_refiner_time_ids, "an SDXL refiner (5 time ids: the aesthetic score's) is not supported"),
    (_seven_channels_folder, "an SDXL UNet with 7 input channels and 4 output channels is not supported"),
    (_no_text_encoder_2, "missing (an SDXL folder's second text encoder)"),
])
def test_sdxl_folders_refused(folder, tmp_path, change, expected):
    import shutil

    copy_ = tmp_path / "f"
    shutil.copytree(folder, copy_)
    change(copy_)
    with pytest.raises(BadInput) as info:
        load_pipeline(str(copy_))
    message = str(info.value)
    assert "\n" not in message and str(copy_) in message and expected in message, message


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_refusals_exit_2_writing_nothing(kind, sdxl_tiny, folder, tmp_path):
    """The command line: one line naming the source, exit 2, no output folder."""
    if kind == "file":
        tensors = L.sdxl_to_ldm(sdxl_tiny)
        _refiner_file(tensors)
        source = L.write_checkpoint(tmp_path / "refiner.safetensors", tensors)
    else:
        import shutil

        source = tmp_path / "seven"
        shutil.copytree(folder, source)
        _seven_channels_folder(source)
    out = tmp_path / "OUT"
    result = run_difflite("convert", source, "-o", out)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[difflite] ")]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"difflite: error: {source}: ") and "is not supported" in lines[0]
    assert not out.exists() and not list(tmp_path.glob("OUT*"))


def test_config_folder_of_sdxl_is_refused(single, folder):
    with pytest.raises(BadInput, match="--config with an SDXL folder is not supported"):
        load_pipeline(str(single), config=str(folder))


# ---- LoRAs merged at conversion ------------------------------------------------------------------

# (component, module, rank) on sdxl-tiny: attention, cross-attention, feed-forward and proj_out in the
# deep (depth 2) blocks, both text encoders (text_encoder_2 keeps transformers' text_model.)
SDXL_LORA = [
    ("unet", "down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q", 4),
    ("unet", "down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k", 4),
    ("unet", "mid_block.attentions.0.transformer_blocks.1.ff.net.2", 2),
    ("unet", "up_blocks.0.attentions.2.proj_out", 3),
    ("unet", "up_blocks.0.attentions.1.transformer_blocks.0.attn1.to_out.0", 4),
    ("text_encoder", "encoder.layers.0.self_attn.q_proj", 4),
    ("text_encoder", "encoder.layers.1.mlp.fc1", 2),
    ("text_encoder_2", "text_model.encoder.layers.0.self_attn.v_proj", 4),
    ("text_encoder_2", "text_model.encoder.layers.2.self_attn.out_proj", 2),
    ("text_encoder_2", "text_model.encoder.layers.1.mlp.fc2", 3),
]
_ALPHA = 2.0  # one alpha for every kohya layer (diffusers 0.42 gives kohya attention layers the most
# common alpha: tests/test_lora.py checks per-layer alphas against the arithmetic), over ranks 2..4


def _kohya_name(pipe, component: str, name: str) -> str:
    """kohya's names for SDXL: the UNet's in the original layout (input_blocks_4_1_...), text
    encoders as lora_te1_ / lora_te2_ with transformers' text_model."""
    if component == "unet":
        return "lora_unet_" + L.unet_key(name + ".weight", pipe.unet.config).removesuffix(".weight").replace(".", "_")
    full = name if name.startswith("text_model.") else "text_model." + name
    return {"text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}[component] + full.replace(".", "_")


def _diffusers_name(component: str, name: str) -> str:
    return f"{component}.{name if component != 'text_encoder' else 'text_model.' + name}"


def _write_lora(pipe, path: Path, layout: str, seed: int = 4) -> list:
    """A random LoRA for SDXL_LORA in `layout` ("kohya", float16; or "peft": diffusers' lora_A /
    lora_B, no metadata: alpha == rank); returns [(component, module, down, up, factor)]."""
    from safetensors.torch import save_file
    from support.lora_files import named_module, random_pair

    gen = torch.Generator().manual_seed(seed)
    tensors, expected = {}, []
    for component, name, rank in SDXL_LORA:
        dtype = torch.float16 if layout == "kohya" else torch.float32
        down, up = random_pair(named_module(pipe, component, name), rank, gen, dtype)
        if layout == "kohya":
            key = _kohya_name(pipe, component, name)
            tensors.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                            f"{key}.alpha": torch.tensor(_ALPHA, dtype=dtype)})
        else:
            key = _diffusers_name(component, name)
            tensors.update({f"{key}.lora_A.weight": down, f"{key}.lora_B.weight": up})
        expected.append((component, name, down.float(), up.float(), _ALPHA / rank if layout == "kohya" else 1.0))
    save_file(tensors, str(path))
    return expected


def _weights(pipe) -> dict:
    return {c: {k: v.clone() for k, v in getattr(pipe, c).state_dict().items()} for c in SDXL_MODELS}


@torch.no_grad()
def _diffusers_fused(pipe, path: Path, scale: float) -> dict:
    """diffusers' StableDiffusionXLPipeline on copies of the models: load_lora_weights, fuse_lora;
    each model's weights with the fused layers' base weights in their place."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from safetensors.torch import load_file

    models = {c: copy.deepcopy(getattr(pipe, c)) for c in SDXL_MODELS}
    reference = StableDiffusionXLPipeline(**models, tokenizer=pipe.tokenizer, tokenizer_2=pipe.tokenizer_2,
                                          scheduler=EulerDiscreteScheduler.from_config(pipe.scheduler_config))
    reference.load_lora_weights(load_file(str(path)), adapter_name="test")
    reference.fuse_lora(lora_scale=scale)
    out = {}
    for c in SDXL_MODELS:
        state = getattr(reference, c).state_dict()
        out[c] = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    return out


@pytest.mark.parametrize("layout, scale", [("kohya", 0.75), ("peft", -0.5)])
def test_sdxl_lora_merges_as_diffusers_fuses(layout, scale, sdxl_tiny, tmp_path):
    from difflite.compiler.lora import merge_loras
    from difflite.core.lora import LoraSpec

    path = tmp_path / f"{layout}.safetensors"
    expected = _write_lora(sdxl_tiny, path, layout)
    want = _diffusers_fused(sdxl_tiny, path, scale)
    pipe = copy.copy(sdxl_tiny)
    for c in SDXL_MODELS:
        setattr(pipe, c, copy.deepcopy(getattr(sdxl_tiny, c)))
    before = _weights(pipe)
    pipe.details = {}
    merge_loras(pipe, (LoraSpec(str(path), scale),))
    got = _weights(pipe)
    # diffusers 0.42 under transformers 5 leaves kohya's text_encoder attention layers out
    # (to_q_lora keys "UNEXPECTED" in the flattened CLIPTextModel): the arithmetic below checks them
    skip = {("text_encoder", n + ".weight") for c, n, _ in SDXL_LORA
            if layout == "kohya" and c == "text_encoder" and ".self_attn." in n}
    for c in SDXL_MODELS:
        assert got[c].keys() == want[c].keys(), c
        for key in got[c]:
            if (c, key) not in skip:
                torch.testing.assert_close(got[c][key], want[c][key], rtol=1e-5, atol=1e-6, msg=f"{c}.{key}")
    # the arithmetic: W + scale * alpha / rank * up @ down, in each listed layer and nowhere else
    changed = {(c, k.removesuffix(".weight")) for c in SDXL_MODELS for k in got[c]
               if not torch.equal(got[c][k], before[c][k])}
    assert changed == {(c, n) for c, n, _ in SDXL_LORA}
    for c, name, down, up, factor in expected:
        delta = scale * factor * (up.flatten(1) @ down.flatten(1)).reshape(got[c][name + ".weight"].shape)
        torch.testing.assert_close(got[c][name + ".weight"], before[c][name + ".weight"] + delta,
                                   rtol=1e-5, atol=1e-6)
    record = pipe.details["loras"][0]
    assert record["layers"] == {"unet": 5, "text_encoder": 2, "text_encoder_2": 3}
    assert record["summary"] == f"{'kohya' if layout == 'kohya' else 'diffusers'}, 5 UNet + 2 text encoder + " \
                                f"3 text encoder 2 layers"


def test_convert_with_an_sdxl_lora(single, sdxl_tiny, files, preset_out, tmp_path):
    """`convert --lora` on the SDXL single file, text_encoder_2 alone: recorded, and the file differs
    from the preset's by the merged layers."""
    from difflite.core.lora import LoraSpec

    path = tmp_path / "te2.safetensors"
    _write_lora(sdxl_tiny, path, "kohya")
    out = tmp_path / "out"
    convert.convert(str(single), out, convert.ConvertOptions(components=("text_encoder_2",)),
                    loras=(LoraSpec(str(path), 1.0),))
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["components"]) == ["text_encoder_2"]
    assert manifest["source"]["loras"][0]["layers"] == {"unet": 5, "text_encoder": 2, "text_encoder_2": 3}
    assert (out / "text_encoder_2.tflite").read_bytes() != (preset_out / "text_encoder_2.tflite").read_bytes()


def test_sdxl_lora_on_sd_is_refused(tmp_path):
    """An SDXL-only LoRA (text_encoder_2 layers alone) matches nothing of an SD 1.x pipeline."""
    from difflite.compiler.lora import merge_loras
    from difflite.core.lora import LoraSpec
    from safetensors.torch import save_file

    path = tmp_path / "te2.safetensors"
    save_file({"lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": torch.zeros(2, 48),
               "lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": torch.zeros(48, 2)}, str(path))
    with pytest.raises(BadInput, match="is it a LoRA for Stable Diffusion 1.x/2.x"):
        merge_loras(build_preset("tiny", 0), (LoraSpec(str(path), 1.0),))
