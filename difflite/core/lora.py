"""LoRAs on both sides: a `--lora FILE[:SCALE]` (LoraSpec, parse_spec), and the run-time slots: which
layers of a converted model take a LoRA at run time (`convert --lora-slots`), and the names both
sides share.

A slot is one linear layer (or 1x1 convolution) y = W x + b whose output the file adds
(x D^T) U^T to, with the factors D [r, K] and U [N, r] chosen at run time: through the op library
(`difflite.LoRA`, custom_ops.LORA) in files that need it anyway, or through two graph inputs per
slot in `--no-fuse` files (DOWN_INPUT, UP_INPUT: D^T [K, R] and U^T [R, N] at the folder's largest
rank R, zero-padded; all zero is no LoRA) so that stock LiteRT can apply one too.

Module names are the ones LoRA files use: diffusers' UNet names (`down_blocks.0.attentions.0.
transformer_blocks.0.attn1.to_q`), and the text encoder's with `text_model.` (as PEFT and kohya
files name them, whatever the installed transformers calls the module).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from difflite.core.errors import BadInput

# LoRAs are applied at scales around 1 (negative ones invert them); beyond this a LoRA is no
# longer a LoRA but a way to overflow the weights.
MAX_SCALE = 1000.0


@dataclass(frozen=True)
class LoraSpec:
    """One --lora FILE[:SCALE]."""
    path: str
    scale: float = 1.0


def check_scale(scale: float, where: str) -> float:
    """`scale` where it is finite and within +-MAX_SCALE; else BadInput naming `where`."""
    if not (math.isfinite(scale) and abs(scale) <= MAX_SCALE):
        raise BadInput(f"{where}: LoRA scale {scale:g} must be a finite number from -{MAX_SCALE:g} to "
                       f"{MAX_SCALE:g}")
    return scale


def parse_spec(spec: str) -> LoraSpec:
    """FILE[:SCALE] -> LoraSpec; a suffix that is not a number is part of the file name."""
    path, scale = spec, 1.0
    head, sep, tail = spec.rpartition(":")
    if sep and head:
        try:
            path, scale = head, float(tail)
        except ValueError:
            pass
    return LoraSpec(path, check_scale(scale, f"--lora {spec}"))


SETS = ("auto", "none")
# By form (convert.ConvertOptions.lora_slot_set): fused files take slots that cost nothing without
# a LoRA; --no-fuse files' factor inputs cost every call two products of their rank per slot (SD
# 1.5's UNet on LiteRT's GPU engine, rank 32: 1.87x the step, H200 2026-11-29), so they are asked for.
DEFAULT_SET = {"custom": "auto", "inputs": "none"}
# The largest rank (summed over the LoRAs applied at once) a slot takes, by form: difflite.LoRA ops
# cost nothing until a LoRA is set, and then its own rank; --no-fuse factor inputs cost their full
# size at every call (two matrix products of this rank per slot), so they default smaller.
DEFAULT_MAX_RANK = {"custom": 128, "inputs": 32}
MAX_RANK_LIMIT = 1024
COMPONENTS = ("unet", "text_encoder")
FORMS = ("custom", "inputs")  # difflite.LoRA ops, or factor graph inputs (--no-fuse)

# "auto": the layers kohya's LoRA (networks.lora) and diffusers' PEFT LoRAs train: every linear
# and 1x1 convolution of the UNet's transformers (proj_in, proj_out, attention projections, the
# feed-forward), every linear of the text encoder's attention and MLP.
_PATTERNS = {
    "unet": re.compile(r"(^|\.)attentions\.\d+\.(proj_in|proj_out|transformer_blocks\.\d+\."
                       r"(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2)))$"),
    "text_encoder": re.compile(r"^text_model\.encoder\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|out_proj)|"
                               r"mlp\.(fc1|fc2))$"),
}


def takes_slot(component: str, module: str, which: str = "auto") -> bool:
    """Whether `module` (a LoRA file's name for it, see the module doc) of `component` gets a slot
    under --lora-slots `which`."""
    return which == "auto" and component in _PATTERNS and bool(_PATTERNS[component].search(module))


def lora_module_name(component: str, module: str) -> str:
    """The LoRA files' name of a module of `component` named `module` in the torch model
    (transformers 5's CLIPTextModel has no `text_model.` in its module names)."""
    if component == "text_encoder" and not module.startswith("text_model."):
        return f"text_model.{module}"
    return module


def down_input(slot: int) -> str:
    """The --no-fuse graph input of slot `slot`'s D^T [K, R]."""
    return f"lora_down_{slot}"


def up_input(slot: int) -> str:
    """The --no-fuse graph input of slot `slot`'s U^T [R, N] (the scale folded in)."""
    return f"lora_up_{slot}"


_INPUT = re.compile(r"^lora_(down|up)_(\d+)$")


def is_factor_input(name: str) -> bool:
    return bool(_INPUT.match(name))
