"""Dumps the device binary of one of the library's OpenCL programs as the backend would build it
(on NVIDIA's OpenCL the binary is PTX text), for reading what the compiler made of a kernel:

    python lab/gpu_kernel_binary.py builtins/conv/conv.cl --options "-DVEC=1 -DTM=128 ..." \
        [--half] -o conv.ptx

--half builds for half storage through vload_half (-DDL_HALF_IO=1). Prints the size and, for PTX,
the instruction counts that matter for a GEMM's inner loop (global loads by width, FMAs,
conversions, local loads/stores).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_kernels_harness.launch import Runner  # noqa: E402

PTX_OPS = ("ld.global", "ld.global.nc", "st.global", "ld.shared", "st.shared", "fma.rn", "cvt", "bar.sync")


def ptx_summary(text: str) -> Counter:
    counts: Counter = Counter()
    for line in text.splitlines():
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z][\w.]*)", line)
        if m is None:
            continue
        op = m.group(1)
        for prefix in PTX_OPS:
            if op.startswith(prefix):
                counts[op] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program", help="path under custom_ops/, e.g. builtins/conv/conv.cl")
    ap.add_argument("--options", default="", help="the op's own build options")
    ap.add_argument("--half", action="store_true", help="half storage through vload_half")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    runner = Runner(half_io=args.half)
    program = runner.program(ROOT / "custom_ops" / args.program, args.options)
    binary = program.binaries[0]
    args.output.write_bytes(binary)
    print(f"{args.output}: {len(binary)} bytes ({runner.device.name.strip()})")
    if binary.lstrip().startswith(b"//"):  # PTX
        for op, n in sorted(ptx_summary(binary.decode(errors="replace")).items()):
            print(f"  {op}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
