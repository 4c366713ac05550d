"""Single-file checkpoints: one .safetensors/.ckpt holding the UNet, VAE and text encoder, in
the original LDM/CompVis layout (as checkpoints are shared) or with diffusers keys under
component prefixes (save_single_file)."""

from __future__ import annotations

from pathlib import Path

import torch

from compiler.errors import BadInput
from compiler.models import (
    _COMPONENTS,
    Pipeline,
    _assemble,
    _check_config_folder,
    _config_files,
    _hash_files,
    _one_line,
)

_LDM_UNET_PREFIX = "model.diffusion_model."


def save_single_file(pipe: Pipeline, path: Path) -> None:
    """Write the three models to one .safetensors with component-prefixed diffusers keys."""
    from safetensors.torch import save_file

    tensors = {}
    for name in _COMPONENTS:
        for key, value in getattr(pipe, name).state_dict().items():
            tensors[f"{name}.{key}"] = value.detach().contiguous()
    save_file(tensors, str(path))


def _read_checkpoint(path: Path) -> dict:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            while isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]
    except Exception as e:  # truncated/corrupt files raise assorted errors
        raise BadInput(f"{path}: cannot read checkpoint ({_one_line(e)})") from e
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)} if isinstance(state, dict) else {}
    if not tensors:
        raise BadInput(f"{path}: not a checkpoint of named tensors")
    return tensors


def load_single_file(path: Path, config: Path | None, prediction_type: str | None = None) -> Pipeline:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    if config is None:
        raise BadInput(f"{path}: a single-file checkpoint needs --config (a diffusers folder with the configs)")
    if not config.exists():
        raise BadInput(f"{config}: no such config folder")
    _check_config_folder(config)
    state = _read_checkpoint(path)
    unet = _model_from_config(UNet2DConditionModel, config / "unet")
    vae = _model_from_config(AutoencoderKL, config / "vae")
    text_encoder = _model_from_config(None, config / "text_encoder")
    models = {"unet": unet, "vae": vae, "text_encoder": text_encoder}
    if any(k.startswith(_LDM_UNET_PREFIX) for k in state):
        parts = _convert_ldm(path, state, models)
        strict = False  # LDM files carry extra keys (EMA, open_clip's last layer, logit scale)
    elif any(k.startswith("unet.") for k in state):
        parts = {name: {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")} for name in models}
        strict = True
    else:
        raise BadInput(f"{path}: unknown key layout (expected 'unet.'/'vae.'/'text_encoder.' or LDM keys)")
    for name, model in models.items():
        _load_state(path, name, model, parts[name], strict)
    files = [("checkpoint", path)] + _config_files(config)
    return _assemble(str(path), _hash_files(files), config, text_encoder, unet, vae)


def _model_from_config(cls, folder: Path):
    """A randomly initialised model from folder/config.json (cls None: the CLIP text encoder)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    try:
        if cls is None:
            model = CLIPTextModel(CLIPTextConfig.from_pretrained(str(folder), local_files_only=True))
            model.set_attn_implementation("eager")
            return model
        return cls.from_config(cls.load_config(str(folder), local_files_only=True))
    except Exception as e:  # malformed or incompatible configs raise assorted errors
        raise BadInput(f"{folder / 'config.json'}: cannot build the model: {_one_line(e)}") from e


def _load_state(path: Path, name: str, model: torch.nn.Module, state: dict, strict: bool) -> None:
    if not state:
        raise BadInput(f"{path}: no {name} weights in the checkpoint")
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or (strict and unexpected):
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise BadInput(f"{path}: {name} weights do not match the config: {what}")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise BadInput(f"{path}: {name}.{key} has shape {tuple(state[key].shape)}, "
                           f"the config needs {tuple(tensor.shape)}")
    model.load_state_dict({k: state[k].float() for k in expected}, strict=True)


def _convert_ldm(path: Path, state: dict, models: dict) -> dict:
    """Original LDM/CompVis keys -> diffusers keys, with diffusers' own single-file converters."""
    from diffusers.loaders import single_file_utils as sfu

    try:
        parts = {
            "unet": sfu.convert_ldm_unet_checkpoint(state, dict(models["unet"].config)),
            "vae": sfu.convert_ldm_vae_checkpoint(state, dict(models["vae"].config)),
        }
        if sfu.is_clip_model(state):
            clip = sfu.convert_ldm_clip_checkpoint(state)
        elif sfu.is_open_clip_model(state):
            clip = sfu.convert_open_clip_checkpoint(models["text_encoder"], state, prefix="cond_stage_model.model.")
        else:
            clip = {}
    except Exception as e:
        raise BadInput(f"{path}: cannot convert the LDM checkpoint: {_one_line(e)}") from e
    # transformers >= 5.6 flattened CLIPTextModel: its keys no longer start with "text_model."
    parts["text_encoder"] = {k.removeprefix("text_model."): v for k, v in clip.items()}
    return parts


def replace_vae(pipe: Pipeline, vae: Path) -> None:
    raise BadInput(f"{vae}: --vae is not supported yet")
