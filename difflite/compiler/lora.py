"""LoRA files merged into the pipeline's weights before export (--lora FILE[:SCALE]).

diffusers reads and converts the file (`StableDiffusionLoraLoaderMixin.lora_state_dict`, which
turns kohya/A1111 keys into diffusers ones), injects PEFT LoRA layers (`load_lora_into_unet`,
`load_lora_into_text_encoder`), fuses them at the requested scale (`fuse_lora`) and takes the
PEFT layers out again (`unload_lora_weights`), leaving plain Linear/Conv2d modules with merged
weights. What this module adds around that:

* Every file is read and checked before anything is merged: which of its LoRA layers name a
  Linear/Conv2d of this UNet or text encoder with matching shapes. No match at all is bad input;
  layers that match nothing are reported on stderr and skipped (PEFT would fail on them or
  diffusers only log them); only the matching layers are handed on.
* kohya files: each layer's `alpha / rank` is folded into its `lora_down` weight before diffusers
  sees the file, and the `.alpha` tensors are dropped. diffusers 0.42 names the per-layer alphas of
  kohya attention layers `...processor.to_q_lora.down.weight.alpha` (and of text-encoder layers by
  their parent module), so PEFT's alpha_pattern matches no module and those layers get the most
  common alpha instead of their own (PEFT warns "alpha_pattern keys did not match any targeted
  module"). Without alphas diffusers uses alpha == rank, a factor of exactly 1.
* transformers 5 flattened CLIPTextModel (no `text_model.` in its module names). diffusers 0.42
  strips `text_model.` from the LoRA keys itself when the model has no `text_model`; the alpha
  folding above covers the alpha names it does not strip. (SDXL's text_encoder_2, a
  CLIPTextModelWithProjection, keeps its `text_model.`.)
* SDXL pipelines take text_encoder_2 LoRA layers too (kohya `lora_te2_`, diffusers `text_encoder_2.`),
  through StableDiffusionXLLoraLoaderMixin as diffusers' StableDiffusionXLPipeline.load_lora_weights
  does: kohya UNet names in the original (SGM) layout (`lora_unet_input_blocks_4_1_...`) are mapped by
  the UNet's config.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from difflite.compiler.pipeline import fold_into_hash, one_line, quiet_loaders
from difflite.core.errors import BadInput
from difflite.core.lora import check_scale
from difflite.core.finite import check_finite
from difflite.core.jsonfile import loads_json

_KOHYA_PREFIXES = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")
_KOHYA_SUFFIXES = (".lora_down.weight", ".lora_up.weight", ".alpha")
# Tensors of LoRA variants whose merge is not W + B @ A: refused rather than merged wrongly.
_UNSUPPORTED = ("dora_scale", "lora_magnitude_vector", "lora_B.bias")
_PEFT_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
COMPONENTS = ("unet", "text_encoder")
SDXL_COMPONENTS = (*COMPONENTS, "text_encoder_2")
_LABELS = {"unet": "UNet", "text_encoder": "text encoder", "text_encoder_2": "text encoder 2"}


@dataclass
class _Lora:
    """One checked LoRA file: its layers that match the model, in PEFT form per component."""
    path: Path
    scale: float
    sha256: str
    format: str
    metadata: dict | None
    layers: dict = field(default_factory=dict)  # component -> {module name: (A, B)}
    totals: dict = field(default_factory=dict)  # component -> LoRA layers in the file


def merge_loras(pipe, loras) -> None:
    """Merge each LoRA into pipe.unet / pipe.text_encoder (/ pipe.text_encoder_2: SDXL) in order, at
    its own scale; record it in
    pipe.details["loras"] and fold its sha256 and scale into pipe.source_hash."""
    _require_peft()
    checked = [_check(pipe, spec) for spec in loras]  # all files checked before any merge
    for index, lora in enumerate(checked):
        _warn_partial(lora)
        _merge(pipe, lora, f"difflite_lora_{index}")
        counts = {name: len(lora.layers[name]) for name in _components(pipe)}
        pipe.details.setdefault("loras", []).append({
            "file": lora.path.name, "path": str(lora.path), "sha256": lora.sha256, "scale": lora.scale,
            "format": lora.format, "layers": counts, "summary": _summary(lora.format, counts),
        })
        fold_into_hash(pipe, f"lora={lora.sha256}:{lora.scale}")


def _require_peft() -> None:
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise BadInput("--lora needs the peft package (pip install peft==0.21.2)")


def _components(pipe) -> tuple[str, ...]:
    """The pipeline's LoRA-loadable models."""
    return SDXL_COMPONENTS if pipe.family == "sdxl" else COMPONENTS


