#!/usr/bin/env bash
# Build PoCL's CUDA driver on a Debian bookworm x86_64 host (root, apt + deb.debian.org, no GPU
# needed) and pack it as .pocl/pocl-cuda.tar.xz for a lent NVIDIA GPU machine, where
# benchmarks/pocl_cuda_setup.sh unpacks it.
#
#   bash benchmarks/pocl_cuda_build.sh   # ~6 min on 2 cores once apt has fetched ~1 GB of packages
#
# Why: NVIDIA's own OpenCL lacks cl_khr_fp16. PoCL's CUDA driver compiles OpenCL C with clang to
# NVPTX/PTX in-process and runs it through libcuda, and from PoCL 4.0 on it advertises cl_khr_fp16
# (CMake option ENABLE_CUDA_FP16, default ON). Debian bookworm's own PoCL (3.1) does not: its
# CUDA_DEVICE_EXTENSIONS has no cl_khr_fp16. So the source is Debian trixie's PoCL 6.0 (the
# .orig.tar.gz from the Debian pool, checked by SHA-256), built against bookworm's LLVM 15
# (PoCL 6.0 takes LLVM 14..18).
#
# The bundle (about 25 MiB; the GPU machine's carry limit leaves 28 MiB for it) holds:
#   lib/libpocl.so.2*     PoCL with the CUDA driver linked in and LLVM/clang linked statically
#   share/pocl/           PoCL's kernel library bitcode for NVPTX and clang's OpenCL headers
#   cuda/nvvm/libdevice/  libdevice.10.bc (PoCL links it into every kernel; POCL_CUDA_TOOLKIT_PATH)
#   bin/clinfo, lib/loader/libOpenCL.so.1   clinfo and the ocl-icd loader it needs
#   lib/*.so*             any other shared library libpocl needs beyond glibc/libstdc++/libcuda
#   MANIFEST.txt          versions, cmake options, ldd output, the newest GLIBC_ symbol needed
# libcuda.so.1 is not bundled: the GPU machine's driver provides it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${POCL_BUILD_DIR:-/work/pocl-build}         # outside the repository
OUT=$ROOT/.pocl/pocl-cuda.tar.xz
MAX_BYTES=$((28 * 1024 * 1024))
JOBS=${JOBS:-$(nproc)}
LLVM_VER=15
POCL_VER=6.0
POCL_TGZ=pocl_${POCL_VER}.orig.tar.gz
POCL_URL=http://deb.debian.org/debian/pool/main/p/pocl/$POCL_TGZ
POCL_SHA256=de9710223fc1855f833dbbf42ea2681e06aa8ec0464f0201104dc80a74dfd1f2
CUDA_ROOT=/usr/lib/nvidia-cuda-toolkit          # Debian's layout (nvcc in bin/, libdevice/)

t0=$(date +%s)
log() { echo "pocl_cuda_build: $*" >&2; }

. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] || log "warning: expected Debian bookworm, found ${PRETTY_NAME:-?}"
[ "$(id -u)" = 0 ] || { log "needs root (apt-get)"; exit 1; }

# --- 1. packages -------------------------------------------------------------------------------
# nvidia-cuda-toolkit (cuda.h, libcuda.so to link, nvcc that CMake's FindCUDA wants, libdevice)
# lives in non-free and pulls libcuda1, whose nvidia-support is in contrib.
SRC=/etc/apt/sources.list.d/debian.sources
if [ -f "$SRC" ]; then
  if grep -q '^Components: main$' "$SRC"; then
    sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$SRC"
  fi
elif ! grep -qs 'bookworm.* non-free' /etc/apt/sources.list; then
  echo 'deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware' \
    > /etc/apt/sources.list.d/pocl-nonfree.list
fi
PKGS="llvm-$LLVM_VER llvm-$LLVM_VER-dev clang-$LLVM_VER libclang-$LLVM_VER-dev libclang-cpp$LLVM_VER-dev
      cmake make g++ pkg-config python3 curl xz-utils ocl-icd-dev ocl-icd-opencl-dev
      ocl-icd-libopencl1 clinfo nvidia-cuda-toolkit"
