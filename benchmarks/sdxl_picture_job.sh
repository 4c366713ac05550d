# One detached job: the int4 SDXL phone files' `--low-memory` picture at 1024x1024 on an NVIDIA
# GPU (sdxl_gpu.py converts the int4 folder, then runs STEPS), and the host memory of a process
# loading and running the UNet (host_memory_stages.py). It runs from a copy of the tree
# (WORK/src), since each later device call re-copies the working tree; WORK/all_done marks the end.
#
#   setsid nohup bash benchmarks/sdxl_picture_job.sh /tmp/pic [STEPS] > /tmp/pic.log 2>&1 &
WORK=${1:-/tmp/pic}
STEPS=${2:-peer_int4,picture_int4_low_memory,gpu_context}
mkdir -p "$WORK/src" && rm -f "$WORK/all_done"
cp -a . "$WORK/src" && cd "$WORK/src" || exit 1
source benchmarks/device_setup.sh || exit 1
python benchmarks/sdxl_gpu.py --work "$WORK" --runs 5 --peer-runs 5 --recipes benchmarks/recipes --steps "$STEPS"
python benchmarks/host_memory_stages.py "$WORK/int4" --components unet --save "$WORK/host_stages.json"
touch "$WORK/all_done"
