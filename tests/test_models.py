"""difflite.compiler.models: presets, diffusers folders, single-file checkpoints, bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT, ldm_layout

from difflite.compiler.models import load_pipeline
from difflite.compiler.pipeline import Pipeline
from difflite.compiler.single_file import save_single_file
from difflite.core.errors import BadInput

PROMPT = "a photo of an astronaut riding a horse"


@pytest.fixture(scope="module")
def tiny() -> Pipeline:
    return load_pipeline("preset:tiny")


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    tiny.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_single_file(tiny, path)
    return path


def _state(pipe: Pipeline) -> dict:
    return {f"{c}.{k}": v for c in ("text_encoder", "unet", "vae") for k, v in getattr(pipe, c).state_dict().items()}


def _same_weights(a: Pipeline, b: Pipeline) -> bool:
    sa, sb = _state(a), _state(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@torch.no_grad()
def _outputs(pipe: Pipeline) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = pipe.tokenizer(PROMPT, padding="max_length", max_length=77, return_tensors="pt").input_ids
    context = pipe.text_encoder(ids).last_hidden_state
    latent = torch.randn((1, 4, 8, 12), generator=gen)
    noise = pipe.unet(latent, torch.tensor([321.0]), encoder_hidden_states=context).sample
    image = pipe.vae.decode(latent).sample
    return [context, noise, image]


def _assert_same_outputs(a: Pipeline, b: Pipeline) -> None:
    for x, y in zip(_outputs(a), _outputs(b)):
        assert torch.equal(x, y)


# ---- presets ----------------------------------------------------------------------------------


def test_tiny_is_deterministic(tiny):
    again = load_pipeline("preset:tiny")
    assert again.source == "preset:tiny"
    assert again.source_hash == tiny.source_hash
    assert _same_weights(tiny, again)


def test_tiny_seed_changes_weights(tiny):
    other = load_pipeline("preset:tiny", seed=1)
    assert other.source_hash != tiny.source_hash
    assert not torch.equal(other.unet.conv_in.weight, tiny.unet.conv_in.weight)
    assert not torch.equal(other.vae.decoder.conv_out.bias, tiny.vae.decoder.conv_out.bias)


def test_tiny_same_in_another_process(tiny):
    code = (
        "import hashlib; from difflite.compiler.models import load_pipeline; p = load_pipeline('preset:tiny'); "
        "h = hashlib.sha256(); "
        "[h.update(v.numpy().tobytes()) for c in (p.text_encoder, p.unet, p.vae) for v in c.state_dict().values()]; "
        "print(p.source_hash, h.hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    digest = __import__("hashlib").sha256()
    for component in (tiny.text_encoder, tiny.unet, tiny.vae):
        for value in component.state_dict().values():
            digest.update(value.numpy().tobytes())
    assert out.stdout.split() == [tiny.source_hash, digest.hexdigest()]


def test_every_norm_and_bias_is_perturbed(tiny):
    for component in (tiny.text_encoder, tiny.unet, tiny.vae):
        for module in component.modules():
            if isinstance(module, (torch.nn.GroupNorm, torch.nn.LayerNorm)):
                assert not torch.all(module.weight == 1)
                assert not torch.all(module.bias == 0)
        for name, param in component.named_parameters():
            if name.endswith("bias"):
                assert not torch.all(param == 0), name


def test_tiny_variety(tiny):
    assert tiny.unet.config.norm_num_groups != 32 and tiny.vae.config.norm_num_groups != 32
    assert tiny.text_encoder.config._attn_implementation == "eager"
    assert tiny.vae_scale_factor == 8  # four VAE levels, as in SD
    assert tiny.scheduler_config["_class_name"] == "PNDMScheduler"
    assert all(p.dtype == torch.float32 for p in tiny.unet.parameters())
    assert not tiny.unet.training and not tiny.vae.training and not tiny.text_encoder.training


def test_tokenizer_pads_to_77(tiny):
    ids = tiny.tokenizer(PROMPT, padding="max_length", max_length=tiny.tokenizer.model_max_length).input_ids
    assert len(ids) == 77
    assert ids[0] == tiny.tokenizer.bos_token_id
    assert tiny.tokenizer.pad_token == "<|endoftext|>" and ids[-1] == tiny.tokenizer.pad_token_id
    assert max(ids) < tiny.text_encoder.config.vocab_size
    assert len(tiny.tokenizer) <= tiny.text_encoder.config.vocab_size


def test_tokenizer_files_load_with_clip_tokenizer(tiny, tmp_path):
    from transformers import CLIPTokenizer

    tiny.save_tokenizer(tmp_path)
    assert {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    loaded = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert loaded(PROMPT).input_ids == tiny.tokenizer(PROMPT).input_ids
    padded = CLIPTokenizer.from_pretrained(str(tmp_path))(PROMPT, padding="max_length").input_ids
    assert len(padded) == 77


def test_save_scheduler(tiny, tmp_path):
    tiny.save_scheduler(tmp_path)
    assert json.loads((tmp_path / "scheduler_config.json").read_text()) == tiny.scheduler_config


# ---- folders and single files -----------------------------------------------------------------


def test_folder_round_trip(tiny, folder):
    loaded = load_pipeline(str(folder))
    assert loaded.source == str(folder)
    assert loaded.text_encoder.config._attn_implementation == "eager"
    assert loaded.scheduler_config == tiny.scheduler_config
    assert _same_weights(tiny, loaded)
    _assert_same_outputs(tiny, loaded)
    assert load_pipeline(str(folder)).source_hash == loaded.source_hash


def test_folder_loads_in_diffusers(folder):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(folder), local_files_only=True)
    assert type(pipe.scheduler).__name__ == "PNDMScheduler"


def test_folder_written_by_diffusers_loads(tiny, tmp_path):
    from diffusers import PNDMScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline(
        vae=tiny.vae, text_encoder=tiny.text_encoder, tokenizer=tiny.tokenizer, unet=tiny.unet,
        scheduler=PNDMScheduler.from_config(tiny.scheduler_config), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )
    pipe.save_pretrained(tmp_path / "sd")
    loaded = load_pipeline(str(tmp_path / "sd"))
    assert _same_weights(tiny, loaded)
    assert loaded.tokenizer(PROMPT).input_ids == tiny.tokenizer(PROMPT).input_ids
    assert loaded.scheduler_config["_class_name"] == "PNDMScheduler"


def test_single_file_round_trip(tiny, folder, checkpoint):
    loaded = load_pipeline(str(checkpoint), config=str(folder))
    assert loaded.source == str(checkpoint)
    assert _same_weights(tiny, loaded)
    _assert_same_outputs(tiny, loaded)


def test_ckpt_with_state_dict_wrapper(tiny, folder, tmp_path):
    path = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": _state(tiny)}, path)
    assert _same_weights(tiny, load_pipeline(str(path), config=str(folder)))


def test_ldm_layout(tiny, folder, tmp_path):
    path = tmp_path / "ldm.safetensors"
    from safetensors.torch import save_file

    models = {"unet": tiny.unet, "vae": tiny.vae, "text_encoder": tiny.text_encoder}
    save_file({k: v.contiguous() for k, v in ldm_layout.to_ldm(models, "sd1").items()}, str(path))
    loaded = load_pipeline(str(path), config=str(folder))
    assert _same_weights(tiny, loaded)


# ---- bad input ---------------------------------------------------------------------------------


def _bad(model: str, config: str | None = None) -> str:
    with pytest.raises(BadInput) as info:
        load_pipeline(model, config=config)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_path(tmp_path):
    assert str(tmp_path / "nope") in _bad(str(tmp_path / "nope"))


def test_folder_without_model_index(tmp_path):
    assert str(tmp_path) in _bad(str(tmp_path))


def test_folder_missing_component_config(folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "unet" / "config.json").unlink()
    assert str(broken / "unet") in _bad(str(broken))


def _copy_with_config(folder: Path, copy: Path, component: str, **changes) -> Path:
    """A copy of the diffusers folder whose component config.json has `changes`."""
    shutil.copytree(folder, copy)
    config_path = copy / component / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **changes}))
    return copy


def test_folder_with_mismatched_config(folder, tmp_path):
    broken = _copy_with_config(folder, tmp_path / "broken", "unet", cross_attention_dim=48)
    assert str(broken / "unet") in _bad(str(broken))


@pytest.mark.parametrize("token_id, reason", [(2**31 + 5, "is no int32 id"), (1024, "vocabulary (1024 tokens)")])
def test_folder_with_a_token_id_the_text_encoder_cannot_look_up(folder, tmp_path, token_id, reason):
    """preset:tiny's text encoder has 1024 rows; the tokenizer files name a token id past them."""
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    for name, vocab_of in (("vocab.json", lambda data: data), ("tokenizer.json", lambda data: data["model"]["vocab"])):
        path = broken / "tokenizer" / name
        data = json.loads(path.read_text())
        vocab = vocab_of(data)
        vocab[next(iter(vocab))] = token_id
        path.write_text(json.dumps(data))
    message = _bad(str(broken))
    assert str(broken / "tokenizer") in message and str(token_id) in message and reason in message, message


def test_single_file_with_mismatched_config(folder, checkpoint, tmp_path):
    other = _copy_with_config(folder, tmp_path / "other", "vae", latent_channels=8)
    assert str(checkpoint) in _bad(str(checkpoint), config=str(other))


def test_single_file_with_unbuildable_config(folder, checkpoint, tmp_path):
    other = _copy_with_config(folder, tmp_path / "other", "unet", down_block_types=["NoSuchBlock2D", "DownBlock2D"])
    assert str(other / "unet" / "config.json") in _bad(str(checkpoint), config=str(other))


def test_truncated_safetensors(folder, checkpoint, tmp_path):
    cut = tmp_path / "cut.safetensors"
    data = checkpoint.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert str(cut) in _bad(str(cut), config=str(folder))


def test_corrupt_ckpt(folder, tmp_path):
    path = tmp_path / "junk.ckpt"
    path.write_bytes(b"not a pickle at all" * 10)
    assert str(path) in _bad(str(path), config=str(folder))


def test_checkpoint_without_config(checkpoint):
    message = _bad(str(checkpoint))
    assert str(checkpoint) in message and "--config" in message


def test_unknown_preset():
    assert "preset:nope" in _bad("preset:nope")