# shellcheck disable=SC2086
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS
fi

# --- 2. PoCL source ----------------------------------------------------------------------------
mkdir -p "$WORK"
cd "$WORK"
if ! { [ -f "$POCL_TGZ" ] && echo "$POCL_SHA256  $POCL_TGZ" | sha256sum -c --quiet; }; then
  curl -fsSL -o "$POCL_TGZ" "$POCL_URL"
  echo "$POCL_SHA256  $POCL_TGZ" | sha256sum -c --quiet
fi
[ -d pocl-$POCL_VER ] || tar xzf "$POCL_TGZ"
# Our two changes to PoCL, both in pocl-ptx-gen.cc, made to a fresh copy of that file from the
# tarball each run (tar -m: newer than its object, so make rebuilds it).
PTXGEN=pocl-$POCL_VER/lib/CL/devices/cuda/pocl-ptx-gen.cc
tar xzmf "$POCL_TGZ" "$PTXGEN"
# First, two lines: the CUDA driver maps the calls its kernel library leaves to C math functions
# onto CUDA's libdevice (__nv_*), but its list (mapLibDeviceCalls) lacks erf and erfc, so
# erf(float) stays a call to an undefined erff and the driver's PTX JIT refuses every program
# with a GELU (cuModuleLoad fails; ptxas: "Unresolved extern function 'erff'"). libdevice has both.
sed -i 's/^\( *\)LDMAP("cosh")$/&\n\1LDMAP("erf")\n\1LDMAP("erfc")/' "$PTXGEN"
grep -q 'LDMAP("erfc")' "$PTXGEN" || { echo "pocl_cuda_build: could not add erf to $PTXGEN" >&2; exit 1; }
# Second, opt-in launch bounds: PoCL marks each kernel for NVPTX with "kernel" alone and drops its
# reqd_work_group_size, so ptxas never learns the work-group size and sizes registers for any.
# The tensor-core GEMM tile then took 160 registers where NVIDIA's compiler gives the same source
# 125: one 256-item work-group a compute unit instead of two, and 2.8x NVIDIA's time
# (docs/lab-notebook.md §70). With POCL_CUDA_MIN_BLOCKS_PER_SM=N set at run time, a kernel with a
# reqd_work_group_size gets it as .maxntid and N as .minnctapersm (CUDA's __launch_bounds__), so
# ptxas holds registers to what N work-groups a compute unit leave; POCL_CUDA_LAUNCH_BOUNDS_KERNELS
# (kernel names, comma separated) limits that to those kernels.
cat > launch_bounds.inc <<'CPP'
    // difflite's pocl_cuda_build.sh: launch bounds from reqd_work_group_size (opt-in).
    const char *BoundsKernels = getenv("POCL_CUDA_LAUNCH_BOUNDS_KERNELS");
    const std::string Listed = "," + std::string(BoundsKernels ? BoundsKernels : "") + ",";
    const bool Chosen = !BoundsKernels || Listed.find("," + Function->getName().str() + ",") != std::string::npos;
    if (const char *MinBlocks = Chosen ? getenv("POCL_CUDA_MIN_BLOCKS_PER_SM") : nullptr) {
      if (llvm::MDNode *Reqd = Function->getMetadata("reqd_work_group_size")) {
        auto Annotate = [&](const char *Key, uint64_t Value) {
          Annotations->addOperand(llvm::MDNode::get(
              Context, {FuncMD, llvm::MDString::get(Context, Key),
                        llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(
                            llvm::Type::getInt32Ty(Context), Value))}));
        };
        const char *Keys[] = {"maxntidx", "maxntidy", "maxntidz"};
        for (unsigned D = 0; D < 3 && D < Reqd->getNumOperands(); ++D)
          Annotate(Keys[D], llvm::mdconst::extract<llvm::ConstantInt>(Reqd->getOperand(D))->getZExtValue());
        if (atoi(MinBlocks) > 0)
          Annotate("minctasm", atoi(MinBlocks));
      }
    }
