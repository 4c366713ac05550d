"""The presets: real Stable Diffusion architectures with seeded random weights (no hub), and the
small deterministic byte-level BPE tokenizer they carry in CLIP's format."""

from __future__ import annotations

import hashlib
import json

import torch

from difflite.compiler.pipeline import BOS, EOS, MAX_LENGTH, SDXL_TIME_IDS, Pipeline
from difflite.core.errors import BadInput

PRESETS = ("tiny", "sd15", "sd21", "sd21-768", "sd15-inpaint", "tiny-inpaint", "sdxl", "sdxl-tiny", "sdxl-inpaint",
           "sdxl-tiny-inpaint")
# SDXL's UNet takes SDXL_TIME_IDS (6) time ids beside the pooled text embedding: the original size
# (h, w), the crop's top-left (top, left) and the target size (h, w), each embedded in
# addition_time_embed_dim
# An inpainting UNet's sample: the latents (4), the mask (1) and the masked picture's latents (4)
INPAINT_CHANNELS = 9
_WEIGHTS_SCHEME = 1  # bump when preset weight generation changes, so preset hashes change too

# ---------------------------------------------------------------------------------------------
# Tokenizer files (no hub: a small deterministic byte-level BPE in CLIP's format)

_WORD_TEXT = (
    "a an the of and in on with at by for to from is are this that it its as or photo picture "
    "image painting portrait drawing illustration art style astronaut riding horse cat dog man "
    "woman person city street mountain river forest sky sea beach house car tree flower red blue "
    "green yellow black white light dark night day sun moon space planet detailed beautiful "
    "high quality realistic digital oil cinematic lighting sharp focus trending artstation "
    "by greg rutkowski fantasy landscape castle dragon robot futuristic old young small large"
)
_WORDS = _WORD_TEXT.split()


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins for bytes used by byte-level BPE (GPT-2 / CLIP convention)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def tokenizer_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocab and merges of the generated tokenizer (deterministic; 838 tokens)."""
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            if pair not in merges:
                merges.append(pair)
            parts = [parts[0] + parts[1]] + parts[2:]
    known = set(tokens)
    for a, b in merges:
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
    tokens += [BOS, EOS]
    return {t: i for i, t in enumerate(tokens)}, merges


def preset_tokenizer():
    """The presets' CLIPTokenizer (tokenizer_vocab's tokens, padded with <|endoftext|>)."""
    from transformers import CLIPTokenizer

    vocab, merges = tokenizer_vocab()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=MAX_LENGTH, pad_token=EOS)



# ---------------------------------------------------------------------------------------------
# Preset configs

_SD_SCHEDULER = {
    "_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "beta_start": 0.00085, "clip_sample": False, "num_train_timesteps": 1000, "set_alpha_to_one": False,
    "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None,
}

_SD15_UNET = {
    "act_fn": "silu", "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4,
    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-5, "norm_num_groups": 32,
    "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}

_SD_VAE = {
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3, "latent_channels": 4,
    "layers_per_block": 2, "norm_num_groups": 32, "out_channels": 3, "sample_size": 512,
    "scaling_factor": 0.18215, "up_block_types": ["UpDecoderBlock2D"] * 4,
}

_SD15_CLIP = {
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
    "num_attention_heads": 12, "max_position_embeddings": MAX_LENGTH, "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5, "projection_dim": 768,
}

_SD21_UNET = {**_SD15_UNET, "attention_head_dim": [5, 10, 20, 20], "cross_attention_dim": 1024,
              "use_linear_projection": True}
# OpenCLIP ViT-H's text tower less its last layer (SD 2.x conditions on the penultimate one).
_SD21_CLIP = {**_SD15_CLIP, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 23,
              "num_attention_heads": 16, "hidden_act": "gelu", "projection_dim": 512}

# SDXL base 1.0: EulerDiscrete as diffusers' SDXL pipelines use (leading spacing, steps_offset 1).
_SDXL_SCHEDULER = {
    "_class_name": "EulerDiscreteScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear", "num_train_timesteps": 1000,
    "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False, "skip_prk_steps": True,
    "steps_offset": 1, "timestep_spacing": "leading", "trained_betas": None, "use_karras_sigmas": False,
}
# SDXL's UNet: three levels, no attention at the first, 1/2/10 transformer layers, text_time
# conditioning on text_encoder_2's pooled projection (1280) and 6 time ids (6 x 256): 2816.
_SDXL_UNET = {
    "act_fn": "silu", "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256, "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280],
    "center_input_sample": False, "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4,
    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-5, "norm_num_groups": 32,
    "out_channels": 4, "projection_class_embeddings_input_dim": 2816, "sample_size": 128,
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "upcast_attention": False, "use_linear_projection": True,
}
# SD's VAE retrained: scaling 0.13025; it overflows in float16 (force_upcast, issue 32 item 6).
_SDXL_VAE = {**_SD_VAE, "sample_size": 1024, "scaling_factor": 0.13025, "force_upcast": True}
# CLIP ViT-L (SDXL conditions on its penultimate layer) and OpenCLIP ViT-bigG with its projection.
_SDXL_CLIP = {**_SD15_CLIP}
_SDXL_CLIP_2 = {**_SD15_CLIP, "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                "num_attention_heads": 20, "hidden_act": "gelu", "projection_dim": 1280}

_PRESET_CONFIGS = {
    "sd15": {"unet": _SD15_UNET, "vae": _SD_VAE, "text_encoder": _SD15_CLIP, "scheduler": _SD_SCHEDULER},
    "sd21": {"unet": _SD21_UNET, "vae": _SD_VAE, "text_encoder": _SD21_CLIP,
             "scheduler": {**_SD_SCHEDULER, "prediction_type": "epsilon"}},
    # SD 2.x at 768x768: v-prediction, attention computed in float32 (upcast) as the 768 model needs.
    "sd21-768": {"unet": {**_SD21_UNET, "sample_size": 96, "upcast_attention": True}, "vae": {**_SD_VAE, "sample_size": 768},
                 "text_encoder": _SD21_CLIP, "scheduler": {**_SD_SCHEDULER, "prediction_type": "v_prediction"}},
    "tiny": {
        # Same block types as SD 1.5 at small widths; group counts other than 32 on purpose.
        "unet": {**_SD15_UNET, "attention_head_dim": [2, 4], "block_out_channels": [32, 64],
                 "cross_attention_dim": 32, "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                 "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "norm_num_groups": 8, "sample_size": 64},
        # Four VAE levels as in SD, so the latent is 1/8 of the image like every real checkpoint
        # (and the 512x512 default stays small: a 64x64 latent).
        "vae": {**_SD_VAE, "block_out_channels": [16, 32, 32, 32], "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4, "layers_per_block": 1, "norm_num_groups": 16,
                "sample_size": 64},
        "text_encoder": {**_SD15_CLIP, "vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "projection_dim": 32},
        "scheduler": _SD_SCHEDULER,
    },
}
_PRESET_CONFIGS["sdxl"] = {"unet": _SDXL_UNET, "vae": _SDXL_VAE, "text_encoder": _SDXL_CLIP,
                           "text_encoder_2": _SDXL_CLIP_2, "scheduler": _SDXL_SCHEDULER}
# SDXL's shape at tiny widths: two text encoders of different widths (their penultimate hidden
# states concatenated: cross_attention_dim 32 + 48), text_time conditioning (projection 24 + 6 x 8
# time ids), two transformer layers at the second level, linear projections.
_TINY = _PRESET_CONFIGS["tiny"]
_PRESET_CONFIGS["sdxl-tiny"] = {
    "unet": {**_SDXL_UNET, "addition_embed_type_num_heads": 4, "addition_time_embed_dim": 8,
             "attention_head_dim": [2, 4], "block_out_channels": [32, 64], "cross_attention_dim": 80,
             "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"], "norm_num_groups": 8,
             "projection_class_embeddings_input_dim": 24 + SDXL_TIME_IDS * 8, "sample_size": 16,
             "transformer_layers_per_block": [1, 2], "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"]},
    "vae": {**_TINY["vae"], "sample_size": 128, "scaling_factor": 0.13025, "force_upcast": True},
    "text_encoder": {**_TINY["text_encoder"], "num_hidden_layers": 3},
    "text_encoder_2": {**_TINY["text_encoder"], "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3,
                       "num_attention_heads": 4, "hidden_act": "gelu", "projection_dim": 24},
    "scheduler": _SDXL_SCHEDULER,
}

# SD 1.5's and SDXL's inpainting models (and the tiny ones for tests): the same architectures whose
# UNet takes INPAINT_CHANNELS input channels.
for _name in ("sd15", "tiny", "sdxl", "sdxl-tiny"):
    _PRESET_CONFIGS[f"{_name}-inpaint"] = {
        **_PRESET_CONFIGS[_name], "unet": {**_PRESET_CONFIGS[_name]["unet"], "in_channels": INPAINT_CHANNELS}}


def preset_configs(name: str) -> dict:
    """The component configs of a preset (copies; "scheduler" is scheduler_config.json)."""
    if name not in _PRESET_CONFIGS:
        raise BadInput(f"preset:{name}: unknown preset (known: {', '.join(PRESETS)})")
    return json.loads(json.dumps(_PRESET_CONFIGS[name]))



# ---------------------------------------------------------------------------------------------
# Presets


def build_preset(name: str, seed: int) -> Pipeline:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    configs = preset_configs(name)
    key = json.dumps({"preset": name, "seed": seed, "configs": configs, "scheme": _WEIGHTS_SCHEME}, sort_keys=True)
    tokenizer = preset_tokenizer()
    # Build on a forked RNG so loading a preset leaves the caller's torch RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = _clip_from_config(configs["text_encoder"], tokenizer)
        unet = UNet2DConditionModel.from_config(configs["unet"])
        vae = AutoencoderKL.from_config(configs["vae"])
        # SDXL's second encoder, built after the others so SD presets keep their weights
        text_encoder_2 = (_clip_from_config(configs["text_encoder_2"], tokenizer, projection=True)
                          if "text_encoder_2" in configs else None)
    parts = [("text_encoder", text_encoder), ("unet", unet), ("vae", vae)]
    if text_encoder_2 is not None:
        parts.append(("text_encoder_2", text_encoder_2))
    for part, module in parts:
        _perturb(module, _derived_seed(seed, part))
    extra = {}
    if text_encoder_2 is not None:
        # SDXL's tokenizer_2 differs from tokenizer only in its pad token ("!"); the preset's one
        # tokenizer serves both (issue 32: the pad token is a generate-parity question)
        extra = {"text_encoder_2": text_encoder_2.float().eval(), "tokenizer_2": tokenizer}
    return Pipeline(
        source=f"preset:{name}",
        source_hash=hashlib.sha256(key.encode()).hexdigest(),
        text_encoder=text_encoder.float().eval(),
        unet=unet.float().eval(),
        vae=vae.float().eval(),
        tokenizer=tokenizer,
        scheduler_config=configs["scheduler"],
        **extra,
    )


def build_seeded(factory, seed: int, part: str) -> torch.nn.Module:
    """The presets' weights for a model outside the pipeline (a ControlNet): factory() built on a
    forked torch RNG seeded from (seed, part), then every parameter moved off its init (_perturb:
    zero-initialised layers too). Float32, eval mode."""
    derived = _derived_seed(seed, part)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived)
        module = factory()
    _perturb(module, derived)
    return module.float().eval()


def preset_hash(payload: dict) -> str:
    """The source hash of seeded preset weights described by `payload` (name, seed, config), which
    changes with the weights scheme."""
    key = json.dumps({**payload, "scheme": _WEIGHTS_SCHEME}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def _clip_from_config(config: dict, tokenizer, projection: bool = False):
    """A CLIPTextModel, or with `projection` a CLIPTextModelWithProjection (SDXL's text_encoder_2:
    the pooled output projected to projection_dim, text_embeds)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    model = (CLIPTextModelWithProjection if projection else CLIPTextModel)(CLIPTextConfig(**config, **ids))
    model.set_attn_implementation("eager")
    return model


def _derived_seed(seed: int, part: str) -> int:
    digest = hashlib.sha256(f"{seed}/{part}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Move every floating parameter off its init so no norm is an identity and no bias is zero:
    a swapped or dropped weight then changes the outputs. Small steps keep SD 1.5 depth sane."""
    gen = torch.Generator().manual_seed(seed)
    norm_weights = {
        id(m.weight) for m in module.modules()
        if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) and m.weight is not None
    }
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.is_floating_point():
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if id(p) in norm_weights:
                p.add_(0.1 * noise)
            elif name.endswith("bias"):
                p.add_(0.02 * noise)
            else:
                std = float(p.std()) if p.numel() > 1 else 0.0
                p.add_((0.1 * std if std > 0 else 0.02) * noise)