def _summary(fmt: str, counts: dict) -> str:
    parts = [f"{n} {_LABELS[name]}" for name, n in counts.items() if n]
    return f"{fmt}, {' + '.join(parts)} layer{'' if sum(counts.values()) == 1 else 's'}"


# ---------------------------------------------------------------------------------------------
# Reading and checking a file


def _read(path: Path) -> tuple[bytes, dict[str, torch.Tensor], dict]:
    from safetensors.torch import load

    if not path.exists():
        raise BadInput(f"{path}: no such LoRA file")
    if path.is_dir():
        raise BadInput(f"{path}: a folder, not a .safetensors LoRA file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: cannot read the LoRA file ({e.strerror or e})") from e
    try:
        tensors = load(data)
    except Exception as e:  # safetensors raises its own error type, or others on garbage
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"{path}: not a .safetensors file ({reason[:200]}); LoRAs are read from .safetensors "
                       f"only") from e
    header = loads_json(data[8:8 + int.from_bytes(data[:8], "little")], source=path, what="safetensors header")
    if not tensors:
        raise BadInput(f"{path}: the LoRA file holds no tensors")
    return data, tensors, header.get("__metadata__") or {}


def _check(pipe, spec) -> _Lora:
    from diffusers.loaders import (
        StableDiffusionLoraLoaderMixin,
        StableDiffusionXLLoraLoaderMixin,
    )

    components = _components(pipe)
    sdxl = components == SDXL_COMPONENTS
    path = Path(spec.path).expanduser().absolute()
    scale = check_scale(float(spec.scale), str(path))
    data, tensors, file_metadata = _read(path)
    keys = sorted(tensors)
    for key in keys:
        if any(mark in key for mark in _UNSUPPORTED):
            raise BadInput(f"{path}: tensor {key} is not plain LoRA (DoRA and LoRA biases are not supported)")
        if tensors[key].is_floating_point() and not torch.isfinite(tensors[key]).all():
            raise BadInput(f"{path}: tensor {key} holds NaN or infinite values")
    # The model is float32: LoRAs stored in float16/bfloat16 are merged in float32.
    tensors = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in tensors.items()}
    # kohya layout: lora_unet_* / lora_te*_ keys, possibly beside others that are no LoRA layer of
    # ours (e.g. bundled textual-inversion embeddings), which are set aside and reported as skipped.
    is_kohya = any(k.startswith(_KOHYA_PREFIXES) for k in keys) and \
        not any(k.startswith(tuple(f"{c}." for c in SDXL_COMPONENTS)) for k in keys)
    metadata, set_aside = None, []
    if is_kohya:
        set_aside = [k for k in keys if not k.startswith(_KOHYA_PREFIXES)]
        tensors = _fold_kohya_alphas(path, {k: v for k, v in tensors.items() if k.startswith(_KOHYA_PREFIXES)})
    elif file_metadata.get("lora_adapter_metadata"):
        metadata = loads_json(file_metadata["lora_adapter_metadata"], source=f"{path}: its lora_adapter_metadata")
        if not isinstance(metadata, dict):
            raise BadInput(f"{path}: its lora_adapter_metadata is not a JSON object")
    try:
        if sdxl:  # kohya's SDXL UNet names follow the original layout: mapped by the UNet's config
            state_dict, _ = StableDiffusionXLLoraLoaderMixin.lora_state_dict(tensors, unet_config=pipe.unet.config)
        else:
            state_dict, _ = StableDiffusionLoraLoaderMixin.lora_state_dict(tensors)
    except Exception as e:
        raise BadInput(f"{path}: diffusers cannot read this LoRA: {one_line(e)}") from e
    lora = _Lora(path, scale, hashlib.sha256(data).hexdigest(), "kohya" if is_kohya else "diffusers", metadata)
    unmatched: dict[str, set] = {}
    for component in components:
        part = {k.removeprefix(f"{component}."): v for k, v in state_dict.items() if k.startswith(f"{component}.")}
        model = getattr(pipe, component)
        layers, missing = _match(path, component, model, _to_peft(component, part, model))
        lora.layers[component] = layers
        lora.totals[component] = len(layers) + len(missing)
    # Keys for no component of ours (an SDXL text_encoder_2 on SD 1.x / 2.x, another model's names).
    others = [k for k in state_dict if not k.startswith(tuple(f"{c}." for c in components))] + set_aside
    for key in others:
        head = "text_encoder_2" if key.startswith("text_encoder_2.") else "other"
        unmatched.setdefault(head, set()).add(_layer_name(key))
    for head, names in unmatched.items():
        lora.totals[head] = len(names)
    if not any(lora.layers[c] for c in components):
        sample = ", ".join(repr(k) for k in keys[:2])
        models, family = ("UNet or text encoders", "SDXL") if sdxl else \
            ("UNet or text encoder", "Stable Diffusion 1.x/2.x")
        raise BadInput(f"{path}: none of its {sum(lora.totals.values())} LoRA layers matches a layer of this "
                       f"model's {models} (keys look like {sample}); is it a LoRA for {family}?")
    return lora


