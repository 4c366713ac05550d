"""Run-time LoRAs: a LoRA .safetensors file read into per-layer factors, in NumPy.

`read_lora(spec, slots)` gives, for every layer of the file, Factors (down [r, K], up [N, r],
float32) such that W + up @ down is the weight `convert --lora FILE:SCALE` merges (diffusers'
fuse_lora at that scale, compiler/lora.py): scale * (alpha / r) * B @ A, computed in float64 from
the file's values as converted to float32 and rounded to float32 once per factor. The per-layer
factor alpha / r is folded into down, the user's scale into up; scale 0 gives an up of zeros.
`combine` concatenates several files' factors along the rank: the sum of their updates.

Formats (the ones compiler/lora.py merges):
* kohya / A1111: `lora_unet_<module with _ for .>.lora_down.weight` / `.lora_up.weight` /
  `.alpha` (a scalar; none means alpha == rank), `lora_te_` or `lora_te1_` for the text encoder.
  The underscores are mapped back by matching the names of the model's slots. Tensors without
  those prefixes (bundled textual-inversion embeddings and the like) are set aside.
* diffusers / PEFT: `unet.<module>.lora_A.weight` / `.lora_B.weight` (`text_encoder.` with or
  without `text_model.`), with alpha / r from the header's `lora_adapter_metadata` where it has
  keys for the component (LoraConfig fields: r, lora_alpha, rank_pattern, alpha_pattern matched as
  PEFT matches them, use_rslora; PEFT's defaults r = lora_alpha = 8 for the fields it lacks), else
  alpha == rank. The older diffusers names too: `unet.<module>.lora.down.weight`,
  `unet.<attention>[.processor].to_q_lora.down.weight` (to_out_lora: to_out.0),
  `text_encoder.<module>.lora_linear_layer.down.weight` and
  `text_encoder.<attention>.to_q_lora.down.weight` (q_proj, ..., to_out_lora: out_proj).

The file is read without torch and without the safetensors package: its header is bounded
(64 MiB, core/jsonfile.py), every tensor's byte range is checked against the file's size (the
ranges must tile the data exactly, as the safetensors library requires) before anything is read,
and only the tensors of the layers that match slots are read (checked finite; float16, bfloat16,
float32 or float64 as convert takes them, converted to float32 first as convert does). A pickle
(.ckpt/.pt/.bin) is recognised by its first bytes and never unpickled. Any problem is one
BadInput line naming the file, raised before any factor is returned.

Where convert's check is wider than what is read here: a NaN in a tensor set aside (a bundled
embedding) is not looked at; lora_adapter_metadata's target_modules / exclude_modules are not
consulted (the weights say which layers the file has); rank_pattern / alpha_pattern keys must be
module names (letters, digits, _ - . ^ $ |), not other regular expressions, so that matching is
bounded.

Stricter than `convert --lora` on purpose: a file layer that is not a slot of this model (a
LoCon 3x3 convolution, time_emb_proj, a layer of another architecture or of a component this
folder has no slots for, such as SDXL's text_encoder_2) refuses the file instead of being skipped,
since a run-time LoRA applied in part is not the LoRA. LDM-named UNet layers (`input_blocks_1_1_`,
which diffusers does not map for SD 1.x/2.x either) match no slot.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from difflite.core.errors import BadInput
from difflite.core.jsonfile import MAX_BYTES, loads_json
from difflite.core.lora import LoraSpec, check_scale, lora_module_name

MAX_HEADER_BYTES = MAX_BYTES  # the safetensors header's bound (64 MiB)
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Slot:
    """One layer that takes a LoRA at run time, as the folder's manifest describes it."""
    component: str  # "unet" or "text_encoder"
    module: str  # the LoRA files' name (core/lora.py), e.g. "text_model.encoder.layers.0.self_attn.q_proj"
    in_features: int  # K
    out_features: int  # N
    conv: bool  # a 1x1 Conv2d (proj_in / proj_out in SD 1.x) rather than a Linear


@dataclass
class Factors:
    """One layer's update up @ down ([N, K]), alpha / rank folded into down, the scale into up."""
    down: np.ndarray  # [r, K] float32
    up: np.ndarray  # [N, r] float32

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])


