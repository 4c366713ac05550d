#!/bin/bash
# The OpenCL test files on a real GPU (CI runs them on PoCL): source device_setup.sh first, with
# DIFFLITE_OPLIB pointing at a prebuilt library. DIFFLITE_CL_TRACE=1 logs every buffer's creation
# and release (how NVIDIA's crash releasing an arena sub-buffer was found). The ops' files also
# hold their CPU backend tests (class TestCpuBackend), which need tensorflow: left out here.
export DIFFLITE_OPENCL_DEVICE=${DIFFLITE_OPENCL_DEVICE:-NVIDIA}
ops=(tests/test_op_group_norm.py tests/test_op_gelu.py tests/test_op_attention.py tests/test_op_winograd.py)
cpu=()
for f in "${ops[@]}"; do cpu+=(--deselect "$f::TestCpuBackend"); done
timeout "${TEST_SECONDS:-300}" python3 -m pytest -q -p no:cacheprovider "${cpu[@]}" \
  "${ops[@]}" tests/test_opencl_programs.py tests/test_opencl_builtins.py tests/test_opencl_models.py "$@"
