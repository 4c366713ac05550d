"""Randomized configurations of the five difflite ops for tests/test_custom_ops_randomized.py.

Each configuration is drawn with a fixed-seed NumPy Generator from the ranges real checkpoints use
(the named constants below say where each comes from) and knows:

* `id`: the test id, spelling out every drawn value (a failure is reproducible from it alone);
* `module()`: a small float32 torch module computing the op's decomposition as PyTorch writes it
  (torch.nn.GroupNorm (+ SiLU), torch.nn.LayerNorm, GELU forms, x[..., :D] * gelu(x[..., D:]) after a
  projection, F.scaled_dot_product_attention and its hand-written forms, a 3x3 pad-1 Conv2d), its
  parameters moved off their init (no norm is an identity, no bias zero);
* `inputs()`: seeded, non-zero float32 inputs (ONNX / torch layout);
* `expected`: the difflite op the passes must fuse it into and the attribute values it implies.

`prepare(config)` exports the module with torch.onnx (the dynamo exporter `difflite convert` uses
for one or two configurations of each op, drawn; the TorchScript exporter for the rest: 0.1 s a
module against dynamo's 2 s, which would not fit 40 configurations in the file's time budget),
runs the passes as `difflite convert` does, fused and --no-fuse, writes both .tflite files with the
compiler's writer and computes the float64 PyTorch reference. `run_written` runs a written file
through LiteRT (with the op library's delegate or none), outputs poisoned before the run.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
import torch.nn.functional as F

from difflite.compiler.convert import CANONICAL_KINDS
from difflite.compiler.tflite.writer import WriteResult, write_tflite
from difflite.core import custom_ops
from difflite.core import winograd as wg
from difflite.core.profiles import load_profile
from difflite.folder.reader import read_tflite
from difflite.passes import run_passes
from difflite.passes import winograd as winograd_pass

from . import passes_helpers as H

SEED = 20  # issue 20; every op draws from its own Generator seeded from this and the op's name

# ------------------------------------------------------------------------------------------------
# Ranges of real checkpoints

# GroupNorm: diffusers' UNet2DConditionModel block widths (block_out_channels 320, 640, 1280 in
# SD 1.x, 2.x and SDXL) and AutoencoderKL's (128, 256, 512); both use norm_num_groups = 32.
GROUP_NORM_CHANNELS = (128, 256, 320, 512, 640, 1280)
GROUP_NORM_GROUPS = 32
# Other divisors: groups=1 over an image (a group norm, not a layer norm), and narrower groupings.
OTHER_GROUPS = (1, 4, 8, 16)
# UNet resnets and attention norms (resnet_eps / norm_eps 1e-5), the VAE (1e-6), and a BERT-style
# 1e-12 that float32 cannot add to a variance of order 1 (the op must still read it).
GROUP_NORM_EPSILONS = (1e-5, 1e-6, 1e-12)
# Spatial sides: small odd sizes keep the test fast and off every multiple of 4 and work-group size.
ODD_SIDES = (1, 3, 5, 7, 9)
# The [N, C, L] form (a norm over tokens): odd lengths.
GROUP_NORM_LENGTHS = (1, 3, 7, 11, 13, 19, 25)
# LayerNorm-as-GroupNorm (groups=1 on [M, C, 1]): the UNet transformer blocks' widths, CLIP
# ViT-L/14's 768 (SD 1.x text encoder) and OpenCLIP ViT-H/14's 1024 (SD 2.x); eps 1e-5 (CLIP,
# diffusers' BasicTransformerBlock), 1e-6 (PixArt/DiT-style blocks), 1e-12 (BERT-style encoders).
LAYER_NORM_CHANNELS = (320, 640, 1280, 768, 1024)
LAYER_NORM_EPSILONS = (1e-5, 1e-6, 1e-12)
TEXT_TOKENS = 77  # CLIP's max_position_embeddings: the text encoder's sequence, the UNet's keys

# GELU: erf (torch.nn.GELU, the UNet's GEGLU gate, OpenCLIP ViT-H), tanh (gelu_new / gelu_pytorch_tanh
# text encoders), sigmoid (CLIP ViT-L's quick_gelu, SD 1.x). Widths: CLIP ViT-L's MLP (3072),
# OpenCLIP ViT-H's (4096), the UNet's (1280, 2560, 5120), and odd ones.
GELU_APPROXIMATIONS = ("erf", "tanh", "sigmoid")
GELU_WIDTHS = (1280, 2560, 3072, 4096, 5120)
GELU_MAX_ELEMENTS = 60_000

# GeGLU: the UNet feed-forward (diffusers FeedForward, activation_fn="geglu", mult 4) at 320, 640
# and 1280 channels has inner widths D = 1280, 2560, 5120; the projection writes 2D. Its input
# width is not the op's: small ones keep the export and the projection cheap.
GEGLU_INNER = (1280, 2560, 5120)
GEGLU_APPROXIMATIONS = ("erf", "tanh")
GEGLU_PROJECTION_INPUTS = (8, 16, 24, 40)
GEGLU_TOKENS = (1, 3, 5, 7, 9, 11, 13)

# Attention (heads, head size) of real layers:
ATTENTION_FAMILIES = {
    "vae": ((1, 512),),  # AutoencoderKL's mid-block (SD 1.x / 2.x / SDXL): one head over its 512 channels
    "sd1": ((8, 40), (8, 80), (8, 160)),  # SD 1.x UNet: 8 heads at 320 / 640 / 1280 channels
    "sd2": ((5, 64), (10, 64), (20, 64)),  # SD 2.x UNet: head size 64 at 320 / 640 / 1280
    "clip": ((12, 64), (16, 64)),  # CLIP ViT-L/14 (SD 1.x), OpenCLIP ViT-H/14 (SD 2.x): causal, 77 tokens
}
# Query lengths (latent pixels at small sizes, e.g. 11 x 13 = 143; tokens): none a multiple of 4, 8 or
# 16, some over the kernels' 64-row and 32-key blocks.
ATTENTION_LENGTHS = (1, 3, 5, 7, 9, 13, 15, 21, 25, 35, 49, 65, 99, 143)
ATTENTION_VARIANTS = next(a.choices for a in custom_ops.ATTENTION.attrs if a.name == "variant")

# WinogradConv3x3: the UNet's and VAE's 3x3 convolution widths, conv_in / conv_out's 4 latent
# channels; Cin * Cout capped (the transformed weight is 36 Cin Cout floats).
WINOGRAD_CHANNELS = (4, 128, 256, 320, 512, 640, 1280)
WINOGRAD_MAX_CIN_COUT = 128 * 1280
WINOGRAD_MAX_MACS = 60_000_000  # 9 N H W Cin Cout of the direct convolution
WINOGRAD_SIDES = (3, 5, 7, 9, 11, 13)

# ------------------------------------------------------------------------------------------------
# Configurations


def _eps_text(eps: float) -> str:
    return f"{eps:.0e}"


def _exported(config, text: str) -> str:
    return f"{text}-dynamo" if config.exporter == "dynamo" else text


def _nonzero(rng: np.random.Generator, shape, scale=1.0, offset=0.0) -> np.ndarray:
    """Values bounded away from zero, random signs (the kernel tests' convention)."""
    v = rng.uniform(0.1, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return (v * scale + offset).astype(np.float32)


@dataclass(frozen=True)
class Expected:
    op: custom_ops.CustomOp
    attrs: dict  # every attribute but attention's variant (a hint the test sets)
    shapes: tuple  # the op's input shapes in the ONNX graph (channels first)


@dataclass(frozen=True)
class GroupNormConfig:
    channels: int
    groups: int
    epsilon: float
    activation: str  # "none" | "silu"
    shape: tuple  # torch input [N, C, H, W] or [N, C, L]; LayerNorm: [N, L, C]
    layer_norm: bool = False
    seed: int = 0
    exporter: str = "legacy"  # torch.onnx's TorchScript exporter, or "dynamo" (convert's)

    @property
    def id(self) -> str:
        dims = "x".join(map(str, (self.shape[0], *self.shape[1:-1]) if self.layer_norm
                            else (self.shape[0], *self.shape[2:])))
        if self.layer_norm:
            return _exported(self, f"layernorm-c{self.channels}-eps{_eps_text(self.epsilon)}-{dims}")
        return _exported(self, f"groupnorm-c{self.channels}-g{self.groups}-eps{_eps_text(self.epsilon)}"
                               f"-{self.activation}-{dims}")

    @property
    def fuse_kind(self) -> str:
        return custom_ops.LAYER_NORM_KIND if self.layer_norm else "groupnorm"

    def module(self) -> torch.nn.Module:
        if self.layer_norm:
            return torch.nn.LayerNorm(self.channels, eps=self.epsilon)
        norm = torch.nn.GroupNorm(self.groups, self.channels, eps=self.epsilon)
        return torch.nn.Sequential(norm, torch.nn.SiLU()) if self.activation == "silu" else norm

    def inputs(self) -> tuple[np.ndarray, ...]:
        """A non-zero mean per group, and one group (LayerNorm: one row) of variance ~3 epsilon, so
        that a misread epsilon changes the output (1e-12 cannot show in float32: variance ~1e-7)."""
        rng = np.random.default_rng(self.seed)
        x = _nonzero(rng, self.shape, 2.0, rng.uniform(0.5, 3.0))
        small = 3.0 * math.sqrt(max(self.epsilon, 1e-7))
        if self.layer_norm:
            x[0, 0, :] = _nonzero(rng, self.channels, small)
        else:
            group = (slice(None), slice(0, self.channels // self.groups))
            x[group] = _nonzero(rng, x[group].shape, small)
        return (x,)

    @property
    def expected(self) -> Expected:
        attrs = {"groups": self.groups, "epsilon": self.epsilon, "activation": self.activation}
        if self.layer_norm:  # [M, C, 1] in ONNX: one group, one position a row
            x = (math.prod(self.shape[:-1]), self.channels, 1)
        else:
            x = tuple(self.shape)
        return Expected(custom_ops.GROUP_NORM, attrs, (x, (self.channels,), (self.channels,)))


@dataclass(frozen=True)
class GeluConfig:
    approximate: str
    form: str  # how the module spells it (see GELU_FORMS)
    shape: tuple
    seed: int = 0
    exporter: str = "legacy"  # torch.onnx's TorchScript exporter, or "dynamo" (convert's)

    @property
    def id(self) -> str:
        return _exported(self, f"gelu-{self.approximate}-{self.form}-{'x'.join(map(str, self.shape))}")

    @property
    def fuse_kind(self) -> str:
        return "gelu"

    def module(self) -> torch.nn.Module:
        return Gelu(self.form, self.approximate)

    def inputs(self):
        return (_nonzero(np.random.default_rng(self.seed), self.shape, 4.0),)

    @property
    def expected(self) -> Expected:
        return Expected(custom_ops.GELU, {"approximate": self.approximate}, (tuple(self.shape),))


# approximate -> the spellings of real code
GELU_FORMS = {
    "erf": ("nn", "formula"),  # torch.nn.GELU(); transformers' GELUActivation-style formula with erf
    "tanh": ("nn", "formula"),  # torch.nn.GELU("tanh"); transformers' NewGELUActivation (gelu_new)
    "sigmoid": ("formula",),  # transformers' QuickGELUActivation: x * sigmoid(1.702 x)
}


class Gelu(torch.nn.Module):
    def __init__(self, form: str, approximate: str):
        super().__init__()
        self.form, self.approximate = form, approximate

    def forward(self, x):
        return gelu(x, self.approximate, self.form)


def gelu(x, approximate: str, form: str):
    if approximate == "sigmoid":
        return x * torch.sigmoid(1.702 * x)
    if form == "nn":
        return F.gelu(x, approximate="none" if approximate == "erf" else "tanh")
    if approximate == "erf":
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GeGLU(torch.nn.Module):
    """diffusers' GEGLU: a projection to 2D, hidden * gelu(gate) of its two halves."""

    def __init__(self, dim_in: int, inner: int, approximate: str):
        super().__init__()
        self.proj = torch.nn.Linear(dim_in, 2 * inner)
        self.approximate = approximate

    def forward(self, x):
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return hidden * F.gelu(gate, approximate="none" if self.approximate == "erf" else "tanh")


@dataclass(frozen=True)
class GeGLUConfig:
    inner: int
    approximate: str
    dim_in: int
    shape: tuple  # [N, L] leading dims
    seed: int = 0
    exporter: str = "legacy"  # torch.onnx's TorchScript exporter, or "dynamo" (convert's)

    @property
    def id(self) -> str:
        dims = "x".join(map(str, self.shape))
        return _exported(self, f"geglu-d{self.inner}-{self.approximate}-in{self.dim_in}-{dims}")

    @property
    def fuse_kind(self) -> str:
        return "gelu"

    def module(self):
        return GeGLU(self.dim_in, self.inner, self.approximate)

    def inputs(self):
        return (_nonzero(np.random.default_rng(self.seed), (*self.shape, self.dim_in), 2.0),)

    @property
    def expected(self) -> Expected:
        return Expected(custom_ops.GEGLU, {"approximate": self.approximate}, ((*self.shape, 2 * self.inner),))


class Attention(torch.nn.Module):
    """q [N, Lq, H*D], k / v [N, Lk, H*D] -> heads -> attention -> [N, Lq, H*D], in one of the forms:
    sdpa      F.scaled_dot_product_attention(is_causal, scale) (diffusers AttnProcessor2_0, CLIP sdpa)
    explicit  softmax(q k^T * scale + [N, 1, L, L] causal mask of finfo.min) v (transformers' eager
              attention)
    baddbmm   3-D heads [N*H, L, D], baddbmm(mask or empty, q, k^T, beta, alpha=scale), bmm
              (diffusers AttnProcessor; its masks are -10000 where masked)."""

    def __init__(self, heads: int, scale: float, causal: bool, form: str):
        super().__init__()
        self.heads, self.scale, self.causal, self.form = heads, scale, causal, form

    def _split(self, t):
        n, length, width = t.shape
        return t.reshape(n, length, self.heads, width // self.heads).transpose(1, 2)

    def forward(self, q, k, v):
        n, lq, _ = q.shape
        lk = k.shape[1]
        qh, kh, vh = self._split(q), self._split(k), self._split(v)
        if self.form == "sdpa":
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=self.causal, scale=self.scale)
        elif self.form == "explicit":
            scores = (qh @ kh.transpose(-1, -2)) * self.scale
            if self.causal:  # transformers' 4-D causal mask, expanded over the batch
                mask = torch.full((lq, lk), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)
                scores = scores + mask[None, None].expand(n, 1, lq, lk)
            out = scores.softmax(-1) @ vh
        else:
            batch = n * self.heads
            q3, k3, v3 = (t.reshape(batch, t.shape[2], t.shape[3]) for t in (qh, kh, vh))
            if self.causal:
                bias = torch.full((lq, lk), -10000.0, dtype=q.dtype).triu(1).expand(batch, lq, lk)
                beta = 1
            else:
                bias, beta = torch.empty(batch, lq, lk, dtype=q.dtype), 0
            scores = torch.baddbmm(bias, q3, k3.transpose(-1, -2), beta=beta, alpha=self.scale)
            out = torch.bmm(scores.softmax(-1), v3).reshape(n, self.heads, lq, -1)
        return out.transpose(1, 2).reshape(n, lq, -1)


ATTENTION_FORMS = ("sdpa", "explicit", "baddbmm")


@dataclass(frozen=True)
class AttentionConfig:
    family: str
    heads: int
    head_dim: int
    batch: int
    lq: int
    lk: int
    causal: bool
    scale: float
    variant: str
    form: str
    seed: int = 0
    exporter: str = "legacy"  # torch.onnx's TorchScript exporter, or "dynamo" (convert's)

    @property
    def id(self) -> str:
        kind = "self" if self.lq == self.lk else "cross"
        scale = "invsqrtd" if self.scale == 1.0 / math.sqrt(self.head_dim) else f"{self.scale:.6g}"
        return _exported(self, f"attention-{self.family}-h{self.heads}x{self.head_dim}-{self.batch}x{self.lq}x{self.lk}"
                               f"-{kind}{'-causal' if self.causal else ''}-s{scale}-{self.variant}-{self.form}")

    @property
    def fuse_kind(self) -> str:
        return "attention"

    def module(self):
        return Attention(self.heads, self.scale, self.causal, self.form)

    def inputs(self):
        rng = np.random.default_rng(self.seed)
        width = self.heads * self.head_dim
        return (_nonzero(rng, (self.batch, self.lq, width)), _nonzero(rng, (self.batch, self.lk, width)),
                _nonzero(rng, (self.batch, self.lk, width)))

    @property
    def expected(self) -> Expected:
        q = (self.batch, self.lq, self.heads * self.head_dim)
        kv = (self.batch, self.lk, self.heads * self.head_dim)
        causal = self.causal and self.lq > 1  # a causal mask over one key masks nothing: no mask
        return Expected(custom_ops.ATTENTION, {"heads": self.heads, "scale": self.scale, "causal": causal},
                        (q, kv, kv))


@dataclass(frozen=True)
class WinogradConfig:
    cin: int
    cout: int
    shape: tuple  # [N, H, W]
    seed: int = 0
    exporter: str = "legacy"  # torch.onnx's TorchScript exporter, or "dynamo" (convert's)

    @property
    def id(self) -> str:
        return _exported(self, f"winograd-cin{self.cin}-cout{self.cout}-{'x'.join(map(str, self.shape))}")

    @property
    def fuse_kind(self) -> str:
        return "winograd"

    def module(self):
        return torch.nn.Conv2d(self.cin, self.cout, 3, padding=1)

    def inputs(self):
        n, h, w = self.shape
        return (_nonzero(np.random.default_rng(self.seed), (n, self.cin, h, w)),)

    @property
    def expected(self) -> Expected:
        n, h, w = self.shape
        return Expected(custom_ops.WINOGRAD_CONV3X3, {"tile": 4, "activation": "none"},
                        ((n, self.cin, h, w), (wg.POSITIONS, self.cin, self.cout), (self.cout,)))


# A profile for the Winograd pass whose cost model counts multiply-adds only (no thresholds, no
# launch overhead, no memory bound): it takes Winograd exactly where F(4x4, 3x3) saves work.
WINOGRAD_PROFILE = dataclasses.replace(
    load_profile("generic"), name="randomized-test", winograd_min_in_channels=1, winograd_min_out_channels=1,
    winograd_min_tiles=1, launch_overhead_us=0.0, bandwidth_gbps=1e12)


def _generator(op: str) -> np.random.Generator:
    return np.random.default_rng([SEED, sum(map(ord, op))])


def _pick(rng, values):
    return values[int(rng.integers(len(values)))]


def _dynamo(rng, configs: list, count: int) -> list:
    """`count` of the configurations (drawn last, so the others do not depend on it) exported with
    the dynamo exporter, as `difflite convert` exports."""
    chosen = set(rng.choice(len(configs), size=count, replace=False).tolist())
    return [dataclasses.replace(c, exporter="dynamo") if i in chosen else c for i, c in enumerate(configs)]


def draw_group_norms(count: int, layer_norms: int, dynamo: int = 1) -> list[GroupNormConfig]:
    rng = _generator("groupnorm")
    out = []
    for i in range(count):
        channels = _pick(rng, GROUP_NORM_CHANNELS)
        groups = GROUP_NORM_GROUPS if rng.random() < 0.7 else _pick(rng, OTHER_GROUPS)
        batch = int(rng.integers(1, 3))
        if rng.random() < 0.3:
            shape = (batch, channels, _pick(rng, GROUP_NORM_LENGTHS))
        else:
            shape = (batch, channels, _pick(rng, ODD_SIDES), _pick(rng, ODD_SIDES))
        out.append(GroupNormConfig(channels, groups, _pick(rng, GROUP_NORM_EPSILONS),
                                   _pick(rng, ("none", "silu")), shape, seed=1000 + i))
    for i in range(layer_norms):
        channels = _pick(rng, LAYER_NORM_CHANNELS)
        tokens = TEXT_TOKENS if channels in (768, 1024) else _pick(rng, GROUP_NORM_LENGTHS)
        shape = (int(rng.integers(1, 3)), tokens, channels)
        out.append(GroupNormConfig(channels, 1, _pick(rng, LAYER_NORM_EPSILONS), "none", shape, layer_norm=True,
                                   seed=1100 + i))
    groups, layers = out[:count], out[count:]  # dynamo exports of each form (when asked for)
    return _dynamo(rng, groups, min(dynamo, 1)) + _dynamo(rng, layers, max(dynamo - 1, 0))


def draw_gelus(count: int, dynamo: int = 1) -> list[GeluConfig]:
    rng = _generator("gelu")
    out = []
    for i in range(count):
        approximate = GELU_APPROXIMATIONS[i % len(GELU_APPROXIMATIONS)]
        form = _pick(rng, GELU_FORMS[approximate])
        rank = int(rng.integers(2, 5))
        width = _pick(rng, GELU_WIDTHS) if rng.random() < 0.5 else int(rng.integers(1, 500)) * 2 + 1
        lead = [int(rng.integers(1, 12)) * 2 - 1 for _ in range(rank - 1)]
        lead[0] = min(lead[0], 2)  # a batch
        while math.prod(lead) * width > GELU_MAX_ELEMENTS:
            lead[int(np.argmax(lead))] = max(1, max(lead) // 2) | 1
        out.append(GeluConfig(approximate, form, (*lead, width), seed=2000 + i))
    return _dynamo(rng, out, dynamo)


def draw_geglus(count: int, dynamo: int = 1) -> list[GeGLUConfig]:
    rng = _generator("geglu")
    out = []
    for i in range(count):
        inner = GEGLU_INNER[i % len(GEGLU_INNER)]
        shape = (int(rng.integers(1, 3)), _pick(rng, GEGLU_TOKENS))
        out.append(GeGLUConfig(inner, _pick(rng, GEGLU_APPROXIMATIONS), _pick(rng, GEGLU_PROJECTION_INPUTS), shape,
                               seed=3000 + i))
    return _dynamo(rng, out, dynamo)


def draw_attentions(count: int, dynamo: int = 1) -> list[AttentionConfig]:
    rng = _generator("attention")
    families = list(ATTENTION_FAMILIES)
    variants = [ATTENTION_VARIANTS[i % len(ATTENTION_VARIANTS)] for i in range(count)]
    rng.shuffle(variants)
    # UNet attention is self- or cross-attention (keys: the 77 text tokens), the VAE's self-attention;
    # causal masks (the text encoder's) are also put on self-attention of the other shapes.
    modes = {"sd1": ["cross", "self", "causal", "cross"], "sd2": ["cross", "causal", "self", "cross"],
             "vae": ["self", "causal"]}
    for cycle in modes.values():
        rng.shuffle(cycle)
    out = []
    for i in range(count):
        family = families[i % len(families)]
        heads, head_dim = _pick(rng, ATTENTION_FAMILIES[family])
        batch = int(rng.integers(1, 3))
        if family == "clip":
            lq = lk = TEXT_TOKENS
            causal = True
        else:
            lq = _pick(rng, ATTENTION_LENGTHS[1:12] if head_dim >= 512 else ATTENTION_LENGTHS)
            mode = modes[family][(i // len(families)) % len(modes[family])]
            lk = TEXT_TOKENS if mode == "cross" else lq
            causal = mode == "causal"
        if rng.random() < 0.6:
            scale = 1.0 / math.sqrt(head_dim)
        else:
            scale = _pick(rng, (1.0, 0.5, round(float(rng.uniform(0.02, 0.3)), 4)))
        out.append(AttentionConfig(family, heads, head_dim, batch, lq, lk, causal, scale, variants[i],
                                   _pick(rng, ATTENTION_FORMS), seed=4000 + i))
    return _dynamo(rng, out, dynamo)


def _winograd_saves_work(n, cin, cout, h, w) -> bool:
    return winograd_pass.conv_cost(n, cin, cout, h, w, WINOGRAD_PROFILE, "fp32").saved_s > 0


def draw_winograds(count: int, dynamo: int = 1) -> list[WinogradConfig]:
    """Draws that the pass takes under WINOGRAD_PROFILE (where Winograd saves multiply-adds)."""
    rng = _generator("winograd")
    out = []
    while len(out) < count:
        cin, cout = _pick(rng, WINOGRAD_CHANNELS), _pick(rng, WINOGRAD_CHANNELS)
        n, h, w = int(rng.integers(1, 3)), _pick(rng, WINOGRAD_SIDES), _pick(rng, WINOGRAD_SIDES)
        if cin * cout > WINOGRAD_MAX_CIN_COUT or 9 * n * h * w * cin * cout > WINOGRAD_MAX_MACS:
            continue
        if not _winograd_saves_work(n, cin, cout, h, w):
            continue
        out.append(WinogradConfig(cin, cout, (n, h, w), seed=5000 + len(out)))
    return _dynamo(rng, out, dynamo)


# ------------------------------------------------------------------------------------------------
# Export, passes, writer, reference


@dataclass
class Prepared:
    config: object
    inputs: dict  # graph input name -> array (ONNX layout)
    reference: np.ndarray  # float64, ONNX layout
    fused_onnx: ir.Model  # after the passes (fused kinds as difflite ops)
    fused: WriteResult  # written to fused_path
    fused_path: Path
    unfused: WriteResult  # convert --no-fuse's file
    unfused_path: Path
    fusion_counts: dict


def perturbed_module(config) -> torch.nn.Module:
    torch.manual_seed(config.seed)
    return H.perturb(config.module(), seed=config.seed)


def _passes_fused(model: ir.Model, config) -> dict:
    """`convert --fuse <the config's kind>`: canonical kinds recognised, the config's kind fused."""
    kinds = set(CANONICAL_KINDS) | {config.fuse_kind}
    counts = run_passes(model, kinds, profile=WINOGRAD_PROFILE, winograd_budget_mb=math.inf, precision="fp32")
    if isinstance(config, AttentionConfig):  # the variant is a hint: the config asks for one
        for node in H.difflite_nodes(model, custom_ops.ATTENTION):
            node.attributes["variant"] = ir.AttrString("variant", config.variant)
    return counts


@functools.cache
def _work_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="difflite-randomized-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def prepare(config) -> Prepared:
    module = perturbed_module(config)
    arrays = config.inputs()
    with torch.no_grad():
        reference = copy.deepcopy(module).double()(*(torch.from_numpy(a).double() for a in arrays)).numpy()
    exported = H.export(module, tuple(torch.from_numpy(a) for a in arrays), dynamo=config.exporter == "dynamo")
    proto = ir.to_proto(exported)
    names = [v.name for v in exported.graph.inputs]
    inputs = dict(zip(names, arrays, strict=True))

    fused = ir.from_proto(proto)
    counts = _passes_fused(fused, config)
    fused_path = _work_dir() / f"{config.id}.fused.tflite"
    fused_result = write_tflite(fused, precision="fp32", fuse={config.fuse_kind}, path=fused_path)

    unfused = ir.from_proto(proto)  # convert --no-fuse: recognised kinds decomposed by the writer
    run_passes(unfused, set(CANONICAL_KINDS), profile="generic", precision="fp32")
    unfused_path = _work_dir() / f"{config.id}.unfused.tflite"
    unfused_result = write_tflite(unfused, precision="fp32", fuse=(), path=unfused_path)
    return Prepared(config, inputs, reference, fused, fused_result, fused_path, unfused_result, unfused_path, counts)


# ------------------------------------------------------------------------------------------------
# Running written files

NHWC = (0, 2, 3, 1)
NCHW = (0, 3, 1, 2)


def run_written(path: Path, written: WriteResult, feeds: dict, lib: Path | None = None,
                options: dict | None = None) -> list[np.ndarray]:
    """Run a written .tflite through its serving_default signature on LiteRT, with the op library's
    delegate (`options`) or none; feeds and outputs in ONNX layout (the writer's entries say which
    are NHWC in the file). Every output is poisoned with NaN before the run."""
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    signature = read_tflite(path).signatures["serving_default"]
    delegates = [load_delegate(str(lib), dict(options))] if options is not None else []
    interpreter = Interpreter(model_path=str(path), experimental_delegates=delegates)
    interpreter.allocate_tensors()
    for entry in written.inputs:
        x = np.asarray(feeds[entry["name"]], np.float32)
        if entry["layout"] == "NHWC":
            x = x.transpose(NHWC)
        interpreter.set_tensor(signature["inputs"][entry["name"]], np.ascontiguousarray(x))
    for entry in written.outputs:
        view = interpreter.tensor(signature["outputs"][entry["name"]])()
        view[...] = np.nan
        del view  # no live reference into the interpreter during invoke
    interpreter.invoke()
    outs = []
    for entry in written.outputs:
        y = interpreter.get_tensor(signature["outputs"][entry["name"]]).copy()
        outs.append(y.transpose(NCHW) if entry["layout"] == "NHWC" else y)
    return outs


def custom_ops_in(path: Path) -> list:
    return [op for op in read_tflite(path).ops if op.name.startswith(custom_ops.DOMAIN + ".")]
