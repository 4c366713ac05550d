"""Which backend runs the models: `--backend auto|cpu|opencl|litert-gpu` of generate, bench and
verify. auto is the OpenCL backend where an OpenCL GPU device is present (the op library's OpenCL
backend picks the first GPU device too), else the CPU backend: a CPU device such as PoCL's or
Intel's CPU runtime does not count, the CPU backend is faster there. The choice is said in one
line and recorded in each command's --json."""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import asdict, dataclass

from difflite.core.errors import BadInput

CHOICES = ("auto", "cpu", "opencl", "litert-gpu")
HELP = ("auto: opencl where an OpenCL GPU device is present, else cpu (the choice is said in one line and "
        "in --json). cpu / opencl: LiteRT's interpreter with the op library's CPU or OpenCL backend (opencl "
        "runs the whole graph on the GPU); litert-gpu: stock LiteRT's GPU accelerator (--no-fuse files).")
CL_DEVICE_TYPE_GPU = 1 << 2
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_DEVICE_NAME = 0x102B
CL_DEVICE_TYPE = 0x1000


@dataclass(frozen=True)
class OpenClDevice:
    name: str
    is_gpu: bool


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # cpu | opencl | litert-gpu
    requested: str  # what --backend said
    reason: str

    def line(self) -> str:
        return f"[difflite] backend {self.backend} ({self.reason})"

    def as_dict(self) -> dict:
        return asdict(self)


def choose(requested: str) -> BackendChoice:
    """The backend for --backend `requested`; auto looks for an OpenCL GPU device."""
    if requested not in CHOICES:
        raise BadInput(f"--backend {requested!r}: choose from {', '.join(CHOICES)}")
    if requested != "auto":
        return BackendChoice(requested, requested, "as asked")
    devices = opencl_devices()
    gpus = [d.name for d in devices if d.is_gpu]
    if gpus:
        return BackendChoice("opencl", "auto", f"auto: OpenCL GPU device '{gpus[0]}'")
    if devices:
        names = ", ".join(f"'{d.name}'" for d in devices)
        return BackendChoice("cpu", "auto", f"auto: no OpenCL GPU device; the CPU backend is faster than OpenCL "
                                            f"CPU devices ({names})")
    return BackendChoice("cpu", "auto", "auto: no OpenCL device")


def opencl_devices() -> list[OpenClDevice]:
    """Every OpenCL device of every platform, through the ICD loader (none where there is no
    loader or no platform): the same enumeration as the op library's OpenCL backend."""
    library = _opencl_library()
    if library is None:
        return []
    devices = []
    for platform in _ids(library.clGetPlatformIDs):
        for device in _ids(lambda n, ids, count: library.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, n, ids, count)):
            kind = ctypes.c_uint64(0)
            if library.clGetDeviceInfo(device, CL_DEVICE_TYPE, ctypes.sizeof(kind), ctypes.byref(kind), None) != 0:
                continue
            devices.append(OpenClDevice(_device_name(library, device), bool(kind.value & CL_DEVICE_TYPE_GPU)))
    return devices


def _opencl_library():
    name = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    library.clGetPlatformIDs.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_uint32)]
    library.clGetDeviceIDs.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32)]
    library.clGetDeviceInfo.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_size_t)]
    return library


def _ids(query) -> list[int]:
    """The ids a clGet*IDs call lists (count first, then the ids); [] on any error."""
    count = ctypes.c_uint32(0)
    if query(0, None, ctypes.byref(count)) != 0 or count.value == 0:
        return []
    ids = (ctypes.c_void_p * count.value)()
    if query(count.value, ids, None) != 0:
        return []
    return list(ids)


def _device_name(library, device) -> str:
    size = ctypes.c_size_t(0)
    if library.clGetDeviceInfo(device, CL_DEVICE_NAME, 0, None, ctypes.byref(size)) != 0 or size.value == 0:
        return "unnamed"
    name = ctypes.create_string_buffer(size.value)
    if library.clGetDeviceInfo(device, CL_DEVICE_NAME, size.value, name, None) != 0:
        return "unnamed"
    return name.value.decode(errors="replace").strip()
