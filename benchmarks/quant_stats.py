"""The OpenCL delegate's view of one converted component: its stats JSON (weights held quantized
and dequantized, nodes claimed, partitions) and every "not delegating" line of its verbose log,
with host memory after load. For checking how a quantized file lands on a device.

    python benchmarks/quant_stats.py OUT unet
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    from difflite.core.procmem import high_water_mark_mb, resident_mb
    from difflite.folder import manifest
    from difflite.runtime.component import find_oplib

    def rss_mb() -> dict:
        return {**resident_mb(), "peak": high_water_mark_mb()}

    out, name = Path(sys.argv[1]), sys.argv[2]
    entry = manifest.read_manifest(out)["components"][name]
    precision = manifest.read_manifest(out)["options"]["precision"]
    stats = Path(tempfile.mkdtemp()) / "stats.json"
    delegate = load_delegate(str(find_oplib()), {"backend": "opencl", "precision": precision, "verbose": "1",
                                                  "stats_path": str(stats)})
    interpreter = Interpreter(model_path=str(out / entry["file"]), experimental_delegates=[delegate])
    interpreter.allocate_tensors()
    print(json.dumps({"rss_after_load_mb": rss_mb()}))
    interpreter.invoke()
    print(json.dumps({"rss_after_invoke_mb": rss_mb()}))
    del interpreter
    print(stats.read_text())


if __name__ == "__main__":
    main()
