"""Single-file checkpoints: one .safetensors/.ckpt holding the UNet, VAE and text encoder, in
the original LDM/CompVis layout (as checkpoints are shared) or with diffusers keys under
component prefixes (save_single_file).

Without --config the architecture of an original-layout SD 1.x / 2.x file (text-to-image, or
inpainting: a UNet of 9 input channels) is inferred from its keys and tensor shapes: the family
from the text encoder's layout (CLIP under `cond_stage_model.transformer.` = SD 1.x, OpenCLIP
under `cond_stage_model.model.` = SD 2.x), everything a shape can tell from the shapes, the rest
from the family's preset (models.py), and the tokenizer from the CLIP BPE merges that the
open_clip_torch package ships. What was decided and why goes to `pipe.details["architecture"]`
(the manifest's source, convert's summary).

SDXL base files (CLIP ViT-L under `conditioner.embedders.0.transformer.`, OpenCLIP ViT-bigG under
`conditioner.embedders.1.model.`) are inferred the same way: the UNet's transformer depth per
level and its added (text_time) embedding from the shapes, text_encoder_2 as a
CLIPTextModelWithProjection (every layer, text_projection transposed), SDXL's VAE scaling, 64-wide
heads and 1024x1024, and SDXL inpainting from a 9-channel UNet; a file whose shapes are exactly an
SDXL preset's (preset:sdxl, preset:sdxl-tiny or their -inpaint forms) takes that preset's heads and
image size (and, without CLIP's vocabulary, its tokenizer). The refiner (OpenCLIP alone as embedder
0, aesthetic-score time ids) is refused."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import types
from pathlib import Path

import torch

from difflite.compiler.pipeline import (
    BOS,
    COMPONENTS,
    EOS,
    SDXL_TIME_IDS,
    Pipeline,
    assemble,
    check_config_folder,
    config_files,
    fold_into_hash,
    from_pretrained,
    hash_files,
    is_sdxl_folder,
    one_line,
    quiet_loaders,
    weight_files,
)
from difflite.compiler.presets import preset_configs, preset_tokenizer, tokenizer_vocab
from difflite.core.errors import BadInput
from difflite.core.finite import check_finite
from difflite.folder.output_folder import unsupported_input_channels

_UNET = "model.diffusion_model."
_VAE = "first_stage_model."
_CLIP = "cond_stage_model.transformer."  # SD 1.x: transformers' CLIPTextModel
_OPEN_CLIP = "cond_stage_model.model."  # SD 2.x: OpenCLIP's text tower
_EMA = "model_ema."
_SDXL = "conditioner.embedders."
_SDXL_CLIP = _SDXL + "0.transformer."  # SDXL: CLIP ViT-L (transformers' CLIPTextModel)
_SDXL_OPEN_CLIP = _SDXL + "1.model."  # SDXL: OpenCLIP ViT-bigG's text tower with its projection
_REFINER_OPEN_CLIP = _SDXL + "0.model."  # the SDXL refiner's one text encoder (OpenCLIP)
_LAYOUTS = {"UNet": _UNET, "VAE": _VAE, "CLIP": _CLIP, "OpenCLIP": _OPEN_CLIP}

# CLIP's tokenizer: 256 byte symbols, the same with "</w>", 48894 merges, <|startoftext|> and
# <|endoftext|> make 49408 tokens; every SD 1.x / 2.x text encoder has that vocabulary.
_CLIP_VOCAB_SIZE = 49408
_CLIP_MERGES = 49152 - 256 - 2
_BPE_FILE = "bpe_simple_vocab_16e6.txt.gz"
_CLIP_HEAD_SIZE = 64  # CLIP ViT-L and OpenCLIP ViT-H text towers: hidden / 64 heads
_SD1_HEADS = 8  # SD 1.x UNet: 8 heads at every level
_SD2_HEAD_SIZE = 64  # SD 2.x UNet: 64 channels a head (5, 10, 20, 20 heads at 320..1280)
_SD2_512_STEP = 875000  # global_step of SD 2's 512-base-ema.ckpt (what diffusers' converter keys on)
_SDXL_HEAD_SIZE = 64  # SDXL's UNet: 64 channels a head (5, 10, 20 heads at 320, 640, 1280)
_SDXL_SIZE = 1024
# SDXL architectures known by name: a file whose shapes are exactly one of these presets' takes
# the preset's heads (no weight holds them) and, for a vocabulary other than CLIP's, its tokenizer
_SDXL_PRESETS = ("sdxl", "sdxl-tiny", "sdxl-inpaint", "sdxl-tiny-inpaint")


def save_single_file(pipe: Pipeline, path: Path) -> None:
    """Write the three models to one .safetensors with component-prefixed diffusers keys."""
    from safetensors.torch import save_file

    tensors = {}
    for name in COMPONENTS:
        for key, value in getattr(pipe, name).state_dict().items():
            tensors[f"{name}.{key}"] = value.detach().contiguous()
    save_file(tensors, str(path))


def read_checkpoint(path: Path) -> tuple[dict, dict]:
    """(named tensors, the other top-level entries of a .ckpt, such as global_step)."""
    meta: dict = {}
    try:
        path.open("rb").close()  # safetensors says "No such file" for a file it may not read
    except OSError as e:
        raise BadInput(f"{path}: cannot read checkpoint ({e.strerror or e})") from e
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            while isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                meta.update({k: v for k, v in state.items() if k != "state_dict" and not isinstance(v, dict)})
                state = state["state_dict"]
    except Exception as e:  # truncated/corrupt files raise assorted errors
        raise BadInput(f"{path}: cannot read checkpoint ({one_line(e)})") from e
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)} if isinstance(state, dict) else {}
    if not tensors:
        raise BadInput(f"{path}: not a checkpoint of named tensors")
    for key, value in tensors.items():
        # load_state_dict would cast integers into the float parameters without a word
        if key.endswith((".weight", ".bias")) and not value.is_floating_point():
            raise BadInput(f"{path}: {key} is stored as {str(value.dtype).removeprefix('torch.')}, "
                           f"not as floating-point weights")
    if isinstance(state, dict):
        meta.update({k: v for k, v in state.items() if not isinstance(v, torch.Tensor) and not isinstance(v, dict)})
    return tensors, meta


def load_single_file(path: Path, config: Path | None, prediction_type: str | None = None) -> Pipeline:
    """Load a single-file checkpoint: with `config` (a diffusers folder) its configs and
    tokenizer are used; without, an original-layout SD 1.x / 2.x file's architecture is inferred.
    `prediction_type` is the caller's --prediction-type (load_pipeline applies it to the
    scheduler either way); inference also takes it as evidence of SD 2.x's image size."""
    if config is not None:
        if not config.exists():
            raise BadInput(f"{config}: no such config folder")
        index = check_config_folder(config)
        if is_sdxl_folder(config, index):
            raise BadInput(f"{config}: --config with an SDXL folder is not supported: an original-format SDXL "
                           f"file's architecture is inferred without --config")
        state, _ = read_checkpoint(path)
        return _load_with_config(path, state, config)
    state, meta = read_checkpoint(path)
    return _load_inferred(path, state, meta, prediction_type)


