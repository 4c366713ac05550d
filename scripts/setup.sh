#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for difflite: system packages, the CPU build of torch,
# then difflite itself (editable). `--test` adds the test-only dependencies (pytest, tensorflow).
set -euo pipefail
cd "$(dirname "$0")/.."
# `--test` also unpacks Intel's CPU runtime for OpenCL (scripts/fetch_fp16_opencl.sh): the tests'
# OpenCL device with cl_khr_fp16, for half arithmetic (tests/test_fp16_device.py).

APT_PACKAGES=(cmake g++ make opencl-headers ocl-icd-opencl-dev pocl-opencl-icd libflatbuffers-dev clinfo)
# tests also cross-compile the op library for aarch64 and load it under qemu-user, and build it
# with ASan/UBSan plus its libFuzzer target (tests/test_sanitizers.py: clang and its runtimes,
# which Debian 12's clang-15 brings in libclang-common-15-dev)
[ "${1:-}" = "--test" ] && APT_PACKAGES+=(g++-aarch64-linux-gnu qemu-user clang-15)
PYTHON=${PYTHON:-python3}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# torch first and pinned: anything that pulls an unpinned torch would fetch a multi-GB CUDA build.
"$PYTHON" -m pip install -q torch==2.13.0
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
"$PYTHON" -m pip install -q -e ".${extras}"
# A single-file checkpoint carries no tokenizer: its CLIP vocabulary comes from the BPE merges that
# open_clip_torch ships as package data. --no-deps: only that file is read (open_clip is never
# imported), and its requirements would pull torchvision and an unpinned torch.
"$PYTHON" -m pip install -q --no-deps open_clip_torch==3.3.0
"$PYTHON" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
if [ "${1:-}" = "--test" ]; then PYTHON="$PYTHON" scripts/fetch_fp16_opencl.sh >/dev/null; fi
