"""The pipeline being converted (text encoder, UNet, VAE, tokenizer, scheduler config), and what
every source loader shares: reading a diffusers folder's parts, writing tokenizer files, folding
later changes into the source hash."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from difflite.core.errors import BadInput
from difflite.core.jsonfile import loads_json, read_json
from difflite.folder.output_folder import inpaint_channels
from difflite.folder.tokenizer import check_token_ids

COMPONENTS = ("text_encoder", "unet", "vae")
_MODEL_CLASSES = {"text_encoder": "CLIPTextModel", "unet": "UNet2DConditionModel", "vae": "AutoencoderKL"}
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
MAX_LENGTH = 77

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
    # architecture was inferred ("architecture"), the LoRAs merged ("loras"), the ControlNets
    # ("controlnets"), and the like.
    details: dict = field(default_factory=dict)
    # diffusers ControlNetModels (--controlnet, difflite/compiler/controlnet.py): components
    # controlnet_0, controlnet_1, ... in this order; with any, the UNet takes their residuals
    controlnets: list = field(default_factory=list)
    # SDXL (issue 32): the second text encoder (transformers.CLIPTextModelWithProjection, eager
    # attention) and its tokenizer; None for SD 1.x / 2.x
    text_encoder_2: object = None
    tokenizer_2: object = None

    @property
    def family(self) -> str:
        """"sdxl" for a UNet conditioned on text_time (SDXL's pooled text embedding and time ids,
        diffusers' added_cond_kwargs), else "sd" (SD 1.x / 2.x)."""
        return "sdxl" if self.unet.config.get("addition_embed_type") == "text_time" else "sd"

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def inpainting(self) -> bool:
        """An inpainting UNet: its sample is the latents, the mask and the masked picture's latents
        (9 channels for SD's 4-channel latents), as diffusers' StableDiffusionInpaintPipeline runs it."""
        return int(self.unet.config.in_channels) == inpaint_channels(int(self.vae.config.latent_channels))

    @property
    def default_size(self) -> int:
        """The image size the UNet was trained at (its config's sample_size, in pixels)."""
        return int(self.unet.config.sample_size) * self.vae_scale_factor

    def save_tokenizer(self, folder: Path, tokenizer=None) -> None:
        """Write vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json (what
        transformers loads), and tokenizer.json (what `generate` loads without transformers), of
        `tokenizer` (default: the pipeline's first)."""
        from difflite.folder.tokenizer import save_pipeline

        tok = self.tokenizer if tokenizer is None else tokenizer
        pipeline_json, pipeline = tokenizer_pipeline(tok)
        model = pipeline["model"]
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        special = {"bos_token": str(tok.bos_token), "eos_token": str(tok.eos_token),
                   "unk_token": str(tok.unk_token), "pad_token": str(tok.pad_token)}
        _write_tokenizer_files(Path(folder), model["vocab"], merges, special, tok.model_max_length)
        save_pipeline(pipeline_json, folder)

    def save_scheduler(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "scheduler_config.json", self.scheduler_config)

    def save_pretrained(self, folder: Path) -> None:
        if self.family != "sd":
            raise BadInput(f"{self.source}: saving an SDXL pipeline as a diffusers folder is not supported yet")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in COMPONENTS:
            getattr(self, name).save_pretrained(folder / name, safe_serialization=True)
        self.save_tokenizer(folder / "tokenizer")
        self.save_scheduler(folder / "scheduler")
        index = {
            "_class_name": "StableDiffusionInpaintPipeline" if self.inpainting else "StableDiffusionPipeline",
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
        write_json(folder / "model_index.json", index)


def fold_into_hash(pipe: Pipeline, *parts: str) -> None:
    """Make the source hash depend on what was changed after loading (a VAE, LoRAs, options)."""
    h = hashlib.sha256(pipe.source_hash.encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    pipe.source_hash = h.hexdigest()



def _write_tokenizer_files(folder: Path, vocab: dict[str, int], merges: list, special: dict,
                           max_length: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    (folder / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": max_length, "do_lower_case": True,
              "errors": "replace", "add_prefix_space": False, **special}
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "special_tokens_map.json", special)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")



# ---------------------------------------------------------------------------------------------
# Diffusers folders


def one_line(error: BaseException) -> str:
    """The error's first line; a heading that ends in ":" ("Error(s) in loading state_dict for X:")
    gets the line after it, which names what went wrong."""
    text = [t.strip() for t in str(error).strip().splitlines() if t.strip()]
    line = text[0] if text else type(error).__name__
    if line.endswith(":") and len(text) > 1:
        line = f"{line} {text[1]}"
    return line if len(line) <= 300 else line[:297] + "..."


def tokenizer_pipeline(tokenizer) -> tuple[str, dict]:
    """A transformers tokenizer's tokenizers-library pipeline (what OUT/tokenizer/tokenizer.json
    holds): its JSON text and values."""
    text = tokenizer.backend_tokenizer.to_str()
    return text, loads_json(text, source=f"{tokenizer.name_or_path}: the tokenizer's pipeline")


def _read_json(path: Path) -> dict:
    data = read_json(path, what="model config")
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return data


def check_config_folder(folder: Path) -> dict:
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
        config = _read_json(folder / name / "config.json")
        if name == "unet" and config.get("addition_embed_type") == "text_time":
            raise BadInput(f"{folder}: an SDXL diffusers folder (text_time UNet); loading SDXL folders is not "
                           f"supported yet (issue 32: preset:sdxl-tiny converts)")
    if not (folder / "scheduler" / "scheduler_config.json").is_file():
        raise BadInput(f"{folder / 'scheduler' / 'scheduler_config.json'}: missing")
    _read_json(folder / "scheduler" / "scheduler_config.json")
    tok = folder / "tokenizer"
    if not ((tok / "vocab.json").is_file() and (tok / "merges.txt").is_file()) and not (tok / "tokenizer.json").is_file():
        raise BadInput(f"{tok}: missing tokenizer files (vocab.json + merges.txt or tokenizer.json)")
    for path in sorted(tok.glob("*.json")):  # bounded here, before transformers parses them unbounded
        read_json(path, what="tokenizer file")
    return index


def weight_files(component: Path) -> list[Path]:
    """The weight files from_pretrained reads: plain (non-variant) safetensors, else .bin."""
    for pattern in ("*.safetensors", "*.bin"):
        files = [f for f in component.glob(pattern) if f.name.count(".") == 1]
        if files:
            return sorted(files)
    return []


def hash_files(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in files:
        h.update(label.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def config_files(folder: Path) -> list[tuple[str, Path]]:
    """Files other than weights that change the pipeline (configs, tokenizer)."""
    names = ["model_index.json", "scheduler/scheduler_config.json"]
    names += [f"{c}/config.json" for c in COMPONENTS]
    names += sorted(f"tokenizer/{p.name}" for p in (folder / "tokenizer").iterdir() if p.is_file())
    return [(n, folder / n) for n in names]


def load_folder(folder: Path) -> Pipeline:
    """A diffusers folder (save_pretrained's layout) as a Pipeline, its weight and config files hashed."""
    check_config_folder(folder)  # before seconds of importing diffusers and transformers
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    files = config_files(folder)
    for name in COMPONENTS:
        weights = weight_files(folder / name)
        if not weights:
            raise BadInput(f"{folder / name}: no weight file (.safetensors or .bin)")
        files += [(f"{name}/{w.name}", w) for w in weights]
    unet = from_pretrained(UNet2DConditionModel, folder / "unet")
    vae = from_pretrained(AutoencoderKL, folder / "vae")
    text_encoder = from_pretrained(CLIPTextModel, folder / "text_encoder")
    text_encoder.set_attn_implementation("eager")
    return assemble(str(folder), hash_files(files), folder, text_encoder, unet, vae)


def from_pretrained(cls, path: Path):
    _read_json(path / "config.json")  # bounded here, before the loaders parse it unbounded
    # Mismatched shapes are reported back rather than raised so the message can name the tensor.
    kwargs = {"local_files_only": True, "output_loading_info": True, "ignore_mismatched_sizes": True}
    if cls.__name__ == "CLIPTextModel":
        kwargs.update(attn_implementation="eager", dtype=torch.float32)
    else:
        kwargs.update(low_cpu_mem_usage=False)  # the default wants accelerate and warns without it
    try:
        with quiet_loaders():
            model, info = cls.from_pretrained(str(path), **kwargs)
    except Exception as e:  # loaders raise many types; all mean bad input here
        raise BadInput(f"{path}: cannot load {cls.__name__}: {one_line(e)}") from e
    mismatched = sorted(info.get("mismatched_keys", []))
    if mismatched:
        key, found, needed = mismatched[0]
        raise BadInput(f"{path}: {key} has shape {tuple(found)}, the config needs {tuple(needed)}")
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise BadInput(f"{path}: missing weights {missing[:3]}")
    return model


@contextlib.contextmanager
def quiet_loaders():
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


def assemble(source: str, source_hash: str, config_folder: Path, text_encoder, unet, vae) -> Pipeline:
    from transformers import CLIPTokenizer

    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(config_folder / "tokenizer"), local_files_only=True)
    except Exception as e:
        raise BadInput(f"{config_folder / 'tokenizer'}: cannot load the tokenizer: {one_line(e)}") from e
    vocab_size = text_encoder.config.vocab_size
    if len(tokenizer) > vocab_size:
        raise BadInput(f"{config_folder / 'tokenizer'}: {len(tokenizer)} tokens but the text encoder has {vocab_size}")
    check_token_ids(config_folder / "tokenizer", tokenizer_pipeline(tokenizer)[1], vocab_size)
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
