#!/usr/bin/env bash
# Convert a local diffusers folder (the `save_pretrained` layout: model_index.json, unet/,
# vae/, text_encoder/, tokenizer/, scheduler/), verify every component against PyTorch, and
# make one picture with the converted files.
#
#   examples/convert_local_folder.sh MODEL_DIR [OUT] [PROMPT]
#
# MODEL_DIR may also be preset:tiny / preset:sd15 / preset:sd21 to try it without a model.
# Environment: HEIGHT/WIDTH (512), PRECISION (fp32; verification tolerances are fp32 1e-3
# relative, fp16 40 dB PSNR), BATCH (2: guidance in one UNet call), STEPS (20), SEED (0),
# GUIDANCE (7.5), SCHEDULER (default: the folder's own), BACKEND (cpu|opencl),
# CONVERT_ARGS (more `difflite convert` arguments, e.g. --no-fuse), IMAGE (OUT/picture.png).
# Exit codes: those of the failing difflite command (1 verification failed, 2 bad input).
set -euo pipefail

MODEL=${1:?usage: $0 MODEL_DIR [OUT] [PROMPT]}
OUT=${2:-out/$(basename "$MODEL" | tr -c 'A-Za-z0-9_.-' '_')}
PROMPT=${3:-"a photo of an astronaut riding a horse"}
IMAGE=${IMAGE:-$OUT/picture.png}

if [[ "$MODEL" != preset:* && ! -f "$MODEL/model_index.json" && ! -d "$MODEL/unet" ]]; then
  echo "convert_local_folder: $MODEL is not a diffusers folder (no model_index.json or unet/)" >&2
  exit 2
fi

# 1. convert (text encoder, UNet, VAE decoder, and the VAE encoder for img2img)
# shellcheck disable=SC2086
difflite convert "$MODEL" -o "$OUT" \
  --height "${HEIGHT:-512}" --width "${WIDTH:-512}" \
  --precision "${PRECISION:-fp32}" --batch "${BATCH:-2}" \
  --components text_encoder,unet,vae_decoder,vae_encoder ${CONVERT_ARGS:-}

# 2. what was written: ops, custom ops, weights and planned memory
difflite inspect "$OUT"

# 3. each component against PyTorch on seeded inputs (exit 1 when over tolerance)
difflite verify "$OUT" --backend "${BACKEND:-cpu}"

# 4. one picture (the same one diffusers' StableDiffusionPipeline makes from the same seed)
difflite generate "$OUT" "$PROMPT" -o "$IMAGE" \
  --steps "${STEPS:-20}" --seed "${SEED:-0}" --guidance "${GUIDANCE:-7.5}" \
  --scheduler "${SCHEDULER:-default}" --backend "${BACKEND:-cpu}" --json

# 5. img2img from that picture, to show the VAE encoder works too
difflite generate "$OUT" "$PROMPT, oil painting" -o "${IMAGE%.png}-img2img.png" \
  --init-image "$IMAGE" --strength 0.6 --steps "${STEPS:-20}" --seed "${SEED:-0}" \
  --scheduler "${SCHEDULER:-default}" --backend "${BACKEND:-cpu}"

echo "converted $MODEL into $OUT; pictures: $IMAGE ${IMAGE%.png}-img2img.png"
