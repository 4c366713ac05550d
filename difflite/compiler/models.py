"""Load a Stable Diffusion pipeline (SD 1.x / 2.x, or SDXL base): a preset
(difflite/compiler/presets.py), a local diffusers folder, or a single-file checkpoint
(difflite/compiler/single_file.py: architecture inferred, or a diffusers config folder); then a
separate VAE, the prediction type, LoRAs (difflite/compiler/lora.py) and ControlNets
(difflite/compiler/controlnet.py)."""

from __future__ import annotations

from pathlib import Path

from difflite.compiler.pipeline import Pipeline, fold_into_hash, load_folder
from difflite.compiler.presets import build_preset, preset_configs
from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json
from difflite.core.lora import LoraSpec


def peek_configs(model: str) -> tuple[dict, dict] | None:
    """The UNet's and the VAE's configs of a preset or a diffusers folder, read without building
    or importing anything; None for a single file (its architecture comes from its tensors) or
    configs that loading will have to judge."""
    if model.startswith("preset:"):
        configs = preset_configs(model.removeprefix("preset:"))
        return configs["unet"], configs["vae"]
    folder = Path(model).expanduser()
    try:
        unet, vae = (read_json(folder / name / "config.json", what="model config") for name in ("unet", "vae"))
    except BadInput:
        return None

    def listed(config, key: str, kind=object) -> bool:
        values = config.get(key) if isinstance(config, dict) else None
        return isinstance(values, list) and bool(values) and all(isinstance(v, kind) for v in values)

    if listed(unet, "block_out_channels", int) and listed(unet, "down_block_types") and \
            listed(vae, "block_out_channels", int):
        return unet, vae
    return None


PREDICTION_TYPES = ("epsilon", "v_prediction")


def load_pipeline(model: str, config: str | None = None, seed: int = 0, *, vae: str | None = None,
                  prediction_type: str | None = None, loras: tuple[LoraSpec, ...] = (),
                  controlnets: tuple[str, ...] = ()) -> Pipeline:
    """Load "preset:NAME", a diffusers folder, or a .safetensors/.ckpt file (architecture inferred
    from its keys unless `config` names a diffusers folder); then swap in a separate VAE, set the
    prediction type, merge LoRAs and add ControlNets (each a preset, folder or file, read before
    the base model loads), each recorded in `details` and folded into `source_hash`."""
    if prediction_type is not None and prediction_type not in PREDICTION_TYPES:
        raise BadInput(f"--prediction-type {prediction_type!r}: choose from {', '.join(PREDICTION_TYPES)}")
    sources = []
    if controlnets:
        from difflite.compiler import controlnet

        sources = controlnet.read_sources(tuple(controlnets), seed)
    pipe = _load_base(str(model), config, seed, prediction_type)
    if vae is not None:
        from difflite.compiler.single_file import replace_vae

        replace_vae(pipe, Path(vae).expanduser().absolute())
    if prediction_type is not None:
        _set_prediction_type(pipe, prediction_type)
    if loras:
        from difflite.compiler.lora import merge_loras

        merge_loras(pipe, tuple(loras))
    if sources:
        controlnet.attach(pipe, sources, seed)
    return pipe


def _load_base(model: str, config: str | None, seed: int, prediction_type: str | None) -> Pipeline:
    if model.startswith("preset:"):
        return build_preset(model.removeprefix("preset:"), seed)
    path = Path(model).expanduser().absolute()
    if not path.exists():
        raise BadInput(f"{path}: no such file or folder")
    if path.is_dir():
        return load_folder(path)
    if path.suffix not in (".safetensors", ".ckpt"):
        raise BadInput(f"{path}: not a diffusers folder, .safetensors or .ckpt file")
    from difflite.compiler.single_file import load_single_file

    return load_single_file(path, Path(config).expanduser().absolute() if config else None, prediction_type)


def _set_prediction_type(pipe: Pipeline, prediction_type: str) -> None:
    if pipe.scheduler_config.get("prediction_type", "epsilon") == prediction_type:
        return
    pipe.scheduler_config = {**pipe.scheduler_config, "prediction_type": prediction_type}
    fold_into_hash(pipe, f"prediction_type={prediction_type}")
