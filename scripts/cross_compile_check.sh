#!/usr/bin/env bash
# CI check: cross-compile the op library (custom_ops/) for 64-bit Arm Linux with the GNU cross
# toolchain and check the result: an AArch64 ELF shared library that exports exactly the two
# TFLite external-delegate entry points.
#
#   scripts/cross_compile_check.sh [--qemu] [BUILD_DIR]
#
# BUILD_DIR defaults to build/aarch64-linux-gnu (ignored by git). --qemu also installs qemu-user
# and runs a small aarch64 program that dlopens the library, creates a delegate with
# backend=cpu, checks that a bad option is refused, and destroys it.
# Installs (apt, Debian/Ubuntu names): g++-aarch64-linux-gnu, libflatbuffers-dev (header-only use,
# architecture-independent), opencl-headers (architecture-independent), cmake, make.
set -euo pipefail
cd "$(dirname "$0")/.."

QEMU=0
BUILD_DIR=build/aarch64-linux-gnu
for arg in "$@"; do
  case "$arg" in
    --qemu) QEMU=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "cross_compile_check: unknown option $arg" >&2; exit 2 ;;
    *) BUILD_DIR=$arg ;;
  esac
done

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

APT_PACKAGES=(g++-aarch64-linux-gnu libflatbuffers-dev opencl-headers cmake make)
[ "$QEMU" = 1 ] && APT_PACKAGES+=(qemu-user)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cross_compile_check: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

TRIPLE=aarch64-linux-gnu
FLATBUFFERS_HEADERS=${FLATBUFFERS_HEADERS:-/usr/include/flatbuffers}
OPENCL_HEADERS=${OPENCL_HEADERS:-/usr/include/CL}
[ -f "$FLATBUFFERS_HEADERS/flexbuffers.h" ] || {
  echo "cross_compile_check: $FLATBUFFERS_HEADERS/flexbuffers.h not found (install libflatbuffers-dev)" >&2; exit 1; }
[ -f "$OPENCL_HEADERS/cl.h" ] || {
  echo "cross_compile_check: $OPENCL_HEADERS/cl.h not found (install opencl-headers)" >&2; exit 1; }

mkdir -p "$BUILD_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
# A folder holding only flatbuffers/ and CL/ (header-only uses; OpenCL is dlopen'ed at run time):
# putting the host's /usr/include on the cross compiler's include path would let the host's C
# library headers shadow the target's.
CROSS_INCLUDE="$BUILD_DIR/cross-include"
mkdir -p "$CROSS_INCLUDE"
ln -sfn "$FLATBUFFERS_HEADERS" "$CROSS_INCLUDE/flatbuffers"
ln -sfn "$OPENCL_HEADERS" "$CROSS_INCLUDE/CL"

cmake -S custom_ops -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/custom_ops/cmake/$TRIPLE.cmake" \
  -DDIFFLITE_FLATBUFFERS_INCLUDE_DIR="$CROSS_INCLUDE" -DDIFFLITE_OPENCL_INCLUDE_DIR="$CROSS_INCLUDE"
cmake --build "$BUILD_DIR" -j "$(nproc 2>/dev/null || echo 2)"

LIB="$BUILD_DIR/libdifflite_delegate.so"
fail() { echo "cross_compile_check: FAILED: $*" >&2; exit 1; }
[ -f "$LIB" ] || fail "$LIB was not built"

machine=$($TRIPLE-readelf -h "$LIB" | sed -n 's/^ *Machine: *//p')
type=$($TRIPLE-readelf -h "$LIB" | sed -n 's/^ *Type: *//p')
[ "$machine" = "AArch64" ] || fail "$LIB is for '$machine', not AArch64"
case "$type" in DYN*) ;; *) fail "$LIB is '$type', not a shared object" ;; esac

exports=$($TRIPLE-nm -D --defined-only "$LIB" | awk '$2 == "T" {print $3}' | sort | tr '\n' ' ')
expected="difflite_lora_bytes difflite_lora_error difflite_lora_set tflite_plugin_create_delegate tflite_plugin_destroy_delegate "
[ "$exports" = "$expected" ] || fail "exported functions are '$exports', expected '$expected'"
needed=$($TRIPLE-readelf -d "$LIB" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')

echo "cross_compile_check: $LIB"
echo "  machine: $machine, type: ${type%% *}, size: $(stat -c %s "$LIB") bytes"
echo "  exports: $exports"
echo "  needs:   $needed"

if [ "$QEMU" = 1 ]; then
  SMOKE_SRC="$BUILD_DIR/load_smoke.cc"
  cat > "$SMOKE_SRC" <<'CC'
// dlopen the op library, create a delegate with backend=cpu, check a bad option is refused.
#include <dlfcn.h>
#include <cstdio>
typedef void* (*Create)(char**, char**, size_t, void (*)(const char*));
typedef void (*Destroy)(void*);
static void report(const char* message) { std::fprintf(stderr, "  (reported) %s\n", message); }
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { std::fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  Create create = reinterpret_cast<Create>(dlsym(lib, "tflite_plugin_create_delegate"));
  Destroy destroy = reinterpret_cast<Destroy>(dlsym(lib, "tflite_plugin_destroy_delegate"));
  if (!create || !destroy) { std::fprintf(stderr, "missing entry points\n"); return 1; }
  char key[] = "backend", cpu[] = "cpu", bogus[] = "no-such-backend";
  char* keys[] = {key};
  char* good[] = {cpu};
  void* delegate = create(keys, good, 1, report);
  if (!delegate) { std::fprintf(stderr, "backend=cpu: no delegate\n"); return 1; }
  destroy(delegate);
  // backend=opencl where there is no OpenCL: refused with a report or accepted (lazy), never a crash.
  char opencl[] = "opencl";
  char* gpu[] = {opencl};
  void* gpu_delegate = create(keys, gpu, 1, report);
  std::printf("  qemu-aarch64: backend=opencl without an OpenCL driver: %s\n",
              gpu_delegate ? "delegate created (OpenCL looked up later)" : "refused cleanly");
  if (gpu_delegate) destroy(gpu_delegate);
  char* bad[] = {bogus};
  void* refused = create(keys, bad, 1, report);
  if (refused) { std::fprintf(stderr, "backend=no-such-backend was accepted\n"); destroy(refused); return 1; }
  std::printf("  qemu-aarch64: loaded, created and destroyed a backend=cpu delegate; bad option refused\n");
  return 0;
}
CC
  $TRIPLE-g++ -O1 -o "$BUILD_DIR/load_smoke" "$SMOKE_SRC" -ldl
  qemu-aarch64 -L "/usr/$TRIPLE" "$BUILD_DIR/load_smoke" "$LIB" || fail "the aarch64 smoke test under qemu failed"
fi
echo "cross_compile_check: OK"
