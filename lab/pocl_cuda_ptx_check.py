"""Reproduce, without a GPU, the PTX that PoCL 6.0's CUDA driver generates for each OpenCL program
of the library and assemble it with ptxas: the NVIDIA driver's PTX JIT rejects what ptxas rejects
(PoCL reports only "cuModuleLoad PTX failed").

The pipeline follows PoCL (lib/CL/pocl_llvm_build.cc, pocl_llvm_wg.cc,
lib/CL/devices/cuda/pocl-ptx-gen.cc) by hand:
  clang-15 -cc1 (PoCL's headers, defines and -cl-ext list; triple nvptx64, -target-cpu sm_XX)
  -> llvm-link --only-needed with the kernel library (kernel-nvptx64-sm30-ptx60-63.bc for PTX 6.0-6.3)
  -> math calls renamed to libdevice (mapLibDeviceCalls), libdevice linked, nvvm-reflect-ftz=1,
     everything but kernels internalized, opt -O3
  -> llc-15 -mtriple=nvptx64-nvidia-cuda -mcpu=sm_XX -mattr=+ptxNN
  -> ptxas -arch=sm_XX (and any further --ptxas-arch).
Checked against the H200 (driver 580, PoCL at sm_75 / PTX 6.3): in cl_khr_fp16+math mode it fails exactly
the programs that failed there at cuModuleLoad (attention, geglu, gelu, conv, elementwise, gemm,
softmax) and passes the rest. ptxas stops at the first unresolved function; the last column lists
every `.extern .func` the PTX leaves (PoCL resolves nothing after llc, so any is a load failure).
On the GPU, POCL_DEBUG=cuda makes PoCL print the JIT's own log (cuModuleLoadDataEx).

    python lab/pocl_cuda_ptx_check.py [--pocl /work/pocl-build/install] [--ptxas ptxas]
        [--programs elementwise,gelu] [--modes cl_khr_fp16+math,cl_khr_fp16,float] [--keep DIR] [--show-errors]
        [--sm 80 --ptx 80 --real-mma]   # PoCL with POCL_CUDA_GPU_ARCH=sm_80 and the tensor-core tiles
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_build_check import PRELUDE, STORAGE as MODES  # noqa: E402  (the runtime's build options)
# config.h CUDA_DEVICE_EXTENSIONS plus what pocl-cuda.c adds for PTX 6.0-6.3 on sm <= 75
EXTENSIONS = ("cl_khr_byte_addressable_store cl_khr_global_int32_base_atomics "
              "cl_khr_global_int32_extended_atomics cl_khr_local_int32_base_atomics "
              "cl_khr_local_int32_extended_atomics cl_khr_int64_base_atomics "
              "cl_khr_int64_extended_atomics cl_nv_device_attribute_query cl_khr_fp16 cl_khr_fp64 "
              "cl_ext_buffer_device_address cl_khr_subgroup_ballot cl_khr_subgroup_shuffle").split()
# pocl-ptx-gen.cc: mapLibDeviceCalls, with the erf and erfc that benchmarks/pocl_cuda_build.sh adds
LDMAP = ("acos acosh asin asinh atan atanh atan2 cbrt ceil copysign cos cosh erf erfc exp exp2 expm1 fdim floor "
         "fmax fmin hypot ilogb lgamma log log2 log10 log1p logb nextafter remainder rint round sin sinh "
         "sqrt tan tanh trunc").split()


def libdevice_map() -> dict[str, str]:
    m = {}
    for n in LDMAP:
        m[n + "f"] = f"__nv_{n}f"
        m[n] = f"__nv_{n}"
        m[f"llvm.{n}.f32"] = f"__nv_{n}f"
        m[f"llvm.{n}.f64"] = f"__nv_{n}"
    m.update({"llvm.copysign.f32": "__nv_copysignf", "llvm.copysign.f64": "__nv_copysign",
              "llvm.pow.f32": "__nv_powf", "llvm.pow.f64": "__nv_pow",
              "llvm.powi.f32": "__nv_powif", "llvm.powi.f64": "__nv_powi",
              "frexp": "__nv_frexp", "frexpf": "__nv_frexpf", "tgamma": "__nv_tgamma",
              "tgammaf": "__nv_tgammaf", "ldexp": "__nv_ldexp", "ldexpf": "__nv_ldexpf",
              "llvm.ldexp.f64.i32": "__nv_ldexp", "llvm.ldexp.f32.i32": "__nv_ldexpf",
              "modf": "__nv_modf", "modff": "__nv_modff", "remquo": "__nv_remquo",
              "remquof": "__nv_remquof"})
    return m


def sources() -> list[Path]:
    root = ROOT / "custom_ops"
    return [*sorted((root / "ops").glob("*/*.cl")), *sorted((root / "builtins").glob("*/*.cl")),
            root / "delegate" / "opencl" / "convert.cl"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} failed:\n{p.stderr[-4000:]}")
    return p


def map_libdevice(ll: str) -> str:
    """Rename calls and declarations of the mapped math functions (as mapLibDeviceCalls does)."""
    mapping = libdevice_map()
    declared = set(re.findall(r"^declare [^@]*@([\w.$]+)\(", ll, re.M))
    for ocl in sorted(declared & set(mapping), key=len, reverse=True):
        nv = mapping[ocl]
        pat = re.compile(r"@" + re.escape(ocl) + r"(?=\()")
        if nv in declared:  # drop the now-duplicate declaration
            ll = re.sub(r"^declare [^@]*@" + re.escape(ocl) + r"\(.*$\n", "", ll, flags=re.M)
        ll = pat.sub("@" + nv, ll)
        declared.add(nv)
    return ll


REFLECT = '!{i32 4, !"nvvm-reflect-ftz", i32 1}'


def add_reflect_flag(ll: str) -> str:
    """PoCL adds nvvm-reflect-ftz=1 after linking libdevice; the kernel library already carries
    nvvm-reflect-ftz=0 and getModuleFlag (NVVMReflect) sees that first one, so keep it alone then."""
    if '!"nvvm-reflect-ftz"' in ll:
        return ll
    m = re.search(r"^!llvm\.module\.flags = !\{(.*)\}$", ll, re.M)
    ids = [int(x) for x in re.findall(r"^!(\d+) = ", ll, re.M)]
    new = max(ids, default=-1) + 1000
    ll += f"\n!{new} = {REFLECT}\n"
    if m:
        ll = ll[:m.start()] + f"!llvm.module.flags = !{{{m.group(1)}, !{new}}}" + ll[m.end():]
    else:
        ll += f"!llvm.module.flags = !{{!{new}}}\n"
    return ll


def kernel_names(ll: str) -> list[str]:
    return re.findall(r"^define [^@]*spir_kernel [^@]*@([\w.$]+)\(|^define [^@]*ptx_kernel [^@]*@([\w.$]+)\(", ll, re.M)


def build_ptx(src: str, options: str, work: Path, pocl: Path, libdevice: Path, sm: int, ptx: int,
              tools: dict) -> Path:
    inc = pocl / "share" / "pocl" / "include"
    kernellib = pocl / "share" / "pocl" / ("kernel-nvptx64-sm30-ptx60-63.bc" if 60 <= ptx < 64 else
                                           "kernel-nvptx64-sm70-ptx64.bc")
    cl = work / "prog.cl"
    cl.write_text(src)
    exts = ",".join("+" + e for e in EXTENSIONS)
    std = re.search(r"-cl-std=CL(\d)\.(\d)", options)
    std_i = int(std.group(1)) * 100 + int(std.group(2)) * 10 if std else 300
    cmd = [tools["clang"], "-cc1", "-triple", "nvptx64", "-target-cpu", f"sm_{sm}", "-x", "cl",
           *options.split(), *(["-cl-std=CL3.0"] if not std else []),
           "-Dcl_khr_int64", "-DPOCL_DEVICE_ADDRESS_BITS=64", "-D__USE_CLANG_OPENCL_C_H",
           "-Dinline=", "-I.", "-cl-kernel-arg-info", "-opaque-pointers",
           "-D__ENDIAN_LITTLE__=1", "-DCL_DEVICE_MAX_GLOBAL_VARIABLE_SIZE=0",
           "-D__OPENCL_VERSION__=300", f"-D__OPENCL_C_VERSION__={std_i}",
           *[f"-D{e}=1" for e in EXTENSIONS], f"-cl-ext=-all,{exts}",
           "-fno-builtin", "-fno-jump-tables", "-ffp-contract=on",
           "-ffreestanding", "-fblocks", "-mrelocation-model", "pic", "-pic-level", "2",
           "-I", str(inc), "-include", str(inc / "pocl_types.h"), "-include", str(inc / "_builtin_renames.h"),
           "-include", str(inc / "opencl-c-base.h"), "-include", str(inc / "opencl-c.h"),
           "-include", str(inc / "_kernel.h"), "-emit-llvm-bc", "-O2", "-o", str(work / "fe.bc"), str(cl)]
    run(cmd)
    run([tools["llvm-link"], "--only-needed", str(work / "fe.bc"), str(kernellib), "-o", str(work / "linked.bc")])
    # PoCL's SPMD work-group passes: inline everything into the kernels
    run([tools["opt"], "-passes=always-inline,inline,mem2reg", str(work / "linked.bc"), "-o", str(work / "inl.bc")])
    ll = run([tools["llvm-dis"], str(work / "inl.bc"), "-o", "-"]).stdout
    kernels = [a or b for a, b in kernel_names(ll)]
    ll = add_reflect_flag(map_libdevice(ll))
    (work / "mapped.ll").write_text(ll)
    run([tools["llvm-link"], "--only-needed", str(work / "mapped.ll"), str(libdevice), "-o", str(work / "ld.bc")])
    keep = ",".join(kernels)
    run([tools["opt"], f"-internalize-public-api-list={keep}", "-passes=internalize,default<O3>",
         str(work / "ld.bc"), "-o", str(work / "opt.bc")])
    out = work / "prog.ptx"
    run([tools["llc"], "-mtriple=nvptx64-nvidia-cuda", f"-mcpu=sm_{sm}", f"-mattr=+ptx{ptx}",
         str(work / "opt.bc"), "-o", str(out)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pocl", type=Path, default=Path("/work/pocl-build/install"), help="PoCL install dir")
    ap.add_argument("--ptxas", default=shutil.which("ptxas") or "ptxas", help="ptxas to assemble with")
    ap.add_argument("--libdevice", type=Path, default=Path("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"))
    ap.add_argument("--sm", type=int, default=75, help="PoCL's target (it caps the GPU's SM at 75)")
    ap.add_argument("--ptx", type=int, default=63, help="PoCL's PTX ISA version (6.3 with LLVM 15)")
    ap.add_argument("--ptxas-arch", default="sm_75,sm_90", help="ptxas -arch values, comma separated")
    ap.add_argument("--programs", default="", help="comma separated program stems (default all)")
    ap.add_argument("--modes", default="cl_khr_fp16+math,cl_khr_fp16,float", help=f"of {', '.join(MODES)}")
    ap.add_argument("--llvm-suffix", default="-15")
    ap.add_argument("--keep", type=Path, default=None, help="write each PTX and ptxas log here")
    ap.add_argument("--show-errors", action="store_true", help="print the first ptxas errors of each failure")
    ap.add_argument("--real-mma", action="store_true",
                    help="the tensor-core variants with PTX's mma.sync itself, not its OpenCL C emulation "
                         "(what DIFFLITE_TENSOR_CORES=on builds; needs --sm 80 or newer)")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args()

    from gpu_kernels_harness import launch

    tools = {t: shutil.which(t + args.llvm_suffix) or t for t in ("clang", "llvm-link", "opt", "llc", "llvm-dis")}
    archs = [a for a in args.ptxas_arch.split(",") if a]
    modes = [m for m in args.modes.split(",") if m]
    wanted = set(filter(None, args.programs.split(",")))
    jobs = []
    for path in sources():
        if wanted and path.stem not in wanted:
            continue
        text = PRELUDE + launch.cl_source(path)
        for vi, extra in enumerate(launch.PROGRAM_VARIANTS.get(path.stem, ([],))):
            if args.real_mma:
                extra = [option for option in extra if option != "-DMMA_EMULATE=1"]
            for mode in modes:
                jobs.append((path.stem, vi, " ".join(extra), mode, text,
                             f"-cl-std=CL1.2 {MODES[mode]} {' '.join(extra)}"))

    def one(job):
        stem, vi, extra, mode, text, options = job
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            try:
                ptx = build_ptx(text, options, work, args.pocl, args.libdevice, args.sm, args.ptx, tools)
            except RuntimeError as exc:
                return job, {"gen": str(exc)}, None
            text = ptx.read_text()
            # ptxas stops at the first; list every function the PTX leaves unresolved
            res = {"externs": sorted(set(re.findall(r"^\.extern \.func[^;]*?([\w$]+)\s*(?:\(|;|$)",
                                                    text, re.M)))}
            for arch in archs:
                p = subprocess.run([args.ptxas, f"-arch={arch}", str(ptx), "-o", os.devnull],
                                   capture_output=True, text=True)
                res[arch] = None if p.returncode == 0 else (p.stderr or p.stdout)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                name = f"{stem}.v{vi}.{mode}"
                shutil.copy(ptx, args.keep / f"{name}.ptx")
                for arch, err in res.items():
                    if arch != "externs" and err:
                        (args.keep / f"{name}.{arch}.log").write_text(err)
            return job, res, text.count("\n")

    with ThreadPoolExecutor(args.j) as pool:
        results = list(pool.map(one, jobs))

    failures = 0
    header = (f"{'program':<18} {'variant':<48} {'mode':<10} " + " ".join(f"{a:<7}" for a in archs)
              + " unresolved functions")
    print(header)
    print("-" * len(header))
    errors = []
    for (stem, vi, extra, mode, _, _), res, _ in results:
        if "gen" in res:
            cells = ["GENFAIL"] * len(archs)
            errors.append((stem, vi, mode, "generation", res["gen"]))
        else:
            cells = ["ok" if res[a] is None else "FAIL" for a in archs]
            for a in archs:
                if res[a]:
                    errors.append((stem, vi, mode, a, res[a]))
        failures += any(c != "ok" for c in cells)
        label = f"v{vi} {extra}"[:48]
        print(f"{stem:<18} {label:<48} {mode:<10} " + " ".join(f"{c:<7}" for c in cells)
              + " " + " ".join(res.get("externs", [])))
    print(f"\n{failures} of {len(results)} builds fail (PoCL CUDA: sm_{args.sm}, PTX {args.ptx / 10:.1f}; "
          f"ptxas {args.ptxas})")
    if args.show_errors:
        for stem, vi, mode, arch, err in errors:
            lines = [l for l in err.splitlines() if l.strip()]
            print(f"\n== {stem} v{vi} {mode} {arch}:\n" + "\n".join(lines[:6]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
