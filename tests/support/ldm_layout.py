"""Test helper: tiny SD 1.x / 2.x style diffusers models (text-to-image, or inpainting: a 9-channel
UNet) written as original-format (LDM / CompVis / A1111) single-file checkpoints, to exercise
difflite.compiler.single_file's inference; SDXL pipelines (preset:sdxl-tiny) in the layout of SDXL
base files (`sdxl_to_ldm`: Stability's generative-models keys); and ControlNets in the layout of
ControlNet 1.x files (difflite.compiler.controlnet's).

The diffusers -> LDM key map here is written independently of diffusers' LDM -> diffusers
converters that the loader uses, so a round trip through both checks each against the other."""

from __future__ import annotations

from pathlib import Path

import torch

from difflite.compiler.presets import _perturb, preset_configs

UNET, VAE, CLIP, OPEN_CLIP = "model.diffusion_model.", "first_stage_model.", "cond_stage_model.transformer.", \
    "cond_stage_model.model."
# SDXL base: CLIP ViT-L (transformers' layout) and OpenCLIP ViT-bigG's text tower
SDXL_CLIP, SDXL_OPEN_CLIP = "conditioner.embedders.0.transformer.", "conditioner.embedders.1.model."
BOS, EOS = 49406, 49407

# Shapes that obey the families' rules (SD 1.x: 8 heads; SD 2.x: 64-channel heads; 32 norm
# groups; CLIP's 49408-token vocabulary, 64-wide heads in the text encoder), small enough to be fast.
TINY = {
    "sd1": {
        "unet": {**preset_configs("sd15")["unet"], "block_out_channels": [32, 64], "layers_per_block": 1,
                 "attention_head_dim": 8, "cross_attention_dim": 64,
                 "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "sample_size": 64},
        "vae": {**preset_configs("sd15")["vae"], "block_out_channels": [32, 32, 64, 64], "layers_per_block": 2},
        "text_encoder": {**preset_configs("sd15")["text_encoder"], "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 1, "projection_dim": 64,
                         "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS},
    },
    "sd2": {
        "unet": {**preset_configs("sd21-768")["unet"], "block_out_channels": [64, 128], "layers_per_block": 2,
                 "attention_head_dim": [1, 2], "cross_attention_dim": 64,
                 "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]},
        "vae": {**preset_configs("sd21-768")["vae"], "block_out_channels": [32, 64, 64, 64], "layers_per_block": 1},
        "text_encoder": {**preset_configs("sd21-768")["text_encoder"], "hidden_size": 64, "intermediate_size": 256,
                         "num_hidden_layers": 3, "num_attention_heads": 1, "projection_dim": 64,
                         "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": 0},
    },
}


def tiny_models(family: str, seed: int = 0, in_channels: int = 4) -> dict:
    """{"unet", "vae", "text_encoder"}: float32 eval models with seeded random weights, every norm
    and bias moved off its init (presets._perturb). `in_channels` 9: an inpainting UNet (latents,
    mask, masked picture's latents)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    configs = TINY[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = CLIPTextModel(CLIPTextConfig(**configs["text_encoder"]))
        text_encoder.set_attn_implementation("eager")
        built = {"unet": UNet2DConditionModel.from_config({**configs["unet"], "in_channels": in_channels}),
                 "vae": AutoencoderKL.from_config(configs["vae"]), "text_encoder": text_encoder}
    for index, (name, model) in enumerate(built.items()):
        _perturb(model, seed * 10 + index + 1)
        model.float().eval()
    return built


def perturbed_copy(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The same architecture with every tensor moved (an EMA copy that differs from the weights)."""
    import copy

    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    return other


# ---- UNet ----------------------------------------------------------------------------------------

_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
           "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}
_UNET_TOP = {"conv_in": "input_blocks.0.0", "time_embedding.linear_1": "time_embed.0",
             "time_embedding.linear_2": "time_embed.2", "conv_norm_out": "out.0", "conv_out": "out.2",
             # SDXL's text_time embedding (the pooled text embedding and the time ids)
             "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2"}


def _resnet(parts: list[str]) -> list[str]:
    return [_RESNET[parts[0]]] + parts[1:]


def unet_key(key: str, config) -> str:
    """A diffusers UNet2DConditionModel key -> its LDM openaimodel key (without the prefix)."""
    for name, ldm in _UNET_TOP.items():
        if key.startswith(name + "."):
            return ldm + key[len(name):]
    parts = key.split(".")
    per_level = config.layers_per_block + 1
    if parts[0] == "mid_block":  # resnet 0, attention, resnet 1
        slot = {"resnets.0": 0, "attentions.0": 1, "resnets.1": 2}[f"{parts[1]}.{parts[2]}"]
        rest = _resnet(parts[3:]) if parts[1] == "resnets" else parts[3:]
        return ".".join(["middle_block", str(slot)] + rest)
    level, kind = int(parts[1]), parts[2]
    if parts[0] == "down_blocks":
        if kind == "downsamplers":  # its own input block after the level's layers: a strided conv "op"
            return ".".join(["input_blocks", str(1 + level * per_level + config.layers_per_block), "0", "op"]
                            + parts[5:])
        block = 1 + level * per_level + int(parts[3])
        head = ["input_blocks", str(block)]
    else:
        if kind == "upsamplers":  # inside the level's last output block, after its attention if any
            slot = 2 if config.up_block_types[level].startswith("CrossAttn") else 1
            return ".".join(["output_blocks", str(level * per_level + config.layers_per_block), str(slot), "conv"]
                            + parts[5:])
        head = ["output_blocks", str(level * per_level + int(parts[3]))]
    if kind == "resnets":
        return ".".join(head + ["0"] + _resnet(parts[4:]))
    return ".".join(head + ["1"] + parts[4:])  # attentions: the SpatialTransformer keeps diffusers' names


def unet_to_ldm(unet) -> dict:
    return {UNET + unet_key(k, unet.config): v for k, v in unet.state_dict().items()}


def ema_copy(unet) -> dict:
    """LDM's EMA copy of a UNet: model_ema.diffusion_model<key without dots> (LitEma's names)."""
    out = {}
    for key, value in unet_to_ldm(unet).items():
        out["model_ema." + "".join(key.split(".")[1:])] = value
    out["model_ema.decay"] = torch.tensor(0.9999)
    out["model_ema.num_updates"] = torch.tensor(1000, dtype=torch.int32)
    return out


# ---- ControlNet ----------------------------------------------------------------------------------

CONTROL = "control_model."
_HINT = "controlnet_cond_embedding."


def controlnet_key(key: str, config) -> str:
    """A diffusers ControlNetModel key -> its ControlNet 1.x (cldm) key (without the prefix): the
    UNet encoder half as unet_key maps it, the hint block (a Sequential with a SiLU between
    convolutions: indices 0, 2, 4, ..), a zero convolution per input block and the middle block's."""
    parts = key.split(".")
    if key.startswith(_HINT + "conv_in."):
        return ".".join(["input_hint_block", "0"] + parts[2:])
    if key.startswith(_HINT + "blocks."):
        return ".".join(["input_hint_block", str(2 * (int(parts[2]) + 1))] + parts[3:])
    if key.startswith(_HINT + "conv_out."):
        convs = 2 * len(config.conditioning_embedding_out_channels)  # conv_in, 2 a level but the last, conv_out
        return ".".join(["input_hint_block", str(2 * (convs - 1))] + parts[2:])
    if parts[0] == "controlnet_down_blocks":
        return ".".join(["zero_convs", parts[1], "0"] + parts[2:])
    if parts[0] == "controlnet_mid_block":
        return ".".join(["middle_block_out", "0"] + parts[1:])
    return unet_key(key, config)


def controlnet_to_ldm(controlnet, prefix: str = CONTROL) -> dict:
    """A ControlNetModel's state dict in the layout of ControlNet 1.0 / 1.1 files (`control_model.`
    keys; prefix "" for the bare keys some files carry)."""
    return {prefix + controlnet_key(k, controlnet.config): v for k, v in controlnet.state_dict().items()}


# ---- VAE -----------------------------------------------------------------------------------------

_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def vae_key(key: str, levels: int) -> str:
    side, rest = key.split(".", 1)
    if side not in ("encoder", "decoder"):
        return key  # quant_conv, post_quant_conv
    parts = rest.split(".")
    if parts[0] == "conv_norm_out":
        return ".".join([side, "norm_out"] + parts[1:])
    if parts[0] == "mid_block":
        if parts[1] == "resnets":
            return ".".join([side, "mid", f"block_{int(parts[2]) + 1}"] + _vae_resnet(parts[3:]))
        name = ".".join(parts[3:-1])
        return ".".join([side, "mid", "attn_1", _VAE_ATTENTION[name], parts[-1]])
    if parts[0] in ("down_blocks", "up_blocks"):
        level = int(parts[1])
        ldm_level = level if parts[0] == "down_blocks" else levels - 1 - level  # LDM numbers up levels bottom-up
        group = "down" if parts[0] == "down_blocks" else "up"
        if parts[2] == "resnets":
            return ".".join([side, group, str(ldm_level), "block", parts[3]] + _vae_resnet(parts[4:]))
        sampler = "downsample" if parts[2] == "downsamplers" else "upsample"
        return ".".join([side, group, str(ldm_level), sampler] + parts[4:])
    return key  # conv_in, conv_out


def _vae_resnet(parts: list[str]) -> list[str]:
    return (["nin_shortcut"] if parts[0] == "conv_shortcut" else [parts[0]]) + parts[1:]


def vae_to_ldm(vae, prefix: str = VAE) -> dict:
    levels = len(vae.config.block_out_channels)
    out = {}
    for key, value in vae.state_dict().items():
        ldm = vae_key(key, levels)
        if ".mid.attn_1." in ldm and ldm.endswith(".weight") and value.dim() == 2:
            value = value[:, :, None, None]  # LDM's attention projections are 1x1 convolutions
        out[prefix + ldm] = value
    return out


# ---- text encoders -------------------------------------------------------------------------------


def clip_to_ldm(text_encoder) -> dict:
    """SD 1.x: transformers' CLIPTextModel under cond_stage_model.transformer.text_model."""
    out = {CLIP + "text_model." + k: v for k, v in text_encoder.state_dict().items()}
    positions = text_encoder.config.max_position_embeddings
    out[CLIP + "text_model.embeddings.position_ids"] = torch.arange(positions)[None]  # as older files carry
    return out


def open_clip_to_ldm(text_encoder, seed: int = 7) -> dict:
    """SD 2.x: OpenCLIP's text tower under cond_stage_model.model., with one resblock more than
    the CLIPTextModel (the last layer, which SD 2.x does not use: random here), the projection and
    the logit scale."""
    sd = text_encoder.state_dict()
    config = text_encoder.config
    hidden, layers = config.hidden_size, config.num_hidden_layers
    out = _open_clip_tower(sd, layers)
    gen = torch.Generator().manual_seed(seed)
    last = f"transformer.resblocks.{layers}."
    for key in [k for k in out if k.startswith("transformer.resblocks.0.")]:
        out[last + key.removeprefix("transformer.resblocks.0.")] = torch.randn(out[key].shape, generator=gen)
    out["text_projection"] = torch.randn((hidden, hidden), generator=gen)
    out["logit_scale"] = torch.tensor(4.6052)
    return {OPEN_CLIP + k: v for k, v in out.items()}


def open_clip_g_to_ldm(text_encoder_2) -> dict:
    """SDXL: transformers' CLIPTextModelWithProjection as OpenCLIP ViT-bigG's text tower under
    conditioner.embedders.1.model.: every layer, the projection stored [width, projection] (OpenCLIP
    computes x @ text_projection), and the logit scale."""
    sd = {k.removeprefix("text_model."): v for k, v in text_encoder_2.state_dict().items()}
    out = _open_clip_tower(sd, text_encoder_2.config.num_hidden_layers)
    out["text_projection"] = sd["text_projection.weight"].t().contiguous()
    out["logit_scale"] = torch.tensor(4.6052)
    return {SDXL_OPEN_CLIP + k: v for k, v in out.items()}


def _open_clip_tower(sd: dict, layers: int) -> dict:
    """OpenCLIP's names for a CLIPTextModel state dict's embeddings, `layers` resblocks (q, k and v
    fused into in_proj) and final layer norm."""
    out = {
        "token_embedding.weight": sd["embeddings.token_embedding.weight"],
        "positional_embedding": sd["embeddings.position_embedding.weight"],
        "ln_final.weight": sd["final_layer_norm.weight"], "ln_final.bias": sd["final_layer_norm.bias"],
    }
    for n in range(layers):
        src, dst = f"encoder.layers.{n}.", f"transformer.resblocks.{n}."
        for kind in ("weight", "bias"):
            out[dst + f"attn.in_proj_{kind}"] = torch.cat(
                [sd[src + f"self_attn.{p}_proj.{kind}"] for p in ("q", "k", "v")])
            out[dst + f"attn.out_proj.{kind}"] = sd[src + f"self_attn.out_proj.{kind}"]
            out[dst + f"ln_1.{kind}"] = sd[src + f"layer_norm1.{kind}"]
            out[dst + f"ln_2.{kind}"] = sd[src + f"layer_norm2.{kind}"]
            out[dst + f"mlp.c_fc.{kind}"] = sd[src + f"mlp.fc1.{kind}"]
            out[dst + f"mlp.c_proj.{kind}"] = sd[src + f"mlp.fc2.{kind}"]
    return out


# ---- whole checkpoints ---------------------------------------------------------------------------


def to_ldm(models: dict, family: str, ema_unet=None) -> dict:
    """The original-format state dict of {"unet", "vae", "text_encoder"}; with `ema_unet`, an
    LDM EMA copy holding that UNet's weights."""
    tensors = {**unet_to_ldm(models["unet"]), **vae_to_ldm(models["vae"])}
    tensors.update(clip_to_ldm(models["text_encoder"]) if family == "sd1" else open_clip_to_ldm(models["text_encoder"]))
    if ema_unet is not None:
        tensors.update(ema_copy(ema_unet))
    return tensors


def sdxl_to_ldm(pipe) -> dict:
    """An SDXL pipeline (unet, vae, text_encoder, text_encoder_2) as an SDXL base single file's
    state dict: model.diffusion_model. (label_emb for the added embedding), first_stage_model.,
    and the two text encoders under conditioner.embedders.0 / .1."""
    tensors = {**unet_to_ldm(pipe.unet), **vae_to_ldm(pipe.vae), **open_clip_g_to_ldm(pipe.text_encoder_2)}
    tensors.update({SDXL_CLIP + "text_model." + k: v for k, v in pipe.text_encoder.state_dict().items()})
    return tensors


def write_checkpoint(path: Path, tensors: dict, dtype: torch.dtype = torch.float32, **ckpt_extra) -> Path:
    """.safetensors, or .ckpt as torch.save({"state_dict": ..., **ckpt_extra}) like LDM's
    Lightning checkpoints. Floating tensors are stored as `dtype`."""
    stored = {k: (v.to(dtype) if v.is_floating_point() else v).detach().clone() for k, v in tensors.items()}
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(stored, str(path))
    else:
        torch.save({"state_dict": stored, **ckpt_extra}, str(path))
    return path


def as_stored(model: torch.nn.Module, dtype: torch.dtype) -> dict:
    """A model's float32 state dict as it reads back after storage in `dtype`."""
    return {k: v.to(dtype).float() for k, v in model.state_dict().items()}
