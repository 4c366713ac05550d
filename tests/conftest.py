"""Session-wide test setup."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Fixtures kept in modules of their own: launch / runner / half_runner (the OpenCL kernel tests'
# pyopencl harness, one a session) and runtime (litert and tf.lite, the op library's tests).
pytest_plugins = ["support.opencl_fixtures", "support.oplib_fixtures"]


def _share_exports_between_conversions() -> None:
    """Every `difflite convert` the tests start (subprocesses inherit the environment) shares one
    export cache for the session (`convert --export-cache`): the tests convert the tiny preset at
    a few sizes dozens of times, and exporting is most of each conversion. The first conversion of
    each component, model and size still exports; tests of the exporter itself call
    difflite.compiler.export directly, and tests/test_export_cache.py tests the cache."""
    if "DIFFLITE_EXPORT_CACHE" not in os.environ:
        folder = tempfile.mkdtemp(prefix="difflite-test-exports-")
        os.environ["DIFFLITE_EXPORT_CACHE"] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)


_share_exports_between_conversions()


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


@pytest.fixture(scope="session")
def lib() -> Path:
    """The op library (custom_ops/, built once and cached by difflite.runtime.oplib, or the prebuilt
    one $DIFFLITE_OPLIB names)."""
    from support.oplib_helpers import build_oplib

    return build_oplib()


@pytest.fixture(scope="session")
def opencl_lib(lib) -> Path:
    """`lib`, after checking that its OpenCL backend can start here (fails, never skips)."""
    from support.opencl_helpers import require_opencl

    require_opencl(lib)
    return lib


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per core, at most 4 (each holds torch and
    TensorFlow, and many tests start conversions of their own), at least 2: most of the suite
    waits on single-threaded `difflite` subprocesses (imports, export), so two share a core well."""
    return min(max(os.cpu_count() or 1, 2), 4)


# Fixtures that run OpenCL (PoCL) in the test's own process: a test taking one, directly or through
# another fixture, belongs to the "opencl" group.
OPENCL_FIXTURES = {"launch", "runner", "half_runner", "opencl_lib"}

# Modules that belong to the "opencl" group whole, whatever fixtures each test takes: a module-scoped
# fixture or a process-wide cache serves their OpenCL tests and the others alike (the converted tiny
# preset; the randomized configurations' exports, functools.cache), made once that way.
OPENCL_MODULES = {"test_opencl_models.py", "test_custom_ops_randomized.py"}

# Modules whose tests take opencl_lib but run OpenCL in child processes only: grouped by module, as
# any other, so that they run beside the "opencl" group rather than after it on its worker.
CHILD_OPENCL_MODULES = {"test_runtime_memory.py", "test_hostile_program_cache.py", "test_half_range.py"}


# The modules that take longest (minutes each: sanitized and cross builds, many conversions), queued
# right after the OpenCL group so that no worker is left with one of them at the end.
LONGEST_FIRST = ("test_bad_inputs.py", "test_sanitizers.py", "test_convert_cli.py", "test_controlnet.py", "test_lora.py",
                 "test_cross_compile.py", "test_single_file.py", "test_inpaint.py", "test_quantize.py", "test_bench.py",
                 "test_fewstep.py", "test_weight_recipe.py", "test_export.py", "test_passes_on_exports.py")


def in_opencl_group(item) -> bool:
    """Whether `item` runs OpenCL in this process (see OPENCL_FIXTURES, OPENCL_MODULES,
    CHILD_OPENCL_MODULES)."""
    name = item.path.name
    if name in OPENCL_MODULES:
        return True
    if name in CHILD_OPENCL_MODULES:
        return False
    return not OPENCL_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def loads_tensorflow(item) -> bool:
    """Whether `item` imports tensorflow: its name says so, or it runs on the `runtime` fixture's
    "tf" (tf.lite)."""
    callspec = getattr(item, "callspec", None)
    return "tensorflow" in item.name or (callspec is not None and callspec.params.get("runtime") == "tf")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Run the in-process OpenCL tests before anything that imports tensorflow: the warm-up above
    keeps our delegate working after tensorflow loads, but PoCL still crashed compiling some of
    pyopencl's programs afterwards.

    The rule: a test is in the "opencl" group when it takes an OpenCL fixture (OPENCL_FIXTURES) or
    its module is in OPENCL_MODULES, unless its module is in CHILD_OPENCL_MODULES; any other test
    is in its module's group. So one module can hold both (tests/test_op_*.py: an op's CPU backend
    tests, which run on tensorflow's tf.lite too, beside its OpenCL tests). Under xdist (pyproject's
    addopts) a worker runs a group whole, so its fixtures are made once; the "opencl" group is
    queued first (no reordering), so its worker runs it before anything else, the group's own
    tensorflow tests (loads_tensorflow) last. With -n 0 the same order holds in the one process:
    the "opencl" group, the longest modules, the rest, the "opencl" group's tensorflow tests."""
    opencl = {id(item) for item in items if in_opencl_group(item)}

    def place(item) -> tuple[int, int]:
        if id(item) in opencl:
            return (3, 0) if loads_tensorflow(item) else (0, 0)
        name = item.path.name
        return (1, LONGEST_FIRST.index(name)) if name in LONGEST_FIRST else (2, 0)
    items.sort(key=place)  # stable: keeps the order within each group
    for item in items:
        group = "opencl" if id(item) in opencl else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group))