# ---------------------------------------------------------------------------------------------
# With --config FOLDER


def _load_with_config(path: Path, state: dict, config: Path) -> Pipeline:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet = _model_from_config(UNet2DConditionModel, config / "unet")
    vae = _model_from_config(AutoencoderKL, config / "vae")
    text_encoder = _model_from_config(None, config / "text_encoder")
    models = {"unet": unet, "vae": vae, "text_encoder": text_encoder}
    ema = None
    if any(k.startswith(_UNET) for k in state):
        unet_weights, ema, _ = _unet_weights(state)
        layers = text_encoder.config.num_hidden_layers
        parts = {
            "unet": convert_with(path, "UNet", _convert_unet, unet_weights, dict(unet.config)),
            "vae": convert_with(path, "VAE", _convert_vae, strip(state, _VAE), dict(vae.config)),
        }
        if any(k.startswith(_CLIP) for k in state):
            parts["text_encoder"] = _convert_clip(state)
        elif any(k.startswith(_OPEN_CLIP) for k in state):
            parts["text_encoder"] = convert_with(path, "OpenCLIP", _convert_open_clip, strip(state, _OPEN_CLIP),
                                             layers, text_encoder.config.hidden_size)
        else:
            parts["text_encoder"] = {}
        strict = False  # LDM files carry extra keys (the non-EMA copy, open_clip's projection, buffers)
    elif any(k.startswith("unet.") for k in state):
        parts = {name: strip(state, name + ".") for name in models}
        strict = True
    else:
        raise BadInput(f"{path}: unknown key layout (expected 'unet.'/'vae.'/'text_encoder.' or LDM keys)")
    for name, model in models.items():
        load_state(path, name, model, parts[name], strict)
    files = [("checkpoint", path)] + config_files(config)
    pipe = assemble(str(path), hash_files(files), config, text_encoder, unet, vae)
    if ema is not None:
        pipe.details["ema"] = bool(ema)
    return pipe


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
        raise BadInput(f"{folder / 'config.json'}: cannot build the model: {one_line(e)}") from e


def load_state(path: Path, name: str, model: torch.nn.Module, state: dict, strict: bool) -> None:
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


# ---------------------------------------------------------------------------------------------
# Original LDM keys -> diffusers keys (diffusers' own single-file converters)


def strip(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def convert_with(path: Path, what: str, fn, *args):
    """fn(*args) (one of diffusers' single-file converters), any failure a BadInput naming the file."""
    try:
        with quiet_loaders():
            return fn(*args)
    except BadInput:
        raise
    except Exception as e:  # the converters index what they expect and raise assorted errors
        raise BadInput(f"{path}: cannot convert the {what} weights: {one_line(e)}") from e


def _convert_unet(weights: dict, config: dict) -> dict:
    from diffusers.loaders import single_file_utils as sfu

    return sfu.convert_ldm_unet_checkpoint({_UNET + k: v for k, v in weights.items()}, config)


def _convert_vae(weights: dict, config: dict) -> dict:
    from diffusers.loaders import single_file_utils as sfu

    return sfu.convert_ldm_vae_checkpoint({_VAE + k: v for k, v in weights.items()}, config)


def _convert_clip(state: dict) -> dict:
    # transformers >= 5.6 flattened CLIPTextModel: its keys no longer start with "text_model."
    return {k.removeprefix("text_model."): v for k, v in strip(state, _CLIP).items()}


def _convert_open_clip(weights: dict, layers: int, hidden: int) -> dict:
    """OpenCLIP's text tower -> CLIPTextModel keys, keeping the first `layers` resblocks (SD 2.x
    conditions on the penultimate layer: the last resblock is not used)."""
    from diffusers.loaders import single_file_utils as sfu

    kept = {}
    for key, value in weights.items():
        if key.startswith("transformer.resblocks.") and int(key.split(".")[2]) >= layers:
            continue
        kept[_OPEN_CLIP + key] = value
    stub = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden))
    converted = sfu.convert_open_clip_checkpoint(stub, kept, prefix=_OPEN_CLIP)
    return {k.removeprefix("text_model."): v for k, v in converted.items() if k != "text_projection.weight"}


def _flat_ema_key(unet_key: str) -> str:
    """The LDM EMA copy's name for model.diffusion_model.KEY: "model_ema.diffusion_model" + KEY
    with the dots removed (LitEma's buffer names)."""
    return _EMA + "".join((_UNET + unet_key).split(".")[1:])


def _unet_weights(state: dict) -> tuple[dict, bool, str]:
    """The UNet's LDM weights (without the prefix): the EMA copy where the file has a complete
    one (what the original LDM sampler uses), else the trained weights; and the reason."""
    weights = strip(state, _UNET)
    ema_keys = [k for k in state if k.startswith(_EMA)]
    if not ema_keys:
        return weights, False, "no model_ema.* copy: the UNet weights as stored"
    ema = {k: state.get(_flat_ema_key(k)) for k in weights}
    if all(v is not None and v.shape == weights[k].shape for k, v in ema.items()):
        return ema, True, (f"EMA weights: {len(ema)} model_ema.* UNet tensors used instead of "
                           f"model.diffusion_model.* (what the LDM sampler uses)")
    covered = sum(v is not None for v in ema.values())
    return weights, False, (f"{len(ema_keys)} model_ema.* keys cover {covered} of {len(weights)} UNet tensors: "
                            f"not an EMA copy, the UNet weights as stored")


# ---------------------------------------------------------------------------------------------
# Inference


def _layout_counts(state: dict) -> dict:
    counts = {prefix: 0 for prefix in (*_LAYOUTS.values(), _EMA, _SDXL)}
    for key in state:
        for prefix in counts:
            if key.startswith(prefix):
                counts[prefix] += 1
                break
    return counts


def _describe_keys(state: dict, counts: dict) -> str:
    shown = ", ".join(f"{n} '{p}'" for p, n in counts.items() if p != _EMA and (n or p in _LAYOUTS.values()))
    other = [k for k in state if not any(k.startswith(p) for p in counts)]
    extra = f", {len(other)} other (e.g. {other[0]!r})" if other else ""
    return f"found {shown}{extra} keys"


def _family(path: Path, state: dict) -> tuple[str, str]:
    """"sd1" or "sd2", and the reason; BadInput for any layout that is neither."""
    counts = _layout_counts(state)
    what = _describe_keys(state, counts)
    if counts[_SDXL]:
        return _sdxl_family(path, state, counts, what)
    if not counts[_UNET]:
        if any(k.startswith(("unet.", "vae.", "text_encoder.")) for k in state):
            raise BadInput(f"{path}: diffusers keys ('unet.', 'vae.', 'text_encoder.'): inference reads the "
                           f"original LDM layout only, pass --config FOLDER (a diffusers folder with the configs)")
        raise BadInput(f"{path}: not an SD 1.x/2.x checkpoint (no '{_UNET}' UNet keys): {what}")
    if not counts[_VAE]:
        raise BadInput(f"{path}: no '{_VAE}' VAE keys in this checkpoint: {what}")
    clip, open_clip = counts[_CLIP], counts[_OPEN_CLIP]
    if clip and open_clip:
        raise BadInput(f"{path}: ambiguous text encoder (both CLIP and OpenCLIP layouts): {what}")
    if not clip and not open_clip:
        raise BadInput(f"{path}: no text encoder ('{_CLIP}' or '{_OPEN_CLIP}' keys): {what}")
    if clip:
        return "sd1", f"{clip} '{_CLIP}' keys (CLIP text encoder): SD 1.x"
    return "sd2", f"{open_clip} '{_OPEN_CLIP}' keys (OpenCLIP text encoder): SD 2.x"


