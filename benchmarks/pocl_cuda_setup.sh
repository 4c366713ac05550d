# Source this on a lent NVIDIA GPU machine from the repository root, after
# `source benchmarks/device_setup.sh`, with .pocl/pocl-cuda.tar.xz carried along (built on a Debian
# bookworm host by benchmarks/pocl_cuda_build.sh):
#
#   source benchmarks/pocl_cuda_setup.sh
#
# Afterwards PoCL's CUDA driver is the only ICD (OCL_ICD_VENDORS=/tmp/icd-pocl): OpenCL C with
# half arithmetic (cl_khr_fp16) runs on the GPU, compiled by PoCL's built-in clang/LLVM 15 to
# PTX and JIT-compiled by the driver. `export OCL_ICD_VENDORS=/tmp/icd` goes back to NVIDIA's
# OpenCL. PoCL writes each kernel's PTX (*.ptx) under POCL_CACHE_DIR=/tmp/pocl-cache.
#
# No GPU arch is set: PoCL targets the device's compute capability capped at sm_75 with PTX 6.3
# (LLVM 15 emits nothing newer than sm_86 / PTX 7.5), and the driver JIT-compiles that for sm_90.
# POCL_CUDA_GPU_ARCH=sm_80 (what pocl_cuda_peer.sh's TENSOR_CORES=1 sets) makes PoCL ask LLVM 15
# for PTX 8.0, which it lacks and ignores: LLVM 15 then writes PTX 7.0 for sm_80, whose
# mma.sync.m16n8k16 the tensor-core GEMM tiles need (with DIFFLITE_TENSOR_CORES=on: PoCL answers
# no compute capability). POCL_CUDA_MIN_BLOCKS_PER_SM=N (our build's launch bounds) has ptxas keep
# each fixed-size work-group's registers to what N of them a compute unit leave.
if ! (return 0 2>/dev/null); then
  echo "pocl_cuda_setup: source this file (source benchmarks/pocl_cuda_setup.sh), don't run it" >&2
  exit 1
fi
_pocl_cuda_setup() {
  local tarball=.pocl/pocl-cuda.tar.xz dest=/tmp/pocl icd=/tmp/icd-pocl stamp
  if [ ! -f "$tarball" ]; then
    echo "pocl_cuda_setup: $tarball not found (run from the repository root; build it with benchmarks/pocl_cuda_build.sh on a Debian bookworm host)" >&2
    return 1
  fi
  # Unpack once per bundle: the stamp is the tarball's size and mtime.
  stamp=$(stat -c '%s %Y' "$tarball")
  if [ "$(cat "$dest/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dest" && mkdir -p "$dest" && tar -C "$dest" -xJf "$tarball" \
      || { echo "pocl_cuda_setup: could not unpack $tarball into $dest" >&2; return 1; }
    echo "$stamp" > "$dest/.stamp"
  fi
  local lib
  lib=$(ls "$dest"/lib/libpocl.so.2.* 2>/dev/null | head -1)
  [ -n "$lib" ] || { echo "pocl_cuda_setup: no libpocl.so.2.* in $dest/lib" >&2; return 1; }
  local d found=
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/libcuda.so.1" ] && found=1; done
  if [ -z "$found" ] && ! ldconfig -p | grep -q 'libcuda\.so\.1'; then
    echo "pocl_cuda_setup: no libcuda.so.1 (linker cache, LD_LIBRARY_PATH): PoCL needs the driver's" >&2
    return 1
  fi
  mkdir -p "$icd" && rm -f "$icd"/*.icd && echo "$lib" > "$icd/pocl.icd" \
    || { echo "pocl_cuda_setup: could not write $icd/pocl.icd" >&2; return 1; }
  export OCL_ICD_VENDORS=$icd
  export POCL_DEVICES=cuda                     # the bundle has no CPU driver anyway
  export POCL_CACHE_DIR=/tmp/pocl-cache        # compiled kernels (and their PTX) live here
  export POCL_CUDA_TOOLKIT_PATH=$dest/cuda     # $dest/cuda/nvvm/libdevice/libdevice.10.bc
  export POCL_KERNEL_CACHE=1
  # libpocl has RUNPATH $ORIGIN for its libz/libtinfo; LD_LIBRARY_PATH too, for anything that
  # resolves them before libpocl is loaded.
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$dest/lib:"*) ;;
    *) export LD_LIBRARY_PATH=$dest/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
  esac
  mkdir -p "$POCL_CACHE_DIR"
  # One-line summary, and a half2 fma kernel run as a smoke test (pyopencl comes from
  # device_setup.sh's wheels; the bundled clinfo is the fallback: $dest/bin/clinfo needs
  # LD_LIBRARY_PATH=$dest/lib/loader).
  local summary
  summary=$(python3 - <<'PY' 2>&1
import sys
try:
    import numpy as np
    import pyopencl as cl
except Exception as e:
    print(f"FAIL: pyopencl/numpy not importable ({e})"); sys.exit(1)
try:
    plats = [p for p in cl.get_platforms() if "Portable Computing Language" in p.name]
    dev = plats[0].get_devices()[0]
except Exception as e:
    print(f"FAIL: no PoCL CUDA device ({type(e).__name__}: {e})"); sys.exit(1)
fp16 = "cl_khr_fp16" in dev.extensions.split()
msg = f"{dev.name} via PoCL {plats[0].version.split('PoCL ')[-1].split()[0]}, cl_khr_fp16={'yes' if fp16 else 'NO'}"
if not fp16:
    print("FAIL: " + msg); sys.exit(1)
try:
    ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
    src = """#pragma OPENCL EXTENSION cl_khr_fp16 : enable
    __kernel void k(__global const half2 *a, __global half2 *o) {
      size_t i = get_global_id(0); o[i] = fma(a[i], a[i], (half2)(1.0h)); }"""
    prg = cl.Program(ctx, src).build()
    a = (np.arange(64, dtype=np.float16) / 8).astype(np.float16)
    mf = cl.mem_flags
    ab = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    ob = cl.Buffer(ctx, mf.WRITE_ONLY, a.nbytes)
    prg.k(q, (32,), None, ab, ob)
    o = np.empty_like(a); cl.enqueue_copy(q, o, ob); q.finish()
    ref = (a.astype(np.float32) ** 2 + 1).astype(np.float16)
    ok = np.allclose(o.astype(np.float32), ref.astype(np.float32), rtol=1e-3, atol=1e-3)
except Exception as e:
    print(f"FAIL: {msg}, half kernel failed ({type(e).__name__}: {str(e)[:300]})"); sys.exit(1)
if not ok:
    print(f"FAIL: {msg}, half kernel gave wrong results"); sys.exit(1)
print(f"{msg}, half2 fma kernel ok")
PY
  ) || { echo "pocl_cuda_setup: ${summary}" >&2; return 1; }
  echo "pocl_cuda_setup: ${summary}"
}
_pocl_cuda_setup
_pocl_cuda_setup_rc=$?
unset -f _pocl_cuda_setup
return $_pocl_cuda_setup_rc