Key = tuple[str, str]  # (component, module)


# ---------------------------------------------------------------------------------------------
# The public functions


def read_lora(spec: LoraSpec, slots: Sequence[Slot], max_rank: int | None = None) -> dict[Key, Factors]:
    """The factors of every layer of the LoRA file `spec.path` at `spec.scale`, keyed by
    (component, module) of `slots`; BadInput (one line naming the file) where the file cannot be
    read, is not a plain LoRA, has a layer that is not one of `slots` or does not fit it, or a layer
    of rank above `max_rank`."""
    path = Path(spec.path).expanduser().absolute()
    scale = check_scale(float(spec.scale), str(path))
    by_key = {(s.component, s.module): s for s in slots}
    with _open(path) as file:
        header = _Header.read(path, file)
        layers, fmt = _parse_layers(path, header, by_key)
        configs = _peft_configs(path, header.metadata) if fmt == "diffusers" else {}
        matched = _match(path, layers, by_key, header, max_rank)
        # PEFT's alpha / r, checked for every layer before any tensor is read (kohya's are tensors)
        scalings = {key: _peft_scaling(path, configs.get(key[0]), layer, header.entries[layer.keys["down"]].shape[0])
                    for key, layer in sorted(matched.items())} if fmt == "diffusers" else {}
        return {key: _factors(path, file, header, layer, scalings.get(key), scale)
                for key, layer in sorted(matched.items())}


def combine(per_file: Sequence[Mapping[Key, Factors]], max_rank: int | None = None,
            names: Sequence[str] | None = None) -> dict[Key, Factors]:
    """Several LoRAs at once: per layer, the downs stacked and the ups side by side, so that
    up @ down is the sum of the files' updates (what merging them one after the other gives).
    BadInput where a layer's summed rank exceeds `max_rank`; `names` (the files, in order) name
    them in that message."""
    ranks: dict[Key, list[int]] = {}
    for factors in per_file:
        for key, f in factors.items():
            ranks.setdefault(key, []).append(f.rank)
    if max_rank is not None:
        for key, parts in ranks.items():
            if sum(parts) > max_rank:
                who = ", ".join(str(n) for n in names) if names else f"the {len(per_file)} LoRAs"
                raise BadInput(f"{who}: together they give layer {_name(key)} rank {sum(parts)} "
                               f"({' + '.join(map(str, parts))}), more than the {max_rank} this folder's LoRA "
                               f"slots take")
    out = {}
    for key in ranks:
        parts = [factors[key] for factors in per_file if key in factors]
        if len(parts) == 1:
            out[key] = Factors(parts[0].down, parts[0].up)
        else:
            out[key] = Factors(np.concatenate([p.down for p in parts], axis=0),
                               np.concatenate([p.up for p in parts], axis=1))
    return out


def _name(key: Key) -> str:
    return f"{key[0]}.{key[1]}"


# ---------------------------------------------------------------------------------------------
# The safetensors file: header and byte ranges, checked before anything is read

# dtype -> bits per element (the safetensors format's dtypes)
_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
               "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
               "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
_FLOATS = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}  # converted to float32 as convert does
_INTS = {"U8": "<u1", "I8": "<i1", "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8",
         "U64": "<u8"}
_NOT_SAFETENSORS = "LoRAs are read from .safetensors only"
_MAX_NAME = 1024  # characters of a tensor name (real ones: under 200)


def _show(value, limit: int = 60) -> str:
    """A value of the file in a message: JSON (escaped, so one line), cut short."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[:limit] + "..."


def _not_safetensors(path: Path, why: str) -> BadInput:
    return BadInput(f"{path}: not a .safetensors file ({why}); {_NOT_SAFETENSORS}")


def _open(path: Path):
    if not path.exists():
        raise BadInput(f"{path}: no such LoRA file")
    if path.is_dir():
        raise BadInput(f"{path}: a folder, not a .safetensors LoRA file")
    if not path.is_file():  # a FIFO or a device would block or never end
        raise BadInput(f"{path}: not a regular file, not a .safetensors LoRA file")
    try:
        return open(path, "rb")
    except OSError as e:
        raise BadInput(f"{path}: cannot read the LoRA file ({e.strerror or e})") from e


def _sniff(head: bytes) -> str | None:
    """What a file that is not safetensors looks like, from its first bytes."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a Python pickle, as .ckpt/.pt/.bin files are: difflite never unpickles"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive, as torch.save writes .ckpt/.pt files: difflite never unpickles"
    return None


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int


