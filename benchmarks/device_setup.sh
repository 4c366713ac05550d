# Source this on a lent NVIDIA GPU machine (Python 3.12 with torch, no network) from the repository
# root, with .whl/ (cp312 wheels: ai-edge-litert 2.3.0, backports.strenum, diffusers 0.42.1,
# onnx-ir, pyopencl + pytools, platformdirs, siphash24) and .gl/ (the Debian .debs of libvulkan1
# and the GL loaders) carried along; see docs/lab-notebook.md for how they are fetched.
#
#   source benchmarks/device_setup.sh
#
# The image has no flatbuffers headers to build the op library with: build it on the host
# (`difflite oplib build -o .devcarry`) and carry .devcarry/ too; DIFFLITE_OPLIB then names it.
#
# Afterwards: NVIDIA's OpenCL is the only ICD (OCL_ICD_FILENAMES; OCL_ICD_VENDORS for other
# loaders), Vulkan finds NVIDIA's driver for LiteRT's GPU accelerator, and the wheels are on
# PYTHONPATH before the image's own packages.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "device_setup: wheel install failed" >&2; return 1; }
export PYTHONPATH=/tmp/site:$PWD
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
if ! ldconfig -p | grep -q libnvidia-opencl; then echo "device_setup: no libnvidia-opencl" >&2; fi
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd
# The image's libOpenCL.so.1 (CUDA's loader) reads OCL_ICD_FILENAMES, not OCL_ICD_VENDORS, and the
# image sets it to libpocl.so.2:libnvidia-opencl.so.1: every process then loaded PoCL and its LLVM 16
# and clang (61 MiB of host memory) for a platform it never used (benchmarks/opencl_libraries.sh,
# notebook §78). Unset, that loader finds no platform at all (checked 2026-12-01): name NVIDIA's only.
export OCL_ICD_FILENAMES=libnvidia-opencl.so.1
# Fail here, not minutes later in a job that falls back to the CPU: one platform, NVIDIA's.
python3 -c "import ctypes, sys; cl = ctypes.CDLL('libOpenCL.so.1'); n = ctypes.c_uint(0)
ids = (ctypes.c_void_p * 4)(); name = ctypes.create_string_buffer(256)
ok = cl.clGetPlatformIDs(4, ids, ctypes.byref(n)) == 0 and n.value == 1
ok = ok and cl.clGetPlatformInfo(ctypes.c_void_p(ids[0]), 0x0902, 256, name, None) == 0
sys.exit(not (ok and b'NVIDIA' in name.value))" \
  || { echo "device_setup: the OpenCL loader does not find NVIDIA's platform alone" >&2; return 1; }
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if [ -f .devcarry/libdifflite_delegate.so ]; then export DIFFLITE_OPLIB=$PWD/.devcarry/libdifflite_delegate.so; fi
export DIFFLITE_DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
echo "device_setup: $DIFFLITE_DEVICE_NAME, python $(python3 -c 'import sys; print(sys.version.split()[0])')"
