"""Load a Stable Diffusion pipeline: a preset (real architecture, seeded random weights), a local
diffusers folder, or a single-file checkpoint (compiler/single_file.py: architecture inferred, or
a diffusers config folder); then a separate VAE, the prediction type and LoRAs (compiler/lora.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from compiler.errors import BadInput

PRESETS = ("tiny", "sd15", "sd21", "sd21-768")

_COMPONENTS = ("text_encoder", "unet", "vae")
_MODEL_CLASSES = {"text_encoder": "CLIPTextModel", "unet": "UNet2DConditionModel", "vae": "AutoencoderKL"}
_WEIGHTS_SCHEME = 1  # bump when preset weight generation changes, so preset hashes change too
_BOS, _EOS = "<|startoftext|>", "<|endoftext|>"
_MAX_LENGTH = 77


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
    tokens += [_BOS, _EOS]
    return {t: i for i, t in enumerate(tokens)}, merges


def _write_tokenizer_files(folder: Path, vocab: dict[str, int], merges: list, special: dict,
                           max_length: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    (folder / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": max_length, "do_lower_case": True,
              "errors": "replace", "add_prefix_space": False, **special}
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special)


def _make_tokenizer():
    from transformers import CLIPTokenizer

    vocab, merges = tokenizer_vocab()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=_MAX_LENGTH, pad_token=_EOS)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


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
    "num_attention_heads": 12, "max_position_embeddings": _MAX_LENGTH, "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5, "projection_dim": 768,
}

_SD21_UNET = {**_SD15_UNET, "attention_head_dim": [5, 10, 20, 20], "cross_attention_dim": 1024,
              "use_linear_projection": True}
# OpenCLIP ViT-H's text tower less its last layer (SD 2.x conditions on the penultimate one).
_SD21_CLIP = {**_SD15_CLIP, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 23,
              "num_attention_heads": 16, "hidden_act": "gelu", "projection_dim": 512}

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


def preset_configs(name: str) -> dict:
    """The component configs of a preset (copies; "scheduler" is scheduler_config.json)."""
    if name not in _PRESET_CONFIGS:
        raise BadInput(f"preset:{name}: unknown preset (known: {', '.join(PRESETS)})")
    return json.loads(json.dumps(_PRESET_CONFIGS[name]))


def peek_configs(model: str) -> tuple[dict, dict] | None:
    """The UNet's and the VAE's configs of a preset or a diffusers folder, read without building
    or importing anything; None for a single file (its architecture comes from its tensors) or
    configs that loading will have to judge."""
    if model.startswith("preset:"):
        configs = preset_configs(model.removeprefix("preset:"))
        return configs["unet"], configs["vae"]
    folder = Path(model).expanduser()
    try:
        unet, vae = (json.loads((folder / name / "config.json").read_text()) for name in ("unet", "vae"))
    except (OSError, ValueError):
        return None

    def listed(config, key: str, kind=object) -> bool:
        values = config.get(key) if isinstance(config, dict) else None
        return isinstance(values, list) and bool(values) and all(isinstance(v, kind) for v in values)

    if listed(unet, "block_out_channels", int) and listed(unet, "down_block_types") and \
            listed(vae, "block_out_channels", int):
        return unet, vae
    return None


# ---------------------------------------------------------------------------------------------
# The pipeline


@dataclass
class Pipeline:
    source: str
    source_hash: str
    text_encoder: object  # transformers.CLIPTextModel (eager attention)
    unet: object  # diffusers.UNet2DConditionModel
    vae: object  # diffusers.AutoencoderKL
    tokenizer: object  # transformers.CLIPTokenizer
    scheduler_config: dict
    # What the manifest's "source" records beyond model and hash: how a single file's
    # architecture was inferred ("architecture"), the LoRAs merged ("loras"), and the like.
    details: dict = field(default_factory=dict)

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def default_size(self) -> int:
        """The image size the UNet was trained at (its config's sample_size, in pixels)."""
        return int(self.unet.config.sample_size) * self.vae_scale_factor

    def save_tokenizer(self, folder: Path) -> None:
        """Write vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json (what
        transformers loads), and tokenizer.json (what `generate` loads without transformers)."""
        from compiler.prompt_tokens import save_pipeline

        tok = self.tokenizer
        pipeline_json = tok.backend_tokenizer.to_str()
        model = json.loads(pipeline_json)["model"]
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        special = {"bos_token": str(tok.bos_token), "eos_token": str(tok.eos_token),
                   "unk_token": str(tok.unk_token), "pad_token": str(tok.pad_token)}
        _write_tokenizer_files(Path(folder), model["vocab"], merges, special, tok.model_max_length)
        save_pipeline(pipeline_json, folder)

    def save_scheduler(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / "scheduler_config.json", self.scheduler_config)

    def save_pretrained(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in _COMPONENTS:
            getattr(self, name).save_pretrained(folder / name, safe_serialization=True)
        self.save_tokenizer(folder / "tokenizer")
        self.save_scheduler(folder / "scheduler")
        index = {
            "_class_name": "StableDiffusionPipeline",
            "feature_extractor": [None, None],
            "image_encoder": [None, None],
            "requires_safety_checker": False,
            "safety_checker": [None, None],
            "scheduler": ["diffusers", self.scheduler_config["_class_name"]],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        }
        _write_json(folder / "model_index.json", index)


PREDICTION_TYPES = ("epsilon", "v_prediction")


@dataclass(frozen=True)
class LoraSpec:
    """One --lora FILE[:SCALE]."""
    path: str
    scale: float = 1.0


def load_pipeline(model: str, config: str | None = None, seed: int = 0, *, vae: str | None = None,
                  prediction_type: str | None = None, loras: tuple[LoraSpec, ...] = ()) -> Pipeline:
    """Load "preset:NAME", a diffusers folder, or a .safetensors/.ckpt file (architecture inferred
    from its keys unless `config` names a diffusers folder); then swap in a separate VAE, set the
    prediction type and merge LoRAs, each recorded in `details` and folded into `source_hash`."""
    if prediction_type is not None and prediction_type not in PREDICTION_TYPES:
        raise BadInput(f"--prediction-type {prediction_type!r}: choose from {', '.join(PREDICTION_TYPES)}")
    pipe = _load_base(str(model), config, seed, prediction_type)
    if vae is not None:
        from compiler.single_file import replace_vae

        replace_vae(pipe, Path(vae).expanduser().absolute())
    if prediction_type is not None:
        _set_prediction_type(pipe, prediction_type)
    if loras:
        from compiler.lora import merge_loras

        merge_loras(pipe, tuple(loras))
    return pipe


def _load_base(model: str, config: str | None, seed: int, prediction_type: str | None) -> Pipeline:
    if model.startswith("preset:"):
        return _build_preset(model.removeprefix("preset:"), seed)
    path = Path(model).expanduser().absolute()
    if not path.exists():
        raise BadInput(f"{path}: no such file or folder")
    if path.is_dir():
        return _load_folder(path)
    if path.suffix not in (".safetensors", ".ckpt"):
        raise BadInput(f"{path}: not a diffusers folder, .safetensors or .ckpt file")
    from compiler.single_file import load_single_file

    return load_single_file(path, Path(config).expanduser().absolute() if config else None, prediction_type)


def _set_prediction_type(pipe: Pipeline, prediction_type: str) -> None:
    if pipe.scheduler_config.get("prediction_type", "epsilon") == prediction_type:
        return
    pipe.scheduler_config = {**pipe.scheduler_config, "prediction_type": prediction_type}
    fold_into_hash(pipe, f"prediction_type={prediction_type}")


def fold_into_hash(pipe: Pipeline, *parts: str) -> None:
    """Make the source hash depend on what was changed after loading (a VAE, LoRAs, options)."""
    h = hashlib.sha256(pipe.source_hash.encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    pipe.source_hash = h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Presets


def _build_preset(name: str, seed: int) -> Pipeline:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    configs = preset_configs(name)
    key = json.dumps({"preset": name, "seed": seed, "configs": configs, "scheme": _WEIGHTS_SCHEME}, sort_keys=True)
    tokenizer = _make_tokenizer()
    # Build on a forked RNG so loading a preset leaves the caller's torch RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = _clip_from_config(configs["text_encoder"], tokenizer)
        unet = UNet2DConditionModel.from_config(configs["unet"])
        vae = AutoencoderKL.from_config(configs["vae"])
    for part, module in (("text_encoder", text_encoder), ("unet", unet), ("vae", vae)):
        _perturb(module, _derived_seed(seed, part))
    return Pipeline(
        source=f"preset:{name}",
        source_hash=hashlib.sha256(key.encode()).hexdigest(),
        text_encoder=text_encoder.float().eval(),
        unet=unet.float().eval(),
        vae=vae.float().eval(),
        tokenizer=tokenizer,
        scheduler_config=configs["scheduler"],
    )


def _clip_from_config(config: dict, tokenizer):
    from transformers import CLIPTextConfig, CLIPTextModel

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    model = CLIPTextModel(CLIPTextConfig(**config, **ids))
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


# ---------------------------------------------------------------------------------------------
# Diffusers folders


def _one_line(error: BaseException) -> str:
    """The error's first line; a heading that ends in ":" ("Error(s) in loading state_dict for X:")
    gets the line after it, which names what went wrong."""
    text = [t.strip() for t in str(error).strip().splitlines() if t.strip()]
    line = text[0] if text else type(error).__name__
    if line.endswith(":") and len(text) > 1:
        line = f"{line} {text[1]}"
    return line if len(line) <= 300 else line[:297] + "..."


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: missing") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not readable JSON ({_one_line(e)})") from e
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return data


def _check_config_folder(folder: Path) -> dict:
    """Validate the layout of a diffusers Stable Diffusion folder; return model_index.json."""
    if not folder.is_dir():
        raise BadInput(f"{folder}: not a folder")
    if not (folder / "model_index.json").is_file():
        raise BadInput(f"{folder}: not a diffusers folder (no model_index.json)")
    index = _read_json(folder / "model_index.json")
    for name, cls in _MODEL_CLASSES.items():
        entry = index.get(name)
        if not isinstance(entry, list) or len(entry) != 2 or entry[1] != cls:
            raise BadInput(f"{folder / 'model_index.json'}: expected {name} = {cls}, got {entry!r}")
        if not (folder / name / "config.json").is_file():
            raise BadInput(f"{folder / name / 'config.json'}: missing")
    if not (folder / "scheduler" / "scheduler_config.json").is_file():
        raise BadInput(f"{folder / 'scheduler' / 'scheduler_config.json'}: missing")
    tok = folder / "tokenizer"
    if not ((tok / "vocab.json").is_file() and (tok / "merges.txt").is_file()) and not (tok / "tokenizer.json").is_file():
        raise BadInput(f"{tok}: missing tokenizer files (vocab.json + merges.txt or tokenizer.json)")
    return index


def _weight_files(component: Path) -> list[Path]:
    """The weight files from_pretrained reads: plain (non-variant) safetensors, else .bin."""
    for pattern in ("*.safetensors", "*.bin"):
        files = [f for f in component.glob(pattern) if f.name.count(".") == 1]
        if files:
            return sorted(files)
    return []


def _hash_files(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in files:
        h.update(label.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def _config_files(folder: Path) -> list[tuple[str, Path]]:
    """Files other than weights that change the pipeline (configs, tokenizer)."""
    names = ["model_index.json", "scheduler/scheduler_config.json"]
    names += [f"{c}/config.json" for c in _COMPONENTS]
    names += sorted(f"tokenizer/{p.name}" for p in (folder / "tokenizer").iterdir() if p.is_file())
    return [(n, folder / n) for n in names]


def _load_folder(folder: Path) -> Pipeline:
    _check_config_folder(folder)  # before seconds of importing diffusers and transformers
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    files = _config_files(folder)
    for name in _COMPONENTS:
        weights = _weight_files(folder / name)
        if not weights:
            raise BadInput(f"{folder / name}: no weight file (.safetensors or .bin)")
        files += [(f"{name}/{w.name}", w) for w in weights]
    unet = _from_pretrained(UNet2DConditionModel, folder / "unet")
    vae = _from_pretrained(AutoencoderKL, folder / "vae")
    text_encoder = _from_pretrained(CLIPTextModel, folder / "text_encoder")
    text_encoder.set_attn_implementation("eager")
    return _assemble(str(folder), _hash_files(files), folder, text_encoder, unet, vae)


def _from_pretrained(cls, path: Path):
    # Mismatched shapes are reported back rather than raised so the message can name the tensor.
    kwargs = {"local_files_only": True, "output_loading_info": True, "ignore_mismatched_sizes": True}
    if cls.__name__ == "CLIPTextModel":
        kwargs.update(attn_implementation="eager", dtype=torch.float32)
    else:
        kwargs.update(low_cpu_mem_usage=False)  # the default wants accelerate and warns without it
    try:
        with _quiet_loaders():
            model, info = cls.from_pretrained(str(path), **kwargs)
    except Exception as e:  # loaders raise many types; all mean bad input here
        raise BadInput(f"{path}: cannot load {cls.__name__}: {_one_line(e)}") from e
    mismatched = sorted(info.get("mismatched_keys", []))
    if mismatched:
        key, found, needed = mismatched[0]
        raise BadInput(f"{path}: {key} has shape {tuple(found)}, the config needs {tuple(needed)}")
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise BadInput(f"{path}: missing weights {missing[:3]}")
    return model


@contextlib.contextmanager
def _quiet_loaders():
    """from_pretrained logs load reports and progress bars; our BadInput says what matters."""
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    levels = diffusers_logging.get_verbosity(), transformers_logging.get_verbosity()
    bars = transformers_logging.is_progress_bar_enabled()
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        diffusers_logging.set_verbosity(levels[0])
        transformers_logging.set_verbosity(levels[1])
        if bars:
            transformers_logging.enable_progress_bar()


def _assemble(source: str, source_hash: str, config_folder: Path, text_encoder, unet, vae) -> Pipeline:
    from transformers import CLIPTokenizer

    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(config_folder / "tokenizer"), local_files_only=True)
    except Exception as e:
        raise BadInput(f"{config_folder / 'tokenizer'}: cannot load the tokenizer: {_one_line(e)}") from e
    vocab_size = text_encoder.config.vocab_size
    if len(tokenizer) > vocab_size:
        raise BadInput(f"{config_folder / 'tokenizer'}: {len(tokenizer)} tokens but the text encoder has {vocab_size}")
    scheduler = _read_json(config_folder / "scheduler" / "scheduler_config.json")
    if "_class_name" not in scheduler:
        raise BadInput(f"{config_folder / 'scheduler' / 'scheduler_config.json'}: no _class_name")
    return Pipeline(
        source=source,
        source_hash=source_hash,
        text_encoder=text_encoder.float().eval(),
        unet=unet.float().eval(),
        vae=vae.float().eval(),
        tokenizer=tokenizer,
        scheduler_config=scheduler,
    )