def _sdxl_family(path: Path, state: dict, counts: dict, what: str) -> tuple[str, str]:
    """"sdxl" and the reason for a file with SDXL base's layout (CLIP ViT-L as embedder 0, OpenCLIP
    ViT-bigG as embedder 1, the UNet and the VAE); BadInput naming what else it is."""
    found = {prefix: sum(k.startswith(prefix) for k in state)
             for prefix in (_SDXL_CLIP, _SDXL_OPEN_CLIP, _REFINER_OPEN_CLIP)}
    if found[_REFINER_OPEN_CLIP]:
        raise BadInput(f"{path}: an SDXL refiner (OpenCLIP alone as '{_REFINER_OPEN_CLIP}', aesthetic-score time "
                       f"ids) is not supported: SDXL base only")
    if counts[_CLIP] or counts[_OPEN_CLIP]:
        raise BadInput(f"{path}: ambiguous text encoders (SD 1.x / 2.x 'cond_stage_model.' and SDXL '{_SDXL}' "
                       f"keys): {what}")
    missing = [p for p in (_SDXL_CLIP, _SDXL_OPEN_CLIP) if not found[p]]
    if missing:
        raise BadInput(f"{path}: an SDXL checkpoint without its '{missing[0]}' text encoder: {what}")
    other = [k for k in state if k.startswith(_SDXL) and not k.startswith((_SDXL_CLIP, _SDXL_OPEN_CLIP))]
    if other:
        raise BadInput(f"{path}: SDXL conditioner keys other than its two text encoders (e.g. {other[0]!r}) "
                       f"are not supported: {what}")
    for prefix, name in ((_UNET, "UNet"), (_VAE, "VAE")):
        if not counts[prefix]:
            raise BadInput(f"{path}: an SDXL checkpoint without '{prefix}' {name} keys: {what}")
    return "sdxl", (f"{found[_SDXL_CLIP]} '{_SDXL_CLIP}' (CLIP) and {found[_SDXL_OPEN_CLIP]} '{_SDXL_OPEN_CLIP}' "
                    f"(OpenCLIP) keys: SDXL")