def _fold_kohya_alphas(path: Path, tensors: dict) -> dict:
    """kohya scales each layer by alpha / rank (rank = lora_down's first dimension; no alpha means
    alpha == rank). Fold that factor into lora_down and drop the alphas (see the module doc)."""
    names = {}
    for key in tensors:
        if not key.endswith(_KOHYA_SUFFIXES):
            raise BadInput(f"{path}: tensor {key} is not a kohya LoRA weight (expected .lora_down.weight, "
                           f".lora_up.weight or .alpha; LoHa, LoKr and other LyCORIS types are not supported)")
        name, kind = key.split(".", 1)
        names.setdefault(name, set()).add(kind)
    out = {}
    for name, kinds in names.items():
        if "lora_down.weight" not in kinds or "lora_up.weight" not in kinds:
            have = ", ".join(sorted(kinds))
            raise BadInput(f"{path}: LoRA layer {name} needs lora_down.weight and lora_up.weight (has {have})")
        down = tensors[f"{name}.lora_down.weight"]
        rank = down.shape[0]
        if "alpha" in kinds:
            alpha = tensors[f"{name}.alpha"]
            if alpha.numel() != 1:
                raise BadInput(f"{path}: {name}.alpha has shape {tuple(alpha.shape)}, expected a scalar")
            factor = float(alpha.reshape(()).item()) / rank
            down = (down.double() * factor).to(down.dtype)
        out[f"{name}.lora_down.weight"] = down
        out[f"{name}.lora_up.weight"] = tensors[f"{name}.lora_up.weight"]
    return out


def _to_peft(component: str, part: dict, model) -> dict:
    """A component's LoRA keys in PEFT form (`<module>.lora_A.weight`), renamed by diffusers' own
    conversion tables as its loaders would (with the source layout named rather than guessed:
    its guess fails on, e.g., a text-encoder LoRA without out_proj layers)."""
    from diffusers.utils.state_dict_utils import (
        StateDictType,
        convert_state_dict_to_diffusers,
        convert_state_dict_to_peft,
        convert_unet_state_dict_to_peft,
    )

    if not part:
        return {}
    if component == "unet":
        return convert_unet_state_dict_to_peft(part)
    part = convert_state_dict_to_diffusers(part, original_type=StateDictType.DIFFUSERS_OLD)
    part = convert_state_dict_to_peft(part, original_type=StateDictType.DIFFUSERS)
    if not hasattr(model, "text_model"):  # transformers 5: flattened CLIPTextModel
        part = {k.removeprefix("text_model."): v for k, v in part.items()}
    return part


