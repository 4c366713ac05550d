#!/bin/bash
# GEMM/conv tile choice and Winograd coverage on the lent GPU. Converts the SD 1.5 UNet and VAE
# decoder (fp16 weights, batch 2, 512x512) twice, in parallel: the default conversion (generic
# profile, 200 MB Winograd budget) and one with the nvidia-h100 profile and no budget limit (every
# eligible 3x3 convolution as Winograd). Profiles the default UNet with each DIFFLITE_GEMM_TILE in
# $TILES and the default choice, then the all-Winograd UNet and both VAE decoders
# (benchmarks/gpu_profile.py). Source benchmarks/device_setup.sh first; results go to $OUT.
out=${OUT:-/tmp/tiles}
mkdir -p "$out"
convert() {  # folder, extra args...
  local folder=$1; shift
  [ -f "$folder/manifest.json" ] || python3 -m difflite convert preset:sd15 -o "$folder" --precision fp16 --batch 2 \
    --components unet,vae_decoder "$@" > "$out/convert_$(basename "$folder").txt" 2>&1
}
convert /tmp/sd15 & convert /tmp/sd15w --device-profile nvidia-h100 --winograd-budget-mb 100000 & wait
for folder in /tmp/sd15 /tmp/sd15w; do
  [ -f "$folder/manifest.json" ] || { echo "convert $folder failed"; tail -3 "$out/convert_$(basename "$folder").txt"; exit 1; }
done
profile() {  # label, folder, component
  timeout 120 python3 benchmarks/gpu_profile.py "$2" "$3" --runs 5 --json "$out/profile_$1.json" > "$out/profile_$1.txt" 2>&1
  echo "$1: $(head -1 "$out/profile_$1.txt")"
  grep -E "CONV_2D|FULLY_CONNECTED|Attention|Winograd" "$out/profile_$1.txt"
}
for tile in default ${TILES:-64x64x16x4x4v 128x128x16x8x8v}; do
  if [ "$tile" = default ]; then profile unet_default /tmp/sd15 unet
  else DIFFLITE_GEMM_TILE=$tile profile "unet_$tile" /tmp/sd15 unet; fi
done
profile unet_all_winograd /tmp/sd15w unet
python3 -c "import json; r = json.load(open('/tmp/sd15w/report.json'))['components']['unet']['winograd']; print('all-winograd UNet:', len(r['convs']), 'convs,', r['extra_weights_mb'], 'MB extra')"
profile vae_default /tmp/sd15 vae_decoder
profile vae_all_winograd /tmp/sd15w vae_decoder
