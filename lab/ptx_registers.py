"""Registers, spills and shared memory a kernel takes on sm_90 when PoCL's CUDA driver compiles it
(lab/pocl_cuda_ptx_check.py's PTX pipeline, then ptxas -v), for build-option sets given on the
command line: a way to see, without a GPU, how many work-groups of a tile fit a compute unit.

    python lab/ptx_registers.py gemm gemm "-DVEC=1 -DTM=128 -DTN=128 -DTK=16 -DWM=8 -DWN=8" \
        [more option sets ...] [--modes float,cl_khr_fp16+math] [--group 256]

(program stem, kernel name, then option sets). Prints per set and mode: registers, spill bytes,
shared memory, and work-groups of --group items a 64K-register, 228 KB compute unit holds
(register-limited, rounded to the allocation unit of 8 registers a thread).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pocl_cuda_ptx_check import MODES, PRELUDE, build_ptx, sources

REGISTERS_PER_CU, SMEM_PER_CU = 65536, 228 * 1024


def ptxas_info(ptx: Path, kernel: str, arch: str = "sm_90") -> dict:
    log = subprocess.run(["ptxas", f"-arch={arch}", "-O3", "-v", str(ptx), "-o", "/dev/null"], check=False,
                         capture_output=True, text=True).stderr
    block = log.split(f"Compiling entry function '{kernel}'", 1)[-1]
    regs = int(re.search(r"Used (\d+) registers", block).group(1))
    spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", block.split("Compile time")[0]))
    smem = re.search(r"(\d+) bytes smem", block.split("Compile time")[0])
    return {"registers": regs, "spill_bytes": spill, "smem": int(smem.group(1)) if smem else 0}


def groups_per_cu(info: dict, group: int) -> int:
    regs = -(-info["registers"] // 8) * 8
    by_regs = REGISTERS_PER_CU // (regs * group)
    by_smem = SMEM_PER_CU // info["smem"] if info["smem"] else by_regs
    return min(by_regs, by_smem)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("kernel")
    ap.add_argument("options", nargs="+")
    ap.add_argument("--modes", default="float,cl_khr_fp16+math")
    ap.add_argument("--group", type=int, default=256, help="work-items a work-group")
    ap.add_argument("--pocl", type=Path, default=Path("/work/pocl-build/install"))
    ap.add_argument("--libdevice", type=Path, default=Path("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"))
    args = ap.parse_args()
    from gpu_kernels_harness import launch

    path = next(p for p in sources() if p.stem == args.program)
    text = PRELUDE + launch.cl_source(path)
    tools = {t: shutil.which(t + "-15") or t for t in ("clang", "llvm-link", "opt", "llc", "llvm-dis")}
    print(f"{'options':<60} {'mode':<18} regs spill  smem  groups/CU")
    for options in args.options:
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory() as d:
                ptx = build_ptx(text, f"-cl-std=CL1.2 {MODES[mode]} {options}", Path(d), args.pocl,
                                args.libdevice, 75, 63, tools)
                info = ptxas_info(ptx, args.kernel)
            print(f"{options:<60} {mode:<18} {info['registers']:4d} {info['spill_bytes']:5d} "
                  f"{info['smem']:5d}  {groups_per_cu(info, args.group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
