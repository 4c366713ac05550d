"""Run-time LoRAs (`generate --lora`, `LitePipeline.set_loras`): LoRA files -> each component's
slot factors, applied to loaded models without touching their base weights.

A folder converted with slots (convert --lora-slots, core/lora.py) holds, per slot, either a
`difflite.LoRA` op, whose factors are set on the op library once per change (lora_factors.py), or
two factor inputs (`--no-fuse` files), fed at every call: the factors padded with zeros to the
folder's largest rank, all zeros without a LoRA. Several LoRAs at once are one LoRA of the summed
rank (their factors side by side), which is exactly the sum of their deltas.

The op library's copy is the only one kept: a plan hands each component its factors once and
forgets them, and a model loaded later (--low-memory, a fallback's new delegate) reads the files
again. On a phone the GPU's memory is the process's, so a host copy would be a second LoRA.
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
    """What a set of LoRA files applies. `pending` holds, per component, the {slot: (down, up)}
    not yet handed over; `take` hands them over once, and reads the files again when a component
    asks after that (a model loaded again)."""
    specs: tuple[lora.LoraSpec, ...] = ()
    pending: dict[str, dict[int, Pair]] = field(default_factory=dict)
    layers: dict[str, int] = field(default_factory=dict)  # per component, the layers given a LoRA
    stamps: tuple[tuple[str, int, int], ...] = ()  # each file's (path, size, mtime_ns) when read
    folder: OutputFolder | None = None

    def take(self, name: str) -> dict[int, Pair]:
        """The factors of component `name`: the pending ones, else read from the files again."""
        if name in self.pending:
            return self.pending.pop(name)
        if not self.layers.get(name):
            return {}
        self._check_unchanged()
        return plan_for_folder(self.folder, self.specs, only=name).pending.get(name, {})

    def source(self, name: str):
        """A callable giving `name`'s factors again, read from the files (for a new delegate)."""
        return lambda: self.take(name)

    def held_bytes(self) -> int:
        """Bytes of the factors still pending (0 once every loaded model has taken its own)."""
        return sum(d.nbytes + u.nbytes for slots in self.pending.values() for d, u in slots.values())

    def describe(self) -> list[dict]:
        return [{"file": Path(spec.path).name, "path": str(spec.path), "scale": spec.scale} for spec in self.specs]

    def layer_counts(self) -> dict[str, int]:
        return dict(self.layers)

    def _check_unchanged(self) -> None:
        for now, then in zip(file_stamps(self.specs), self.stamps):
            if now != then:
                raise BadInput(f"{now[0]}: changed on disk since its LoRAs were set; set them again")


def file_stamps(specs: Sequence[lora.LoraSpec]) -> tuple[tuple[str, int, int], ...]:
    stamps = []
    for spec in specs:
        path = Path(spec.path).expanduser().absolute()
        try:
            st = path.stat()
        except OSError:
            stamps.append((str(path), -1, -1))
        else:
            stamps.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(stamps)


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


def plan_for_folder(folder: OutputFolder, loras: Sequence, only: str | None = None) -> LoraPlan:
    """Read and check every file against the folder's slots, then combine them: a BadInput names
    the first file that does not fit, before anything is applied. `only`: keep that component's
    factors alone (every layer is still checked)."""
    specs = as_specs(loras)
    if not specs:
        return LoraPlan()
    stamps = file_stamps(specs)
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
    layers: dict[str, int] = {}
    for (component, module), pair in combined.items():
        if not np.any(pair.down) or not np.any(pair.up):
            continue  # a zero delta (scale 0): exactly no LoRA, nothing to apply
        layers[component] = layers.get(component, 0) + 1
        if only is None or component == only:
            down, up = (np.ascontiguousarray(a, dtype=np.float32) for a in (pair.down, pair.up))
            factors.setdefault(component, {})[numbers[(component, module)]] = (down, up)
    return LoraPlan(specs, factors, layers, stamps, folder)


class SlotFactors:
    """The factors one loaded component applies, per slot, and (in --no-fuse files) its factor
    inputs: each slot's D^T [K, R] and U^T [R, N], zeros past the rank set."""

    def __init__(self, entry: ComponentEntry):
        self.slots = entry.lora_slots
        self.active: set[int] = set()  # the slots with a LoRA (their factors live where they are set)
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
        changed.update(factors)
        self.active = set(factors)
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
