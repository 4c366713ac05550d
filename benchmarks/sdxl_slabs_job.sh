# One detached job (a lent machine's calls are capped at 10 minutes): what the weight slabs save on
# the int4 SDXL phone files on an NVIDIA GPU, side by side in one run, and the int8 / int4 VAE
# decoders' time at 1024x1024. sdxl_gpu.py converts the int4 folder (generic profile, batch 1,
# appended weights) and the batch-1 int8 UNet and VAE decoder, then times the int4 UNet and VAE
# decoder with slabs and the UNet without, the --low-memory picture with and without, the int8
# UNet and VAE decoder, and a bare OpenCL context; gpu_memory_parts.py then splits the int4 UNet's
# GPU memory with and without. WORK/all_done marks the end.
#
#   setsid nohup bash benchmarks/sdxl_slabs_job.sh /tmp/slabs > /tmp/slabs.log 2>&1 &
source benchmarks/device_setup.sh || exit 1
WORK=${1:-/tmp/slabs}
mkdir -p "$WORK" && rm -f "$WORK/all_done"
python benchmarks/sdxl_gpu.py --work "$WORK" --runs 5 --peer-runs 5 --recipes benchmarks/recipes \
  --steps peer_int4,peer_int4_apart,picture_int4_low_memory,picture_int4_low_memory_apart,peer_int8_b1,gpu_context
python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet --save "$WORK/parts_slabs.json"
DIFFLITE_WEIGHT_SLABS=off python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet \
  --save "$WORK/parts_apart.json"
touch "$WORK/all_done"
