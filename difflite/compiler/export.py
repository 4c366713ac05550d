"""Torch pipeline components -> ONNX (torch.onnx.export, dynamo, opset >= 18, static shapes)."""

from __future__ import annotations

import contextlib
import io
import logging
import numbers
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from difflite.core import control
from difflite.core.errors import BadInput

COMPONENTS = ("text_encoder", "unet", "vae_decoder", "vae_encoder")  # an SD 1.x / 2.x pipeline's
SDXL_ONLY = ("text_encoder_2",)  # SDXL's second text encoder
KNOWN = (*COMPONENTS[:1], *SDXL_ONLY, *COMPONENTS[1:])  # and controlnet_N (is_component)
# SDXL's text encoders give their penultimate layer's hidden states (diffusers' StableDiffusionXLPipeline:
# hidden_states[-2]); text_encoder_2 adds its pooled output projected (the UNet's text_embeds)
PENULTIMATE = "penultimate_hidden_state"
TEXT_EMBEDS = "text_embeds"
TIME_IDS = "time_ids"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MIN_OPSET = 18  # the dynamo exporter writes invalid Split nodes at opset 17 (FACTS)
MAX_TENSOR_ELEMENTS = 2**31 - 1  # TFLite's kernels and the op library's (kMaxIndex) index with int32


class ExportError(BadInput):
    """torch.onnx.export (or the ONNX check after it) failed for one component: the model cannot
    be converted as it is (exit 2, one line: the root cause and the exporter's last word;
    DIFFLITE_DEBUG=1 shows all of its output)."""


@dataclass
class ComponentSpec:
    name: str
    module: torch.nn.Module
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    example_inputs: tuple[torch.Tensor, ...]


class TextEncoderModule(torch.nn.Module):
    def __init__(self, text_encoder):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids):
        # Only last_hidden_state: the pooled output would add ArgMax/GatherND to the graph.
        return self.text_encoder(input_ids, return_dict=True).last_hidden_state


class PenultimateTextEncoderModule(torch.nn.Module):
    """SDXL's text_encoder: the hidden states before the last layer (hidden_states[-2], no final
    layer norm), as diffusers' StableDiffusionXLPipeline.encode_prompt takes them."""

    def __init__(self, text_encoder):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids):
        return self.text_encoder(input_ids, output_hidden_states=True, return_dict=True).hidden_states[-2]


class PooledTextEncoderModule(torch.nn.Module):
    """SDXL's text_encoder_2 (CLIPTextModelWithProjection): the penultimate hidden states, and
    text_embeds: the final-layer-normed hidden state at the first end-of-text token, projected.
    transformers finds that token with an ArgMax and gathers its row (ArgMax / GatherND, which the
    writer does not lower); here the row is picked by a one-hot product, the same values (position
    0 where no end-of-text token is found, as ArgMax gives): tests/test_sdxl.py compares the two."""

    def __init__(self, text_encoder):
        super().__init__()
        self.text_encoder = text_encoder
        self.eos_token_id = int(text_encoder.config.eos_token_id)
        length = int(text_encoder.config.max_position_embeddings)
        # before[i, j] = 1 where i < j: (is_eos @ before)[j] counts end-of-text tokens before j
        self.register_buffer("before", torch.triu(torch.ones(length, length), diagonal=1), persistent=False)
        first = torch.zeros(length)
        first[0] = 1.0
        self.register_buffer("first", first, persistent=False)

    def forward(self, input_ids):
        out = self.text_encoder.text_model(input_ids, output_hidden_states=True, return_dict=True)
        if self.eos_token_id == 2:  # transformers' legacy configs: the largest id marks the end
            is_eos = (input_ids == input_ids.max(dim=-1, keepdim=True).values).to(torch.float32)
        else:
            is_eos = (input_ids == self.eos_token_id).to(torch.float32)
        pick = is_eos * (torch.matmul(is_eos, self.before) == 0).to(torch.float32)  # the first one only
        found = pick.sum(dim=-1, keepdim=True)
        pick = pick + (1.0 - found) * self.first  # none: position 0
        pooled = torch.matmul(pick.unsqueeze(1), out.last_hidden_state).squeeze(1)
        return out.hidden_states[-2], self.text_encoder.text_projection(pooled)


