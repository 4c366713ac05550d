"""Build the C++ op library (custom_ops/, CMake) that runs the difflite custom ops.

`difflite oplib build` and the tests use this; the runtime finds the result through
difflite.runtime.component.find_oplib (custom_ops/build by default)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from difflite.core.errors import BadInput

SOURCE = Path(__file__).resolve().parents[2] / "custom_ops"
DEFAULT_BUILD = SOURCE / "build"
LIBRARY_NAME = "libdifflite_delegate.so"
TARGETS = ("host", "android-arm64")


class BuildFailed(RuntimeError):
    pass


BUILD_LOG = "build-output.log"  # in the build folder: the failed step's whole output


def newest_source_mtime(source: Path, build_dir: Path) -> float:
    newest = 0.0
    for path in source.rglob("*"):
        if path.is_file() and build_dir not in path.parents and not path.relative_to(source).parts[0].startswith("build"):
            newest = max(newest, path.stat().st_mtime)
    return newest


@contextlib.contextmanager
def build_lock(build_dir: Path):
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".difflite-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


ANDROID_ABI = "arm64-v8a"
ANDROID_PLATFORM_DEFAULT = "android-28"
NDK_ENV = "ANDROID_NDK_HOME"
FLATBUFFERS_ENV = "DIFFLITE_FLATBUFFERS_INCLUDE_DIR"
OPENCL_ENV = "DIFFLITE_OPENCL_INCLUDE_DIR"
HEADER_SEARCH = (Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include"))
# Header-only dependencies a cross build takes from the build machine:
# (CMake cache variable, folder, a header in it, the Debian package that ships it)
CROSS_HEADERS = ((FLATBUFFERS_ENV, "flatbuffers", "flexbuffers.h", "libflatbuffers-dev"),
                 (OPENCL_ENV, "CL", "cl.h", "opencl-headers"))


def default_build_dir(target: str = "host") -> Path:
    """Where build(target) puts the library when no build_dir is given. DIFFLITE_OPLIB_BUILD_DIR
    overrides the host build only: a cross build must not share a CMake cache with it."""
    if target == "host":
        return Path(os.environ.get("DIFFLITE_OPLIB_BUILD_DIR") or DEFAULT_BUILD)
    return SOURCE / f"build-{target}"


def android_ndk() -> Path:
    """The Android NDK folder from $ANDROID_NDK_HOME (or $ANDROID_NDK_ROOT), checked."""
    ndk = os.environ.get(NDK_ENV) or os.environ.get("ANDROID_NDK_ROOT")
    if not ndk:
        raise BadInput(f"--target android-arm64 needs the Android NDK, and {NDK_ENV} is not set: install an NDK "
                       f"(r23 or newer; Android Studio's SDK Manager or developer.android.com/ndk/downloads) "
                       f"and export {NDK_ENV}=/path/to/android-ndk")
    toolchain = Path(ndk) / "build" / "cmake" / "android.toolchain.cmake"
    if not toolchain.is_file():
        raise BadInput(f"{toolchain}: not found; {NDK_ENV}={ndk} must point at an Android NDK folder "
                       f"(the one holding build/cmake/android.toolchain.cmake)")
    return Path(ndk)


def host_headers(variable: str, folder: str, header: str, package: str) -> Path:
    """The folder holding folder/header on the build machine ($variable, else the usual places).
    These are header-only uses (FlexBuffers; the OpenCL API, dlopen'ed at run time), so the
    build machine's headers serve every target."""
    env = os.environ.get(variable)
    candidates = [Path(env)] if env else list(HEADER_SEARCH)
    for place in candidates:
        if (place / folder / header).is_file():
            return place
    where = f"{variable}={env}" if env else ", ".join(map(str, HEADER_SEARCH))
    raise BadInput(f"{folder}/{header} not found in {where}: a cross build takes it from this machine: "
                   f"apt-get install {package}, or set {variable} to the folder that holds {folder}/")


def flatbuffers_headers() -> Path:
    return host_headers(*CROSS_HEADERS[0])


def stage_headers(build_dir: Path) -> Path:
    """A folder inside build_dir holding only flatbuffers/ and CL/ (links to the build machine's):
    handing a cross compiler the host's /usr/include would let the host's C library headers
    shadow the target's."""
    staged = build_dir / "cross-include"
    staged.mkdir(parents=True, exist_ok=True)
    for spec in CROSS_HEADERS:
        source = host_headers(*spec) / spec[1]
        link = staged / spec[1]
        if link.is_symlink() and link.resolve() == source.resolve():
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        try:
            link.symlink_to(source, target_is_directory=True)
        except OSError:
            shutil.copytree(source, link)
    return staged


def cmake_arguments(target: str, build_dir: Path | None = None) -> list[str]:
    """Extra CMake configure arguments of a target. android-arm64: the NDK's toolchain file,
    ANDROID_ABI=arm64-v8a, ANDROID_PLATFORM ($ANDROID_PLATFORM or android-28), the static C++
    runtime (nothing but the library to push), and the build machine's flatbuffers and OpenCL
    headers staged in build_dir (the NDK ships neither)."""
    if target == "host":
        return []
    toolchain = android_ndk() / "build" / "cmake" / "android.toolchain.cmake"
    headers = stage_headers(Path(build_dir or default_build_dir(target)))
    return [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", f"-DANDROID_ABI={ANDROID_ABI}",
            f"-DANDROID_PLATFORM={os.environ.get('ANDROID_PLATFORM') or ANDROID_PLATFORM_DEFAULT}",
            "-DANDROID_STL=c++_static", *(f"-D{spec[0]}={headers}" for spec in CROSS_HEADERS)]


def build(target: str = "host", build_dir: Path | None = None, jobs: int | None = None) -> Path:
    """Configure and build; an up-to-date library is returned without running anything."""
    if target not in TARGETS:
        raise BadInput(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    if shutil.which("cmake") is None:
        raise BadInput("cmake is not installed (apt-get install cmake g++)")
    if target != "host":
        android_ndk()  # say what is missing before anything is created
    build_dir = Path(build_dir or default_build_dir(target))
    library = build_dir / LIBRARY_NAME
    with build_lock(build_dir):
        extra = cmake_arguments(target, build_dir)
        if library.exists() and library.stat().st_mtime >= newest_source_mtime(SOURCE, build_dir):
            return library
        log = build_dir / BUILD_LOG
        if not configured(build_dir):
            configure(build_dir, extra, log)
        run("building", ["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)], log)
        if not library.exists():
            raise BuildFailed(f"the build finished but {library} is missing")
        library.touch()  # an unchanged relink keeps the old mtime
    return library


def configured(build_dir: Path) -> bool:
    """Whether CMake finished configuring build_dir: a failed configure leaves CMakeCache.txt but
    no Makefile, and building that folder only says 'No rule to make target'."""
    return (build_dir / "CMakeCache.txt").exists() and (build_dir / "Makefile").exists()


def configure(build_dir: Path, extra: list[str], log: Path) -> None:
    """Configure build_dir; a failure removes the cache, so that the next attempt (after the
    missing package is installed) searches again from the start."""
    try:
        run("configuring", ["cmake", "-S", str(SOURCE), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                            *extra], log)
    except BuildFailed:
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        raise


def run(step: str, command: list[str], log: Path) -> None:
    """Run one build step; where it fails, BuildFailed says in one line which step and the
    compiler's first error, and `log` holds the whole output."""
    process = subprocess.run(command, capture_output=True, text=True)
    if process.returncode == 0:
        return
    output = f"$ {' '.join(command)}\n{process.stdout}\n{process.stderr}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    first = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no output")
    where = f" (whole output: {log})"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output)
    except OSError:
        where = ""
    raise BuildFailed(f"{step} the op library failed (exit {process.returncode}): {first[:300]}{where}")


def copy_library(library: Path, folder: Path) -> Path:
    """Copy the built library into `folder` through a temporary name: a full disk leaves no
    partial library, nor the folder when this made it. BadInput names what could not be written."""
    created = not folder.exists()
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{library.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        shutil.copy2(library, temporary)
        target = folder / library.name
        os.replace(temporary, target)
        return target
    except OSError as exc:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise BadInput(f"{folder}: cannot write the op library there ({exc.strerror or exc})") from exc
