"""Which memory instructions a difflite OpenCL kernel compiles to on NVIDIA (the program binary
NVIDIA's OpenCL returns is PTX text): counts of each ld/st form per kernel, e.g. whether float4
loads became ld.global.v4.f32 or four scalar loads, and CL_KERNEL_PRIVATE_MEM_SIZE (register
spills to local memory on NVIDIA).

    python benchmarks/gpu_ptx.py OP [OPTIONS] [--dump DIR]
    python benchmarks/gpu_ptx.py group_norm "-DGN_VW=4 -DGN_LX=40 -DGN_LY=6 -DGN_GPW=4 -DGN_UNROLL=4"

OP is a folder under custom_ops/ops (its OP.cl) or a builtin's .cl path relative to the repository.
Needs pyopencl and an NVIDIA OpenCL device; prints one line per kernel.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import pyopencl as cl  # noqa: E402

from gpu_kernels_harness.launch import Runner, pick_context  # noqa: E402

MEMORY_OP = re.compile(r"^\s*(?:@%p\d+\s+)?((?:ld|st)\.(?:global|shared|local)[.\w]*)", re.M)


def kernel_bodies(ptx: str) -> dict[str, str]:
    """PTX text of each .entry, by kernel name."""
    parts = re.split(r"(?m)^(?:\.visible\s+)?\.entry\s+(\w+)\(", ptx)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("op")
    ap.add_argument("options", nargs="?", default="")
    ap.add_argument("--dump", type=Path, default=None, help="also write the PTX here")
    args = ap.parse_args(argv)
    ctx, dev = pick_context()
    r = Runner(ctx, dev)
    path = ROOT / args.op if args.op.endswith(".cl") else ROOT / "custom_ops" / "ops" / args.op / f"{args.op}.cl"
    prog = r.program(path, args.options)
    ptx = prog.get_info(cl.program_info.BINARIES)[0].decode(errors="replace").replace("\x00", "")
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        (args.dump / f"{path.stem}.ptx").write_text(ptx)
    if ".entry" not in ptx:
        print(f"{dev.name}: the program binary is not PTX text", file=sys.stderr)
        return 1
    info = cl.kernel_work_group_info
    for name, body in kernel_bodies(ptx).items():
        counts = collections.Counter(MEMORY_OP.findall(body))
        kernel = cl.Kernel(prog, name)
        private = kernel.get_work_group_info(info.PRIVATE_MEM_SIZE, dev)  # spills, on NVIDIA
        print(f"{name}: private {private} B, " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
