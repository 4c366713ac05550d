"""Where the GPU benchmarks write their JSON: $OUT if set (the device machine's output folder), else
lab/results/, as <name>_<device><suffix>.json."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, device: str, payload: dict, suffix: str = "") -> Path:
    """Writes payload as <name>_<device in lower case, other characters than letters and digits as
    _><suffix>.json and prints the path."""
    out = Path(os.environ.get("OUT", RESULTS))
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_").lower()
    path = out / f"{name}_{slug}{suffix}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nwrote {path}")
    return path
