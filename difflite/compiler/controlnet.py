"""convert --controlnet: ControlNets (diffusers ControlNetModel) loaded beside the pipeline, each
becoming a component controlnet_N (difflite/compiler/export.py) whose residuals the UNet takes.

A ControlNet is given as
- preset:controlnet / preset:controlnet-tiny: the ControlNet of preset:sd15's / preset:tiny's UNet
  (ControlNetModel.from_unet's config relation, the hint embedding of ControlNet 1.x) with the
  presets' seeded weights; its zero convolutions are perturbed like every layer, so the residuals
  are not zero;
- a diffusers ControlNetModel folder (config.json and weights, loaded locally);
- one original-format file (ControlNet 1.0 / 1.1 .safetensors / .pth: `control_model.` keys, or
  the same keys bare): the architecture is inferred from keys and shapes (the UNet encoder half
  as difflite/compiler/single_file.py infers it, the hint block's widths, the zero convolutions),
  what shapes cannot tell (heads, norm groups) taken from the base UNet as from_unet does, and the
  keys converted by diffusers' convert_controlnet_checkpoint.

Sources are read (configs, a file's tensors) before the base model loads, so a bad one fails
fast; each is then checked to fit the base UNet (the residuals must match its skip connections,
the cross-attention the text encoder) and built. What was loaded goes to the manifest's source
("controlnets") and is folded into the source hash."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

from difflite.compiler import presets, single_file
from difflite.compiler.pipeline import (
    Pipeline,
    fold_into_hash,
    from_pretrained,
    hash_files,
    quiet_loaders,
    weight_files,
)
from difflite.core import control
from difflite.core.errors import BadInput
from difflite.core.finite import check_finite
from difflite.core.jsonfile import read_json

# preset:NAME -> the base preset whose UNet the ControlNet is made for
PRESETS = {"controlnet": "sd15", "controlnet-tiny": "tiny"}
HINT_CHANNELS = (16, 32, 96, 256)  # ControlNet 1.x's hint embedding (diffusers' default)
FILE_SUFFIXES = (".safetensors", ".ckpt", ".pth", ".pt")
# The UNet config fields ControlNetModel.from_unet copies.
FROM_UNET = (
    "in_channels", "flip_sin_to_cos", "freq_shift", "down_block_types", "only_cross_attention",
    "block_out_channels", "layers_per_block", "downsample_padding", "mid_block_scale_factor", "act_fn",
    "norm_num_groups", "norm_eps", "cross_attention_dim", "attention_head_dim", "num_attention_heads",
    "use_linear_projection", "class_embed_type", "num_class_embeds", "upcast_attention",
    "resnet_time_scale_shift", "projection_class_embeddings_input_dim", "mid_block_type",
    "transformer_layers_per_block", "encoder_hid_dim", "encoder_hid_dim_type", "addition_embed_type",
    "addition_time_embed_dim",
)
# What must agree with the base UNet: the residuals' channels, count and sizes, and the width of
# the text embedding both read.
FIT_FIELDS = ("in_channels", "block_out_channels", "layers_per_block", "cross_attention_dim")
SDXL = "SDXL ControlNets need SDXL support (not yet)"
_LDM = "control_model."
_HINT = "input_hint_block."
_HINT_CONVS = list(range(0, 16, 2))  # conv_in, 3 x (conv, strided conv), conv_out (SiLUs between)
_KNOWN_PAIRS = {(1024, 768): "an SD 2.x ControlNet on an SD 1.x model",
                (768, 1024): "an SD 1.x ControlNet on an SD 2.x model"}


@dataclass
class ControlNetSource:
    """One --controlnet, read but not built: enough to check it against the base UNet."""
    model: str  # preset:NAME or the absolute path
    kind: str  # "preset" | "folder" | "file"
    config: dict  # ControlNetModel config; a file's: the fields its tensors determine
    sha256: str
    reasons: list[str] = field(default_factory=list)  # how a file's architecture was inferred
    weights: dict | None = field(default=None, repr=False)  # a file's weights, diffusers keys


# ---------------------------------------------------------------------------------------------
# Reading


def read_sources(specs: tuple[str, ...], seed: int = 0) -> list[ControlNetSource]:
    return [read_source(str(spec), seed) for spec in specs]


def read_source(spec: str, seed: int = 0) -> ControlNetSource:
    if spec.startswith("preset:"):
        return _read_preset(spec, seed)
    path = Path(spec).expanduser().absolute()
    if path.is_dir():
        return _read_folder(path)
    if path.is_file():
        return _read_file(path)
    what = "no such file or folder" if not path.exists() else "neither a folder nor a file"
    raise BadInput(f"{path}: --controlnet: {what}")


def _read_preset(spec: str, seed: int) -> ControlNetSource:
    name = spec.removeprefix("preset:")
    if name not in PRESETS:
        raise BadInput(f"{spec}: unknown ControlNet preset (known: {', '.join('preset:' + p for p in PRESETS)})")
    unet = {**_defaults("UNet2DConditionModel"), **presets.preset_configs(PRESETS[name])["unet"]}
    config = {**from_unet_config(unet), "conditioning_embedding_out_channels": list(HINT_CHANNELS)}
    sha = presets.preset_hash({"controlnet_preset": name, "seed": seed, "config": config, "zero_convs": "live"})
    return ControlNetSource(spec, "preset", config, sha)


def _read_folder(path: Path) -> ControlNetSource:
    config_path = path / "config.json"
    if not config_path.is_file():
        index = (path / "model_index.json").is_file()
        pipeline = " but a pipeline's model_index.json: give it as MODEL" if index else ""
        raise BadInput(f"{path}: not a diffusers ControlNet folder (no config.json{pipeline})")
    config = read_json(config_path, what="ControlNet config")
    if not isinstance(config, dict):
        raise BadInput(f"{config_path}: expected a JSON object")
    if config.get("_class_name") != "ControlNetModel":
        raise BadInput(f"{config_path}: _class_name {config.get('_class_name')!r}, not a ControlNetModel")
    if config.get("addition_embed_type") == "text_time":
        raise BadInput(f"{config_path}: addition_embed_type 'text_time' (an SDXL ControlNet): {SDXL}")
    if config.get("global_pool_conditions"):
        raise BadInput(f"{config_path}: global_pool_conditions (residuals pooled to 1x1, as the shuffle "
                       f"ControlNet) is not supported")
    weights = weight_files(path)
    if not weights:
        raise BadInput(f"{path}: no weight file (.safetensors or .bin)")
    sha = hash_files([("config.json", config_path)] + [(w.name, w) for w in weights])
    return ControlNetSource(str(path), "folder", {**_defaults("ControlNetModel"), **config}, sha)


def _read_file(path: Path) -> ControlNetSource:
    if path.suffix not in FILE_SUFFIXES:
        raise BadInput(f"{path}: --controlnet takes a diffusers ControlNet folder, a {'/'.join(FILE_SUFFIXES)} "
                       f"file or preset:NAME")
    state, _ = single_file.read_checkpoint(path)
    config, weights, reasons = infer_file(path, state)
    digest = hashlib.sha256(hash_files([("controlnet", path)]).encode())
    digest.update(json.dumps(config, sort_keys=True).encode())
    return ControlNetSource(str(path), "file", config, digest.hexdigest(), reasons, weights)


def infer_file(path: Path, state: dict) -> tuple[dict, dict, list[str]]:
    """(config fields, weights with diffusers keys, reasons) of an original-format ControlNet's
    tensors: the fields its keys and shapes determine (the rest come from the base UNet). Pure
    dict work (no model is built), so it also runs on meta tensors."""
    weights, prefix = _ldm_weights(path, state)
    fields, summary = single_file.infer_encoder(path, weights, prefix, "ControlNet")
    hint, hint_reason = _infer_hint(path, weights, prefix, fields["block_out_channels"][0])
    _check_zero_convs(path, weights, prefix)
    config = {**fields, **hint}
    converted = single_file.convert_with(path, "ControlNet", _convert, weights, config)
    unplaced = len(weights) - sum(v is not None for v in converted.values())
    if unplaced or len(converted) != len(weights):
        raise BadInput(f"{path}: {max(unplaced, 1)} of its {len(weights)} ControlNet tensors fit no part of the "
                       f"inferred architecture (unrecognised layout)")
    reasons = [summary, hint_reason]
    stored = single_file.dtype_reason(state)
    if stored:
        reasons.append(stored)
    return config, converted, reasons


def _ldm_weights(path: Path, state: dict) -> tuple[dict, str]:
    """The ControlNet's original-layout tensors (the prefix removed) and the prefix; BadInput for
    what is no such ControlNet."""
    if any(k.startswith(_LDM) for k in state):
        weights, prefix = single_file.strip(state, _LDM), _LDM
    elif any(k.startswith(_HINT) for k in state):
        weights, prefix = state, ""
    elif "controlnet_cond_embedding.conv_in.weight" in state:
        if "add_embedding.linear_1.weight" in state:
            raise BadInput(f"{path}: a ControlNet with SDXL's text_time embedding (add_embedding): {SDXL}")
        raise BadInput(f"{path}: a ControlNet with diffusers keys in one file: give its diffusers folder "
                       f"(config.json beside the weights)")
    elif any(k.startswith("model.diffusion_model.") for k in state):
        raise BadInput(f"{path}: a Stable Diffusion checkpoint, not a ControlNet (no '{_LDM}' keys): "
                       f"give it as MODEL")
    else:
        raise BadInput(f"{path}: not a ControlNet (no '{_LDM}' or '{_HINT}' keys; {len(state)} keys such as "
                       f"{next(iter(state))!r})")
    if any(k.startswith("label_emb.") for k in weights):
        raise BadInput(f"{path}: a ControlNet with a label_emb (SDXL's text_time embedding): {SDXL}")
    return weights, prefix


def _infer_hint(path: Path, w: dict, prefix: str, first_channels: int) -> tuple[dict, str]:
    """The hint embedding's config (conditioning channels, widths) from input_hint_block's shapes."""
    shape = single_file.Shapes(path, w, prefix)
    convs = single_file.indices(w, _HINT)
    if convs != _HINT_CONVS:
        raise shape.refuse(f"unrecognised {_HINT[:-1]} (convolutions at {convs}; ControlNet 1.x has "
                           f"{len(_HINT_CONVS)}, at {_HINT_CONVS[0]}, {_HINT_CONVS[1]}, .., {_HINT_CONVS[-1]})")
    widths = [shape(f"{_HINT}{i}.weight", 4)[0] for i in (0, 4, 8, 12)]
    channels = shape(f"{_HINT}0.weight", 4)[1]
    out = shape(f"{_HINT}14.weight", 4)[0]
    if out != first_channels:
        raise shape.refuse(f"{_HINT}14 gives {out} channels, the first level has {first_channels}")
    config = {"conditioning_channels": channels, "conditioning_embedding_out_channels": widths}
    return config, f"hint embedding: {channels}-channel image through {widths}"


def _check_zero_convs(path: Path, w: dict, prefix: str) -> None:
    """A zero convolution per input block and the middle block's (what makes it a ControlNet)."""
    blocks = single_file.indices(w, "input_blocks.")
    zero = single_file.indices(w, "zero_convs.")
    if zero != blocks or "middle_block_out.0.weight" not in w:
        raise BadInput(f"{path}: {len(zero)} {prefix}zero_convs for {len(blocks)} input blocks"
                       f"{'' if 'middle_block_out.0.weight' in w else f', no {prefix}middle_block_out'}: "
                       f"not a ControlNet layout")


