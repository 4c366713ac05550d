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
from difflite.folder.output_folder import inpaint_channels, unsupported_input_channels
from difflite.folder.tokenizer import check_token_ids

COMPONENTS = ("text_encoder", "unet", "vae")
# SDXL (a UNet with addition_embed_type "text_time") adds the second text encoder and tokenizer
SDXL_COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae")
_MODEL_CLASSES = {"text_encoder": "CLIPTextModel", "unet": "UNet2DConditionModel", "vae": "AutoencoderKL"}
_SDXL_MODEL_CLASSES = {**_MODEL_CLASSES, "text_encoder_2": "CLIPTextModelWithProjection"}
# SDXL base's UNet takes 6 time ids (original size, crop top-left, target size); the refiner 5
# (original size, crop top-left, aesthetic score)
SDXL_TIME_IDS = 6
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
        """Write the pipeline as a diffusers folder: StableDiffusion(Inpaint)Pipeline's layout, or
        StableDiffusionXLPipeline's for SDXL (text_encoder_2, tokenizer_2)."""
        sdxl = self.family == "sdxl"
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in SDXL_COMPONENTS if sdxl else COMPONENTS:
            getattr(self, name).save_pretrained(folder / name, safe_serialization=True)
        self.save_tokenizer(folder / "tokenizer")
        self.save_scheduler(folder / "scheduler")
        index = {
            "feature_extractor": [None, None],
            "image_encoder": [None, None],
            "scheduler": ["diffusers", self.scheduler_config["_class_name"]],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        }
        if sdxl:
            self.save_tokenizer(folder / "tokenizer_2", self.tokenizer_2)
            index.update({"_class_name": "StableDiffusionXLInpaintPipeline" if self.inpainting
                          else "StableDiffusionXLPipeline", "force_zeros_for_empty_prompt": True,
                          "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                          "tokenizer_2": ["transformers", "CLIPTokenizer"]})
        else:
            index.update({"requires_safety_checker": False, "safety_checker": [None, None],
                          "_class_name": "StableDiffusionInpaintPipeline" if self.inpainting
                          else "StableDiffusionPipeline"})
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
    """Validate the layout of a diffusers Stable Diffusion folder (StableDiffusionXLPipeline's too:
    a text_time UNet); return model_index.json."""
    if not folder.is_dir():
        raise BadInput(f"{folder}: not a folder")
    if not (folder / "model_index.json").is_file():
        raise BadInput(f"{folder}: not a diffusers folder (no model_index.json)")
    index = _read_json(folder / "model_index.json")
    classes = _MODEL_CLASSES
    if is_sdxl_folder(folder, index):
        classes = _SDXL_MODEL_CLASSES
        entry = index.get("text_encoder")
        if entry is None or (isinstance(entry, list) and entry[-1:] in ([], [None])):
            raise BadInput(f"{folder}: an SDXL refiner (no text_encoder: OpenCLIP's text_encoder_2 only, "
                           f"aesthetic-score time ids) is not supported: SDXL base only")
        encoder_2 = folder / "text_encoder_2" / "config.json"
        if not encoder_2.is_file():
            raise BadInput(f"{encoder_2}: missing (an SDXL folder's second text encoder)")
        check_sdxl_configs(folder, _read_json(folder / "unet" / "config.json"), _read_json(encoder_2))
    for name, cls in classes.items():
        entry = index.get(name)
        if not isinstance(entry, list) or len(entry) != 2 or entry[1] != cls:
            raise BadInput(f"{folder / 'model_index.json'}: expected {name} = {cls}, got {entry!r}")
        if not (folder / name / "config.json").is_file():
            raise BadInput(f"{folder / name / 'config.json'}: missing")
        _read_json(folder / name / "config.json")
    if not (folder / "scheduler" / "scheduler_config.json").is_file():
        raise BadInput(f"{folder / 'scheduler' / 'scheduler_config.json'}: missing")
    _read_json(folder / "scheduler" / "scheduler_config.json")
    for tokenizer in tokenizer_names(folder, index):
        tok = folder / tokenizer
        if not ((tok / "vocab.json").is_file() and (tok / "merges.txt").is_file()) and \
                not (tok / "tokenizer.json").is_file():
            raise BadInput(f"{tok}: missing tokenizer files (vocab.json + merges.txt or tokenizer.json)")
        for path in sorted(tok.glob("*.json")):  # bounded here, before transformers parses them unbounded
            read_json(path, what="tokenizer file")
    return index


def is_sdxl_folder(folder: Path, index: dict) -> bool:
    """An SDXL folder: its UNet is conditioned on text_time (SDXL's pooled text embedding and time
    ids); an SDXL refiner folder (refused by check_sdxl_configs) too."""
    unet = folder / "unet" / "config.json"
    entry = index.get("unet")
    if not isinstance(entry, list) or entry[-1:] != ["UNet2DConditionModel"] or not unet.is_file():
        return False
    return _read_json(unet).get("addition_embed_type") == "text_time"


def check_sdxl_configs(source: Path, unet: dict, text_encoder_2: dict) -> None:
    """Refuse the SDXL variants difflite does not convert, in one line naming `source`: the refiner
    (5 time ids: the aesthetic score in place of the target size; no CLIP-L text encoder) and a
    UNet whose input is neither the latents nor an inpainting UNet's 9 channels."""
    in_channels, out_channels = unet.get("in_channels"), unet.get("out_channels", 4)
    refused = unsupported_input_channels(in_channels, out_channels) \
        if isinstance(in_channels, int) and isinstance(out_channels, int) else None
    if refused:
        raise BadInput(f"{source}: an SDXL {refused}")
    try:
        ids, rest = divmod(int(unet["projection_class_embeddings_input_dim"]) - int(text_encoder_2["projection_dim"]),
                           int(unet["addition_time_embed_dim"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise BadInput(f"{source}: an SDXL UNet config needs projection_class_embeddings_input_dim and "
                       f"addition_time_embed_dim, and text_encoder_2 a projection_dim") from None
    if not rest and ids == SDXL_TIME_IDS - 1:
        raise BadInput(f"{source}: an SDXL refiner ({ids} time ids: the aesthetic score's) is not supported: "
                       f"SDXL base's {SDXL_TIME_IDS} time ids only")
    if rest or ids != SDXL_TIME_IDS:
        found = ids + rest / int(unet["addition_time_embed_dim"])
        raise BadInput(f"{source}: the UNet's added embedding takes text_encoder_2's projection and {found:g} "
                       f"time ids, not SDXL base's {SDXL_TIME_IDS}: not supported")


def tokenizer_names(folder: Path, index: dict) -> tuple[str, ...]:
    return ("tokenizer", "tokenizer_2") if is_sdxl_folder(folder, index) else ("tokenizer",)


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
    index = _read_json(folder / "model_index.json")
    sdxl = is_sdxl_folder(folder, index)
    names = ["model_index.json", "scheduler/scheduler_config.json"]
    names += [f"{c}/config.json" for c in (SDXL_COMPONENTS if sdxl else COMPONENTS)]
    for tokenizer in tokenizer_names(folder, index):
        names += sorted(f"{tokenizer}/{p.name}" for p in (folder / tokenizer).iterdir() if p.is_file())
    return [(n, folder / n) for n in names]


def load_folder(folder: Path) -> Pipeline:
    """A diffusers folder (save_pretrained's layout) as a Pipeline, its weight and config files hashed."""
    index = check_config_folder(folder)  # before seconds of importing diffusers and transformers
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    sdxl = is_sdxl_folder(folder, index)
    files = config_files(folder)
    for name in SDXL_COMPONENTS if sdxl else COMPONENTS:
        weights = weight_files(folder / name)
        if not weights:
            raise BadInput(f"{folder / name}: no weight file (.safetensors or .bin)")
        files += [(f"{name}/{w.name}", w) for w in weights]
    unet = from_pretrained(UNet2DConditionModel, folder / "unet")
    vae = from_pretrained(AutoencoderKL, folder / "vae")
    text_encoder = from_pretrained(CLIPTextModel, folder / "text_encoder")
    text_encoder.set_attn_implementation("eager")
    text_encoder_2 = None
    if sdxl:
        text_encoder_2 = from_pretrained(CLIPTextModelWithProjection, folder / "text_encoder_2")
        text_encoder_2.set_attn_implementation("eager")
    return assemble(str(folder), hash_files(files), folder, text_encoder, unet, vae, text_encoder_2)


def from_pretrained(cls, path: Path):
    _read_json(path / "config.json")  # bounded here, before the loaders parse it unbounded
    # Mismatched shapes are reported back rather than raised so the message can name the tensor.
    kwargs = {"local_files_only": True, "output_loading_info": True, "ignore_mismatched_sizes": True}
    if cls.__name__ in ("CLIPTextModel", "CLIPTextModelWithProjection"):
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


def assemble(source: str, source_hash: str, config_folder: Path, text_encoder, unet, vae,
             text_encoder_2=None) -> Pipeline:
    """The Pipeline of loaded models and the folder's tokenizer(s) and scheduler config; with
    `text_encoder_2` (SDXL) the folder's tokenizer_2 too."""
    tokenizer = load_tokenizer(config_folder / "tokenizer", text_encoder)
    scheduler = _read_json(config_folder / "scheduler" / "scheduler_config.json")
    if "_class_name" not in scheduler:
        raise BadInput(f"{config_folder / 'scheduler' / 'scheduler_config.json'}: no _class_name")
    extra = {}
    if text_encoder_2 is not None:
        extra = {"text_encoder_2": text_encoder_2.float().eval(),
                 "tokenizer_2": load_tokenizer(config_folder / "tokenizer_2", text_encoder_2)}
    return Pipeline(
        source=source,
        source_hash=source_hash,
        text_encoder=text_encoder.float().eval(),
        unet=unet.float().eval(),
        vae=vae.float().eval(),
        tokenizer=tokenizer,
        scheduler_config=scheduler,
        **extra,
    )


def check_tokenizer_files(folder: Path, vocabulary: int) -> None:
    """The token ids of `folder`'s vocab.json and tokenizer.json, checked before the tokenizers
    library reads them: an id near 2**31 there costs it time and memory in proportion (~37 s)."""
    for name in ("vocab.json", "tokenizer.json"):
        path = folder / name
        if path.is_file():
            data = read_json(path, what="tokenizer file")
            pipeline = {"model": {"vocab": data}} if name == "vocab.json" and isinstance(data, dict) else data
            check_token_ids(path, pipeline, vocabulary)


def load_tokenizer(folder: Path, text_encoder):
    """A CLIPTokenizer from `folder`, checked to fit `text_encoder`'s vocabulary."""
    from transformers import CLIPTokenizer

    vocab_size = text_encoder.config.vocab_size
    check_tokenizer_files(folder, vocab_size)
    try:
        tokenizer = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise BadInput(f"{folder}: cannot load the tokenizer: {one_line(e)}") from e
    if len(tokenizer) > vocab_size:
        raise BadInput(f"{folder}: {len(tokenizer)} tokens but the text encoder has {vocab_size}")
    check_token_ids(folder, tokenizer_pipeline(tokenizer)[1], vocab_size)
    return tokenizer
