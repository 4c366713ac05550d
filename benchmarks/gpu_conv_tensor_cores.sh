#!/bin/bash
# CONV_2D's implicit GEMM on the tensor cores (conv.cl -DMMA=1), measured on a lent NVIDIA GPU in
# one detached job that outlives a 10-minute device call (issue 36): the OpenCL tests that reach
# the real mma.sync (gpu_tensor_cores.sh, with its nvidia-h100 per-kernel A/B of the VAE decoder
# and the UNet), the generic (phone) profile's UNet per kernel without and with tensor cores, the
# generic profile's three components against LiteRT's fp16 engine (gpu_phone_profile_tc.sh ab and
# nvidia), then PoCL's half arithmetic with the tensor cores, launch bounds on the GEMM kernels only
# (the convolution's tile takes 200 registers in PoCL's PTX and would spill under 128).
#
#   setsid nohup bash benchmarks/gpu_conv_tensor_cores.sh > /tmp/conv_tc.log 2>&1 < /dev/null &
#   # then, in each call: wait for $RESULTS/done, copy $RESULTS to $OUT
#
# RESULTS (default /tmp/conv_tc) holds every part's JSON and log; PARTS (default "tests ab nvidia
# pocl") picks parts. Repository root; carry .whl .gl .devcarry .pocl.
set -u
RESULTS=${RESULTS:-/tmp/conv_tc}
mkdir -p "$RESULTS"
rm -f "$RESULTS/done"
for part in ${PARTS:-tests ab nvidia pocl}; do
  echo "gpu_conv_tensor_cores: $part from $(date +%T)" >> "$RESULTS/parts.log"
  case "$part" in
    tests) OUT=$RESULTS TEST_SECONDS=${TEST_SECONDS:-150} bash benchmarks/gpu_tensor_cores.sh ;;
    ab|nvidia) OUT=$RESULTS bash benchmarks/gpu_phone_profile_tc.sh "$part" ;;
    pocl) OUT=$RESULTS BOUNDS_KERNELS=${BOUNDS_KERNELS:-gemm} bash benchmarks/gpu_phone_profile_tc.sh pocl ;;
    *) echo "gpu_conv_tensor_cores: parts are tests, ab, nvidia, pocl; not $part" >&2 ;;
  esac > "$RESULTS/$part.log" 2>&1
  echo "gpu_conv_tensor_cores: $part ended $(date +%T) with $?" >> "$RESULTS/parts.log"
done
touch "$RESULTS/done"
