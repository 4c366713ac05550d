"""fp16 without overflow (issue 32 item 3): the VAE's activations brought under half's range by
exact powers of two, chosen by measurement on the torch model before export.

SDXL's VAE overflows in float16: some of its activations pass 65504, so a file whose activations
are stored in half gives inf / NaN pictures. Two facts let the VAE's weights be rescaled without
changing its function:

* GroupNorm is scale invariant: GN(x / s) with eps / s^2 is GN(x) with eps, exactly (the eps is
  rescaled too, so not even eps changes the result).
* Convolutions and linear layers are linear.

So, in diffusers' AutoencoderKL encoder and decoder:

* "conv1": a ResnetBlock2D's conv1 output feeds only its norm2; dividing conv1's weight and bias
  by 2^k (norm2's eps by 4^k) divides that activation by 2^k and nothing else.
* "stream": the residual stream, from conv_in's output through every block to conv_norm_out's
  input (each resnet's shortcut(x) + conv2(...), the attention's to_out(...) + residual, the up /
  down samplers), is divided by 2^k when conv_in's weight and bias, every conv2's and attention
  output projection's weight and bias, and every conv_shortcut's and sampler convolution's bias
  alone (their weights act on the divided input already) are divided by 2^k; every GroupNorm
  reading the stream (resnets' norm1, the attention's group_norm, conv_norm_out) gets eps / 4^k
  and absorbs the rest. output_scale_factor and rescale_output_factor are divisions: linear.

Measurement: forward hooks record max |value| of every module's output and of every GroupNorm's
input, and each attention's largest score (softmax input: the op library's GEMM form stores the
scores in half), over a few seeded probes at a reduced size (weight_recipe.probe_size). The
threshold is 65504 / HEADROOM: the probes are not the pictures a user decodes, and half-arithmetic
kernels round and carry partial sums in half (a 16-deep slice) that may pass the final value, so
an activation must stay HEADROOM times below the range. k is the smallest power of two that brings
every activation of its part under the threshold; an activation over it that no rescale here
reaches (another module, or a structure this module does not know) fails the conversion with one
line naming the module and the value, rather than a file that gives inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from difflite.compiler import export, weight_recipe
from difflite.core.errors import BadInput

HALF_MAX = 65504.0
HEADROOM = 16  # a power of two: the rescales are powers of two, and so is the margin they keep
THRESHOLD = HALF_MAX / HEADROOM
# Where GroupNorm is not fused (--no-fuse: stock LiteRT's files), the writer decomposes it into
# builtins that hold (x - mean)^2 in the storage type: |x - mean| <= 2 max|x|, so a GroupNorm's
# input must stay under sqrt(THRESHOLD) / 2 (~32) for its squares to keep the same headroom.
DECOMPOSED_NORM_THRESHOLD = math.sqrt(THRESHOLD) / 2
PROBE_SEED = 3000  # probe seeds: neither verify's (0, 1) nor the weights recipe's (1000 + i)
PROBES = 2
DECODER_LATENT_GAINS = (1.0, 2.0)  # decoder probes: randn latents (scaled ones, as generate's) and twice them
ENCODER_COARSE = 4  # encoder probes: uniform noise pictures, and smooth ones from a 4x4 grid of noise
CODERS = {"vae_decoder": "decoder", "vae_encoder": "encoder"}
SCORES = ":scores"  # the key suffix of an attention's largest softmax input
INPUT = ":input"  # the key suffix of a GroupNorm's input


class HalfRangeError(BadInput):
    """An activation passes half's range where no exact rescale reaches it."""


class NotRescalable(Exception):
    """The coder's structure is not the one the exact rescale knows (the reason names the module)."""


# -- the structure -----------------------------------------------------------------------------
@dataclass
class Resnet:
    name: str
    module: torch.nn.Module


@dataclass
class Parts:
    """What a rescale of one coder touches, and which measured values each rescale divides."""
    coder: str  # "decoder" / "encoder": the prefix of every name below in the VAE
    scale_all: list[torch.nn.Module] = field(default_factory=list)  # weight and bias / 2^k
    scale_bias: list[torch.nn.Module] = field(default_factory=list)  # bias alone / 2^k
    stream_norms: list[torch.nn.GroupNorm] = field(default_factory=list)  # eps / 4^k
    stream_keys: set[str] = field(default_factory=set)  # measured values the stream scale divides
    resnets: list[Resnet] = field(default_factory=list)

    def conv1_keys(self, resnet: Resnet) -> set[str]:
        return {f"{resnet.name}.conv1", f"{resnet.name}.norm2{INPUT}"}


