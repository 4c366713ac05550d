# One detached job (a lent machine's calls are capped at 10 minutes): what lending the op scratch
# from the intermediates' idle buffers saves on the int4 SDXL phone files on an NVIDIA GPU, side
# by side in one run. sdxl_gpu.py converts the int4 folder (generic profile, batch 1, appended
# weights), then times the int4 UNet and VAE decoder with the scratch lent and apart
# (DIFFLITE_LEND_SCRATCH=off), the --low-memory picture both ways, and a bare OpenCL context;
# gpu_memory_parts.py then splits the UNet's and the VAE decoder's GPU memory both ways, and
# host_memory_stages.py the host memory of a process loading and running each of the two.
#
# It runs from a copy of the tree (WORK/src): each later device call re-copies the working tree,
# which broke a job run from it (notebook §76). WORK/all_done marks the end.
#
#   setsid nohup bash benchmarks/sdxl_lend_job.sh /tmp/lend > /tmp/lend.log 2>&1 &
WORK=${1:-/tmp/lend}
mkdir -p "$WORK/src" && rm -f "$WORK/all_done"
cp -a . "$WORK/src" && cd "$WORK/src" || exit 1
source benchmarks/device_setup.sh || exit 1
python benchmarks/sdxl_gpu.py --work "$WORK" --runs 5 --peer-runs 5 --recipes benchmarks/recipes \
  --steps peer_int4,peer_int4_scratch_apart,picture_int4_low_memory,picture_int4_low_memory_scratch_apart,gpu_context
python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet,vae_decoder --save "$WORK/parts_lent.json"
DIFFLITE_LEND_SCRATCH=off python benchmarks/gpu_memory_parts.py "$WORK/int4" --components unet,vae_decoder \
  --save "$WORK/parts_apart.json"
python benchmarks/host_memory_stages.py "$WORK/int4" --components unet,vae_decoder --save "$WORK/host_stages.json"
touch "$WORK/all_done"
