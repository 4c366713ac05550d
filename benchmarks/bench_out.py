"""Where the GPU benchmarks write their JSON: $OUT if set (the device machine's output folder), else
benchmarks/results/, as <name>_<device>.json."""
from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, device: str, payload: dict) -> Path:
    """Writes payload as <name>_<device, lower case, spaces as _>.json and prints the path."""
    out = Path(os.environ.get("OUT", RESULTS))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}_{device.lower().replace(' ', '_')}.json"
    path.write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {path}")
    return path
