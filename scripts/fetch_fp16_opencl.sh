#!/usr/bin/env bash
# The tests' OpenCL device with cl_khr_fp16: Intel's CPU runtime for OpenCL (from PyPI, pinned),
# unpacked into one folder (its libraries find each other through RUNPATH $ORIGIN) with an ICD
# file naming it. PoCL, the tests' main device, has no cl_khr_fp16, so without this half
# arithmetic (-DDL_FP16_MATH) would only be compiled, never run. Nothing is installed into the
# Python environment: the wheels are only unpacked. Prints the folder; the fp16 lane
# (tests/test_fp16_device.py) points OCL_ICD_VENDORS at its vendors/ subfolder.
#   scripts/fetch_fp16_opencl.sh [DIR]   (default: $DIFFLITE_FP16_OPENCL_DIR or
#                                         ~/.cache/difflite/intel-cpu-opencl-2026.2.0)
set -euo pipefail
PYTHON=${PYTHON:-python3}
WHEELS=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0 tbb==2023.2.0)
DIR=${1:-${DIFFLITE_FP16_OPENCL_DIR:-$HOME/.cache/difflite/intel-cpu-opencl-2026.2.0}}

if [ -f "$DIR/vendors/intel-cpu.icd" ] && [ -f "$DIR/lib/libintelocl.so" ]; then
  echo "$DIR"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" "${WHEELS[@]}" >&2
mkdir -p "$work/unpacked" "$work/out/lib" "$work/out/vendors"
for w in "$work"/wheels/*.whl; do
  "$PYTHON" -m zipfile -e "$w" "$work/unpacked" >&2
done
# Every wheel keeps its libraries under <name>.data/data/lib. Intel's ICD loader (libOpenCL) is
# left out: the system's ocl-icd loads the runtime through the ICD file.
for lib in "$work"/unpacked/*.data/data/lib; do
  cp -a "$lib"/. "$work/out/lib/"
done
rm -f "$work"/out/lib/libOpenCL.so*
[ -f "$work/out/lib/libintelocl.so" ] || { echo "no libintelocl.so in ${WHEELS[*]}" >&2; exit 1; }
mkdir -p "$(dirname "$DIR")"
rm -rf "$DIR"
mv "$work/out" "$DIR"
echo "$DIR/lib/libintelocl.so" > "$DIR/vendors/intel-cpu.icd"
echo "$DIR"
