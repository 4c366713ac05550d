# Issue 36's half-arithmetic comparison on a lent NVIDIA GPU, in one of two parts (each fits one
# 10-minute device call): the generic (phone) profile's fp16 files through PoCL's CUDA driver with
# half arithmetic and with float arithmetic (math=fp32: the same compiler, so the two columns
# separate the arithmetic from PoCL's code generation), side by side with LiteRT's GPU engine at
# fp16 and fp32 on the --no-fuse files of the same weights; the "te_vae" part also profiles the
# VAE decoder per kernel under PoCL (half arithmetic) and, back on NVIDIA's OpenCL, the
# nvidia-h100 profile's VAE decoder (float arithmetic).
#
#   bash benchmarks/pocl_cuda_peer.sh te_vae|unet      (repository root; carry .whl .gl .devcarry .pocl)
#
# PRECISIONS=fp16 leaves out the math=fp32 column (PoCL 6.0 crashed in it on the UNet, H200, 2026-11-29).
# TENSOR_CORES=1: PoCL targets sm_80 and the GEMMs take the tensor-core tiles
# (POCL_CUDA_GPU_ARCH=sm_80 DIFFLITE_TENSOR_CORES=on): half arithmetic elsewhere, the matrix units
# for the GEMMs, as LiteRT's fp16 engine runs on this GPU (docs/lab-notebook.md §68). With it,
# MIN_BLOCKS (default 2; 0: none) work-groups a compute unit bound the kernels' registers
# (POCL_CUDA_MIN_BLOCKS_PER_SM, the launch bounds benchmarks/pocl_cuda_build.sh adds to PoCL;
# §70: the tensor-core tile 160 -> 128 registers, the VAE decoder 28.3 -> 19.8 ms), every
# kernel's or those BOUNDS_KERNELS names (comma separated, e.g. gemm: the convolution's
# tensor-core tile takes 200 registers in PoCL's PTX and would spill under 128).
#
# Results under $OUT (default benchmarks/results): gpu_peer_<device>.json and, for te_vae,
# gpu_profile_vae_decoder_{generic_pocl_half,nvidia_h100_nvidia_fp16}.json.
set -e
part=${1:?usage: bash benchmarks/pocl_cuda_peer.sh te_vae|unet}
OUT=${OUT:-benchmarks/results}
export OUT
source benchmarks/device_setup.sh
case "$part" in
  te_vae) components=text_encoder,vae_decoder ;;
  unet) components=unet ;;
  *) echo "pocl_cuda_peer: part is te_vae or unet, not $part" >&2; exit 2 ;;
esac
if [ "$part" = te_vae ]; then
  # on NVIDIA's OpenCL, before PoCL becomes the ICD (run after it, on 2026-11-30 this profile
  # timed PoCL: its ran_on now says which platform it timed)
  python -m difflite convert preset:sd15 -o /tmp/vae-h100 --components vae_decoder --precision fp16 \
    --device-profile nvidia-h100 > /dev/null
  python benchmarks/gpu_profile.py /tmp/vae-h100 vae_decoder --runs 5 --detail --precision fp16 \
    --json "$OUT/gpu_profile_vae_decoder_nvidia_h100_nvidia_fp16.json" | tail -40
fi
source benchmarks/pocl_cuda_setup.sh
if [ -n "${TENSOR_CORES:-}" ]; then
  export POCL_CUDA_GPU_ARCH=sm_80 DIFFLITE_TENSOR_CORES=on
  [ "${MIN_BLOCKS:-2}" = 0 ] || export POCL_CUDA_MIN_BLOCKS_PER_SM=${MIN_BLOCKS:-2}
  [ -z "${BOUNDS_KERNELS:-}" ] || export POCL_CUDA_LAUNCH_BOUNDS_KERNELS=$BOUNDS_KERNELS
fi
work=/tmp/peer-$part
python benchmarks/gpu_peer.py --work "$work" --runs 10 --components "$components" --skip torch \
  --precisions "${PRECISIONS:-fp16,fp16:math=fp32}" --library "$DIFFLITE_OPLIB" --convert-args "--device-profile generic"
if [ "$part" = te_vae ]; then
  python benchmarks/gpu_profile.py "$work/fused" vae_decoder --runs 5 --detail --precision fp16 \
    --json "$OUT/gpu_profile_vae_decoder_generic_pocl_half.json" | tail -40
fi
