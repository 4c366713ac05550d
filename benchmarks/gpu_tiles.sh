#!/bin/bash
# GEMM/conv tile choice on the lent GPU: converts the SD 1.5 UNet and VAE decoder (fp16 weights,
# batch 2, 512x512) once, then profiles the UNet with each DIFFLITE_GEMM_TILE candidate and the
# default choice (benchmarks/gpu_profile.py). Source device_setup.sh first; results go to $OUT.
out=${OUT:-/tmp/tiles}
mkdir -p "$out"
[ -f /tmp/sd15/manifest.json ] || python3 cli.py convert preset:sd15 -o /tmp/sd15 --precision fp16 --batch 2 \
  --components unet,vae_decoder > "$out/convert.txt" 2>&1 || { echo "convert failed"; tail "$out/convert.txt"; exit 1; }
for tile in default ${TILES:-64x64x16x4x4 128x64x16x8x4 128x128x16x8x8 128x128x8x8x8}; do
  env=""
  [ "$tile" != default ] && env="DIFFLITE_GEMM_TILE=$tile"
  env $env timeout 120 python3 benchmarks/gpu_profile.py /tmp/sd15 unet --runs 5 \
    --json "$out/profile_unet_$tile.json" > "$out/profile_unet_$tile.txt" 2>&1
  echo "tile $tile: $(head -1 "$out/profile_unet_$tile.txt")"
  grep -E "CONV_2D|FULLY_CONNECTED|Attention" "$out/profile_unet_$tile.txt"
done
timeout 120 python3 benchmarks/gpu_profile.py /tmp/sd15 vae_decoder --runs 5 \
  --json "$out/profile_vae_decoder.json" > "$out/profile_vae_decoder.txt" 2>&1
head -8 "$out/profile_vae_decoder.txt"
