#!/bin/bash
# Per-node kernel profile of the SD 1.5 UNet and VAE decoder on the lent GPU (fp16 weights, UNet
# batch $BATCH, default 2, 512x512): converts preset:sd15 with $CONVERT_ARGS (default: the nvidia-h100 device profile) into
# $FOLDER unless it is there, then runs benchmarks/gpu_profile.py --detail on each component at
# the delegate precision $PRECISION (default fp32; fp16: half storage).
# Source device_setup.sh first; results go to $OUT (profile_<component>.json / .txt).
out=${OUT:-/tmp/profile}
folder=${FOLDER:-/tmp/sd15h}
mkdir -p "$out"
if [ ! -f "$folder/manifest.json" ]; then
  # shellcheck disable=SC2086
  python3 -m difflite convert preset:sd15 -o "$folder" --precision fp16 --batch "${BATCH:-2}" --components unet,vae_decoder \
    ${CONVERT_ARGS:---device-profile nvidia-h100} > "$out/convert.txt" 2>&1 \
    || { echo "convert failed"; tail -5 "$out/convert.txt"; exit 1; }
  cp "$folder/report.json" "$out/report.json"
fi
for component in ${COMPONENTS:-unet vae_decoder}; do
  timeout 180 python3 benchmarks/gpu_profile.py "$folder" "$component" --runs 5 --detail \
    --precision "${PRECISION:-fp32}" \
    --json "$out/profile_$component.json" > "$out/profile_$component.txt" 2>"$out/profile_$component.err"
  head -1 "$out/profile_$component.txt"
done