def structure(vae, coder_name: str) -> Parts:
    """The rescalable parts of vae.<coder_name>; NotRescalable where it is not diffusers'
    Encoder / Decoder made of ResnetBlock2D, Attention and Up/Downsample2D as AutoencoderKL's."""
    coder = getattr(vae, coder_name, None)
    parts = Parts(coder_name)
    if coder is None:
        raise NotRescalable(f"the VAE has no {coder_name}")
    blocks_name = "up_blocks" if coder_name == "decoder" else "down_blocks"
    _require(coder, coder_name, conv_in=torch.nn.Conv2d, conv_norm_out=torch.nn.GroupNorm)
    parts.scale_all.append(coder.conv_in)
    parts.stream_norms.append(coder.conv_norm_out)
    parts.stream_keys |= {f"{coder_name}.conv_in", f"{coder_name}.conv_norm_out{INPUT}"}
    mid = f"{coder_name}.mid_block"
    _stream_block(coder.mid_block, mid, parts, samplers=())
    parts.stream_keys.add(mid)
    for i, block in enumerate(getattr(coder, blocks_name)):
        name = f"{coder_name}.{blocks_name}.{i}"
        _stream_block(block, name, parts, samplers=("upsamplers", "downsamplers"))
        parts.stream_keys.add(name)
    return parts


def _require(module, name: str, **types) -> None:
    for attr, kind in types.items():
        if not isinstance(getattr(module, attr, None), kind):
            raise NotRescalable(f"{name}.{attr} is not a {kind.__name__}")


def _stream_block(block, name: str, parts: Parts, samplers: tuple[str, ...]) -> None:
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import Downsample2D, ResnetBlock2D, Upsample2D

    known = {"resnets", "attentions", *samplers}
    for child_name, _ in block.named_children():
        if child_name not in known:
            raise NotRescalable(f"{name}.{child_name}: a part the rescale does not know")
    for i, resnet in enumerate(block.resnets):
        if not isinstance(resnet, ResnetBlock2D):
            raise NotRescalable(f"{name}.resnets.{i} is a {type(resnet).__name__}, not a ResnetBlock2D")
        _stream_resnet(resnet, f"{name}.resnets.{i}", parts)
    for i, attention in enumerate(getattr(block, "attentions", None) or ()):
        if attention is None:
            continue
        if not isinstance(attention, Attention):
            raise NotRescalable(f"{name}.attentions.{i} is a {type(attention).__name__}, not an Attention")
        _stream_attention(attention, f"{name}.attentions.{i}", parts)
    for kind in samplers:
        for i, sampler in enumerate(getattr(block, kind, None) or ()):
            if not isinstance(sampler, (Upsample2D, Downsample2D)):
                raise NotRescalable(f"{name}.{kind}.{i} is a {type(sampler).__name__}")
            _stream_sampler(sampler, f"{name}.{kind}.{i}", parts)


def _stream_resnet(resnet, name: str, parts: Parts) -> None:
    _require(resnet, name, norm1=torch.nn.GroupNorm, norm2=torch.nn.GroupNorm, conv1=torch.nn.Conv2d,
             conv2=torch.nn.Conv2d)
    if resnet.upsample is not None or resnet.downsample is not None or resnet.time_emb_proj is not None:
        raise NotRescalable(f"{name}: a resnet with up/downsampling or a time embedding")
    if resnet.conv_shortcut is not None and not isinstance(resnet.conv_shortcut, torch.nn.Conv2d):
        raise NotRescalable(f"{name}.conv_shortcut is not a Conv2d")
    parts.scale_all.append(resnet.conv2)
    parts.stream_norms.append(resnet.norm1)
    parts.stream_keys |= {name, f"{name}.conv2", f"{name}.norm1{INPUT}"}
    if resnet.conv_shortcut is not None:
        parts.scale_bias.append(resnet.conv_shortcut)
        parts.stream_keys.add(f"{name}.conv_shortcut")
    parts.resnets.append(Resnet(name, resnet))


