"""Run one .tflite component once on the op library's OpenCL backend with given delegate options,
in a child process per option set (a driver that aborts on a faulting kernel takes only the child),
and print per set: ok / the failure, the time of the first call and of a second one. With
DIFFLITE_CL_TRACE=1 the child's last `difflite-cl: launch` line names the kernel a crash was in.

    python lab/opencl_component_run.py MODEL.tflite --library LIB [--sets "precision=fp16,math=fp32;precision=fp32"]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def child(model: str, library: str, options: dict) -> None:
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    delegate = load_delegate(library, {"backend": "opencl", **options})
    interpreter = Interpreter(model_path=model, experimental_delegates=[delegate])
    interpreter.allocate_tensors()
    runner = interpreter.get_signature_runner("serving_default")
    rng = np.random.default_rng(0)
    feeds = {name: (np.full(d["shape"], 500, d["dtype"]) if "timestep" in name else
                    rng.standard_normal(d["shape"]).astype(d["dtype"]))
             for name, d in runner.get_input_details().items()}
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = runner(**feeds)
        times.append(time.perf_counter() - start)
    first = next(iter(out.values()))
    print(json.dumps({"first_s": round(times[0], 2), "second_ms": round(times[1] * 1e3, 1),
                      "finite": bool(np.isfinite(first).all()), "max_abs": float(np.abs(first).max())}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--library", required=True)
    parser.add_argument("--sets", default="precision=fp16;precision=fp16,math=fp32;precision=fp32")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if args.child is not None:
        child(args.model, args.library, json.loads(args.child))
        return 0
    for spec in args.sets.split(";"):
        options = dict(item.split("=", 1) for item in spec.split(","))
        done = subprocess.run([sys.executable, __file__, args.model, "--library", args.library,
                               "--child", json.dumps(options)], capture_output=True, text=True, timeout=args.timeout)
        launches = [line for line in done.stderr.splitlines() if line.startswith("difflite-cl: launch")]
        result = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else \
            f"FAILED rc={done.returncode}: {' | '.join(done.stderr.strip().splitlines()[-3:])[:600]}"
        print(f"{spec}: {result}" + (f"\n  last launch: {launches[-1]}" if launches and done.returncode else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
