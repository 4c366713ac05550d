#!/bin/bash
# The OpenCL test files on a real GPU (CI runs them on PoCL): source device_setup.sh first, with
# DIFFLITE_OPLIB pointing at a prebuilt library. DIFFLITE_CL_TRACE=1 logs every buffer's creation
# and release (how NVIDIA's crash releasing an arena sub-buffer was found).
export DIFFLITE_OPENCL_DEVICE=${DIFFLITE_OPENCL_DEVICE:-NVIDIA}
timeout "${TEST_SECONDS:-300}" python3 -m pytest -q -p no:cacheprovider \
  tests/test_opencl_kernels.py tests/test_opencl_builtins.py tests/test_opencl_models.py "$@"