CPP
# after the line that adds the kernel's "kernel" annotation
sed -i '/^    Annotations->addOperand(Node);$/r launch_bounds.inc' "$PTXGEN"
grep -q POCL_CUDA_LAUNCH_BOUNDS_KERNELS "$PTXGEN" || { echo "pocl_cuda_build: could not add launch bounds to $PTXGEN" >&2; exit 1; }

# --- 3. configure, build, install --------------------------------------------------------------
# ENABLE_HOST_CPU_DEVICES=OFF: CUDA only (no CPU driver, no host-CPU kernel libraries to build).
# STATIC_LLVM=ON: LLVM 15 + clang linked into libpocl, no libLLVM/libclang-cpp .so to carry.
# ENABLE_LOADABLE_DRIVERS=OFF: the CUDA driver goes into libpocl itself; a loadable driver .so
#   would carry a second static copy of LLVM.
# ENABLE_CUDA_FP16=ON (PoCL's default, spelled out): advertise cl_khr_fp16 / __opencl_c_fp16
#   and build the half builtins into the NVPTX kernel library (needs compute capability >= 5.3).
# ENABLE_SPIRV=OFF: no llvm-spirv translator in bookworm for LLVM 15; we feed OpenCL C source.
# CUDA_TOOLKIT_ROOT_DIR pinned to Debian's 11.8 package so FindCUDA never picks some other
#   toolkit on the host; cuda.h 11.8 API calls resolve to symbols every newer driver still exports.
# No GPU arch is fixed at build time: at run time PoCL picks the device's compute capability
#   capped at sm_75 with PTX 6.3, which LLVM 15 can emit (its NVPTX stops at sm_86 / PTX 7.5) and
#   which the driver JIT-compiles for sm_90 (H200).
# --gc-sections: libpocl holds every LLVM target (PoCL calls InitializeAllTargets), ~130 MiB
#   stripped; dropping unreferenced sections saves ~1.5 MiB of the xz'd bundle.
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_INSTALL_PREFIX="$WORK/install"
  -DWITH_LLVM_CONFIG=/usr/bin/llvm-config-$LLVM_VER
  -DSTATIC_LLVM=ON
  -DENABLE_CUDA=ON
  -DENABLE_CUDA_FP16=ON
  -DCUDA_TOOLKIT_ROOT_DIR=$CUDA_ROOT
  -DENABLE_HOST_CPU_DEVICES=OFF
  -DENABLE_LOADABLE_DRIVERS=OFF
  -DENABLE_ICD=ON
  -DENABLE_SPIRV=OFF
  -DENABLE_HWLOC=OFF
  -DENABLE_TESTS=OFF
  -DENABLE_EXAMPLES=OFF
  -DENABLE_POCLCC=OFF
  -DKERNEL_CACHE_DEFAULT=ON
  -DCMAKE_INSTALL_RPATH='$ORIGIN'
  "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--gc-sections $WORK/glibc_compat.o"
)
# bookworm's static LLVMSupport calls arc4random (glibc 2.36) for Process::GetRandomNumber; a
# hidden local definition (over getrandom, glibc 2.25) keeps libpocl at GLIBC_2.34, so it also
# loads on a glibc 2.34/2.35 image (e.g. Ubuntu 22.04). Linked in, no PoCL source touched.
cat > glibc_compat.c <<'C'
#include <stdint.h>
#include <sys/random.h>
__attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t v = 0;
  while (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {}
  return v;
}
C
cc -O2 -fPIC -c glibc_compat.c -o glibc_compat.o
mkdir -p build
cd build
cmake ../pocl-$POCL_VER "${CMAKE_OPTS[@]}" > cmake.log 2>&1 || { tail -n 30 cmake.log; exit 1; }
make -j"$JOBS" 2>&1 | tail -n 5
rm -rf "$WORK/install"
make install >/dev/null

