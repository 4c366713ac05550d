#!/usr/bin/env bash
# Benchmark a converted pipeline on an Android phone over adb:
#   1. build the op library for Android arm64 with the NDK,
#   2. convert a model (default: the SD 1.5 architecture preset, fp16, 512x512),
#   3. push the models and the library and time each component with TFLite's benchmark_model.
#
#   ANDROID_NDK_HOME=/path/to/android-ndk examples/adb_benchmark.sh SERIAL [MODEL] [OUT]
#
# Needs: adb on PATH and the phone listed by `adb devices` (USB debugging on), and TFLite's
# benchmark_model on the phone at /data/local/tmp/benchmark_model, e.g.
#   curl -LO https://storage.googleapis.com/tensorflow-nightly-public/prod/tensorflow/release/lite/tools/nightly/latest/android_aarch64_benchmark_model
#   adb -s SERIAL push android_aarch64_benchmark_model /data/local/tmp/benchmark_model
#   adb -s SERIAL shell chmod +x /data/local/tmp/benchmark_model
# Environment: BACKEND (opencl), PRECISION (fp16), RUNS (10), WARMUP (2), STEPS (20),
# HEIGHT/WIDTH (512), CONVERT_ARGS (extra `difflite convert` arguments).
set -euo pipefail

SERIAL=${1:?usage: $0 SERIAL [MODEL] [OUT]}
MODEL=${2:-preset:sd15}
OUT=${3:-out/adb-$(echo "$MODEL" | tr -c 'A-Za-z0-9_.-' '_')}
BACKEND=${BACKEND:-opencl}
PRECISION=${PRECISION:-fp16}

if [ -z "${ANDROID_NDK_HOME:-}" ]; then
  echo "adb_benchmark: set ANDROID_NDK_HOME to an Android NDK (r23 or newer)" >&2
  exit 2
fi

# 1. the op library for arm64-v8a (custom_ops/build-android-arm64/libdifflite_delegate.so)
LIBRARY=$(difflite oplib build --target android-arm64)
echo "op library: $LIBRARY"

# 2. the models (skipped when OUT already holds a conversion)
if [ ! -f "$OUT/manifest.json" ]; then
  # shellcheck disable=SC2086
  difflite convert "$MODEL" -o "$OUT" --precision "$PRECISION" \
    --height "${HEIGHT:-512}" --width "${WIDTH:-512}" ${CONVERT_ARGS:-}
fi

# 3. time each component on the phone, print the table, keep JSON and a chart next to OUT
difflite bench "$OUT" --adb "$SERIAL" --oplib "$LIBRARY" --backend "$BACKEND" --precision "$PRECISION" \
  --runs "${RUNS:-10}" --warmup "${WARMUP:-2}" --steps "${STEPS:-20}" \
  --save "$OUT.bench.json" --plot "$OUT.bench.png"
echo "results: $OUT.bench.json, chart: $OUT.bench.png"