def _match(path: Path, component: str, model, part: dict) -> tuple[dict, set]:
    """Split a component's LoRA layers into those that name a Linear/Conv2d of `model` (checked
    shapes; {module: (A, B)}) and the names of the others."""
    pairs: dict[str, dict] = {}
    odd: dict[str, str] = {}  # layer name -> a key of it that is not a lora_A/lora_B weight
    for key, value in part.items():
        m = _PEFT_KEY.match(key)
        if m is None:
            odd.setdefault(_layer_name(key), key)
            continue
        pairs.setdefault(m["module"], {})[m["part"]] = value
    missing = set(odd) - set(pairs)
    modules = dict(model.named_modules())
    layers = {}
    for name, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise BadInput(f"{path}: LoRA layer {component}.{name} has lora_{''.join(ab)} but not both lora_A "
                           f"(down) and lora_B (up)")
        if not (ab["A"].is_floating_point() and ab["B"].is_floating_point()):
            raise BadInput(f"{path}: LoRA layer {component}.{name} has {ab['A'].dtype}/{ab['B'].dtype} weights, "
                           f"not floating point")
        module = modules.get(name)
        if type(module) not in (torch.nn.Linear, torch.nn.Conv2d):
            missing.add(name)
            continue
        if name in odd:  # e.g. an alpha diffusers would not apply: refuse rather than merge it wrong
            raise BadInput(f"{path}: tensor {component}.{odd[name]} is not understood (LoRA layers in the "
                           f"diffusers layout have lora_A/lora_B or lora.down/lora.up weights only)")
        _check_shapes(path, f"{component}.{name}", module, ab["A"], ab["B"])
        layers[name] = (ab["A"], ab["B"])
    return layers, missing


def _layer_name(key: str) -> str:
    """The layer a LoRA key belongs to: the key less its LoRA part (`.lora_A.weight`,
    `.lora.down.weight`, `_lora.down.weight`, `.alpha`, ...)."""
    return re.sub(r"[._](?:lora(?:[._].*)?|alpha)$", "", key)


