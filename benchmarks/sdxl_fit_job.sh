# One detached job (a lent machine's calls are capped at 10 minutes): what session 33's op-library
# changes save on the int4 SDXL phone files on an NVIDIA GPU, side by side in one run with the
# op library of the commit before them (.devcarry/libdifflite_delegate_previous.so, built on the
# host: sdxl_gpu.py's PREVIOUS_OPLIB). The changes: Winograd's bands within 64 MiB (was 256) and
# fitted to the buffers the tensors leave idle (GpuOp::FitScratch). sdxl_gpu.py converts the int4
# folder (generic profile, batch 1, appended weights), then times the int4 UNet and VAE decoder
# and the --low-memory picture with both libraries, and a bare OpenCL context;
# gpu_memory_parts.py splits the UNet's and the VAE decoder's GPU memory with both, and
# host_memory_stages.py the host memory of a process loading and running each of the two.
#
# It runs from a copy of the tree (WORK/src): each later device call re-copies the working tree,
# which broke a job run from it (notebook §76). WORK/all_done marks the end.
#
#   setsid nohup bash benchmarks/sdxl_fit_job.sh /tmp/fit > /tmp/fit.log 2>&1 &
WORK=${1:-/tmp/fit}
mkdir -p "$WORK/src" && rm -f "$WORK/all_done"
cp -a . "$WORK/src" && cd "$WORK/src" || exit 1
source benchmarks/device_setup.sh || exit 1
PREVIOUS=$PWD/.devcarry/libdifflite_delegate_previous.so
python benchmarks/sdxl_gpu.py --work "$WORK" --runs 5 --peer-runs 5 --recipes benchmarks/recipes \
  --steps peer_int4,peer_int4_previous,picture_int4_low_memory,picture_int4_low_memory_previous,gpu_context
python benchmarks/host_memory_stages.py "$WORK/int4" --components unet,vae_decoder --save "$WORK/host_stages.json"
python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet,vae_decoder --save "$WORK/parts.json"
DIFFLITE_OPLIB=$PREVIOUS python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet,vae_decoder \
  --save "$WORK/parts_previous.json"
touch "$WORK/all_done"