@dataclass
class _Header:
    entries: dict[str, _Entry]
    metadata: dict[str, str]

    @classmethod
    def read(cls, path: Path, file) -> _Header:
        try:
            size = os.fstat(file.fileno()).st_size
            head = file.read(9)
        except OSError as e:
            raise BadInput(f"{path}: cannot read the LoRA file ({e.strerror or e})") from e
        if (kind := _sniff(head)) is not None:
            raise _not_safetensors(path, kind)
        if len(head) < 9:
            raise _not_safetensors(path, f"{size} bytes, too short for a safetensors header")
        length = int.from_bytes(head[:8], "little")
        if head[8:9] not in (b"{", b"[", b" ") or length < 2:  # JSON, as far as it goes
            raise _not_safetensors(path, f"its first bytes are {head[:9].hex(' ')}, not a safetensors header")
        if length > MAX_HEADER_BYTES:
            raise BadInput(f"{path}: its safetensors header says {length} bytes, more than difflite reads "
                           f"({MAX_HEADER_BYTES} bytes)")
        if 8 + length > size:
            raise BadInput(f"{path}: truncated: its safetensors header says {length} bytes but only {size - 8} "
                           f"follow")
        try:
            raw = head[8:] + file.read(length - 1)
        except OSError as e:
            raise BadInput(f"{path}: cannot read the LoRA file ({e.strerror or e})") from e
        if len(raw) != length:
            raise BadInput(f"{path}: truncated while read (the file shrank?)")
        try:
            header = loads_json(raw, source="header", what="safetensors header")
        except BadInput as e:  # "header: not valid JSON (...)"
            raise _not_safetensors(path, str(e)) from None
        if not isinstance(header, dict):
            raise _not_safetensors(path, f"its header is a JSON {type(header).__name__}, not an object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _not_safetensors(path, "its __metadata__ is not an object of strings")
        for key in header:
            if len(key) > _MAX_NAME or not key.isprintable():
                raise _not_safetensors(path, f"a tensor name of {len(key)} characters, or with control characters")
        entries = {key: _entry(path, key, value, 8 + length) for key, value in header.items()}
        _check_tiling(path, entries, 8 + length, size)
        return cls(entries, metadata)


def _entry(path: Path, key: str, value, data_start: int) -> _Entry:
    if not (isinstance(value, dict) and {"dtype", "shape", "data_offsets"} <= set(value)):
        raise _not_safetensors(path, f"its header entry {key!r} is not a tensor (dtype, shape, data_offsets)")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
        raise _not_safetensors(path, f"tensor {key} has dtype {_show(dtype)}, which safetensors does not define")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _not_safetensors(path, f"tensor {key} has shape {_show(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise _not_safetensors(path, f"tensor {key} has data_offsets {_show(offsets)}")
    nbytes = (math.prod(shape) * _DTYPE_BITS[dtype] + 7) // 8
    if offsets[1] - offsets[0] != nbytes:
        raise _not_safetensors(path, f"tensor {key}: {dtype} {tuple(shape)} is {nbytes} bytes, its offsets span "
                                     f"{offsets[1] - offsets[0]}")
    return _Entry(dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def _check_tiling(path: Path, entries: dict[str, _Entry], data_start: int, size: int) -> None:
    """The tensors' byte ranges follow each other from the header's end to the file's end (what the
    safetensors library requires too): no overlaps, gaps or bytes beyond them."""
    at = data_start
    for key, entry in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if entry.begin != at:
            raise _not_safetensors(path, f"tensor {key}'s bytes start at {entry.begin - data_start} of its data, "
                                         f"not at {at - data_start}")
        at = entry.end
    if at > size:
        raise BadInput(f"{path}: truncated: its tensors need {at - data_start} bytes after the header but the file "
                       f"has {size - data_start}")
    if at < size:
        raise _not_safetensors(path, f"{size - at} bytes after its last tensor")


def _read_tensor(path: Path, file, key: str, entry: _Entry) -> np.ndarray:
    """A float tensor of the file as float32 (as convert converts it), checked finite."""
    try:
        file.seek(entry.begin)
        data = file.read(entry.end - entry.begin)
    except OSError as e:
        raise BadInput(f"{path}: cannot read the LoRA file ({e.strerror or e})") from e
    if len(data) != entry.end - entry.begin:
        raise BadInput(f"{path}: truncated while read (the file shrank?)")
    if entry.dtype in _FLOATS:
        values = np.frombuffer(data, dtype=_FLOATS[entry.dtype])
        if entry.dtype == "BF16":  # bfloat16: the upper 16 bits of a float32
            values = (values.astype(np.uint32) << 16).view(np.float32)
        finite = np.isfinite(values).all()
        with np.errstate(over="ignore"):
            values = values.astype(np.float32)
        if finite and not np.isfinite(values).all():
            raise BadInput(f"{path}: tensor {key} holds values beyond float32's range")
    else:  # an integer alpha
        values = np.frombuffer(data, dtype=_INTS[entry.dtype]).astype(np.float32)
        finite = True
    if not finite:
        raise BadInput(f"{path}: tensor {key} holds NaN or infinite values")
    return values.reshape(entry.shape)


# ---------------------------------------------------------------------------------------------
# The file's layers, in either layout

_KOHYA_PREFIXES = {"lora_unet_": "unet", "lora_te_": "text_encoder", "lora_te1_": "text_encoder",
                   "lora_te2_": "text_encoder_2"}
_KOHYA_PARTS = {"lora_down.weight": "down", "lora_up.weight": "up", "alpha": "alpha"}
_COMPONENT_PREFIXES = ("unet.", "text_encoder.")
# Tensors of LoRA variants whose update is not up @ down (compiler/lora.py refuses them too).
_VARIANTS = (("dora_scale", "DoRA"), ("lora_magnitude_vector", "DoRA"), ("lora_B.bias", "a LoRA bias"),
             ("hada_", "LoHa"), ("lokr_", "LoKr"))
_UNET_KEYS = (
    re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$"),
    re.compile(r"^(?P<module>.+)\.lora\.(?P<part>down|up)\.weight$"),
    re.compile(r"^(?P<parent>.+)\.(?P<proj>to_q|to_k|to_v|to_out)_lora\.(?P<part>down|up)\.weight$"),
)
_TE_KEYS = (
    re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])\.weight$"),
    re.compile(r"^(?P<module>.+)\.lora_linear_layer\.(?P<part>down|up)\.weight$"),
    re.compile(r"^(?P<parent>.+)\.to_(?P<proj>q|k|v|out)_lora\.(?P<part>down|up)\.weight$"),
)
_PARTS = {"A": "down", "B": "up", "down": "down", "up": "up"}
# The layer kinds that take slots (core/lora.py's "auto" set), as a kohya name ends
_SLOT_KIND_KOHYA = re.compile(r"(_attn[12]_(to_q|to_k|to_v|to_out_0)|_ff_net_(0_proj|2)|_proj_in|_proj_out|"
                              r"_self_attn_(q|k|v|out)_proj|_mlp_fc[12])$")
_SLOT_KIND = re.compile(r"(\.attn[12]\.(to_q|to_k|to_v|to_out\.0)|\.ff\.net\.(0\.proj|2)|\.proj_in|\.proj_out|"
                        r"\.self_attn\.(q|k|v|out)_proj|\.mlp\.fc[12])$")
_LDM = re.compile(r"(^|_)(input_blocks|middle_block|output_blocks)_")


@dataclass
class _Layer:
    """One LoRA layer of the file: where its tensors are and what it names."""
    name: str  # as the file names it (a kohya layer name, or component.module)
    component: str  # unet, text_encoder, text_encoder_2 or "" (none of a Stable Diffusion model's)
    module: str | None  # the slot's module name where the file's name maps to one of this model's
    keys: dict  # part (down, up, alpha) -> tensor key
    parsed: bool = True  # False: a layer of no component of ours, its keys not parsed (key -> key)


def _parse_layers(path: Path, header: _Header, slots: Mapping[Key, Slot]) -> tuple[list[_Layer], str]:
    keys = sorted(header.entries)
    if not keys:
        raise BadInput(f"{path}: the LoRA file holds no tensors")
    for key in keys:
        for mark, kind in _VARIANTS:
            if mark in key:
                raise BadInput(f"{path}: tensor {key} is not plain LoRA ({kind} is not supported: a LoRA here is "
                               f"W + up @ down)")
    is_kohya = any(k.startswith(tuple(_KOHYA_PREFIXES)) for k in keys) and \
        not any(k.startswith(_COMPONENT_PREFIXES) for k in keys)
    layers = _kohya_layers(path, keys, slots) if is_kohya else _diffusers_layers(path, keys)
    for layer in layers:
        if layer.parsed and ("down" not in layer.keys or "up" not in layer.keys):
            have = ", ".join(sorted(k.removeprefix(layer.name).lstrip("._") for k in layer.keys.values()))
            raise BadInput(f"{path}: LoRA layer {layer.name} needs both down and up weights (has {have})")
    if not layers:
        raise BadInput(f"{path}: none of its tensors is a LoRA layer (keys look like "
                       f"{', '.join(repr(k) for k in keys[:2])})")
    return layers, "kohya" if is_kohya else "diffusers"


def _kohya_layers(path: Path, keys: list[str], slots: Mapping[Key, Slot]) -> list[_Layer]:
    """kohya keys (others, such as bundled embeddings, set aside); names mapped to the slots'
    modules by their underscore forms."""
    names = {}
    for (component, module) in slots:
        names[(component, module.replace(".", "_"))] = module
        if component == "text_encoder":  # without text_model_, as transformers 5 names the modules
            names.setdefault((component, module.removeprefix("text_model.").replace(".", "_")), module)
    layers: dict[str, _Layer] = {}
    owner: dict[Key, str] = {}
    for key in keys:
        prefix = next((p for p in _KOHYA_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            continue  # not a LoRA layer (e.g. a textual-inversion embedding bundled with it)
        name, _, part = key.partition(".")
        if part not in _KOHYA_PARTS:
            raise BadInput(f"{path}: tensor {key} is not a kohya LoRA weight (expected .lora_down.weight, "
                           f".lora_up.weight or .alpha; LoHa, LoKr and other LyCORIS types are not supported)")
        if name not in layers:
            component = _KOHYA_PREFIXES[prefix]
            module = names.get((component, name[len(prefix):]))
            layers[name] = _Layer(name, component, module, {})
            if module is not None:
                if (component, module) in owner:
                    raise BadInput(f"{path}: layers {owner[component, module]} and {name} are the same layer "
                                   f"{component}.{module}")
                owner[component, module] = name
        layers[name].keys[_KOHYA_PARTS[part]] = key
    return list(layers.values())


def _diffusers_layers(path: Path, keys: list[str]) -> list[_Layer]:
    layers: dict[str, _Layer] = {}
    for key in keys:
        component = next((c[:-1] for c in _COMPONENT_PREFIXES if key.startswith(c)), None)
        if component is None:
            if "lora" in key.lower() or key.endswith("alpha"):  # a layer of another model or component
                name = _layer_name(key)
                head = name.split(".", 1)[0]
                layer = layers.setdefault(name, _Layer(name, head if head == "text_encoder_2" else "", None, {},
                                                       parsed=False))
                layer.keys[key] = key
            continue  # not a LoRA layer (e.g. an embedding): set aside
        rest = key[len(component) + 1:].replace(".processor.", ".")
        found = None
        for pattern in (_UNET_KEYS if component == "unet" else _TE_KEYS):
            if (m := pattern.match(rest)) is not None:
                found = m
                break
        if found is None:
            raise BadInput(f"{path}: tensor {key} is not understood (LoRA layers in the diffusers layout have "
                           f"lora_A/lora_B, lora.down/lora.up or to_q_lora-style down/up weights only)")
        if "parent" in found.groupdict():
            proj = found["proj"]
            if component == "unet":
                module = f"{found['parent']}.{'to_out.0' if proj == 'to_out' else proj}"
            else:
                module = f"{found['parent']}.{proj}_proj"
        else:
            module = found["module"]
        module = lora_module_name(component, module)
        name, part = f"{component}.{module}", _PARTS[found["part"]]
        layer = layers.setdefault(name, _Layer(name, component, module, {}))
        if part in layer.keys:
            raise BadInput(f"{path}: tensors {layer.keys[part]} and {key} are both the {part} weight of layer {name}")
        layer.keys[part] = key
    return list(layers.values())


def _layer_name(key: str) -> str:
    """The layer a LoRA key belongs to: the key less its LoRA part (as compiler/lora.py names it)."""
    return re.sub(r"[._](?:lora(?:[._].*)?|alpha)$", "", key)


# ---------------------------------------------------------------------------------------------
# Matching the layers to the slots


def _match(path: Path, layers: list[_Layer], slots: Mapping[Key, Slot], header: _Header,
           max_rank: int | None) -> dict[Key, _Layer]:
    """The layers that are slots of this model, their shapes, dtypes and ranks checked; BadInput
    for any layer that is not."""
    components = {c for c, _ in slots}
    matched: dict[Key, _Layer] = {}
    unmatched: dict[str, list[_Layer]] = {}
    for layer in layers:
        key = (layer.component, layer.module)
        if layer.module is not None and key in slots:
            matched[key] = layer
        else:
            unmatched.setdefault(_why_unmatched(layer, components), []).append(layer)
    for key, layer in sorted(matched.items()):
        _check_layer(path, header, layer, slots[key], max_rank)
    total = len(layers)
    for why in ("no_slot", "no_component", "elsewhere"):
        if why not in unmatched:
            continue
        some = unmatched[why]
        count, example = len(some), some[0].name
        hint = ""
        if why == "elsewhere":
            example, hint = _hint(some)
        if why == "no_slot":
            raise BadInput(f"{path}: {count} of its {total} LoRA layers have no run-time LoRA slot in this model "
                           f"(e.g. {example}): run-time LoRAs take the UNet's attention, feed-forward and "
                           f"proj_in/proj_out layers and the text encoder's attention and MLP layers only; "
                           f"`difflite convert --lora` can merge this file instead")
        if why == "no_component":
            label = {"unet": "UNet", "text_encoder": "text encoder"}[some[0].component]
            raise BadInput(f"{path}: {count} of its {total} LoRA layers are for the {label}, which has no LoRA slots "
                           f"in this folder (e.g. {example}); `difflite convert --lora` can merge this file instead")
        if not matched:
            sample = ", ".join(repr(k) for k in sorted(header.entries)[:2])
            raise BadInput(f"{path}: none of its {total} LoRA layers matches a layer of this model that takes a LoRA "
                           f"at run time (keys look like {sample}{hint}); is it a LoRA for Stable Diffusion 1.x/2.x?")
        raise BadInput(f"{path}: {count} of its {total} LoRA layers match no layer of this model that takes a LoRA "
                       f"at run time (e.g. {example}{hint}): a LoRA for another architecture?")
    return matched


def _why_unmatched(layer: _Layer, components: set[str]) -> str:
    """no_slot: a kind of layer run-time LoRAs do not take (convert merges it); no_component: a
    component of this model without slots in this folder; elsewhere: a layer of another model."""
    if layer.component not in ("unet", "text_encoder"):
        return "elsewhere"
    if layer.component not in components:
        return "no_component"
    kind = _SLOT_KIND_KOHYA if layer.name.startswith("lora_") else _SLOT_KIND
    if kind.search(layer.name) or _LDM.search(layer.name):
        return "elsewhere"  # a slot's kind of layer this model does not have
    return "no_slot"


def _hint(layers: list[_Layer]) -> tuple[str, str]:
    """A layer to name, and what it says about the file."""
    for layer in layers:
        if layer.component == "text_encoder_2":
            return layer.name, "; text_encoder_2 is SDXL's second text encoder"
    for layer in layers:
        if _LDM.search(layer.name):
            return layer.name, ("; UNet layers under the original LDM names (input_blocks, middle_block, "
                                "output_blocks) are mapped neither here nor by convert --lora")
    return layers[0].name, ""


def _check_layer(path: Path, header: _Header, layer: _Layer, slot: Slot, max_rank: int | None) -> None:
    down, up = header.entries[layer.keys["down"]], header.entries[layer.keys["up"]]
    for part, entry in (("down", down), ("up", up)):
        if entry.dtype not in _FLOATS:
            raise BadInput(f"{path}: tensor {layer.keys[part]} is {entry.dtype}; LoRA weights are read in float16, "
                           f"bfloat16, float32 or float64")
    rank = down.shape[0] if down.shape else 0
    tail = (1, 1) if slot.conv else ()
    kind = "1x1 Conv2d" if slot.conv else "Linear"
    if len(down.shape) != 2 + len(tail) or len(up.shape) != 2 + len(tail) or down.shape[2:] != tail \
            or up.shape[2:] != tail or rank == 0 or up.shape[1] != rank:
        want = "[r, K, 1, 1] / [N, r, 1, 1]" if slot.conv else "[r, K] / [N, r]"
        raise BadInput(f"{path}: LoRA layer {layer.name} has down {down.shape} / up {up.shape}, which do not fit "
                       f"this model's {kind} {slot.in_features} -> {slot.out_features} (down / up {want}, "
                       f"r > 0): a LoRA for another architecture?")
    if (down.shape[1], up.shape[0]) != (slot.in_features, slot.out_features):
        raise BadInput(f"{path}: layer {layer.name} is {down.shape[1]} -> {up.shape[0]} in the file but "
                       f"{slot.in_features} -> {slot.out_features} in this model: a LoRA for another architecture?")
    if "alpha" in layer.keys:
        alpha = header.entries[layer.keys["alpha"]]
        if math.prod(alpha.shape) != 1:
            raise BadInput(f"{path}: {layer.keys['alpha']} has shape {alpha.shape}, expected a scalar")
        if alpha.dtype not in _FLOATS and alpha.dtype not in _INTS:
            raise BadInput(f"{path}: {layer.keys['alpha']} is {alpha.dtype}, not a number")
    if max_rank is not None and rank > max_rank:
        raise BadInput(f"{path}: LoRA layer {layer.name} has rank {rank}, more than the {max_rank} this folder's "
                       f"LoRA slots take")


# ---------------------------------------------------------------------------------------------
# PEFT's alpha / r from lora_adapter_metadata

# A pattern key is a regular expression to PEFT; difflite evaluates only the module-name kind
# (letters, digits, _ - . ^ $ |; a dot matches any character as in PEFT), so that a hostile file
# cannot make matching take forever (no quantifiers, no groups), and only so many of them.
_SAFE_PATTERN = re.compile(r"^[\w.\-^$|]+$")
_MAX_PATTERNS = 4096  # entries of a rank_pattern / alpha_pattern (SDXL's every layer: under 1000)
_MAX_PATTERN_CHARS = 256


def _peft_configs(path: Path, metadata: dict[str, str]) -> dict[str, dict | None]:
    """Per component, its LoraConfig fields from lora_adapter_metadata (None: none for it, so
    alpha == rank, as diffusers derives the config from the weights then)."""
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return {}
    config = loads_json(raw, source=f"{path}: its lora_adapter_metadata", what="lora_adapter_metadata")
    if not isinstance(config, dict):
        raise BadInput(f"{path}: its lora_adapter_metadata is not a JSON object")
    return {component: _peft_config(path, config, component) for component in ("unet", "text_encoder")}


def _peft_config(path: Path, config: dict, component: str) -> dict | None:
    prefix = f"{component}."
    fields = {k.removeprefix(prefix): v for k, v in config.items() if k.startswith(prefix)}
    if not fields:
        return None
    r, alpha = fields.get("r", 8), fields.get("lora_alpha", 8)  # LoraConfig's defaults
    where = f"{path}: its lora_adapter_metadata's {component}"
    if not _positive_int(r):
        raise BadInput(f"{where}.r is {_show(r)}, not a positive integer")
    if not _number(alpha):
        raise BadInput(f"{where}.lora_alpha is {_show(alpha)}, not a finite number")
    out = {"r": r, "lora_alpha": float(alpha), "use_rslora": fields.get("use_rslora", False) is True}
    if fields.get("use_dora"):
        raise BadInput(f"{where}.use_dora is set: DoRA is not plain LoRA (not supported: a LoRA here is "
                       f"W + up @ down)")
    for name, check, what in (("rank_pattern", _positive_int, "a positive integer"),
                              ("alpha_pattern", _number, "a finite number")):
        pattern = fields.get(name) or {}
        if not isinstance(pattern, dict):
            raise BadInput(f"{where}.{name} is not a JSON object")
        if len(pattern) > _MAX_PATTERNS:
            raise BadInput(f"{where}.{name} has {len(pattern)} entries, more than difflite reads ({_MAX_PATTERNS})")
        compiled = []
        for k, v in pattern.items():
            if len(k) > _MAX_PATTERN_CHARS or not _SAFE_PATTERN.match(k):
                raise BadInput(f"{where}.{name} key {_show(k)} is a regular expression difflite does not "
                               f"evaluate (module names only)")
            if not check(v):
                raise BadInput(f"{where}.{name}[{_show(k)}] is {_show(v)}, not {what}")
            try:  # PEFT's get_pattern_key: the key ends the module name, at a dot
                compiled.append((re.compile(rf"(.*\.)?({k})$"), v))
            except re.error as e:
                raise BadInput(f"{where}.{name} key {_show(k)} is not a regular expression ({e})") from None
        out[name] = compiled
    return out


def _positive_int(value) -> bool:
    return type(value) is int and value > 0


def _number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _pattern_value(patterns, module: str, default):
    """PEFT's get_pattern_key and lookup: the value of the first key that matches `module`."""
    for regex, value in patterns:
        if regex.match(module):
            return value
    return default


def _peft_scaling(path: Path, config: dict | None, layer: _Layer, rank: int) -> float:
    """alpha / r of one layer under PEFT's rules; its r must be the file's rank (PEFT would not
    load the weights otherwise)."""
    if config is None:
        return 1.0
    r = _pattern_value(config["rank_pattern"], layer.module, config["r"])
    alpha = float(_pattern_value(config["alpha_pattern"], layer.module, config["lora_alpha"]))
    if r != rank:
        raise BadInput(f"{path}: its lora_adapter_metadata gives layer {layer.name} rank {r}, its weights rank "
                       f"{rank}")
    return alpha / math.sqrt(r) if config["use_rslora"] else alpha / r


# ---------------------------------------------------------------------------------------------
# The factors


def _factors(path: Path, file, header: _Header, layer: _Layer, factor: float | None, scale: float) -> Factors:
    """down * factor and up * scale in float32, from the file's float32 values (as convert has
    them) in float64; `factor` None: kohya's alpha / rank (1 without an alpha)."""
    down = _read_tensor(path, file, layer.keys["down"], header.entries[layer.keys["down"]])
    up = _read_tensor(path, file, layer.keys["up"], header.entries[layer.keys["up"]])
    rank = down.shape[0]
    down, up = down.reshape(rank, -1), up.reshape(up.shape[0], rank)
    if factor is None:
        factor = 1.0
        if "alpha" in layer.keys:
            alpha = _read_tensor(path, file, layer.keys["alpha"], header.entries[layer.keys["alpha"]])
            factor = float(alpha.reshape(())) / rank
    d = (down.astype(np.float64) * factor).astype(np.float32)
    u = (up.astype(np.float64) * scale).astype(np.float32)
    if not (np.isfinite(d).all() and np.isfinite(u).all()):
        raise BadInput(f"{path}: LoRA layer {layer.name} at scale {scale:g} gives factors beyond float32's range")
    # |up @ down| <= r * max|up| * max|down|: where that bound could overflow, compute the product.
    bound = rank * float(np.abs(u).max(initial=0)) * float(np.abs(d).max(initial=0))
    if not bound < _F32_MAX and not np.isfinite(u @ d).all():
        raise BadInput(f"{path}: LoRA layer {layer.name} at scale {scale:g} gives an update beyond float32's range")
    return Factors(d, u)

