"""LoRA files for the tiny preset, in the layouts LoRA trainers write: kohya/A1111 (`write_kohya`)
and diffusers (`write_diffusers`, by style). Each writer returns what the file should do:
[(component, module, down, up, factor)], where the merged weight is W + scale * factor * up @ down
(factor = alpha / rank); the module names are the torch model's (text encoder without
`text_model.`, as transformers 5 names them)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

ATTN = "down_blocks.0.attentions.0.transformer_blocks.0"
UP_ATTN = "up_blocks.1.attentions.1.transformer_blocks.0"

# (component, module, rank, alpha): kohya layers; alpha != rank, and alphas that differ per layer.
KOHYA = [
    ("unet", f"{ATTN}.attn1.to_q", 4, 1.0),
    ("unet", f"{ATTN}.attn1.to_k", 4, 2.0),
    ("unet", f"{ATTN}.attn1.to_v", 4, 3.0),
    ("unet", f"{ATTN}.attn1.to_out.0", 4, 2.0),
    ("unet", "mid_block.attentions.0.transformer_blocks.0.attn2.to_k", 2, 1.0),
    ("unet", "down_blocks.0.attentions.0.proj_in", 4, 1.0),  # a 1x1 Conv2d in SD 1.x
    ("unet", "down_blocks.0.resnets.0.conv1", 2, 3.0),  # LoCon: 3x3 down, 1x1 up
    ("unet", "up_blocks.1.resnets.2.conv2", 3, 1.5),
    ("text_encoder", "encoder.layers.0.self_attn.q_proj", 4, 1.0),
    ("text_encoder", "encoder.layers.0.self_attn.k_proj", 4, 1.0),
    ("text_encoder", "encoder.layers.0.self_attn.v_proj", 4, 1.0),
    ("text_encoder", "encoder.layers.0.self_attn.out_proj", 8, 4.0),
    ("text_encoder", "encoder.layers.1.mlp.fc1", 2, 0.5),
]
# KOHYA less its LoCon convolutions (resnets), which run-time LoRAs do not take; plus the layer
# kinds KOHYA lacks (proj_out, the feed-forward, cross-attention, fc2).
KOHYA_SLOTS = [layer for layer in KOHYA if ".resnets." not in layer[1]] + [
    ("unet", "up_blocks.1.attentions.2.proj_out", 3, 6.0),
    ("unet", f"{UP_ATTN}.ff.net.0.proj", 4, 4.0),
    ("unet", f"{UP_ATTN}.ff.net.2", 2, 1.0),
    ("unet", f"{UP_ATTN}.attn2.to_k", 4, 8.0),
    ("text_encoder", "encoder.layers.1.mlp.fc2", 4, 2.0),
]
# (component, module, rank): diffusers layers; two overlap KOHYA's (to_q, q_proj).
DIFFUSERS = [
    ("unet", f"{UP_ATTN}.attn2.to_q", 4),
    ("unet", f"{UP_ATTN}.attn2.to_v", 4),
    ("unet", f"{UP_ATTN}.attn2.to_out.0", 2),
    ("unet", f"{UP_ATTN}.ff.net.2", 4),
    ("unet", f"{ATTN}.attn1.to_q", 4),
    ("text_encoder", "encoder.layers.1.self_attn.q_proj", 4),
    ("text_encoder", "encoder.layers.1.self_attn.k_proj", 4),
    ("text_encoder", "encoder.layers.1.self_attn.v_proj", 4),
    ("text_encoder", "encoder.layers.1.self_attn.out_proj", 4),
    ("text_encoder", "encoder.layers.0.self_attn.q_proj", 4),
]
# LoraConfig fields diffusers writes as lora_adapter_metadata: alpha 8 over rank 4 in the UNet
# (the rank-2 layer: alpha 1), alpha 2 over rank 4 in the text encoder, which targets by short name.
METADATA = {
    "unet.r": 4, "unet.lora_alpha": 8, "unet.target_modules": sorted(m for c, m, _ in DIFFUSERS if c == "unet"),
    "unet.rank_pattern": {f"{UP_ATTN}.attn2.to_out.0": 2}, "unet.alpha_pattern": {f"{UP_ATTN}.attn2.to_out.0": 1},
    "text_encoder.r": 4, "text_encoder.lora_alpha": 2,
    "text_encoder.target_modules": ["k_proj", "out_proj", "q_proj", "v_proj"],
}
# write_diffusers' styles: the key layouts diffusers reads (see its docstring).
STYLES = ("peft", "flat", "old", "processor")


def named_module(pipe, component, name):
    return dict(getattr(pipe, component).named_modules())[name]


def random_pair(layer, rank, gen, dtype=torch.float32):
    """down (A) and up (B) for the module `layer`, in the layout both formats share."""
    if isinstance(layer, torch.nn.Conv2d):
        down = torch.randn(rank, layer.in_channels, *layer.kernel_size, generator=gen)
        up = torch.randn(layer.out_channels, rank, 1, 1, generator=gen)
    else:
        down = torch.randn(rank, layer.in_features, generator=gen)
        up = torch.randn(layer.out_features, rank, generator=gen)
    return (0.1 * down).to(dtype), (0.1 * up).to(dtype)


def kohya_key(component, name):
    return "lora_unet_" + name.replace(".", "_") if component == "unet" else \
        "lora_te_text_model_" + name.replace(".", "_")


def write_kohya(pipe, path, seed=1, layers=KOHYA, extra=(), dtype=torch.float16):
    """A kohya/A1111 file in float16 as kohya saves them (or `dtype`); returns [(component, module,
    down, up, alpha / rank)]. `extra` adds layers for modules this model does not have."""
    gen = torch.Generator().manual_seed(seed)
    tensors, expected = {}, []
    for component, name, rank, alpha in layers:
        down, up = random_pair(named_module(pipe, component, name), rank, gen, dtype)
        key = kohya_key(component, name)
        tensors.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                        f"{key}.alpha": torch.tensor(alpha, dtype=dtype)})
        expected.append((component, name, down, up, alpha / rank))
    for key, shape_in, shape_out in extra:
        tensors.update({f"{key}.lora_down.weight": torch.randn(4, shape_in, generator=gen).to(dtype),
                        f"{key}.lora_up.weight": torch.randn(shape_out, 4, generator=gen).to(dtype),
                        f"{key}.alpha": torch.tensor(4.0, dtype=dtype)})
    save_file(tensors, str(path), metadata={"ss_network_module": "networks.lora"})
    return expected


def _diffusers_keys(component, name, style):
    """(down key, up key) of one layer in a diffusers style:
    "peft": `unet.X.lora_A.weight`; text-encoder keys with the `text_model.` of transformers 4, as
        files in the wild have them;
    "flat": the same, text-encoder keys without `text_model.` (transformers 5's names);
    "old": `unet.X.lora.down.weight`, `text_encoder...self_attn.to_q_lora.down.weight`;
    "processor": attention processors' `unet...attn1.processor.to_q_lora.down.weight` (to_out_lora
        for to_out.0; other UNet layers as "old"), `text_encoder.X.lora_linear_layer.down.weight`."""
    if component == "unet":
        prefix = f"unet.{name}"
        if style in ("peft", "flat"):
            return f"{prefix}.lora_A.weight", f"{prefix}.lora_B.weight"
        parent, _, proj = prefix.removesuffix(".0").rpartition(".")
        if style == "processor" and proj in ("to_q", "to_k", "to_v", "to_out"):
            return f"{parent}.processor.{proj}_lora.down.weight", f"{parent}.processor.{proj}_lora.up.weight"
        return f"{prefix}.lora.down.weight", f"{prefix}.lora.up.weight"
    prefix = f"text_encoder.{name}" if style == "flat" else f"text_encoder.text_model.{name}"
    if style in ("peft", "flat"):
        return f"{prefix}.lora_A.weight", f"{prefix}.lora_B.weight"
    if style == "processor":
        return f"{prefix}.lora_linear_layer.down.weight", f"{prefix}.lora_linear_layer.up.weight"
    parent, proj = prefix.rsplit(".", 1)
    short = proj.removesuffix("_proj")
    return f"{parent}.to_{short}_lora.down.weight", f"{parent}.to_{short}_lora.up.weight"


def write_diffusers(pipe, path, seed=2, style="peft", metadata=None, dtype=torch.float32, layers=DIFFUSERS):
    """A diffusers-layout file of `layers` in one of STYLES (see _diffusers_keys); `metadata`:
    METADATA or None (no lora_adapter_metadata: alpha == rank); the factors returned are those of
    DIFFUSERS under METADATA or none."""
    gen = torch.Generator().manual_seed(seed)
    tensors, expected = {}, []
    for component, name, rank in layers:
        down, up = random_pair(named_module(pipe, component, name), rank, gen, dtype)
        keys = _diffusers_keys(component, name, style)
        tensors.update({keys[0]: down, keys[1]: up})
        factor = 1.0  # no alpha: diffusers' convention alpha == rank
        if metadata is not None:
            if component == "unet":
                factor = 1 / 2 if name.endswith("to_out.0") else 8 / 4
            else:
                factor = 2 / 4
        expected.append((component, name, down, up, factor))
    header = {"lora_adapter_metadata": json.dumps(metadata)} if metadata is not None else None
    save_file(tensors, str(path), metadata=header)
    return expected


def slots_of(pipe, components=("unet", "text_encoder")):
    """The run-time LoRA slots of `pipe`'s torch model, as a folder's manifest describes them:
    every Linear / 1x1 Conv2d that core.lora.takes_slot accepts, by its LoRA-file name."""
    from difflite.core.lora import lora_module_name, takes_slot
    from difflite.runtime.lora_files import Slot

    slots = []
    for component in components:
        for name, layer in getattr(pipe, component).named_modules():
            lora_name = lora_module_name(component, name)
            if not takes_slot(component, lora_name, "auto"):
                continue
            if isinstance(layer, torch.nn.Conv2d):
                assert layer.kernel_size == (1, 1) and layer.groups == 1, name
                slots.append(Slot(component, lora_name, layer.in_channels, layer.out_channels, True))
            else:
                assert isinstance(layer, torch.nn.Linear), name
                slots.append(Slot(component, lora_name, layer.in_features, layer.out_features, False))
    return slots