def _check_shapes(path: Path, name: str, module, down: torch.Tensor, up: torch.Tensor) -> None:
    rank = down.shape[0] if down.ndim else 0
    if isinstance(module, torch.nn.Linear):
        want_down, want_up = (rank, module.in_features), (module.out_features, rank)
    else:
        want_down = (rank, module.in_channels // module.groups, *module.kernel_size)
        want_up = (module.out_channels, rank, 1, 1)
    if rank == 0 or tuple(down.shape) != want_down or tuple(up.shape) != want_up:
        kind = type(module).__name__
        weight = tuple(module.weight.shape)
        raise BadInput(f"{path}: LoRA layer {name} has down {tuple(down.shape)} / up {tuple(up.shape)}, which do "
                       f"not fit the model's {kind} of weight {weight} (a LoRA for another base model?)")


def _warn_partial(lora: _Lora) -> None:
    matched = sum(len(layers) for layers in lora.layers.values())
    total = sum(lora.totals.values())
    if matched == total:
        return
    counts = ", ".join(f"{name} {len(lora.layers.get(name, ()))}/{n}" for name, n in lora.totals.items() if n)
    print(f"difflite: warning: {lora.path}: {total - matched} of its {total} LoRA layers match no layer of the "
          f"model and are skipped (matched: {counts})", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Merging through diffusers + PEFT


def _target_class(sdxl: bool):
    from diffusers.loaders import (
        StableDiffusionLoraLoaderMixin,
        StableDiffusionXLLoraLoaderMixin,
    )

    class Target(StableDiffusionXLLoraLoaderMixin if sdxl else StableDiffusionLoraLoaderMixin):
        """The LoRA-loadable modules of a pipeline, for the mixin's fuse/unload methods."""

        def __init__(self, pipe):
            self.unet = pipe.unet
            self.text_encoder = pipe.text_encoder
            if sdxl:
                self.text_encoder_2 = pipe.text_encoder_2

    return Target


def _merge(pipe, lora: _Lora, adapter: str) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    target = _target_class(pipe.family == "sdxl")(pipe)
    # UNet keys in PEFT form; text-encoder keys in diffusers' `lora_linear_layer` form, the one its
    # text-encoder loader converts to PEFT without guessing.
    unet_sd = {f"unet.{name}.lora_{p}.weight": t for name, (a, b) in lora.layers["unet"].items()
               for p, t in (("A", a), ("B", b))}
    encoders = {c: {f"{c}.{name}.lora_linear_layer.{p}.weight": t
                    for name, (a, b) in layers.items() for p, t in (("down", a), ("up", b))}
                for c, layers in lora.layers.items() if c != "unet"}
    components = [c for c in lora.layers if (unet_sd if c == "unet" else encoders[c])]
    types = {c: {n: type(m) for n, m in getattr(pipe, c).named_modules() if n in lora.layers[c]}
             for c in components}
    try:
        with quiet_loaders():
            if unet_sd:
                target.load_lora_into_unet(unet_sd, network_alphas=None, unet=pipe.unet, adapter_name=adapter,
                                           metadata=_metadata(lora.metadata, "unet"))
            for c, sd in encoders.items():
                if sd:
                    target.load_lora_into_text_encoder(sd, network_alphas=None, text_encoder=getattr(pipe, c),
                                                       prefix=c, adapter_name=adapter,
                                                       metadata=_metadata(lora.metadata, c))
            for c in components:
                _check_injected(lora, c, getattr(pipe, c), adapter)
            target.fuse_lora(components=components, lora_scale=lora.scale, adapter_names=[adapter])
            target.unload_lora_weights()
    except Exception as e:  # diffusers/PEFT raise ValueError, RuntimeError, KeyError... on odd files
        with contextlib.suppress(Exception):  # leave no PEFT layers behind (unmerged: weights as before)
            target.unload_lora_weights()
        if isinstance(e, BadInput):
            raise
        raise BadInput(f"{lora.path}: diffusers could not merge this LoRA: {one_line(e)}") from e
    for c in components:
        model = getattr(pipe, c)
        if any(isinstance(m, BaseTunerLayer) for m in model.modules()):
            raise RuntimeError(f"{lora.path}: PEFT layers left in the {c} after merging")
        after = {n: type(m) for n, m in model.named_modules() if n in types[c]}
        if after != types[c]:
            raise RuntimeError(f"{lora.path}: merged {c} modules changed type")
        for attr in ("lora_scale", "_safe_fusing"):  # left on the UNet by its fuse_lora
            if attr in model.__dict__:
                delattr(model, attr)
        _check_merged(lora, c, model)


def _check_merged(lora: _Lora, component: str, model) -> None:
    """Each merged layer's weight is still finite (finite factors can overflow float32)."""
    modules = dict(model.named_modules())
    for name in lora.layers[component]:
        check_finite(modules[name].weight.detach(),
                     f"{lora.path}: merged at scale {lora.scale:g}, {component}.{name}.weight")


def _check_injected(lora: _Lora, component: str, model, adapter: str) -> None:
    """Every checked layer got a PEFT layer; any other one (a file's metadata may target modules by
    short name, e.g. every q_proj) must add nothing: its lora_B is still PEFT's zero init."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    injected = {n: m for n, m in model.named_modules()
                if isinstance(m, BaseTunerLayer) and adapter in getattr(m, "lora_A", {})}
    absent = sorted(set(lora.layers[component]) - set(injected))
    if absent:
        raise BadInput(f"{lora.path}: diffusers put no LoRA layer on {component}.{absent[0]} "
                       f"({len(absent)} layers of the file left out)")
    for name, module in injected.items():
        if name not in lora.layers[component] and torch.count_nonzero(module.lora_B[adapter].weight):
            raise BadInput(f"{lora.path}: its metadata targets {component}.{name}, which the file has no "
                           f"weights for")


def _metadata(metadata: dict | None, component: str) -> dict | None:
    """diffusers' lora_adapter_metadata (LoraConfig fields per `unet.` / `text_encoder.`), where the
    file has it for this component; None lets diffusers derive the config from the weights."""
    if not metadata or not any(k.startswith(f"{component}.") for k in metadata):
        return None
    return metadata
