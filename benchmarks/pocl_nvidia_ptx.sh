#!/bin/bash
# The same programs compiled by NVIDIA's OpenCL and by PoCL's CUDA driver (clang/LLVM 15 at sm_80,
# half arithmetic), side by side: the SD 1.5 VAE decoder of the generic (phone) profile at fp16
# with the GEMMs on the tensor cores, profiled per kernel on each, and the PTX each compiler made
# kept for reading offline (issue 36, item 2: under PoCL the tensor-core Winograd GEMMs ran 3x
# slower than NVIDIA's build of the same source, docs/lab-notebook.md §70). MIN_BLOCKS=N sets
# PoCL's launch bounds (POCL_CUDA_MIN_BLOCKS_PER_SM).
#
#   bash benchmarks/pocl_nvidia_ptx.sh      (repository root; carry .whl .gl .devcarry .pocl)
#
# Results under $OUT (default benchmarks/results/pocl_nvidia_ptx): gpu_profile_{nvidia,pocl}.json
# (each says in ran_on which platform it timed), nvidia_programs/ (the op library's program cache
# of NVIDIA's OpenCL: each entry's binary is NVIDIA's PTX) and pocl_ptx/ (PoCL's kernel cache,
# the .ptx files only).
set -e
OUT=${OUT:-benchmarks/results}/pocl_nvidia_ptx
mkdir -p "$OUT"
source benchmarks/device_setup.sh
folder=/tmp/ptx-vae
python3 -m difflite convert preset:sd15 -o "$folder" --components vae_decoder --precision fp16 \
  --device-profile generic > /dev/null
profile() {  # profile NAME: the decoder per kernel, the op library's program cache in /tmp/cache-NAME
  XDG_CACHE_HOME=/tmp/cache-$1 python3 benchmarks/gpu_profile.py "$folder" vae_decoder --runs 5 --detail \
    --precision fp16 --json "$OUT/gpu_profile_$1.json" > "/tmp/profile-$1.log"
  head -12 "/tmp/profile-$1.log"
}
DIFFLITE_TENSOR_CORES=on profile nvidia
source benchmarks/pocl_cuda_setup.sh
# MIN_BLOCKS=2: PoCL's launch bounds (benchmarks/pocl_cuda_build.sh), off by default here
if [ -n "${MIN_BLOCKS:-}" ]; then export POCL_CUDA_MIN_BLOCKS_PER_SM=$MIN_BLOCKS; fi
POCL_CUDA_GPU_ARCH=sm_80 DIFFLITE_TENSOR_CORES=on profile pocl
cp -r /tmp/cache-nvidia/difflite/opencl "$OUT/nvidia_programs"
mkdir -p "$OUT/pocl_ptx"
find "$POCL_CACHE_DIR" -name '*.ptx' | while read -r ptx; do
  cp "$ptx" "$OUT/pocl_ptx/$(echo "${ptx#"$POCL_CACHE_DIR"/}" | tr / _)"
done
du -sh "$OUT"/*
