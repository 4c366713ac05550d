"""Session-wide test setup."""

import ctypes


def _initialise_opencl_before_tensorflow() -> None:
    """PoCL (the CPU OpenCL the OpenCL tests run on) compiles kernels with its own LLVM. If
    tensorflow, which carries another LLVM, is imported first, PoCL's platform initialisation
    segfaults in the same process; initialised first, both work. Some tests import tensorflow
    (the second TFLite runtime), so wake the OpenCL platforms before any test module loads."""
    try:
        library = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return  # no ICD loader: the OpenCL tests fail with their own message
    count = ctypes.c_uint(0)
    library.clGetPlatformIDs(0, None, ctypes.byref(count))


_initialise_opencl_before_tensorflow()
