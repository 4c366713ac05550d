#!/bin/bash
# benchmarks/runtime_memory.py on a lent NVIDIA GPU: SD 1.5 fp16, default profile, batch 2, 512x512,
# converted there (skipped when /tmp/sd15 holds it), with diffusers' fp16 pipeline as the reference.
# Carry .whl (see device_setup.sh) and .oplib (the op library built on the host: libdifflite_delegate.so).
# Results: $OUT/runtime_memory_gpu.json and .log.
source benchmarks/device_setup.sh || exit 1
export DIFFLITE_OPLIB=$PWD/.oplib/libdifflite_delegate.so
set -o pipefail
if [ ! -f /tmp/sd15/manifest.json ]; then
  python3 -m difflite convert preset:sd15 -o /tmp/sd15 --precision fp16 --batch 2 2>&1 | tail -8 | tee $OUT/convert.log
fi
python3 benchmarks/runtime_memory.py /tmp/sd15 --runs 5 --steps 20 --diffusers-folder /tmp/sd15-diffusers \
  --save $OUT/runtime_memory_gpu.json "$@" 2>&1 | tee $OUT/runtime_memory_gpu.log