def _convert(weights: dict, config: dict) -> dict:
    from diffusers.loaders import single_file_utils as sfu

    return sfu.convert_controlnet_checkpoint({_LDM + k: v for k, v in weights.items()}, config)


def _defaults(class_name: str) -> dict:
    """The config defaults of a diffusers model class (its __init__'s)."""
    import diffusers

    parameters = inspect.signature(getattr(diffusers, class_name).__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def from_unet_config(unet: dict) -> dict:
    """ControlNetModel.from_unet's config relation, on a UNet config dict."""
    return {key: unet[key] for key in FROM_UNET if key in unet}


# ---------------------------------------------------------------------------------------------
# Fitting and building


def check_fits(source: ControlNetSource, pipe: Pipeline) -> None:
    """BadInput naming every FIT_FIELDS value that differs from the base UNet's, and a hint
    embedding that does not take the image to the latent's size."""
    unet = dict(pipe.unet.config)
    differences = [f"{key} {_plain(source.config.get(key))} (the UNet's {_plain(unet.get(key))})"
                   for key in FIT_FIELDS if _per_level(source.config, key) != _per_level(unet, key)]
    widths = source.config.get("conditioning_embedding_out_channels")
    if isinstance(widths, (list, tuple)) and 2 ** (len(widths) - 1) != pipe.vae_scale_factor:
        differences.append(f"its hint embedding downsamples the image {2 ** (len(widths) - 1)} times "
                           f"(the VAE {pipe.vae_scale_factor} times)")
    if differences:
        pair = (source.config.get("cross_attention_dim"), unet.get("cross_attention_dim"))
        known = f": {_KNOWN_PAIRS[pair]}" if pair in _KNOWN_PAIRS else ""
        raise BadInput(f"{source.model}: the ControlNet does not fit {pipe.source}'s UNet: "
                       f"{'; '.join(differences)}{known}")


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _per_level(config: dict, key: str):
    """The field comparable across configs (an int layers_per_block is that many at every level)."""
    value = _plain(config.get(key))
    if key == "layers_per_block" and isinstance(value, int):
        return [value] * len(config.get("block_out_channels") or ())
    return value


def build(source: ControlNetSource, pipe: Pipeline, seed: int = 0):
    """The ControlNetModel of a source that fits `pipe` (float32, eval mode)."""
    from diffusers import ControlNetModel

    if source.kind == "folder":
        model = from_pretrained(ControlNetModel, Path(source.model))
    elif source.kind == "preset":
        with quiet_loaders():
            model = presets.build_seeded(lambda: _live_zero_convs(ControlNetModel.from_config(source.config)), seed,
                                         source.model)
    else:
        config = {**from_unet_config(dict(pipe.unet.config)), **source.config}
        try:
            with quiet_loaders():
                model = ControlNetModel.from_config(config)
        except Exception as e:  # an inferred config diffusers rejects: a layout we misread
            raise BadInput(f"{source.model}: cannot build the inferred ControlNet: {e}") from e
        single_file.load_state(Path(source.model), "controlnet", model, source.weights, strict=True)
    model = model.float().eval()
    for name, parameter in model.named_parameters():
        check_finite(parameter.detach(), f"{source.model}: ControlNet parameter {name}")
    return model


def _live_zero_convs(model):
    """What training gives a ControlNet and its initialisation does not: the control image's
    embedding passes the image on (He-initialised, its last layer too, so that its signal survives
    the SiLUs and strided convolutions rather than fading to the biases), and the zero
    convolutions of the residuals are no longer zero (an ordinary convolution's initialisation). So a
    preset ControlNet's residuals change with the control image as a trained one's do, and a
    picture shows which image it got."""
    import torch

    embedding = model.controlnet_cond_embedding
    for conv in (embedding.conv_in, *embedding.blocks, embedding.conv_out):
        torch.nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    for conv in (*model.controlnet_down_blocks, model.controlnet_mid_block):
        conv.reset_parameters()
    return model


def describe(config: dict) -> str:
    return (f"ControlNet: channels {_plain(config['block_out_channels'])}, layers_per_block "
            f"{config['layers_per_block']}, cross-attention width {config['cross_attention_dim']}, "
            f"{config['conditioning_channels']}-channel conditioning image through "
            f"{_plain(config['conditioning_embedding_out_channels'])}")


def attach(pipe: Pipeline, sources: list[ControlNetSource], seed: int = 0) -> None:
    """Check each source against the pipeline's UNet, build it and add it as the next
    controlnet_N: recorded in details["controlnets"] and folded into the source hash."""
    for source in sources:
        check_fits(source, pipe)
    for source in sources:
        model = build(source, pipe, seed)
        name = control.controlnet_name(len(pipe.controlnets))
        pipe.controlnets.append(model)
        reasons = [*source.reasons]
        if source.kind == "file":
            reasons.append(f"heads, norm groups and the rest from {pipe.source}'s UNet (ControlNetModel.from_unet)")
        pipe.details.setdefault("controlnets", []).append({
            "component": name, "model": source.model, "kind": source.kind, "sha256": source.sha256,
            "architecture": {"summary": describe(dict(model.config)), "reasons": reasons},
            "conditioning_channels": int(model.config.conditioning_channels),
        })
        fold_into_hash(pipe, f"controlnet={source.sha256}")
