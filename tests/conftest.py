"""Session-wide test setup."""


def _warm_up_opencl_compiler() -> None:
    """Build one OpenCL program before any test module imports tensorflow.

    PoCL (the CPU OpenCL device the OpenCL tests run on) compiles kernels with its own LLVM,
    loaded on first use. tensorflow, which some tests import as the second TFLite runtime, loads
    another LLVM with global symbol binding; if it comes first, PoCL's compiler then fails
    ("unknown target CPU") or segfaults. Loading PoCL's LLVM first avoids both (seen on this
    project's CI machine: every OpenCL test failed after the tf.lite tests had run)."""
    try:
        import pyopencl as cl
    except ImportError:
        return  # the OpenCL tests fail with their own message
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
        if devices:
            context = cl.Context(devices[:1])
            cl.Program(context, "kernel void warm(global float* a) { a[get_global_id(0)] = 1.0f; }").build()
    except cl.Error:
        return


_warm_up_opencl_compiler()
