"""Run-time LoRAs (`generate --lora`, `LitePipeline.set_loras`): LoRA files -> each component's
slot factors, applied to loaded models without touching their base weights.

A folder converted with slots (convert --lora-slots, core/lora.py) holds, per slot, either a
`difflite.LoRA` op, whose factors are set on the op library once per change (lora_factors.py), or
two factor inputs (`--no-fuse` files), fed at every call: the factors padded with zeros to the
folder's largest rank, all zeros without a LoRA. Several LoRAs at once are one LoRA of the summed
rank (their factors side by side), which is exactly the sum of their deltas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from difflite.core import lora
from difflite.core.errors import BadInput
from difflite.folder.output_folder import ComponentEntry, OutputFolder

Pair = tuple[np.ndarray, np.ndarray]  # down [r, K], up [N, r] (scale folded in), float32


@dataclass
class LoraPlan:
    """What a set of LoRA files applies: per component, {slot: (down, up)}; and what to report."""
    specs: tuple[lora.LoraSpec, ...] = ()
    factors: dict[str, dict[int, Pair]] = field(default_factory=dict)

    def for_component(self, name: str) -> dict[int, Pair]:
        return self.factors.get(name, {})

    def describe(self) -> list[dict]:
        return [{"file": Path(spec.path).name, "path": str(spec.path), "scale": spec.scale} for spec in self.specs]

    def layer_counts(self) -> dict[str, int]:
        return {name: len(slots) for name, slots in self.factors.items()}


def as_specs(loras: Sequence) -> tuple[lora.LoraSpec, ...]:
    """LoraSpec, "FILE[:SCALE]" or (path, scale) items -> LoraSpecs (scales checked)."""
    specs = []
    for item in loras:
        if isinstance(item, lora.LoraSpec):
            specs.append(lora.LoraSpec(item.path, lora.check_scale(float(item.scale), str(item.path))))
        elif isinstance(item, (str, Path)):
            specs.append(lora.parse_spec(str(item)))
        else:
            path, scale = item
            specs.append(lora.LoraSpec(str(path), lora.check_scale(float(scale), str(path))))
    return tuple(specs)


def plan_for_folder(folder: OutputFolder, loras: Sequence) -> LoraPlan:
    """Read and check every file against the folder's slots, then combine them: a BadInput names
    the first file that does not fit, before anything is applied."""
    specs = as_specs(loras)
    if not specs:
        return LoraPlan()
    from difflite.runtime import lora_files
    entries = {name: e for name, e in folder.components.items() if e.lora_slots is not None}
    if not entries:
        raise BadInput(f"{folder.path}: converted without LoRA slots, so it takes no LoRA at run time (convert "
                       f"with --lora-slots auto, or merge the LoRA with convert --lora)")
    slots = [lora_files.Slot(name, s.module, s.in_features, s.out_features, s.conv)
             for name, entry in entries.items() for s in entry.lora_slots.slots]
    max_rank = min(entry.lora_slots.max_rank for entry in entries.values())
    per_file = [lora_files.read_lora(spec, slots, max_rank) for spec in specs]
    combined = lora_files.combine(per_file, max_rank) if len(per_file) > 1 else per_file[0]
    numbers = {(name, s.module): s.slot for name, entry in entries.items() for s in entry.lora_slots.slots}
    factors: dict[str, dict[int, Pair]] = {}
    for (component, module), pair in combined.items():
        down, up = (np.ascontiguousarray(a, dtype=np.float32) for a in (pair.down, pair.up))
        if not np.any(down) or not np.any(up):
            continue  # a zero delta (scale 0): exactly no LoRA, nothing to apply
        factors.setdefault(component, {})[numbers[(component, module)]] = (down, up)
    return LoraPlan(specs, factors)


class SlotFactors:
    """The factors one loaded component applies, per slot, and (in --no-fuse files) its factor
    inputs: each slot's D^T [K, R] and U^T [R, N], zeros past the rank set."""

    def __init__(self, entry: ComponentEntry):
        self.slots = entry.lora_slots
        self.active: dict[int, Pair] = {}
        self._feeds: dict[str, np.ndarray] = {}
        if self.slots is not None and self.slots.form == "inputs":
            self._zero_all()

    @property
    def form(self) -> str | None:
        return None if self.slots is None else self.slots.form

    def change(self, factors: dict[int, Pair]) -> dict[int, Pair | None]:
        """Make `factors` the active set; returns the slots that changed (None: cleared)."""
        if factors and self.slots is None:
            raise BadInput("this model has no LoRA slots")
        changed: dict[int, Pair | None] = {slot: None for slot in self.active if slot not in factors}
        changed.update({slot: pair for slot, pair in factors.items() if self.active.get(slot) is not pair})
        self.active = dict(factors)
        if self.form == "inputs":
            for slot, pair in changed.items():
                self._set_inputs(slot, pair)
        return changed

    def feeds(self) -> dict[str, np.ndarray]:
        """The factor inputs of a --no-fuse file ({} for other files)."""
        return self._feeds

    def _zero_all(self) -> None:
        for s in self.slots.slots:
            self._set_inputs(s.slot, None)

    def _set_inputs(self, slot: int, pair: Pair | None) -> None:
        spec = self.slots.slots[slot]
        rank = self.slots.max_rank
        down_t = np.zeros((spec.in_features, rank), np.float32)
        up_t = np.zeros((rank, spec.out_features), np.float32)
        if pair is not None:
            down, up = pair
            down_t[:, :down.shape[0]] = down.T
            up_t[:up.shape[1], :] = up.T
        self._feeds[lora.down_input(slot)] = down_t
        self._feeds[lora.up_input(slot)] = up_t
