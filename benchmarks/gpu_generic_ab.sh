# Issue 36's per-kernel A/B of the generic (phone) profile's SD 1.5 VAE decoder (or COMPONENT=unet,
# text_encoder; PROFILE=nvidia-h100 for another device profile) on a lent NVIDIA GPU: one
# conversion (fp16 files, generic profile), then benchmarks/gpu_profile.py per variant,
# each in its own process, on NVIDIA's OpenCL (float arithmetic) and on PoCL's CUDA driver (half
# arithmetic). A variant is NAME or NAME:VAR=VALUE[,VAR=VALUE] (the op library's DIFFLITE_*
# switches, custom_ops/README.md), e.g.
#
#   bash benchmarks/gpu_generic_ab.sh base gn256:DIFFLITE_GN_PARTIALS=256 tile128:DIFFLITE_GEMM_TILE=128x128x16x8x8v
#
# (repository root; carry .whl .gl .devcarry .pocl). BACKENDS=nvidia|pocl|"nvidia pocl" (default
# both). Results: $OUT/gpu_profile_<component>_<profile>_<backend>_<variant>.json (default
# benchmarks/results), and a table of kernel ms per variant on stdout.
set -e
[ $# -gt 0 ] || { echo "usage: bash benchmarks/gpu_generic_ab.sh VARIANT [VARIANT ...]" >&2; exit 2; }
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
source benchmarks/device_setup.sh
component=${COMPONENT:-vae_decoder}
profile=${PROFILE:-generic}
# A phone profile's own kernels: no tensor cores on NVIDIA (a variant may set them back on).
if [ "$profile" != nvidia-h100 ]; then export DIFFLITE_TENSOR_CORES=${DIFFLITE_TENSOR_CORES:-off}; fi
work=/tmp/$profile-$component
[ -f "$work/manifest.json" ] || python -m difflite convert preset:sd15 -o "$work" --components "$component" \
  --precision fp16 --device-profile "$profile" > /dev/null
profile_variants() {  # backend
  local spec name settings
  for spec in "${VARIANTS[@]}"; do
    name=${spec%%:*}
    settings=
    [ "$spec" != "$name" ] && settings=${spec#*:}
    env ${settings//,/ } python benchmarks/gpu_profile.py "$work" "$component" --runs 5 --detail \
      --precision fp16 --json "$OUT/gpu_profile_${component}_${profile}_$1_$name.json" > /dev/null \
      || echo "gpu_generic_ab: $1 $name failed" >&2
    python - "$OUT/gpu_profile_${component}_${profile}_$1_$name.json" "$1 $name" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
top = sorted(d["ops_ms"].items(), key=lambda kv: -kv[1])[:6]
print(f"{sys.argv[2]:<24} kernels {d['kernel_ms']:.2f} ms, wall {d['wall_ms_median']:.2f} ms; top: "
      + "; ".join(f"{v:.2f} {k.split(' ')[-1]} {k.split(' ')[1].split(',')[0]}" for k, v in top))
PY
  done
}
VARIANTS=("$@")
for backend in ${BACKENDS:-nvidia pocl}; do
  if [ "$backend" = pocl ]; then source benchmarks/pocl_cuda_setup.sh; fi
  profile_variants "$backend"
done
