"""One component's peak resident memory as a phone would hold it, side by side over settings: PoCL
(whose "device" buffers are host memory, as a phone GPU's are its RAM) running the GPUs' tiled
kernels (DIFFLITE_KERNELS=tiled), a fresh `difflite bench` process per setting (one call, no
warm-up call) after one that fills the program cache; each setting is environment assignments on top of that (e.g. DIFFLITE_LEND_SCRATCH=off).
The peak is the process's own (difflite.core.childmem), beside the op library's report.

    python benchmarks/pocl_component_memory.py OUT --component vae_decoder \\
        --setting default= --setting apart=DIFFLITE_LEND_SCRATCH=off [--save FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import CLI, machine, run_measured

TIMEOUT_S = 3600


def setting(text: str) -> tuple[str, dict]:
    """NAME=K=V,K=V (or NAME= for none) -> (NAME, {K: V})."""
    name, _, assignments = text.partition("=")
    env = dict(item.split("=", 1) for item in assignments.split(",") if item)
    return name, env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a converted folder")
    parser.add_argument("--component", required=True)
    parser.add_argument("--setting", action="append", type=setting, required=True,
                        help="NAME=K=V,K=V: environment for one process (NAME= for none)")
    parser.add_argument("--save", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    data = {"machine": machine(), "out": str(args.out), "component": args.component, "settings": {}}
    # a first, unmeasured process fills the program cache, so that no setting pays the compiles
    run_measured(["env", "DIFFLITE_KERNELS=tiled", *CLI, "bench", str(args.out), "--components", args.component,
                  "--backend", "opencl", "--runs", "1", "--warmup", "0"], TIMEOUT_S)
    for name, env in args.setting:
        assignments = [f"{k}={v}" for k, v in {"DIFFLITE_KERNELS": "tiled", **env}.items()]
        measured = run_measured(["env", *assignments, *CLI, "bench", str(args.out), "--components", args.component,
                                 "--backend", "opencl", "--runs", "1", "--warmup", "0", "--json"], TIMEOUT_S)
        device = json.loads(measured["stdout"])["components"][args.component]["device"]
        data["settings"][name] = {"env": env, "peak_rss_mib": round(measured["peak_rss_mib"], 1),
                                  "wall_s": round(measured["wall_s"], 1),
                                  **{k: round(v, 1) for k, v in device.items() if k.endswith("_mb") and v is not None}}
        print(name, data["settings"][name], flush=True)
    if args.save:
        args.save.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
