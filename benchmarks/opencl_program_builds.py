"""Build every OpenCL program of the op library on this machine's OpenCL device, in the storage and
arithmetic modes the runtime uses, and report which fail, with the driver's build log.

A new OpenCL driver (PoCL's CUDA driver on an NVIDIA GPU, benchmarks/pocl_cuda_setup.sh; a phone's)
can lack a builtin or reject a construct the others take; this names the program, the variant and
the log before a model run fails on it.

    python benchmarks/opencl_program_builds.py [--device NAME] [--modes fp16_math,fp16,fp32] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = {  # build options as runtime.cc gives them (with its half prelude in front of the source)
    "fp32": ["-DDL_T=float", "-DDL_T4=float4"],
    "fp16": ["-DDL_T=half", "-DDL_T4=half4", "-DDL_FP16=1"],
    "fp16_math": ["-DDL_T=half", "-DDL_T4=half4", "-DDL_FP16=1", "-DDL_FP16_MATH=1"],
    "half_io": ["-DDL_T=half", "-DDL_T4=half4", "-DDL_HALF_IO=1"],
}
PRELUDE = "#ifdef DL_FP16\n#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n#endif\n#line 1\n"


def sources() -> list[Path]:
    root = ROOT / "custom_ops"
    return [*sorted((root / "ops").glob("*/*.cl")), *sorted((root / "builtins").glob("*/*.cl")),
            root / "delegate" / "opencl" / "convert.cl"]


def main() -> int:
    import pyopencl as cl

    from benchmarks.gpu_kernels_harness import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="a platform or device name substring")
    parser.add_argument("--modes", default="fp16_math,fp16,fp32")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    ctx, device = launch.pick_context(prefer=args.device)
    print(f"{device.name} ({device.platform.name}, {device.version})", flush=True)
    rows = []
    for mode in args.modes.split(","):
        for path in sources():
            text = PRELUDE + launch.cl_source(path)
            for extra in launch.PROGRAM_VARIANTS.get(path.stem, ([],)):
                options = ["-cl-std=CL1.2", *MODES[mode], *extra]
                start = time.perf_counter()
                try:
                    cl.Program(ctx, text).build(options=options)
                    row = {"program": path.stem, "mode": mode, "options": extra, "ok": True}
                except cl.Error as exc:
                    row = {"program": path.stem, "mode": mode, "options": extra, "ok": False,
                           "log": str(exc)[-4000:]}
                row["build_s"] = round(time.perf_counter() - start, 2)
                rows.append(row)
                status = "ok" if row["ok"] else "FAILED"
                print(f"{mode:10s} {path.stem:18s} {' '.join(extra)[:60]:60s} {status} {row['build_s']} s", flush=True)
                if not row["ok"]:
                    print(row["log"][-1500:], flush=True)
    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} builds passed")
    if args.json:
        args.json.write_text(json.dumps({"device": device.name, "platform": device.platform.name, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