# --- 4. bundle ---------------------------------------------------------------------------------
STAGE=$WORK/bundle
rm -rf "$STAGE"
mkdir -p "$STAGE"/{lib/loader,bin,cuda/nvvm/libdevice,share}
cp -a "$WORK"/install/lib/libpocl.so* "$STAGE/lib/"
cp -a "$WORK"/install/share/pocl "$STAGE/share/"
cp "$CUDA_ROOT/libdevice/libdevice.10.bc" "$STAGE/cuda/nvvm/libdevice/"
cp /usr/bin/clinfo "$STAGE/bin/"
cp -L /usr/lib/x86_64-linux-gnu/libOpenCL.so.1 "$STAGE/lib/loader/"
strip --strip-unneeded "$STAGE"/lib/libpocl.so.*.* "$STAGE/bin/clinfo" "$STAGE/lib/loader/libOpenCL.so.1"

# Every shared library the bundle needs beyond what the GPU machine surely has (glibc, libstdc++,
# libgcc_s, libcuda from the driver) is copied next to libpocl ($ORIGIN RUNPATH / LD_LIBRARY_PATH).
SYSTEM_RE='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libOpenCL)\.so'
LIBPOCL=$(ls "$STAGE"/lib/libpocl.so.*.*)
for f in "$LIBPOCL" "$STAGE/bin/clinfo"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $SYSTEM_RE ]]; then
    log "bundling $name ($path)"
    cp -L "$path" "$STAGE/lib/$name"
    strip --strip-unneeded "$STAGE/lib/$name"
  fi
done

max_glibc() {
  objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
}
max_glibcxx() {
  objdump -T "$@" 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1
}
{
  echo "PoCL $POCL_VER ($POCL_URL, sha256 $POCL_SHA256), with erf/erfc mapped to libdevice and opt-in launch bounds (POCL_CUDA_MIN_BLOCKS_PER_SM, POCL_CUDA_LAUNCH_BOUNDS_KERNELS)"
  echo "LLVM: $(llvm-config-$LLVM_VER --version) (Debian $(dpkg-query -W -f '${Version}' llvm-$LLVM_VER-dev)), static"
  echo "CUDA headers/libdevice: Debian nvidia-cuda-dev $(dpkg-query -W -f '${Version}' nvidia-cuda-dev)"
  echo "built on: $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "cmake options: ${CMAKE_OPTS[*]}"
  echo "newest symbol versions needed: $(max_glibc "$STAGE"/lib/*.so* "$STAGE"/lib/loader/* "$STAGE"/bin/clinfo)" \
       "$(max_glibcxx "$STAGE"/lib/*.so* "$STAGE"/bin/clinfo)"
  echo "ldd libpocl:"
  ldd "$LIBPOCL" | sed 's/ (0x[0-9a-f]*)//; s/^/  /'
  echo "extensions advertised by the CUDA device:"
  grep -o 'CUDA_DEVICE_EXTENSIONS "[^"]*"' "$WORK/build/config.h" | sed 's/^/  /'
} > "$STAGE/MANIFEST.txt"

glibc_needed=$(max_glibc "$STAGE"/lib/*.so* "$STAGE"/lib/loader/* "$STAGE"/bin/clinfo)
log "newest glibc symbol version needed: $glibc_needed"
[ "$glibc_needed" = GLIBC_2.34 ] || log "warning: expected GLIBC_2.34 at most (Debian bookworm builds need 2.34)"

mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
XZ_OPT=-9e tar -C "$STAGE" -cJf "$OUT" .
size=$(stat -c %s "$OUT")
log "wrote $OUT: $size bytes ($((size / 1024 / 1024)) MiB) in $(( $(date +%s) - t0 )) s"
if [ "$size" -gt "$MAX_BYTES" ]; then
  log "bundle is over the 28 MiB carry budget"
  exit 1
fi