class UNetModule(torch.nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


class SDXLUNetModule(torch.nn.Module):
    """An SDXL UNet (addition_embed_type "text_time"): after sample, timestep and
    encoder_hidden_states (both text encoders' penultimate hidden states concatenated), diffusers'
    added_cond_kwargs: text_embeds (text_encoder_2's projected pooled output) and time_ids (the
    original size, crop top-left and target size: 6 numbers per sample)."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds, time_ids):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states,
                         added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids}, return_dict=False)[0]


class ConditionedUNetModule(UNetModule):
    """A UNet with timestep conditioning (config time_cond_proj_dim: LCM-distilled models), whose
    fourth input is the guidance-scale embedding (difflite.core.conditioning.guidance_embedding)."""

    def forward(self, sample, timestep, encoder_hidden_states, timestep_cond):
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, timestep_cond=timestep_cond,
                         return_dict=False)[0]


class ControlledUNetModule(torch.nn.Module):
    """A UNet converted with ControlNets: after sample, timestep, encoder_hidden_states (and an
    LCM-distilled UNet's timestep_cond) it takes the ControlNets' residuals, summed and scaled by
    the runtime (down_residual_0 .., mid_residual: diffusers' down_block_additional_residuals and
    mid_block_additional_residual). Zero residuals give the UNet without ControlNet."""

    def __init__(self, unet, conditioned: bool = False):
        super().__init__()
        self.unet = unet
        self.conditioned = conditioned

    def forward(self, sample, timestep, encoder_hidden_states, *rest):
        timestep_cond, residuals = (rest[0], rest[1:]) if self.conditioned else (None, rest)
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, timestep_cond=timestep_cond,
                         down_block_additional_residuals=tuple(residuals[:-1]),
                         mid_block_additional_residual=residuals[-1], return_dict=False)[0]


class ControlNetModule(torch.nn.Module):
    """A ControlNet at conditioning scale 1 (the runtime multiplies by its --control-scale): its
    down-block residuals, then the mid-block residual."""

    def __init__(self, controlnet):
        super().__init__()
        self.controlnet = controlnet

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond):
        down, mid = self.controlnet(sample, timestep, encoder_hidden_states=encoder_hidden_states,
                                    controlnet_cond=controlnet_cond, conditioning_scale=1.0, return_dict=False)
        return (*down, mid)


class VaeDecoderModule(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae
        self.scaling_factor = float(vae.config.scaling_factor)

    def forward(self, latent):
        return self.vae.decode(latent / self.scaling_factor, return_dict=False)[0]


class VaeEncoderModule(torch.nn.Module):
    """Returns the latent distribution already scaled, so latent = mean + std * eps."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae
        self.scaling_factor = float(vae.config.scaling_factor)

    def forward(self, image):
        dist = self.vae.encode(image, return_dict=False)[0]
        return dist.mean * self.scaling_factor, dist.std * self.scaling_factor


def is_component(name: str) -> bool:
    """A component convert can write: one of KNOWN, or a ControlNet's (controlnet_N)."""
    return name in KNOWN or control.controlnet_index(name) is not None


def takes_batch(name: str) -> bool:
    """Whether the component runs at the conversion's --batch (the UNet and the ControlNets that
    feed it); the others are batch 1."""
    return name == "unet" or control.controlnet_index(name) is not None


def residual_shapes(unet: dict, batch: int, h: int, w: int) -> list[tuple[int, ...]]:
    """[N, C, H, W] of each ControlNet residual a UNet of config `unet` adds at an h x w latent:
    conv_in's output, each down-block layer's and downsampler's, then the mid block's."""
    channels = list(unet["block_out_channels"])
    layers = unet["layers_per_block"]
    layers = list(layers) if isinstance(layers, (list, tuple)) else [layers] * len(channels)
    shapes = [(batch, channels[0], h, w)]
    for level, width in enumerate(channels):
        shapes += [(batch, width, h, w)] * layers[level]
        if level < len(channels) - 1:
            h, w = -(-h // 2), -(-w // 2)  # a 3x3 stride-2 convolution, padding 1
            shapes.append((batch, width, h, w))
    return [*shapes, (batch, channels[-1], h, w)]


def size_multiple(pipe) -> int:
    """Pixel sizes must be multiples of this: the VAE and every UNet downsampling halve them."""
    return _size_multiple(dict(pipe.unet.config), dict(pipe.vae.config))


def _size_multiple(unet: dict, vae: dict) -> int:
    return 2 ** (len(vae["block_out_channels"]) - 1) * 2 ** (len(unet["down_block_types"]) - 1)


def check_size(pipe, height, width, batch=1) -> None:
    check_size_of(pipe.source, dict(pipe.unet.config), dict(pipe.vae.config), height, width, batch)


def check_size_of(source: str, unet: dict, vae: dict, height, width, batch=1) -> None:
    """The size checks from the UNet's and the VAE's configs alone (models.peek_configs gives them
    before anything is built): multiples the models can take, and tensors that can be held."""
    multiple = _size_multiple(unet, vae)
    for label, value in (("height", height), ("width", width)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0 or value % multiple:
            raise BadInput(f"{source}: {label} {value!r} must be a positive multiple of {multiple}")
    what, elements = largest_feature_map(unet, vae, height, width, batch)
    if elements > MAX_TENSOR_ELEMENTS:
        raise BadInput(f"{source}: --height {height} --width {width} needs {what} of {elements:,} values, more "
                       f"than a tensor may hold ({MAX_TENSOR_ELEMENTS:,}: kernels index with int32)")


def largest_feature_map(unet: dict, vae: dict, height, width, batch=1) -> tuple[str, int]:
    """(what, values) of the largest activation at this size, from the configs alone, so that a
    size no tensor can hold is refused before anything is allocated."""
    vae_channels = list(vae["block_out_channels"])
    unet_channels = list(unet["block_out_channels"])
    h, w = height >> (len(vae_channels) - 1), width >> (len(vae_channels) - 1)
    maps = []
    for level in range(len(vae_channels)):
        # the decoder upsamples a deeper level's output to this level's size before narrowing it
        channels = max(vae_channels[level:level + 2])
        maps.append((f"the VAE's {channels}x{height >> level}x{width >> level} feature map",
                     channels * (height >> level) * (width >> level)))
    for level in range(len(unet_channels)):
        # an up block concatenates a skip connection: up to twice the widest channels
        channels = 2 * max(unet_channels[level:level + 2])
        maps.append((f"the UNet's {batch}x{channels}x{h >> level}x{w >> level} feature map",
                     batch * channels * (h >> level) * (w >> level)))
    return max(maps, key=lambda m: m[1])


def latent_size(pipe, height, width) -> tuple[int, int]:
    return height // pipe.vae_scale_factor, width // pipe.vae_scale_factor


def component_spec(pipe, name, height=512, width=512, batch=1, seed=0) -> ComponentSpec:
    """The wrapper module and seeded example inputs of one component at a static size."""
    if not is_component(name):
        raise BadInput(f"{pipe.source}: unknown component {name!r} (known: {', '.join(KNOWN)}, controlnet_N)")
    if batch not in (1, 2):
        raise BadInput(f"{pipe.source}: batch {batch!r} must be 1 or 2")
    check_size(pipe, height, width)
    gen = torch.Generator().manual_seed(seed)
    h, w = latent_size(pipe, height, width)
    latent_channels = pipe.vae.config.latent_channels
    if name in ("text_encoder", "text_encoder_2"):
        return _text_encoder_spec(pipe, name, gen)
    if name == "unet":
        return _unet_spec(pipe, gen, batch, h, w)
    if control.controlnet_index(name) is not None:
        return _controlnet_spec(pipe, name, gen, batch, h, w, (height, width))
    if name == "vae_decoder":
        latent = torch.randn((1, latent_channels, h, w), generator=gen)
        return ComponentSpec(name, VaeDecoderModule(pipe.vae).eval(), ("latent",), ("image",), (latent,))
    image = torch.rand((1, pipe.vae.config.in_channels, height, width), generator=gen) * 2 - 1
    return ComponentSpec(name, VaeEncoderModule(pipe.vae).eval(), ("image",), ("latent_mean", "latent_std"), (image,))


def _text_encoder_spec(pipe, name, gen) -> ComponentSpec:
    sdxl = pipe.family == "sdxl"
    if name == "text_encoder_2" and not sdxl:
        raise BadInput(f"{pipe.source}: no text_encoder_2 (an SDXL component; this is an SD 1.x / 2.x pipeline)")
    encoder, tokenizer = (pipe.text_encoder_2, pipe.tokenizer_2) if name == "text_encoder_2" else \
        (pipe.text_encoder, pipe.tokenizer)
    config = encoder.config
    length = config.max_position_embeddings
    high = min(config.vocab_size, len(tokenizer))
    input_ids = torch.randint(0, high, (1, length), generator=gen, dtype=torch.int64)
    input_ids[0, 0] = tokenizer.bos_token_id
    if not sdxl:
        module = TextEncoderModule(encoder).eval()
        return ComponentSpec(name, module, ("input_ids",), ("last_hidden_state",), (input_ids,))
    # A tokenized prompt's shape: the end-of-text token after a random number of words, then
    # padding, so that text_encoder_2's pooled row is not always the same
    end = int(torch.randint(1, length, (1,), generator=gen))
    input_ids[0, 1:] = torch.where(input_ids[0, 1:] == tokenizer.eos_token_id, tokenizer.bos_token_id,
                                   input_ids[0, 1:])
    input_ids[0, end:] = tokenizer.pad_token_id
    input_ids[0, end] = tokenizer.eos_token_id
    if name == "text_encoder":
        return ComponentSpec(name, PenultimateTextEncoderModule(encoder).eval(), ("input_ids",), (PENULTIMATE,),
                             (input_ids,))
    return ComponentSpec(name, PooledTextEncoderModule(encoder).eval(), ("input_ids",), (PENULTIMATE, TEXT_EMBEDS),
                         (input_ids,))


def _unet_spec(pipe, gen, batch, h, w) -> ComponentSpec:
    config = pipe.unet.config
    sample, timestep, context = _denoiser_inputs(pipe, gen, batch, h, w)
    names, inputs = ["sample", "timestep", "encoder_hidden_states"], [sample, timestep, context]
    if pipe.family == "sdxl":
        if pipe.controlnets or config.get("time_cond_proj_dim"):
            raise BadInput(f"{pipe.source}: an SDXL UNet with ControlNets or timestep_cond is not supported yet")
        text_embeds = torch.randn((batch, pipe.text_encoder_2.config.projection_dim), generator=gen)
        # sizes as SDXL is called: original and target size in pixels, a crop offset
        size = torch.tensor([h * pipe.vae_scale_factor, w * pipe.vae_scale_factor], dtype=torch.float32)
        crop = torch.randint(0, 64, (batch, 2), generator=gen).to(torch.float32)
        time_ids = torch.cat([size.expand(batch, 2), crop, size.expand(batch, 2)], dim=1)
        return ComponentSpec("unet", SDXLUNetModule(pipe.unet).eval(), (*names, TEXT_EMBEDS, TIME_IDS), ("noise_pred",),
                             (*inputs, text_embeds, time_ids))
    cond_dim = config.get("time_cond_proj_dim")
    if cond_dim:
        from difflite.core.conditioning import TIMESTEP_COND, guidance_embedding

        scales = torch.rand((batch,), generator=gen) * 10 + 1
        names.append(TIMESTEP_COND)
        inputs.append(torch.from_numpy(guidance_embedding(scales.numpy(), cond_dim)))
    if pipe.controlnets:
        shapes = residual_shapes(dict(config), batch, h, w)
        names += control.residual_names(len(shapes) - 1)
        inputs += [torch.randn(shape, generator=gen) for shape in shapes]
        module = ControlledUNetModule(pipe.unet, conditioned=bool(cond_dim))
    elif cond_dim:
        module = ConditionedUNetModule(pipe.unet)
    else:
        module = UNetModule(pipe.unet)
    return ComponentSpec("unet", module.eval(), tuple(names), ("noise_pred",), tuple(inputs))


def _denoiser_inputs(pipe, gen, batch, h, w) -> tuple[torch.Tensor, ...]:
    """The sample, timestep and text embedding the UNet and the ControlNets take."""
    sample = torch.randn((batch, pipe.unet.config.in_channels, h, w), generator=gen)
    timestep = torch.randint(1, 1000, (batch,), generator=gen).to(torch.float32)
    length = pipe.text_encoder.config.max_position_embeddings
    context = torch.randn((batch, length, pipe.unet.config.cross_attention_dim), generator=gen)
    return sample, timestep, context


def _controlnet_spec(pipe, name, gen, batch, h, w, image_size) -> ComponentSpec:
    index = control.controlnet_index(name)
    if index >= len(pipe.controlnets):
        raise BadInput(f"{pipe.source}: no {name} (the pipeline has {len(pipe.controlnets)} ControlNet(s))")
    controlnet = pipe.controlnets[index]
    sample, timestep, context = _denoiser_inputs(pipe, gen, batch, h, w)
    image = torch.rand((batch, controlnet.config.conditioning_channels, *image_size), generator=gen)
    outputs = control.residual_names(len(controlnet.controlnet_down_blocks))
    return ComponentSpec(name, ControlNetModule(controlnet).eval(),
                         ("sample", "timestep", "encoder_hidden_states", control.CONTROL_IMAGE), outputs,
                         (sample, timestep, context, image))


def export_onnx(spec: ComponentSpec, path: Path, opset: int = 18) -> Path:
    """Export to `path` with all weights in `path.name + ".data"` beside it. Both are written in a
    staging folder next to `path` and moved into place only after onnx.checker passed."""
    import onnx

    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} is not supported; use >= {MIN_OPSET}")
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = staging / path.name
        staged_data = staging / (path.name + ".data")
        with _quiet() as log:
            try:
                program = _export(spec, opset)
                program.save(staged, external_data=True)
                del program
                staged_data.touch()  # always present, even if no tensor went external
                onnx.checker.check_model(str(staged))  # path-based: works past 2 GB
            except Exception as e:  # the exporter raises many types
                raise ExportError(f"exporting {spec.name} to ONNX failed: {_root_cause(e)}{_tail(log)}") from e
        os.replace(staged_data, path.parent / staged_data.name)
        os.replace(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _export(spec: ComponentSpec, opset: int):
    with torch.no_grad():
        return torch.onnx.export(
            spec.module.eval(),
            spec.example_inputs,
            input_names=list(spec.input_names),
            output_names=list(spec.output_names),
            opset_version=opset,
            dynamo=True,
            external_data=True,
            optimize=True,
        )


@contextlib.contextmanager
def _quiet():
    """Swallow the exporter's progress prints and warnings unless DIFFLITE_DEBUG is set; yields
    the captured text so failures can show its end."""
    if os.environ.get("DIFFLITE_DEBUG"):
        yield None
        return
    buffer = io.StringIO()
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)  # e.g. "torchvision is not installed" from its registry
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield buffer
    finally:
        onnx_logger.setLevel(level)


def _root_cause(error: BaseException) -> str:
    """The innermost exception, since torch.onnx wraps the real reason in a generic step error."""
    seen = {id(error)}
    while (inner := error.__cause__ or error.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        error = inner
    lines = _ANSI.sub("", str(error)).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def _tail(log: io.StringIO | None) -> str:
    if log is None:
        return ""
    lines = [line for line in _ANSI.sub("", log.getvalue()).splitlines() if line.strip()]
    return f" (last exporter output: {lines[-1][:200]})" if lines else ""