def _stream_attention(attention, name: str, parts: Parts) -> None:
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    if not isinstance(attention.processor, (AttnProcessor, AttnProcessor2_0)):
        raise NotRescalable(f"{name}: attention processor {type(attention.processor).__name__}")
    plain = (attention.residual_connection and not attention.is_cross_attention
             and attention.spatial_norm is None and attention.norm_q is None and attention.norm_k is None
             and isinstance(attention.group_norm, torch.nn.GroupNorm)
             and isinstance(attention.to_out[0], torch.nn.Linear))
    if not plain:
        raise NotRescalable(f"{name}: not a self-attention with group_norm, a residual and a linear output")
    parts.scale_all.append(attention.to_out[0])
    parts.stream_norms.append(attention.group_norm)
    parts.stream_keys |= {name, f"{name}.to_out.0", f"{name}.to_out.1", f"{name}.group_norm{INPUT}"}


def _stream_sampler(sampler, name: str, parts: Parts) -> None:
    conv = sampler.conv
    if getattr(sampler, "norm", None) is not None or not isinstance(conv, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
        raise NotRescalable(f"{name}: a sampler with a norm or without a convolution")
    parts.scale_bias.append(conv)
    parts.stream_keys |= {name, f"{name}.conv"}


# -- measuring ---------------------------------------------------------------------------------
def probe_inputs(pipe, component: str, height: int, width: int, count: int = PROBES) -> tuple[torch.Tensor, ...]:
    """The probes, one batch: export.component_spec's seeded inputs at weight_recipe.probe_size,
    and for the decoder the same latents at each DECODER_LATENT_GAINS, for the encoder smooth
    pictures beside the noise ones (photos are mostly smooth: large flat areas, whose activations
    the biases set)."""
    height, width = weight_recipe.probe_size(pipe, height, width)
    specs = [export.component_spec(pipe, component, height, width, 1, seed=PROBE_SEED + i) for i in range(count)]
    first = torch.cat([spec.example_inputs[0] for spec in specs])
    if component == "vae_decoder":
        return (torch.cat([first * gain for gain in DECODER_LATENT_GAINS]),)
    gen = torch.Generator().manual_seed(PROBE_SEED)
    coarse = torch.rand((count, first.shape[1], ENCODER_COARSE, ENCODER_COARSE), generator=gen) * 2 - 1
    smooth = torch.nn.functional.interpolate(coarse, size=first.shape[2:], mode="bilinear", align_corners=True)
    return (torch.cat([first, smooth]),)


def measure(module: torch.nn.Module, vae, inputs: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """max |value| per measured activation of `vae` while `module` runs on `inputs` (float32):
    each submodule's output (its name in the VAE), each GroupNorm's input (NAME:input) and each
    attention's largest softmax input (NAME:scores)."""
    peaks: dict[str, float] = {}
    with torch.no_grad(), _hooks(vae, peaks):
        module.eval()(*inputs)
    return peaks


@contextmanager
def _hooks(vae, peaks: dict[str, float]) -> Iterator[None]:
    from diffusers.models.attention_processor import Attention

    def record(key: str, value) -> None:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            peak = float(value.detach().abs().max()) if value.numel() else 0.0
            peaks[key] = max(peaks.get(key, 0.0), peak if math.isfinite(peak) else math.inf)

    def on_output(name):
        def hook(module, args, output):
            record(name, output if isinstance(output, torch.Tensor) else next(iter(output), None))
            if isinstance(module, torch.nn.GroupNorm) and args:
                record(f"{name}{INPUT}", args[0])
            if isinstance(module, Attention) and args:
                record(f"{name}{SCORES}", _largest_score(module, args[0]))
        return hook

    handles = [m.register_forward_hook(on_output(name)) for name, m in vae.named_modules() if name]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _largest_score(attention, hidden: torch.Tensor) -> torch.Tensor:
    """scale * q k^T of a self-attention on `hidden` ([N, C, H, W] or [N, L, C]), per head."""
    if hidden.dim() == 4:
        hidden = hidden.flatten(2).transpose(1, 2)
    if attention.group_norm is not None:
        hidden = attention.group_norm(hidden.transpose(1, 2)).transpose(1, 2)
    q, k = attention.to_q(hidden), attention.to_k(hidden)
    n, length, inner = q.shape
    heads = attention.heads
    q = q.view(n, length, heads, inner // heads).transpose(1, 2)
    k = k.view(n, -1, heads, inner // heads).transpose(1, 2)
    return attention.scale * (q @ k.transpose(-1, -2))


# -- choosing and applying -----------------------------------------------------------------------
@dataclass
class Plan:
    stream: int = 0  # the residual stream divided by 2^stream
    conv1: dict[str, int] = field(default_factory=dict)  # resnet name -> its conv1 divided by 2^k

    def empty(self) -> bool:
        return self.stream == 0 and not any(self.conv1.values())

    def divisor_log2(self, key: str, parts: Parts) -> int:
        """How many halvings a plan gives the measured value `key`."""
        if key in parts.stream_keys:
            return self.stream
        for resnet in parts.resnets:
            if key in parts.conv1_keys(resnet):
                return self.conv1.get(resnet.name, 0)
        return 0


def halvings(peak: float, threshold: float = THRESHOLD) -> int:
    """The smallest k >= 0 with peak / 2^k under `threshold`."""
    if not math.isfinite(peak):
        raise ValueError(f"not a finite peak: {peak}")
    k = 0
    while peak / 2.0**k >= threshold:
        k += 1
    return k


@dataclass(frozen=True)
class Limits:
    """The bound each measured value must stay under: `threshold`, and `norm_input` for
    GroupNorms' inputs where the file holds GroupNorm decomposed (None: fused, `threshold`)."""
    threshold: float = THRESHOLD
    norm_input: float | None = None

    def of(self, key: str) -> float:
        return self.norm_input if self.norm_input is not None and key.endswith(INPUT) else self.threshold

    def over(self, peaks: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in peaks.items() if v >= self.of(k)}


def choose(peaks: dict[str, float], parts: Parts, limits: Limits = Limits()) -> Plan:
    """The smallest halvings that bring each part's measured values under their limits."""
    def needed(keys) -> int:
        return max((halvings(peaks.get(key, 0.0), limits.of(key)) for key in keys), default=0)

    plan = Plan(stream=needed(parts.stream_keys))
    for resnet in parts.resnets:
        k = needed(parts.conv1_keys(resnet))
        if k:
            plan.conv1[resnet.name] = k
    return plan


def apply(plan: Plan, parts: Parts) -> None:
    """Rescale the VAE's weights in place by `plan` (see the module's docstring)."""
    with torch.no_grad():
        stream = 2.0 ** -plan.stream
        if plan.stream:
            for module in parts.scale_all:
                _scale(module, stream, bias_only=False)
            for module in parts.scale_bias:
                _scale(module, stream, bias_only=True)
            for norm in parts.stream_norms:
                norm.eps = norm.eps * stream * stream
        for resnet in parts.resnets:
            k = plan.conv1.get(resnet.name, 0)
            if k:
                _scale(resnet.module.conv1, 2.0 ** -k, bias_only=False)
                resnet.module.norm2.eps = resnet.module.norm2.eps * 4.0 ** -k


def _scale(module, factor: float, bias_only: bool) -> None:
    if not bias_only:
        module.weight.mul_(factor)
    if module.bias is not None:
        module.bias.mul_(factor)


# -- one component -------------------------------------------------------------------------------
def applies(component: str) -> bool:
    return component in CODERS


def fit(pipe, component: str, height: int, width: int, log: Callable[[str], None] = lambda m: None,
        threshold: float = THRESHOLD, decomposed_norms: bool = False) -> dict:
    """Measure `component`'s activations (a VAE coder) on probes, rescale pipe.vae in place where
    they pass `threshold` (GroupNorms' inputs DECOMPOSED_NORM_THRESHOLD where `decomposed_norms`:
    the file holds GroupNorm as builtins), measure again; the report's record. HalfRangeError where
    an activation over its limit is one no exact rescale reaches."""
    coder = CODERS[component]
    limits = Limits(threshold, DECOMPOSED_NORM_THRESHOLD if decomposed_norms else None)
    inputs = probe_inputs(pipe, component, height, width)
    module = export.component_spec(pipe, component, *weight_recipe.probe_size(pipe, height, width)).module
    before = measure(module, pipe.vae, inputs)
    over = limits.over(before)
    record = {"threshold": threshold, "headroom": HEADROOM, "probes": describe_probes(component, inputs),
              "max_before": _largest(before), "exceeded": {k: _round(v) for k, v in sorted(over.items())}}
    if decomposed_norms:
        record["norm_input_threshold"] = _round(limits.norm_input)
    if not over:
        return {**record, "scales": "none needed", "max_after": record["max_before"]}
    _refuse_not_finite(component, over)
    try:
        parts = structure(pipe.vae, coder)
    except NotRescalable as exc:
        key, value = max(over.items(), key=lambda kv: kv[1])
        raise HalfRangeError(f"{component}: activation {key} reaches {value:.4g}, over half's range / {HEADROOM} "
                             f"({threshold:g}), and {exc}: no exact rescale keeps it in float16") from None
    _refuse_unreachable(component, over, parts, limits)
    plan = choose(before, parts, limits)
    apply(plan, parts)
    after = measure(module, pipe.vae, inputs)
    _refuse_unreachable(component, limits.over(after), parts, limits, after=True)
    log(f"{component}: activations up to {max(over.values()):.4g} over {threshold:g}"
        f"{f' (GroupNorm inputs: {limits.norm_input:.4g})' if decomposed_norms else ''}: {describe_plan(plan)}")
    return {**record, "scales": plan_record(plan), "max_after": _largest(after)}


def _refuse_not_finite(component: str, over: dict[str, float]) -> None:
    # the first in the order the hooks ran (a module's output before its parent's): where it began
    infinite = [k for k, v in over.items() if not math.isfinite(v)]
    if infinite:
        raise HalfRangeError(f"{component}: activation {infinite[0]} is not finite even in float32: "
                             f"no rescale keeps it in float16")


def _refuse_unreachable(component: str, over: dict[str, float], parts: Parts, limits: Limits,
                        after: bool = False) -> None:
    rescalable = set(parts.stream_keys).union(*(parts.conv1_keys(r) for r in parts.resnets))
    stuck = {k: v for k, v in over.items() if after or k not in rescalable}
    if stuck:
        key, value = max(stuck.items(), key=lambda kv: kv[1] / limits.of(kv[0]))
        raise HalfRangeError(f"{component}: activation {key} reaches {value:.4g}, over its limit in float16 "
                             f"({limits.of(key):.4g}), where no exact power-of-two rescale reaches it")


def manifest_entry(record: dict) -> dict:
    """What a component's manifest entry adds: nothing where no rescale was needed (the file is
    the one an older difflite wrote), else the threshold and the scales, as the report has them."""
    if not isinstance(record.get("scales"), dict):
        return {}
    limits = {key: record[key] for key in ("threshold", "norm_input_threshold") if key in record}
    return {"half_range": {**limits, "scales": record["scales"]}}


def plan_record(plan: Plan) -> dict:
    return {"stream_log2": -plan.stream, "stream": 2.0 ** -plan.stream,
            "conv1_log2": {name: -k for name, k in sorted(plan.conv1.items())}}


def describe_plan(plan: Plan) -> str:
    parts = [f"residual stream x 2^-{plan.stream}"] if plan.stream else []
    parts += [f"{name}.conv1 x 2^-{k}" for name, k in sorted(plan.conv1.items())]
    return ", ".join(parts) or "none needed"


def describe_probes(component: str, inputs: tuple[torch.Tensor, ...]) -> dict:
    kind = (f"randn latents (component_spec seeds from {PROBE_SEED}) x {list(DECODER_LATENT_GAINS)}"
            if component == "vae_decoder" else
            f"uniform noise pictures (component_spec seeds from {PROBE_SEED}) and smooth ones "
            f"({ENCODER_COARSE}x{ENCODER_COARSE} noise, bilinear)")
    return {"count": int(inputs[0].shape[0]), "shape": list(inputs[0].shape), "kind": kind}


def _largest(peaks: dict[str, float]) -> dict:
    if not peaks:
        return {"module": None, "value": 0.0}
    key, value = max(peaks.items(), key=lambda kv: kv[1])
    return {"module": key, "value": _round(value)}


def _round(value: float) -> float:
    return float(f"{value:.6g}")