def indices(state: dict, prefix: str) -> list[int]:
    """The distinct integers N of keys PREFIX.N.* (sorted)."""
    found = set()
    for key in state:
        if key.startswith(prefix):
            head = key[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                found.add(int(head))
    return sorted(found)


class Shapes:
    """Shape look-ups that fail with the file and the key."""

    def __init__(self, path: Path, state: dict, prefix: str):
        self.path, self.state, self.prefix = path, state, prefix

    def __call__(self, key: str, rank: int) -> tuple[int, ...]:
        if key not in self.state:
            raise BadInput(f"{self.path}: missing {self.prefix}{key} (unrecognised layout)")
        shape = tuple(self.state[key].shape)
        if len(shape) != rank:
            raise BadInput(f"{self.path}: {self.prefix}{key} has shape {shape}, expected {rank} dimensions")
        return shape

    def refuse(self, message: str) -> BadInput:
        return BadInput(f"{self.path}: {message}")


def _infer_unet(path: Path, u: dict, family: str) -> tuple[dict, list[str]]:
    """The UNet config fields its LDM weights `u` (prefix removed) determine."""
    shape = Shapes(path, u, _UNET)
    if any(k.startswith("label_emb.") for k in u):
        raise shape.refuse("class-conditioned UNet (label_emb: SD 2.x unCLIP or upscaler) is not supported")
    in_channels = shape("input_blocks.0.0.weight", 4)[1]
    out_channels = shape("out.2.weight", 4)[0]
    channels_reason = _input_channels_reason(shape, in_channels, out_channels)
    levels, layers = _unet_blocks(shape, u)
    config, down_attention = _encoder_fields(shape, u, levels, layers, "UNet")
    channels = config["block_out_channels"]
    up_attention = [f"output_blocks.{j * (layers + 1)}.1.proj_in.weight" in u for j in range(levels)]
    if family == "sd1":
        heads = _SD1_HEADS
        uneven = [c for c, a in zip(channels, down_attention) if a and c % heads] + \
            ([channels[-1]] if channels[-1] % heads else [])
        if uneven:
            raise shape.refuse(f"SD 1.x UNet channels {channels} do not split into {heads} heads")
        head_reason = f"{heads} heads at every attention (SD 1.x)"
    else:
        if any(c % _SD2_HEAD_SIZE for c in channels):
            raise shape.refuse(f"SD 2.x UNet channels {channels} are not multiples of the head size {_SD2_HEAD_SIZE}")
        heads = [c // _SD2_HEAD_SIZE for c in channels]
        head_reason = f"heads = channels / {_SD2_HEAD_SIZE} = {heads} (SD 2.x)"
    config.update(out_channels=out_channels, attention_head_dim=heads,
                  up_block_types=["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in up_attention])
    return config, [_encoder_summary("UNet", config, down_attention), channels_reason, head_reason]


def _unet_blocks(shape: Shapes, u: dict) -> tuple[int, int]:
    """(levels, layers per block) of LDM UNet weights `u`, from its input and output blocks."""
    inputs, outputs = indices(u, "input_blocks."), indices(u, "output_blocks.")
    downsamples = _downsamplers(u, inputs)
    levels = len(downsamples) + 1
    layers = len(outputs) // levels - 1
    ok = (layers >= 1 and len(outputs) == levels * (layers + 1) and outputs == list(range(len(outputs)))
          and _input_blocks_fit(inputs, downsamples, levels, layers))
    if not ok:
        raise shape.refuse(f"unrecognised UNet block layout ({len(inputs)} input blocks, {len(outputs)} output "
                           f"blocks, downsamplers at {downsamples})")
    return levels, layers


def _downsamplers(u: dict, inputs: list[int]) -> list[int]:
    return [i for i in inputs if f"input_blocks.{i}.0.op.weight" in u]


def _input_blocks_fit(inputs: list[int], downsamples: list[int], levels: int, layers: int) -> bool:
    """input_blocks 0 (conv_in), then per level `layers` blocks and (but the last) a downsampler."""
    return (inputs == list(range(1 + levels * layers + levels - 1))
            and downsamples == [(b + 1) * (layers + 1) for b in range(levels - 1)])


def _encoder_fields(shape: Shapes, u: dict, levels: int, layers: int, what: str,
                    deep: bool = False) -> tuple[dict, list[bool]]:
    """The config fields the input blocks and the middle block determine (the part of the UNet a
    ControlNet copies), and whether each level has attention. `deep` (SDXL): the transformer
    depth may be more than 1, one per level (transformer_layers_per_block)."""
    first = [1 + b * (layers + 1) for b in range(levels)]
    channels = [shape(f"input_blocks.{i}.0.out_layers.3.weight", 4)[0] for i in first]
    down_attention = [f"input_blocks.{i}.1.proj_in.weight" in u for i in first]
    blocks = sorted({k.rsplit(".proj_in.weight", 1)[0] + "." for k in u if k.endswith(".proj_in.weight")})
    if "middle_block.1." not in blocks:
        raise shape.refuse(f"{what} without mid-block attention (middle_block.1) is not an SD 1.x/2.x/XL {what}")
    depths = {block: len(indices(u, block + "transformer_blocks.")) for block in blocks}
    for block, depth in depths.items():
        if depth != 1 and not deep:
            raise shape.refuse(f"{what} transformer depth {depth} at {shape.prefix}{block[:-1]}: only depth 1 "
                               f"(SD 1.x / 2.x) is supported")
    ranks = {len(u[b + "proj_in.weight"].shape) for b in blocks}
    cross = {shape(b + "transformer_blocks.0.attn2.to_k.weight", 2)[1] for b in blocks}
    if len(ranks) != 1 or len(cross) != 1:
        raise shape.refuse(f"{what} attention blocks disagree (proj_in ranks {sorted(ranks)}, "
                           f"cross-attention widths {sorted(cross)})")
    config = {
        "in_channels": shape("input_blocks.0.0.weight", 4)[1], "block_out_channels": channels,
        "layers_per_block": layers, "cross_attention_dim": cross.pop(), "use_linear_projection": ranks == {2},
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in down_attention],
    }
    if deep:
        config["transformer_layers_per_block"] = _level_depths(shape, depths, first, layers, down_attention)
    return config, down_attention


def _level_depths(shape: Shapes, depths: dict, first: list[int], layers: int, attention: list[bool]) -> list[int]:
    """The transformer depth of each level's input blocks (a level without attention: 1), which
    diffusers also gives the mid block (the last level's) and the up blocks (reversed)."""
    out = []
    for level, start in enumerate(first):
        found = {depths.get(f"input_blocks.{start + n}.1.", 0) for n in range(layers)} if attention[level] else {1}
        if len(found) != 1 or 0 in found:
            raise shape.refuse(f"UNet level {level}'s input blocks have transformer depths {sorted(found)}: "
                               f"one depth a level expected")
        out.append(found.pop())
    mid = depths["middle_block.1."]
    if not attention[-1]:
        out[-1] = mid
    elif mid != out[-1]:
        raise shape.refuse(f"UNet mid-block transformer depth {mid} is not its last level's {out[-1]} "
                           f"(diffusers builds the mid block at the last level's depth)")
    return out


def _encoder_summary(what: str, config: dict, down_attention: list[bool]) -> str:
    at = [b for b, a in enumerate(down_attention) if a]
    return (f"{what}: channels {config['block_out_channels']}, layers_per_block {config['layers_per_block']}, "
            f"attention at levels {at}, {'linear' if config['use_linear_projection'] else 'conv'} proj_in, "
            f"cross-attention width {config['cross_attention_dim']}")


def infer_encoder(path: Path, u: dict, prefix: str, what: str) -> tuple[dict, str]:
    """The UNet config fields that LDM input_blocks.* and middle_block.* weights `u` (`prefix`
    removed, named in messages) determine, from their keys and shapes alone (a ControlNet: the
    UNet's encoder half), and a one-line summary. The layers per block come from the input blocks
    (1 + levels x layers + the levels' downsamplers)."""
    shape = Shapes(path, u, prefix)
    inputs = indices(u, "input_blocks.")
    downsamples = _downsamplers(u, inputs)
    levels = len(downsamples) + 1
    layers = (len(inputs) - levels) // levels
    if layers < 1 or not _input_blocks_fit(inputs, downsamples, levels, layers):
        raise shape.refuse(f"unrecognised {what} block layout ({len(inputs)} input blocks, "
                           f"downsamplers at {downsamples})")
    config, down_attention = _encoder_fields(shape, u, levels, layers, what)
    return config, _encoder_summary(what, config, down_attention)


def _input_channels_reason(shape: Shapes, in_channels: int, out_channels: int) -> str:
    """Why the UNet's input channels are those of a text-to-image or an inpainting UNet; a
    refusal for any other (depth-conditioned and other image-conditioned UNets)."""
    refused = unsupported_input_channels(in_channels, out_channels)
    if refused:
        raise shape.refuse(refused)
    if in_channels == out_channels:
        return f"UNet: {in_channels} input channels (the latents): text-to-image"
    return (f"UNet: {in_channels} input channels (latents {out_channels}, mask 1, masked picture's latents "
            f"{out_channels}): inpainting")


def _infer_vae(path: Path, v: dict) -> tuple[dict, str]:
    shape = Shapes(path, v, _VAE)
    levels = len(indices(v, "encoder.down."))
    layers = len(indices(v, "encoder.down.0.block."))
    if not levels or not layers or len(indices(v, "decoder.up.")) != levels \
            or len(indices(v, "decoder.up.0.block.")) != layers + 1:
        raise shape.refuse(f"unrecognised VAE layout under '{_VAE}' ({levels} encoder levels, "
                           f"{len(indices(v, 'decoder.up.'))} decoder levels)")
    channels = [shape(f"encoder.down.{i}.block.0.conv2.weight", 4)[0] for i in range(levels)]
    config = {
        "in_channels": shape("encoder.conv_in.weight", 4)[1], "out_channels": shape("decoder.conv_out.weight", 4)[0],
        "latent_channels": shape("decoder.conv_in.weight", 4)[1], "block_out_channels": channels,
        "layers_per_block": layers,
        "down_block_types": ["DownEncoderBlock2D"] * levels, "up_block_types": ["UpDecoderBlock2D"] * levels,
        # norm_num_groups cannot be read from the weights (GroupNorm stores per-channel affine
        # parameters only): it stays the presets' 32, as in every SD 1.x / 2.x VAE.
    }
    return config, (f"VAE: channels {channels}, layers_per_block {layers}, "
                    f"{config['latent_channels']} latent channels")


def _infer_text_encoder(path: Path, state: dict, family: str) -> tuple[dict, dict, str]:
    """The text encoder config fields, its diffusers weights and the reason."""
    if family == "sd1":
        weights = _convert_clip(state)
        shape = Shapes(path, weights, _CLIP + "text_model.")
        vocab, hidden = shape("embeddings.token_embedding.weight", 2)
        positions = shape("embeddings.position_embedding.weight", 2)[0]
        layers = len(indices(weights, "encoder.layers."))
        intermediate = shape("encoder.layers.0.mlp.fc1.weight", 2)[0]
        note = f"{layers} layers"
    else:
        o = strip(state, _OPEN_CLIP)
        shape = Shapes(path, o, _OPEN_CLIP)
        vocab, hidden = shape("token_embedding.weight", 2)
        positions = shape("positional_embedding", 2)[0]
        blocks = len(indices(o, "transformer.resblocks."))
        layers = blocks - 1
        if layers < 1:
            raise shape.refuse(f"OpenCLIP text encoder with {blocks} resblock(s): SD 2.x needs the penultimate")
        intermediate = shape("transformer.resblocks.0.mlp.c_fc.weight", 2)[0]
        weights = convert_with(path, "OpenCLIP", _convert_open_clip, o, layers, hidden)
        note = f"{layers} of {blocks} OpenCLIP resblocks (SD 2.x conditions on the penultimate layer)"
    if hidden % _CLIP_HEAD_SIZE:
        raise BadInput(f"{path}: text encoder width {hidden} is not a multiple of CLIP's head size {_CLIP_HEAD_SIZE}")
    config = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
              "num_hidden_layers": layers, "num_attention_heads": hidden // _CLIP_HEAD_SIZE,
              "max_position_embeddings": positions, "hidden_act": "quick_gelu" if family == "sd1" else "gelu"}
    return config, weights, f"text encoder: {note}, width {hidden}, vocab {vocab}, {positions} positions"


# ---------------------------------------------------------------------------------------------
# SDXL base


def _infer_sdxl(path: Path, state: dict, meta: dict, requested: str | None,
                family_reason: str) -> tuple[dict, dict, dict]:
    """infer_architecture for an SDXL base file: the components of StableDiffusionXLPipeline
    (text_encoder_2 too). The shapes give everything but the heads, the VAE's scaling factor and
    the image size: SDXL's (64-channel heads, 0.13025, 1024), or those of the SDXL preset whose
    shapes the file has exactly (preset:sdxl-tiny's files round-trip)."""
    unet_weights, ema, ema_reason = _unet_weights(state)
    vae_weights = strip(state, _VAE)
    unet_fields, unet_reasons = _infer_sdxl_unet(path, unet_weights)
    vae_fields, vae_reason = _infer_vae(path, vae_weights)
    clip = {k.removeprefix("text_model."): v for k, v in strip(state, _SDXL_CLIP).items()}
    clip.pop("embeddings.position_ids", None)
    text_fields = _clip_fields(Shapes(path, clip, _SDXL_CLIP + "text_model."), clip, "quick_gelu")
    text_fields_2, text_weights_2 = _infer_open_clip_g(path, strip(state, _SDXL_OPEN_CLIP))
    context = text_fields["hidden_size"] + text_fields_2["hidden_size"]
    if unet_fields["cross_attention_dim"] != context:
        raise BadInput(f"{path}: the UNet's cross-attention width {unet_fields['cross_attention_dim']} is not the "
                       f"text encoders' widths {text_fields['hidden_size']} + {text_fields_2['hidden_size']}")
    projection = text_fields_2["projection_dim"]
    added = unet_fields["projection_class_embeddings_input_dim"] - projection
    if added <= 0 or added % SDXL_TIME_IDS:
        raise BadInput(f"{path}: the UNet's added embedding takes {added + projection} features: text_encoder_2's "
                       f"projection {projection} and {added} more, not {SDXL_TIME_IDS} whole time ids (SDXL base)")
    unet_fields["addition_time_embed_dim"] = added // SDXL_TIME_IDS
    fields = {"unet": unet_fields, "vae": vae_fields, "text_encoder": text_fields, "text_encoder_2": text_fields_2}
    known = next((name for name in _SDXL_PRESETS if _fits_preset(name, fields)), None)
    base = preset_configs(known or "sdxl")
    if known:
        heads = {"attention_head_dim": base["unet"]["attention_head_dim"]}
        heads_1 = base["text_encoder"]["num_attention_heads"]
        heads_2 = base["text_encoder_2"]["num_attention_heads"]
        head_reason = f"heads as preset:{known}'s (its shapes exactly)"
    else:
        heads = {"attention_head_dim": _sdxl_heads(path, unet_fields["block_out_channels"])}
        heads_1, heads_2 = (_clip_heads(path, f["hidden_size"]) for f in (text_fields, text_fields_2))
        head_reason = f"heads = channels / {_SDXL_HEAD_SIZE} = {heads['attention_head_dim']} (SDXL)"
    tokenizer, ids_1, ids_2, tokenizer_reason = _sdxl_tokenizer(path, known, text_fields, text_fields_2)
    predicts, prediction_reason = _sdxl_prediction(state, meta, requested)
    scale = 2 ** (len(vae_fields["block_out_channels"]) - 1)
    size = base["unet"]["sample_size"] * scale if known else _SDXL_SIZE
    configs = {
        "unet": {**base["unet"], **unet_fields, **heads, "sample_size": size // scale},
        "vae": {**base["vae"], **vae_fields, "sample_size": size},
        "text_encoder": {**base["text_encoder"], **text_fields, "num_attention_heads": heads_1, **ids_1},
        "text_encoder_2": {**base["text_encoder_2"], **text_fields_2, "num_attention_heads": heads_2, **ids_2},
        "scheduler": {**base["scheduler"], "prediction_type": predicts},
    }
    weights = {
        "unet": convert_with(path, "UNet", _convert_unet, unet_weights, configs["unet"]),
        "vae": convert_with(path, "VAE", _convert_vae, vae_weights, configs["vae"]),
        "text_encoder": clip, "text_encoder_2": text_weights_2,
    }
    for name, source in (("unet", unet_weights), ("vae", vae_weights)):
        if len(weights[name]) != len(source):  # the converters map one tensor to one tensor
            raise BadInput(f"{path}: {len(source) - len(weights[name])} of the {len(source)} {name} tensors fit "
                           f"no part of the inferred architecture (unrecognised layout)")
    text_reasons = [
        f"text encoder: CLIP, {text_fields['num_hidden_layers']} layers, width {text_fields['hidden_size']}",
        (f"text encoder 2: OpenCLIP, {text_fields_2['num_hidden_layers']} layers, width "
         f"{text_fields_2['hidden_size']}, projection {projection}"),
        (f"added embedding: projection {projection} + {SDXL_TIME_IDS} time ids x "
         f"{unet_fields['addition_time_embed_dim']}"),
    ]
    reasons = [family_reason, *unet_reasons, head_reason, vae_reason, *text_reasons, tokenizer_reason,
               f"prediction: {prediction_reason}", ema_reason]
    stored = dtype_reason(state)
    if stored:
        reasons.append(stored)
    name = f"SDXL (preset:{known}'s architecture)" if known else "SDXL base (CLIP ViT-L + OpenCLIP ViT-bigG)"
    architecture = {
        "family": "sdxl", "prediction_type": predicts, "image_size": size, "ema": ema,
        "inpainting": unet_fields["in_channels"] != unet_fields["out_channels"],
        "tokenizer": tokenizer, "summary": f"{name}, {predicts} at {size}x{size}" + (", EMA weights" if ema else ""),
        "reasons": reasons,
    }
    return configs, weights, architecture


def _infer_sdxl_unet(path: Path, u: dict) -> tuple[dict, list[str]]:
    """The config fields SDXL UNet weights `u` (LDM layout, prefix removed) determine: the SD
    fields, the transformer depth per level and the added (text_time) embedding's input width."""
    shape = Shapes(path, u, _UNET)
    in_channels = shape("input_blocks.0.0.weight", 4)[1]
    out_channels = shape("out.2.weight", 4)[0]
    channels_reason = _input_channels_reason(shape, in_channels, out_channels)
    if "label_emb.0.0.weight" not in u:
        raise shape.refuse(f"an SDXL UNet without its added embedding ({_UNET}label_emb.0.0: the pooled text "
                           f"and time ids) is not supported")
    time_embed, added = shape("label_emb.0.0.weight", 2)
    levels, layers = _unet_blocks(shape, u)
    config, down_attention = _encoder_fields(shape, u, levels, layers, "UNet", deep=True)
    depths = config["transformer_layers_per_block"]
    up_attention = [f"output_blocks.{j * (layers + 1)}.1.proj_in.weight" in u for j in range(levels)]
    for j, attention in enumerate(up_attention):
        want = depths[levels - 1 - j]
        for n in range(layers + 1) if attention else ():
            block = f"output_blocks.{j * (layers + 1) + n}.1.transformer_blocks."
            if len(indices(u, block)) != want:
                raise shape.refuse(f"UNet {block[:-20]} has transformer depth {len(indices(u, block))}, not its "
                                   f"level's {want} (diffusers mirrors the down levels' depths)")
    config.update(out_channels=out_channels, addition_embed_type="text_time",
                  projection_class_embeddings_input_dim=added,
                  up_block_types=["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in up_attention])
    depth_reason = f"transformer depth per level {depths} (the mid block {depths[-1]})"
    return config, [_encoder_summary("UNet", config, down_attention), channels_reason, depth_reason,
                    f"added embedding: label_emb {added} -> {time_embed}"]


def _fits_preset(name: str, fields: dict) -> bool:
    configs = preset_configs(name)
    return all(configs[part].get(key) == value for part, found in fields.items() for key, value in found.items())


def _sdxl_heads(path: Path, channels: list[int]) -> list[int]:
    if any(c % _SDXL_HEAD_SIZE for c in channels):
        raise BadInput(f"{path}: SDXL UNet channels {channels} are not multiples of the head size {_SDXL_HEAD_SIZE}")
    return [c // _SDXL_HEAD_SIZE for c in channels]


def _clip_heads(path: Path, hidden: int) -> int:
    if hidden % _CLIP_HEAD_SIZE:
        raise BadInput(f"{path}: text encoder width {hidden} is not a multiple of CLIP's head size {_CLIP_HEAD_SIZE}")
    return hidden // _CLIP_HEAD_SIZE


def _clip_fields(shape: Shapes, weights: dict, act: str) -> dict:
    """The CLIPTextConfig fields transformers' CLIPTextModel weights (keys without text_model.) give."""
    vocab, hidden = shape("embeddings.token_embedding.weight", 2)
    return {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": len(indices(weights, "encoder.layers.")),
            "intermediate_size": shape("encoder.layers.0.mlp.fc1.weight", 2)[0],
            "max_position_embeddings": shape("embeddings.position_embedding.weight", 2)[0], "hidden_act": act}


# OpenCLIP resblock modules -> CLIPEncoderLayer's (the fused in_proj is split into q, k, v)
_OPEN_CLIP_LAYER = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
                    "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
_OPEN_CLIP_UNUSED = ("logit_scale", "attn_mask")  # the contrastive loss's scale; a buffer some files carry


def _infer_open_clip_g(path: Path, o: dict) -> tuple[dict, dict]:
    """SDXL's OpenCLIP ViT-bigG text tower (all its layers: the pooled output takes the last)
    as CLIPTextModelWithProjection: its config fields and weights. text_projection is stored
    [width, projection] (x @ P) and becomes the Linear's [projection, width] weight."""
    shape = Shapes(path, o, _SDXL_OPEN_CLIP)
    vocab, hidden = shape("token_embedding.weight", 2)
    width, projection = shape("text_projection", 2)
    if width != hidden:
        raise shape.refuse(f"{_SDXL_OPEN_CLIP}text_projection has shape {(width, projection)}: its first dimension "
                           f"is not the text width {hidden}")
    fields = {"vocab_size": vocab, "hidden_size": hidden, "projection_dim": projection,
              "num_hidden_layers": len(indices(o, "transformer.resblocks.")),
              "intermediate_size": shape("transformer.resblocks.0.mlp.c_fc.weight", 2)[0],
              "max_position_embeddings": shape("positional_embedding", 2)[0], "hidden_act": "gelu"}
    weights = {}
    for key, value in o.items():
        if key in _OPEN_CLIP_UNUSED:
            continue
        if key == "text_projection":
            weights["text_projection.weight"] = value.t().contiguous()
            continue
        name = {"token_embedding.weight": "embeddings.token_embedding.weight",
                "positional_embedding": "embeddings.position_embedding.weight",
                "ln_final.weight": "final_layer_norm.weight", "ln_final.bias": "final_layer_norm.bias"}.get(key)
        if name is None and key.startswith("transformer.resblocks."):
            layer, rest = key.removeprefix("transformer.resblocks.").split(".", 1)
            module, kind = rest.rsplit(".", 1)
            head = f"encoder.layers.{layer}."
            if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
                if value.shape[0] != 3 * hidden:
                    raise shape.refuse(f"{_SDXL_OPEN_CLIP}{key} has shape {tuple(value.shape)}: not q, k and v of "
                                       f"width {hidden}")
                for part, chunk in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                    weights[f"text_model.{head}self_attn.{part}.{rest.rsplit('_', 1)[1]}"] = chunk.clone()
                continue
            if module in _OPEN_CLIP_LAYER:
                name = f"{head}{_OPEN_CLIP_LAYER[module]}.{kind}"
        if name is None:
            raise shape.refuse(f"{_SDXL_OPEN_CLIP}{key} is not part of an OpenCLIP text tower (unrecognised layout)")
        weights["text_model." + name] = value
    return fields, weights


def _sdxl_tokenizer(path: Path, known: str | None, text: dict, text_2: dict) -> tuple[str, dict, dict, str]:
    """Which tokenizer the encoders take ("clip": CLIP's BPE, tokenizer_2 padding with "!" as
    OpenCLIP does; "preset": the presets' own), the encoders' special token ids and the reason."""
    if text["vocab_size"] == text_2["vocab_size"] == _CLIP_VOCAB_SIZE:
        ids = {"bos_token_id": _CLIP_VOCAB_SIZE - 2, "eos_token_id": _CLIP_VOCAB_SIZE - 1}
        return "clip", {**ids, "pad_token_id": ids["eos_token_id"]}, {**ids, "pad_token_id": 0}, \
            f"tokenizers: CLIP's {_CLIP_VOCAB_SIZE} tokens (tokenizer_2 pads with '!')"
    if known:
        vocab, _ = tokenizer_vocab()
        ids = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS], "pad_token_id": vocab[EOS]}
        return "preset", ids, ids, f"tokenizers: the presets' ({len(vocab)} tokens), as preset:{known}"
    raise BadInput(f"{path}: the text encoders have {text['vocab_size']} and {text_2['vocab_size']} tokens, not "
                   f"CLIP's {_CLIP_VOCAB_SIZE}: no tokenizer for them")


def _sdxl_prediction(state: dict, meta: dict, requested: str | None) -> tuple[str, str]:
    if requested is not None:
        return requested, f"--prediction-type {requested}"
    if "v_pred" in state or "v_pred" in meta:
        return "v_prediction", "'v_pred' key in the checkpoint"
    return "epsilon", "SDXL base: epsilon"


def _prediction(path: Path, state: dict, meta: dict, family: str, requested: str | None,
                inpainting: bool = False) -> tuple[str, int, str]:
    """(prediction type, image size, reason). SD 2.x was released as a 768 v-prediction model and
    a 512 epsilon ("base") one with the same architecture: only evidence picks the latter. Its
    inpainting model is a 512 epsilon one (stable-diffusion-2-inpainting, as diffusers' converter
    takes it)."""
    big = 768 if family == "sd2" and not inpainting else 512
    if requested is not None:
        size = big if requested == "v_prediction" else 512
        return requested, size, f"--prediction-type {requested}"
    if "v_pred" in state or "v_pred" in meta:
        return "v_prediction", big, "'v_pred' key in the checkpoint"
    if family == "sd1":
        return "epsilon", 512, "SD 1.x: epsilon at 512"
    if inpainting:
        return "epsilon", 512, "SD 2.x inpainting: epsilon at 512 (as stable-diffusion-2-inpainting)"
    if meta.get("global_step") == _SD2_512_STEP:
        return "epsilon", 512, f"global_step {_SD2_512_STEP} (SD 2 512-base)"
    name = path.name.lower()
    if "512" in name or "base" in name:
        return "epsilon", 512, f"file name {path.name!r} says 512/base"
    return "v_prediction", 768, "SD 2.x without 512/base evidence: the 768 v-prediction model"


def dtype_reason(state: dict) -> str | None:
    kinds = sorted({str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()})
    if kinds == ["float32"]:
        return None
    return f"weights stored as {'/'.join(kinds)}, loaded as float32"


def _clip_symbols() -> list[str]:
    """CLIP's bytes_to_unicode order: the printable bytes as themselves, in byte order, then the
    other 68 bytes as chr(256), chr(257), ... (so token 0 is "!")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(256 - len(printable))]


def _open_clip_folders() -> list[str]:
    """Where the open_clip package is installed, found without importing it (that would import
    torchvision)."""
    spec = importlib.util.find_spec("open_clip")
    return list(spec.submodule_search_locations or []) if spec else []


def _bpe_path(path: Path) -> Path:
    for folder in _open_clip_folders():
        if (Path(folder) / _BPE_FILE).is_file():
            return Path(folder) / _BPE_FILE
    raise BadInput(f"{path}: a single file carries no tokenizer and the CLIP BPE merges ({_BPE_FILE}, shipped "
                   f"by open_clip_torch) are not installed: pip install --no-deps open_clip_torch, "
                   f"or pass --config FOLDER with a tokenizer")


def clip_vocab(bpe_file: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's vocab and merges from its BPE merges file (49408 tokens)."""
    lines = gzip.decompress(bpe_file.read_bytes()).decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1:1 + _CLIP_MERGES]]  # line 0 is a version header
    symbols = _clip_symbols()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + [BOS, EOS]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != _CLIP_VOCAB_SIZE or any(len(m) != 2 for m in merges):
        raise BadInput(f"{bpe_file}: not CLIP's BPE merges ({len(vocab)} tokens, expected {_CLIP_VOCAB_SIZE})")
    return vocab, merges


def clip_tokenizer(bpe_file: Path, pad_token: str, max_length: int = 77):
    """A transformers CLIPTokenizer with CLIP's vocabulary. SD 1.x pads with <|endoftext|>,
    SD 2.x with "!" (OpenCLIP pads with id 0)."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab(bpe_file)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length, pad_token=pad_token)


def _summary(family: str, text: dict, prediction_type: str, size: int, ema: bool, inpainting: bool = False) -> str:
    if family == "sd1":
        known = text["hidden_size"] == 768 and text["num_hidden_layers"] == 12
        encoder = "CLIP ViT-L text encoder" if known else "CLIP text encoder"
        name = "SD 1.x"
    else:
        known = text["hidden_size"] == 1024 and text["num_hidden_layers"] == 23
        encoder = "OpenCLIP ViT-H text encoder" if known else "OpenCLIP text encoder"
        name = "SD 2.x"
    if not known:
        encoder += f": {text['num_hidden_layers']} layers, width {text['hidden_size']}"
    if inpainting:
        name += " inpainting"
    return f"{name} ({encoder}), {prediction_type} at {size}x{size}" + (", EMA weights" if ema else "")


def infer_architecture(path: Path, state: dict, meta: dict | None = None,
                       prediction_type: str | None = None) -> tuple[dict, dict, dict]:
    """(configs, weights, architecture) of an original-layout SD 1.x / 2.x state dict: the
    component configs ("unet", "vae", "text_encoder", "scheduler"), each model's weights with
    diffusers keys, and what goes to details["architecture"]. Pure dict work (no model is built),
    so it also runs on meta tensors."""
    meta = meta or {}
    family, family_reason = _family(path, state)
    if family == "sdxl":
        return _infer_sdxl(path, state, meta, prediction_type, family_reason)
    unet_weights, ema, ema_reason = _unet_weights(state)
    vae_weights = strip(state, _VAE)
    unet_fields, unet_reasons = _infer_unet(path, unet_weights, family)
    vae_fields, vae_reason = _infer_vae(path, vae_weights)
    text_fields, text_weights, text_reason = _infer_text_encoder(path, state, family)
    if unet_fields["cross_attention_dim"] != text_fields["hidden_size"]:
        raise BadInput(f"{path}: the UNet's cross-attention width {unet_fields['cross_attention_dim']} is not "
                       f"the text encoder's width {text_fields['hidden_size']}")
    if text_fields["vocab_size"] != _CLIP_VOCAB_SIZE:
        raise BadInput(f"{path}: the text encoder has {text_fields['vocab_size']} tokens, not CLIP's "
                       f"{_CLIP_VOCAB_SIZE}: no tokenizer for it, pass --config FOLDER with a tokenizer")
    inpainting = unet_fields["in_channels"] != unet_fields["out_channels"]
    predicts, size, prediction_reason = _prediction(path, state, meta, family, prediction_type, inpainting)
    preset = preset_configs("sd15" if family == "sd1" else "sd21-768" if size == 768 else "sd21")
    scale = 2 ** (len(vae_fields["block_out_channels"]) - 1)
    # CLIP's special tokens; SD 2.x (OpenCLIP) pads with "!", id 0.
    ids = {"bos_token_id": _CLIP_VOCAB_SIZE - 2, "eos_token_id": _CLIP_VOCAB_SIZE - 1,
           "pad_token_id": _CLIP_VOCAB_SIZE - 1 if family == "sd1" else 0}
    configs = {
        "unet": {**preset["unet"], **unet_fields, "sample_size": size // scale},
        "vae": {**preset["vae"], **vae_fields, "sample_size": size},
        "text_encoder": {**preset["text_encoder"], **text_fields, **ids},
        "scheduler": {**preset_configs("sd15")["scheduler"], "prediction_type": predicts},
    }
    weights = {
        "unet": convert_with(path, "UNet", _convert_unet, unet_weights, configs["unet"]),
        "vae": convert_with(path, "VAE", _convert_vae, vae_weights, configs["vae"]),
        "text_encoder": {k: v for k, v in text_weights.items() if k != "embeddings.position_ids"},
    }
    for name, source in (("unet", unet_weights), ("vae", vae_weights)):
        if len(weights[name]) != len(source):  # the converters map one tensor to one tensor
            raise BadInput(f"{path}: {len(source) - len(weights[name])} of the {len(source)} {name} tensors fit "
                           f"no part of the inferred architecture (unrecognised layout)")
    reasons = [family_reason, *unet_reasons, vae_reason, text_reason, f"prediction: {prediction_reason}", ema_reason]
    stored = dtype_reason(state)
    if stored:
        reasons.append(stored)
    architecture = {
        "family": family, "prediction_type": predicts, "image_size": size, "ema": ema, "inpainting": inpainting,
        "summary": _summary(family, text_fields, predicts, size, ema, inpainting), "reasons": reasons,
    }
    return configs, weights, architecture


def _load_inferred(path: Path, state: dict, meta: dict, requested: str | None) -> Pipeline:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    configs, weights, architecture = infer_architecture(path, state, meta, requested)
    sdxl = architecture["family"] == "sdxl"
    length = configs["text_encoder"]["max_position_embeddings"]
    tokenizer_2 = None
    if architecture.get("tokenizer") == "preset":
        tokenizer = tokenizer_2 = preset_tokenizer()
        tokenizer_sha, pad = hashlib.sha256(json.dumps(tokenizer_vocab()).encode()).hexdigest(), EOS
    else:
        pad = EOS if architecture["family"] in ("sd1", "sdxl") else "!"
        bpe = _bpe_path(path)
        tokenizer = clip_tokenizer(bpe, pad, length)
        if sdxl:  # OpenCLIP pads with "!" (id 0), as SDXL's tokenizer_2
            tokenizer_2 = clip_tokenizer(bpe, "!", configs["text_encoder_2"]["max_position_embeddings"])
        tokenizer_sha = hashlib.sha256(bpe.read_bytes()).hexdigest()
    try:
        with quiet_loaders():
            unet = UNet2DConditionModel.from_config(configs["unet"])
            vae = AutoencoderKL.from_config(configs["vae"])
            text_encoder = CLIPTextModel(CLIPTextConfig(**configs["text_encoder"]))
            text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**configs["text_encoder_2"])) if sdxl else None
    except Exception as e:  # an inferred config diffusers rejects: a layout we misread
        raise BadInput(f"{path}: cannot build the inferred architecture: {one_line(e)}") from e
    models = {"unet": unet, "vae": vae, "text_encoder": text_encoder}
    for encoder in (text_encoder, text_encoder_2):
        if encoder is not None:
            encoder.set_attn_implementation("eager")
    if sdxl:
        models["text_encoder_2"] = text_encoder_2
    for name, model in models.items():
        load_state(path, name, model, weights[name], strict=True)
    # The hash covers the file, what was inferred from it and the tokenizer's source.
    digest = hashlib.sha256(hash_files([("checkpoint", path)]).encode())
    digest.update(json.dumps({"configs": configs, "ema": architecture["ema"], "tokenizer": tokenizer_sha, "pad": pad},
                             sort_keys=True).encode())
    extra = {"text_encoder_2": text_encoder_2.float().eval(), "tokenizer_2": tokenizer_2} if sdxl else {}
    return Pipeline(
        source=str(path), source_hash=digest.hexdigest(),
        text_encoder=text_encoder.float().eval(), unet=unet.float().eval(), vae=vae.float().eval(),
        tokenizer=tokenizer, scheduler_config=configs["scheduler"], details={"architecture": architecture}, **extra,
    )


# ---------------------------------------------------------------------------------------------
# --vae


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


_VAE_PARTS = ("encoder.", "decoder.", "quant_conv.", "post_quant_conv.")


def _vae_from_file(path: Path, state: dict, config: dict):
    from diffusers import AutoencoderKL

    weights = state
    for prefix in (_VAE, "vae."):
        if any(k.startswith(prefix) for k in state):
            weights = strip(state, prefix)
            break
    weights = {k: v for k, v in weights.items() if k.startswith(_VAE_PARTS)}
    if any(k.startswith("encoder.down.") for k in weights):  # original LDM keys
        converted = convert_with(path, "VAE", _convert_vae, weights, config)
        if len(converted) != len(weights):
            raise BadInput(f"{path}: {len(weights) - len(converted)} of its {len(weights)} VAE tensors do not fit "
                           f"the pipeline's VAE ({len(config['block_out_channels'])} levels)")
    elif any(k.startswith("encoder.down_blocks.") for k in weights):  # diffusers keys
        converted = weights
    else:
        raise BadInput(f"{path}: no VAE weights (expected original 'encoder.down.N' or diffusers "
                       f"'encoder.down_blocks.N' keys, optionally under '{_VAE}' or 'vae.')")
    with quiet_loaders():
        vae = AutoencoderKL.from_config(config)
    load_state(path, "vae", vae, converted, strict=True)
    return vae


def replace_vae(pipe: Pipeline, path: Path) -> None:
    """Use the VAE at `path` (a diffusers vae folder, or a .safetensors/.ckpt with original or
    diffusers keys) instead of the pipeline's; recorded in details["vae"] and the source hash."""
    from diffusers import AutoencoderKL

    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such VAE file or folder")
    config = dict(pipe.vae.config)
    if path.is_dir():
        vae = from_pretrained(AutoencoderKL, path)
        theirs = (vae.config.latent_channels, len(vae.config.block_out_channels))
        mine = (config["latent_channels"], len(config["block_out_channels"]))
        if theirs != mine:
            raise BadInput(f"{path}: a VAE with {theirs[0]} latent channels and {theirs[1]} levels does not fit "
                           f"the pipeline's ({mine[0]} latent channels, {mine[1]} levels)")
        files = [("config.json", path / "config.json")] + [(w.name, w) for w in weight_files(path)]
        sha = hash_files(files)
    elif path.suffix in (".safetensors", ".ckpt"):
        state, _ = read_checkpoint(path)
        vae = _vae_from_file(path, state, config)
        sha = _sha256_file(path)
    else:
        raise BadInput(f"{path}: --vae takes a diffusers vae folder or a .safetensors/.ckpt file")
    vae = vae.float().eval()
    for name, parameter in vae.named_parameters():  # as float32: a wider file's values may overflow
        check_finite(parameter.detach(), f"{path}: VAE parameter {name}")
    pipe.vae = vae
    pipe.details["vae"] = {"path": str(path), "sha256": sha}
    fold_into_hash(pipe, "vae=" + sha)
