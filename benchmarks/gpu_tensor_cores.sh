#!/bin/bash
# The GEMMs on tensor cores (custom_ops/builtins/matmul/gemm_mma.cl) on a lent NVIDIA GPU: the
# OpenCL tests that reach them (half storage, NVIDIA's OpenCL), then the per-kernel profile of the
# nvidia-h100 profile's SD 1.5 VAE decoder and UNet with tensor cores and without
# (DIFFLITE_TENSOR_CORES=off), each in its own process (benchmarks/gpu_generic_ab.sh).
#
#   bash benchmarks/gpu_tensor_cores.sh      # repository root; carry .whl .devcarry
#
# COMPONENTS (default "vae_decoder unet"), TILES (more variants, e.g.
# "tk16:DIFFLITE_GEMM_TILE=128x128x16x8x8m"), PEER=1 (then benchmarks/gpu_peer.py at fp16),
# TEST_SECONDS (default 300). Results (OUT, default
# benchmarks/results): gpu_tensor_cores_tests.log and
# gpu_profile_<component>_nvidia-h100_nvidia_{tc,tcoff}.json.
set -e
source benchmarks/device_setup.sh
export DIFFLITE_OPENCL_DEVICE=NVIDIA
log=${OUT:-benchmarks/results}/gpu_tensor_cores_tests.log
: > "$log"
run_tests() { timeout "${TEST_SECONDS:-300}" python3 -m pytest -q -o addopts= -p no:cacheprovider "$@" >> "$log" 2>&1 || true; }
run_tests tests/test_opencl_builtins.py -k "tensor_cores or batch_matmul or fully_connected or forced or split_k"
run_tests tests/test_quantized_weights_delegate.py -k "half_storage"
run_tests tests/test_op_winograd.py --deselect tests/test_op_winograd.py::TestCpuBackend
grep -E "passed|failed" "$log"
for component in ${COMPONENTS:-vae_decoder unet}; do
  # shellcheck disable=SC2086
  PROFILE=nvidia-h100 BACKENDS=nvidia COMPONENT=$component \
    bash benchmarks/gpu_generic_ab.sh tc tcoff:DIFFLITE_TENSOR_CORES=off ${TILES:-}
done
# PEER=1: then SD 1.5's UNet step and VAE decoder at fp16 against LiteRT's GPU engine and PyTorch
# in one run (benchmarks/gpu_peer.py, nvidia-h100 profile, tensor cores as the delegate chooses).
if [ -n "${PEER:-}" ]; then
  python3 benchmarks/gpu_peer.py --work /tmp/peer-tc --runs 10 --precisions fp16 --library "$DIFFLITE_OPLIB"
fi
