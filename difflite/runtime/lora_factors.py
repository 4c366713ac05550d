"""Run-time LoRA factors on the op library's delegate: the factors of each `difflite.LoRA` slot
(DESIGN §2) of a model loaded with the library, set between calls through the library's C entry
points `difflite_lora_set` / `difflite_lora_error` / `difflite_lora_bytes` (DESIGN §5). numpy and
ctypes only.

The delegate is the object LiteRT's `load_delegate` (or tensorflow's `tf.lite.experimental.
load_delegate`) returned for the library at `library` (`component.find_oplib()`), after the
interpreter it was given to has allocated its tensors: the library learns each slot's layer
(K in, N out features) from the model it prepared."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from difflite.core.errors import BadInput

_INT32_MAX = 2**31 - 1
_FLOAT_P = ctypes.POINTER(ctypes.c_float)
_libraries: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def _library(library: Path) -> ctypes.CDLL:
    """The op library at `library` with the LoRA entry points typed, opened once per path (the
    same file LiteRT opened for the delegate: the process then holds one copy of it)."""
    key = str(library)
    with _lock:
        lib = _libraries.get(key)
        if lib is None:
            try:
                lib = ctypes.CDLL(key)
            except OSError as exc:
                raise BadInput(f"{library}: cannot be loaded ({exc})") from exc
            if not hasattr(lib, "difflite_lora_set") or not hasattr(lib, "difflite_lora_error"):
                raise BadInput(f"{library}: an op library without run-time LoRA (no difflite_lora_set)")
            lib.difflite_lora_set.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                              ctypes.c_int32, _FLOAT_P, _FLOAT_P]
            lib.difflite_lora_set.restype = ctypes.c_int
            lib.difflite_lora_error.argtypes = []
            lib.difflite_lora_error.restype = ctypes.c_char_p
            if hasattr(lib, "difflite_lora_bytes"):
                lib.difflite_lora_bytes.argtypes = [ctypes.c_void_p]
                lib.difflite_lora_bytes.restype = ctypes.c_int64
            _libraries[key] = lib
        return lib


def delegate_pointer(delegate) -> int:
    """The TfLiteDelegate* of a delegate object (ai_edge_litert's or tf.lite's `Delegate`, which
    keep it as `_delegate_ptr`), or of an int that is one."""
    if isinstance(delegate, int) and not isinstance(delegate, bool):
        return delegate
    getter = getattr(delegate, "_get_native_delegate_pointer", None)
    pointer = getter() if callable(getter) else getattr(delegate, "_delegate_ptr", None)
    if isinstance(pointer, ctypes.c_void_p):
        pointer = pointer.value
    if not isinstance(pointer, int) or isinstance(pointer, bool) or pointer == 0:
        raise BadInput(f"not a loaded TFLite delegate: {type(delegate).__name__}")
    return pointer


def _int32(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BadInput(f"LoRA {what} must be an int, got {type(value).__name__}")
    value = int(value)
    if not -2**31 <= value <= _INT32_MAX:
        raise BadInput(f"LoRA {what} {value} out of range")
    return value


def _factor(array, what: str) -> np.ndarray:
    a = np.asarray(array)
    if a.ndim != 2 or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise BadInput(f"LoRA {what} must be a 2-D array of floats, got {a.dtype} {list(a.shape)}")
    return np.ascontiguousarray(a, dtype=np.float32)


def set_factors(library: Path, delegate, slot: int, down: np.ndarray | None, up: np.ndarray | None) -> None:
    """Sets slot `slot`'s factors on `delegate`: down D [r, K] and up U [N, r] (the LoRA's scale
    folded into U), copied by the library; None / None, or r == 0, clears the slot (the op then
    outputs its y unchanged). BadInput with the library's one-line reason where it refuses (an
    unknown slot, factors that do not fit the slot's K -> N layer, ...); the slot then keeps its
    previous factors."""
    lib = _library(Path(library))
    pointer = delegate_pointer(delegate)
    slot = _int32(slot, "slot")
    if (down is None) != (up is None):
        raise BadInput(f"slot {slot}: give both LoRA factors (down [r, K] and up [N, r]) or neither")
    rank, k, n, down_p, up_p = 0, 0, 0, None, None
    if down is not None:
        down, up = _factor(down, "down"), _factor(up, "up")
        if up.shape[1] != down.shape[0]:
            raise BadInput(f"slot {slot}: down is [{down.shape[0]} x {down.shape[1]}] and up "
                           f"[{up.shape[0]} x {up.shape[1]}]: their ranks differ")
        rank = _int32(down.shape[0], "rank")
        if rank:
            k, n = _int32(down.shape[1], "in_features"), _int32(up.shape[0], "out_features")
            down_p, up_p = down.ctypes.data_as(_FLOAT_P), up.ctypes.data_as(_FLOAT_P)
    status = lib.difflite_lora_set(ctypes.c_void_p(pointer), slot, rank, k, n, down_p, up_p)
    if status != 0:
        message = lib.difflite_lora_error() or b"the op library refused the factors"
        raise BadInput(message.decode("utf-8", "replace"))


def factor_bytes(library: Path, delegate) -> int:
    """The bytes the library holds for `delegate`'s LoRA factors, all slots together, as its backend
    keeps them (OpenCL: device buffers in the storage type); BadInput where the library has no such
    count or `delegate` is not one of its live delegates."""
    lib = _library(Path(library))
    if not hasattr(lib, "difflite_lora_bytes"):
        raise BadInput(f"{library}: an op library that does not count its LoRA bytes (no difflite_lora_bytes)")
    held = lib.difflite_lora_bytes(ctypes.c_void_p(delegate_pointer(delegate)))
    if held < 0:
        raise BadInput("not a live difflite delegate")
    return int(held)
