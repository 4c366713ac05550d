# One detached job (a lent machine's calls are capped at 10 minutes): where the GPU memory of the
# int4 SDXL phone files goes (gpu_memory_parts.py) for the UNet and the VAE decoder at 1024x1024,
# with and without tensor cores, beside preset:sdxl-tiny at the same settings (whose weights and
# activations are small: what stays is the driver's). WORK/done marks the end.
#
#   setsid nohup bash benchmarks/sdxl_int4_memory_job.sh /tmp/mem > /tmp/mem.log 2>&1 &
source benchmarks/device_setup.sh || exit 1
WORK=${1:-/tmp/mem}
mkdir -p "$WORK" && rm -f "$WORK/done"
FLAGS="--precision fp16 --height 1024 --width 1024 --batch 1 --weights int4 --device-profile generic --weights-layout appended"
python -m difflite convert preset:sdxl -o "$WORK/sdxl" $FLAGS --components unet,vae_decoder \
  --weights-recipe benchmarks/recipes/sdxl_int4.json > "$WORK/convert_sdxl.log" 2>&1 &
SDXL=$!
python -m difflite convert preset:sdxl-tiny -o "$WORK/tiny" $FLAGS --components unet,vae_decoder > "$WORK/convert_tiny.log" 2>&1
python benchmarks/gpu_memory_parts.py "$WORK/tiny" --save "$WORK/tiny.json"
DIFFLITE_TENSOR_CORES=off python benchmarks/gpu_memory_parts.py "$WORK/tiny" --save "$WORK/tiny_tc_off.json"
wait $SDXL || { tail -20 "$WORK/convert_sdxl.log"; touch "$WORK/done"; exit 1; }
python benchmarks/gpu_memory_parts.py "$WORK/sdxl" --save "$WORK/sdxl.json"
DIFFLITE_TENSOR_CORES=off python benchmarks/gpu_memory_parts.py "$WORK/sdxl" --components unet --save "$WORK/sdxl_tc_off.json"
touch "$WORK/done"
