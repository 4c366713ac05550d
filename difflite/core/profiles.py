"""Device profiles: the facts about a target GPU that the cost models of the passes need.

    profile = load_profile("adreno-740")
    profile.local_mem_bytes, profile.winograd_min_tiles, profile.flash_attention, ...

The data lives in difflite/core/device_profiles.json (with its sources); this module validates it and
turns each entry into a frozen `Profile`. An unknown name raises BadInput naming it and listing the
known ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json

PROFILES_FILE = Path(__file__).with_name("device_profiles.json")
DEFAULT_PROFILE = "generic"
PRECISIONS = ("fp16", "fp32")

_TOP_KEYS = {"description": str, "gpu": str, "local_mem_bytes": int, "max_work_group_size": int,
             "fp16": bool, "bandwidth_gbps": float, "fp32_gflops": float, "fp16_gflops": float,
             "launch_overhead_us": float, "winograd": dict, "attention": dict}
_WINOGRAD_KEYS = {"min_in_channels": int, "min_out_channels": int, "min_tiles": int, "source": str}
# Optional: the extra weight memory Winograd may add on this device when --winograd-budget-mb is
# not given (its weights are 4x a 3x3 conv's); phones keep the default.
DEFAULT_WINOGRAD_BUDGET_MB = 200.0
_ATTENTION_KEYS = {"flash": bool, "flash_block_q": int, "flash_block_kv": int, "flash_max_head_dim": int,
                   "flash_min_kv_len": int, "source": str}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpu: str
    # Per work-group limits, as the OpenCL/Metal runtime reports them.
    local_mem_bytes: int
    max_work_group_size: int
    fp16: bool  # the GPU has float16 arithmetic (cl_khr_fp16)
    # Throughput (approximate peaks).
    bandwidth_gbps: float  # DRAM bandwidth, GB/s
    fp32_gflops: float
    fp16_gflops: float
    launch_overhead_us: float  # fixed cost per GPU kernel launch
    # Winograd F(4x4,3x3) candidates: channel minimums and 4x4 output tiles per image.
    winograd_min_in_channels: int
    winograd_min_out_channels: int
    winograd_min_tiles: int
    winograd_source: str
    # Attention variant rule inputs.
    flash_attention: bool  # a FlashAttention kernel is used on this GPU at all
    flash_block_q: int  # query rows per work-group
    flash_block_kv: int  # key/value rows staged in local memory per step
    flash_max_head_dim: int  # largest head dim whose q row + accumulator fit the registers
    flash_min_kv_len: int  # shorter key sequences use the partially fused softmax
    attention_source: str
    winograd_budget_mb: float = DEFAULT_WINOGRAD_BUDGET_MB  # default Winograd weight budget

    def element_bytes(self, precision: str | None = None) -> int:
        """Bytes per activation/weight element on the device: `precision` ("fp16"/"fp32") when
        given, else fp16 where the GPU computes in it. fp16 storage needs no fp16 arithmetic
        (vload_half / vstore_half are core OpenCL), so "fp16" is 2 bytes on every GPU."""
        if precision is None:
            return 2 if self.fp16 else 4
        _precision(self, precision)  # validates it
        return 2 if precision == "fp16" else 4

    def peak_gflops(self, precision: str | None = None) -> float:
        return self.fp16_gflops if _precision(self, precision) == "fp16" else self.fp32_gflops


def _precision(profile: Profile, precision: str | None) -> str:
    if precision is None:
        return "fp16" if profile.fp16 else "fp32"
    if precision not in PRECISIONS:
        raise BadInput(f"precision {precision!r} must be one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and not profile.fp16:
        return "fp32"  # no fp16 arithmetic on this GPU: it computes in fp32
    return precision


@functools.lru_cache(maxsize=1)
def _load_all() -> dict[str, Profile]:
    where = PROFILES_FILE
    data = read_json(where, what="device profiles")
    entries = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise BadInput(f"{where}: no 'profiles' object")
    return {name: _profile(where, name, entry) for name, entry in entries.items()}


def _checked(where: Path, label: str, entry: object, keys: dict[str, type]) -> dict:
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: {label} must be an object")
    missing = sorted(set(keys) - set(entry))
    unknown = sorted(set(entry) - set(keys))
    if missing or unknown:
        raise BadInput(f"{where}: {label}: missing keys {missing}, unknown keys {unknown}")
    out = {}
    for key, kind in keys.items():
        value = entry[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise BadInput(f"{where}: {label}.{key} must be {kind.__name__}, got {value!r}")
        if kind in (int, float) and value <= 0:
            raise BadInput(f"{where}: {label}.{key} must be positive, got {value!r}")
        out[key] = value
    return out


def _profile(where: Path, name: str, entry: object) -> Profile:
    top = _checked(where, f"profile {name!r}", entry, _TOP_KEYS)
    wino_entry = dict(top.pop("winograd"))
    budget = wino_entry.pop("budget_mb", DEFAULT_WINOGRAD_BUDGET_MB)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0:
        raise BadInput(f"{where}: profile {name!r} winograd.budget_mb must be a number >= 0, got {budget!r}")
    wino = _checked(where, f"profile {name!r} winograd", wino_entry, _WINOGRAD_KEYS)
    attn = _checked(where, f"profile {name!r} attention", top.pop("attention"), _ATTENTION_KEYS)
    return Profile(
        name=name, **top,
        winograd_min_in_channels=wino["min_in_channels"], winograd_min_out_channels=wino["min_out_channels"],
        winograd_min_tiles=wino["min_tiles"], winograd_source=wino["source"],
        flash_attention=attn["flash"], flash_block_q=attn["flash_block_q"], flash_block_kv=attn["flash_block_kv"],
        flash_max_head_dim=attn["flash_max_head_dim"], flash_min_kv_len=attn["flash_min_kv_len"],
        attention_source=attn["source"], winograd_budget_mb=float(budget),
    )


def _profile_file(where: Path) -> Profile:
    data = read_json(where, what="device profile")
    entries = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or len(entries) != 1:
        raise BadInput(f"{where}: needs a 'profiles' object with exactly one profile")
    (name, entry), = entries.items()
    return _profile(where, name, entry)


def profile_names() -> tuple[str, ...]:
    return tuple(_load_all())


def load_profile(name: str | Profile) -> Profile:
    """The profile called `name`, or the one profile in the JSON file `name` names (a user's own
    GPU, same format as device_profiles.json); a Profile passes through. BadInput otherwise."""
    if isinstance(name, Profile):
        return name
    if str(name).endswith(".json"):
        return _profile_file(Path(name))
    profiles = _load_all()
    if name not in profiles:
        raise BadInput(f"unknown device profile {name!r} (known: {', '.join(profiles)})")
    return profiles[name]


PROFILE_NAMES = profile_names()
