"""The private memory per work-item of each OpenCL program a run built (CL_KERNEL_PRIVATE_MEM_SIZE:
on NVIDIA, registers spilled and private arrays, in its local memory): the driver reserves that much for every resident thread of the GPU
(cl_driver_memory.py: 4 KiB a work-item held 792 MiB on an H200), which is the rest
gpu_memory_parts.py leaves after a component's buffers.

    source benchmarks/device_setup.sh
    python benchmarks/cl_kernel_lmem.py benchmarks/results/sdxl_gpu_h200x2_2026-11-30_b1_quantized.json

Reads every "program_builds" list (the op library's stats: program, options) in the JSON file.
Each program is built whole here, where the op library keeps the one kernel it needs
(kernel_source.cc: KeepOneKernel): a variant whose other kernels do not compile with its options
(int4 with float16 scales: gemm_rows reads its scales as float) is named "not built", unmeasured.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_build_check import PRELUDE, ROOT
from gpu_kernels_harness import launch

def builds_in(value) -> list[tuple[str, str]]:
    """Every (program, options) pair under a "program_builds" key, in order, once each."""
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "program_builds":
                found += [(b["program"], b["options"]) for b in item]
            else:
                found += builds_in(item)
    elif isinstance(value, list):
        for item in value:
            found += builds_in(item)
    return list(dict.fromkeys(found))


def source_of(program: str) -> Path:
    return next(p for p in (ROOT / "custom_ops").rglob(f"{program}.cl") if "build" not in p.parts)


def main() -> int:
    import pyopencl as cl

    context, _ = launch.pick_context()
    rows = []
    for program, options in builds_in(json.loads(Path(sys.argv[1]).read_text())):
        try:
            built = cl.Program(context, PRELUDE + launch.cl_source(source_of(program))).build(
                options=options)
        except cl.RuntimeError as exc:  # a build this harness does not reproduce: named, not measured
            print(f"not built: {program} [{options}]: {str(exc).splitlines()[-1][:200]}")
            continue
        for kernel in built.all_kernels():
            private = kernel.get_work_group_info(cl.kernel_work_group_info.PRIVATE_MEM_SIZE, context.devices[0])
            rows.append((private, kernel.function_name, program, options))
    for private, kernel, program, options in sorted(rows, reverse=True):
        print(f"{private:6d} B private  {program}/{kernel}  {options}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
