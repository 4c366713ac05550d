"""Builds every OpenCL program of the library, in each build variant the runtime's plans use and in
each storage mode the device supports, on one device, and prints each build that fails with its
log. The library falls back silently from a hinted kernel that does not build (attention flash ->
partial softmax, vectorised GEMM tiles -> scalar ones), so a compiler difference shows up only as
a slower profile; this names it.

    python benchmarks/gpu_build_check.py [--device NVIDIA]

Exit status 1 when a build fails.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

PRELUDE = "#ifdef DL_FP16\n#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n#endif\n#line 1\n"
STORAGE = {
    "float": "-DDL_T=float -DDL_T4=float4",
    "vload_half": "-DDL_T=half -DDL_T4=half4 -DDL_HALF_IO=1",
    "cl_khr_fp16": "-DDL_T=half -DDL_T4=half4 -DDL_FP16=1",
    "cl_khr_fp16+math": "-DDL_T=half -DDL_T4=half4 -DDL_FP16=1 -DDL_FP16_MATH=1",
}


def main() -> int:
    import pyopencl as cl

    from gpu_kernels_harness import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="platform/device name substring")
    args = parser.parse_args()
    ctx, dev = launch.pick_context(prefer=args.device)
    modes = [m for m in STORAGE if "cl_khr_fp16" not in m or "cl_khr_fp16" in dev.extensions]
    print(f"{dev.name} ({dev.platform.name}): storage modes {', '.join(modes)}")
    root = ROOT / "custom_ops"
    sources = [*sorted((root / "ops").glob("*/*.cl")), *sorted((root / "builtins").glob("*/*.cl")),
               root / "delegate" / "opencl" / "convert.cl"]
    failures = 0
    for path in (p for p in sources if p.stem not in launch.INCLUDED_ONLY):
        text = PRELUDE + launch.cl_source(path)
        for extra in launch.PROGRAM_VARIANTS.get(path.stem, ([],)):
            for mode in (m for m in modes if m != "float" or not launch.needs_half_storage(extra)):
                options = f"-cl-std=CL1.2 {STORAGE[mode]} {' '.join(extra)}"
                try:
                    cl.Program(ctx, text).build(options=options)
                except cl.RuntimeError as exc:
                    failures += 1
                    print(f"FAIL {path.name} [{options}]:\n{str(exc)[-3000:]}\n")
    print(f"{failures} failed builds")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
