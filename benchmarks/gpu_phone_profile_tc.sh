#!/bin/bash
# The generic (phone) profile's SD 1.5 fp16 files against LiteRT's GPU engine at fp16 on a lent
# NVIDIA GPU, with the GEMMs on the tensor cores on both sides (issue 36, item 2;
# docs/lab-notebook.md §68-69: on the H200 LiteRT's fp16 GEMMs run there too). Three parts, each
# into its own folder under OUT (default benchmarks/results/phone_tc):
#
#   nvidia  gpu_peer.py on NVIDIA's OpenCL: every component of the generic profile's files with
#           tensor cores (float arithmetic elsewhere), LiteRT fp16 on the --no-fuse files;
#   ab      gpu_generic_ab.sh per kernel, generic UNet: float tiles (base), tensor cores (tc), and
#           tensor cores with the attention's GEMM form instead of the recompute kernels (tcgemm);
#   pocl    pocl_cuda_peer.sh te_vae and unet with TENSOR_CORES=1: PoCL's CUDA driver at sm_80,
#           half arithmetic, the GEMMs on the tensor cores (needs .pocl).
#
#   bash benchmarks/gpu_phone_profile_tc.sh [nvidia] [ab] [pocl]     (default: all three)
#
# Repository root; carry .whl .gl .devcarry (and .pocl for the pocl part). Each delegate's stats
# (gpu_peer's delegate_stats) carry gemm_tiles: a trailing m where a GEMM took a tensor-core tile.
set -e
OUT_ROOT=${OUT:-benchmarks/results}/phone_tc
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(nvidia ab pocl)
source benchmarks/device_setup.sh
for part in "${parts[@]}"; do
  mkdir -p "$OUT_ROOT/$part"
  case "$part" in
    nvidia)
      OUT="$OUT_ROOT/$part" python3 benchmarks/gpu_peer.py --work /tmp/phone-tc --runs 10 \
        --components text_encoder,unet,vae_decoder --precisions fp16 --litert-precisions fp16 --skip torch \
        --library "$DIFFLITE_OPLIB" --convert-args "--device-profile generic"
      ;;
    ab)
      OUT="$OUT_ROOT/$part" COMPONENT=unet PROFILE=generic BACKENDS=nvidia bash benchmarks/gpu_generic_ab.sh \
        base tc:DIFFLITE_TENSOR_CORES=auto tcgemm:DIFFLITE_TENSOR_CORES=auto,DIFFLITE_ATTN_KERNEL=partial
      ;;
    pocl)
      for component in te_vae unet; do
        mkdir -p "$OUT_ROOT/$part/$component"
        OUT="$OUT_ROOT/$part/$component" TENSOR_CORES=1 PRECISIONS=fp16 \
          bash benchmarks/pocl_cuda_peer.sh "$component" || echo "gpu_phone_profile_tc: pocl $component failed" >&2
      done
      ;;
    *) echo "gpu_phone_profile_tc: parts are nvidia, ab, pocl; not $part" >&2; exit 2 ;;
  esac
done
