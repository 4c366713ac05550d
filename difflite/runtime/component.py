"""Run emitted .tflite models on the host: ai-edge-litert's interpreter, plus the difflite op
library as an external delegate when the model has difflite custom ops (or a GPU backend is
asked for). Inputs and outputs are exchanged in ONNX/PyTorch layout (NCHW); the NHWC
transposes at the model boundary happen here."""

from __future__ import annotations

import gc
import itertools
import os
import re
import tempfile
import weakref
from pathlib import Path

import numpy as np

from difflite.folder.manifest import check_model_file
from difflite.folder.output_folder import ComponentEntry
from difflite.folder.schema import SIGNATURE_KEY
from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json
from difflite.core.procmem import process_running, return_freed_heap
from difflite.runtime.loras import SlotFactors

BACKENDS = ("cpu", "opencl", "litert-gpu")
LIBRARY_ENV = "DIFFLITE_OPLIB"


def find_oplib() -> Path:
    """The op library: $DIFFLITE_OPLIB, else the source tree's build (built or rebuilt here
    when missing or older than its sources)."""
    from difflite.runtime import oplib

    env = os.environ.get(LIBRARY_ENV)
    if env:
        return check_host_library(Path(env), LIBRARY_ENV)
    if not oplib.SOURCE.is_dir():
        raise BadInput(f"the op library {oplib.LIBRARY_NAME} is not available: set {LIBRARY_ENV} to its path")
    try:
        return oplib.build("host")
    except oplib.BuildFailed as exc:
        raise BadInput(f"building the op library failed: {str(exc).splitlines()[0]}") from exc


HOST_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}  # platform.machine() -> ELF e_machine


def check_host_library(path: Path, named_by: str) -> Path:
    """The op library at `path` (named by `named_by`), opened once here: LiteRT's load_delegate
    turns a file that is no shared library for this machine into a bare OSError, and its
    half-made Delegate prints a second traceback when it is collected."""
    import ctypes
    import platform

    from difflite.runtime.adb import ELF_MACHINES, elf_machine

    where = f"{path} ({named_by})"
    if not path.is_file():
        raise BadInput(f"{where}: no such file")
    try:
        machine = elf_machine(path)
    except OSError as exc:
        raise BadInput(f"{where}: cannot read ({exc.strerror or exc})") from exc
    if machine is None:
        raise BadInput(f"{where}: not a shared library (no ELF header)")
    host = HOST_MACHINES.get(platform.machine().lower())
    if host is not None and machine != host:
        raise BadInput(f"{where}: built for {ELF_MACHINES.get(machine, f'ELF machine {machine}')}, "
                       f"not for this {platform.machine()} machine")
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise BadInput(f"{where}: cannot be loaded ({str(exc).removeprefix(f'{path}: ')})") from exc
    if not hasattr(library, "tflite_plugin_create_delegate"):
        raise BadInput(f"{where}: not a TFLite delegate (no tflite_plugin_create_delegate)")
    return path


def uses_oplib(entry: ComponentEntry, backend: str) -> bool:
    """Whether a component runs with the op library: always on OpenCL; on the CPU backend where
    the model has difflite custom ops or quantized weights (the library's kernels read them as
    stored; TFLite alone would hold float32 copies: 4x an int8 weight, 8x an int4 one)."""
    if backend == "litert-gpu":
        return False  # stock LiteRT runs it alone
    return backend == "opencl" or bool(entry.custom_ops) or entry.quantized_weights


def delegate_for(backend: str, precision: str = "fp32", stats_path: Path | None = None, library: Path | None = None):
    from ai_edge_litert.interpreter import load_delegate

    options = {"backend": backend, "precision": precision}
    if stats_path is not None and backend == "opencl":
        options["stats_path"] = str(stats_path)
    try:
        return load_delegate(str(library or find_oplib()), options)
    except ValueError as exc:
        # LiteRT's "Failed to load delegate from PATH", then what the library said: its own line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = [line.split(": ", 1)[1] for line in lines if line.startswith("difflite: ") and ": " in line]
        reason = said[-1] if said else (lines[-1] if lines else "no reason given")
        raise BadInput(f"the op library refused backend={backend}: {reason}") from exc


_STATS_IDS = itertools.count()
FALLBACKS = ("none", "cpu")  # what --backend opencl does where OpenCL cannot run a model


# TFLite appends its own messages to a delegate's with no separator between them
_TFLITE_TAILS = re.compile(r"(?<=[^\s;(])(?=(Node number|Encountered unresolved|Restored original|Failed to apply))")


def runtime_error_text(exc: BaseException) -> str:
    """One line of what the interpreter (and the delegate, before it) said."""
    return " ".join(_TFLITE_TAILS.sub("; ", str(exc)).split())


def check_fallback(fallback: str) -> None:
    if fallback not in FALLBACKS:
        raise BadInput(f"--fallback {fallback!r} is not one of {', '.join(FALLBACKS)}")
STATS_PREFIX = "difflite-stats-"  # then PID-N.json (the delegate writes PID-N.json.tmp first)
_swept = False


def sweep_stale_stats(folder: Path) -> list[Path]:
    """Removes the stats files that difflite processes no longer running left in `folder` (a
    killed process cannot remove its own); returns them."""
    removed = []
    for path in folder.glob(f"{STATS_PREFIX}*-*.json*"):
        pid = path.name[len(STATS_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_running(int(pid)):
            _remove_file(path)
            removed.append(path)
    return removed


def _remove_file(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def open_component(entry: ComponentEntry, backend: str, precision: str = "fp32", weights: str = "float",
                   threads: int | None = None, fallback: str = "none", on_fallback=None):
    """The component on `backend`: cpu / opencl, LiteRT's interpreter with the op library's
    backend (Component); litert-gpu, stock LiteRT's CompiledModel on its GPU accelerator. With
    `fallback` "cpu", a model the chosen GPU backend cannot load runs on the CPU backend instead
    (`on_fallback(reason)` is told)."""
    if backend != "litert-gpu":
        return Component(entry, backend=backend, threads=threads, precision=precision, fallback=fallback,
                         on_fallback=on_fallback)
    from difflite.runtime import litert_gpu

    check_fallback(fallback)
    try:
        return litert_gpu.LiteRtComponent(entry, litert_gpu.accelerator_for(precision, weights))
    except BadInput as exc:
        if fallback != "cpu":
            raise
        component = Component(entry, backend="cpu", threads=threads, precision=precision)
        component.fallback_reason = str(exc)
        if on_fallback is not None:
            on_fallback(str(exc))
        return component


class Component:
    """One emitted model, callable with NCHW numpy arrays by input name."""

    def __init__(self, entry: ComponentEntry | str | Path, backend: str = "cpu", threads: int | None = None,
                 precision: str = "fp32", fallback: str = "none", on_fallback=None):
        """`precision`: the delegate's (fp16: half storage on the OpenCL backend; the CPU
        backend computes in float32 either way). `fallback` "cpu": where the OpenCL backend cannot
        load this model (no OpenCL, no device, a kernel that does not build, memory the device
        refuses), load it on the CPU backend instead; `backend` then says "cpu" and
        `fallback_reason` why. "none": that is a BadInput. The same holds for a model that fails
        while it runs (a kernel the device will not launch): run again on the CPU backend, or a
        BadInput. `on_fallback(reason)` is told when the CPU backend takes over. `entry`: the
        component as the output folder's manifest describes it, or a lone .tflite's path (its
        tensors exchanged as the file holds them)."""
        check_fallback(fallback)
        self.path = entry.path if isinstance(entry, ComponentEntry) else Path(entry)
        if not self.path.is_file():
            raise BadInput(f"{self.path}: no such model file")
        # Structure, graph and difflite ops (remembered per file): TFLite's own loader takes some
        # files that point outside themselves (its bounds checks wrap around), so a hostile file
        # must never reach an interpreter.
        check_model_file(self.path)
        if not isinstance(entry, ComponentEntry):
            entry = ComponentEntry.for_file(self.path)
        # The CPU backend needs the op library for difflite custom ops and for quantized weights.
        custom = uses_oplib(entry, "cpu")
        # The OpenCL backend reports what it allocated (arena, weights, scratch) in this file;
        # the first component of a process also removes those that killed processes left.
        global _swept
        if not _swept:
            _swept = True
            sweep_stale_stats(Path(tempfile.gettempdir()))
        self.stats_path = Path(tempfile.gettempdir()) / f"{STATS_PREFIX}{os.getpid()}-{next(_STATS_IDS)}.json"
        self._remove_stats = weakref.finalize(self, _remove_file, self.stats_path)
        self.backend, self.fallback, self.fallback_reason = backend, fallback, None
        self._on_fallback = on_fallback
        self._settings = (custom, precision, threads)
        self.lora = SlotFactors(entry)
        self._lora_source = None  # gives the active LoRAs' factors again (set_lora)
        self._ran = False
        try:
            self._load(backend, *self._settings)
        except BadInput as exc:
            if backend == "cpu" or fallback != "cpu":
                raise
            self._fall_back(str(exc))
        self.entry = entry
        self.input_details = self.runner.get_input_details()

    def _fall_back(self, reason: str) -> None:
        self.backend, self.fallback_reason = "cpu", reason
        self._load("cpu", *self._settings)
        if self._on_fallback is not None:
            self._on_fallback(reason)

    def _load(self, backend: str, custom: bool, precision: str, threads: int | None) -> None:
        """The delegate (where the model has custom ops or quantized weights, or the backend is
        not the CPU's) and the interpreter, planned and ready to run; BadInput where either cannot
        be made."""
        from ai_edge_litert.interpreter import Interpreter

        self.delegate = self.interpreter = self.runner = self.library = None
        if custom or backend != "cpu":
            self.library = find_oplib()
            self.delegate = delegate_for(backend, precision, stats_path=self.stats_path, library=self.library)
        try:
            self.interpreter = Interpreter(model_path=str(self.path),
                                           experimental_delegates=[] if self.delegate is None else [self.delegate],
                                           num_threads=threads or os.cpu_count())
            # The OpenCL backend plans memory and uploads the weights here: loading ends ready to run.
            self.interpreter.allocate_tensors()
            self.runner = self.interpreter.get_signature_runner(SIGNATURE_KEY)
        except (ValueError, RuntimeError) as exc:
            self.delegate = self.interpreter = None
            raise BadInput(f"{self.path}: cannot load ({runtime_error_text(exc)})") from exc
        if self.lora.form == "custom" and self.lora.active:  # a delegate made again (a fallback)
            self._set_on_delegate(self._lora_source())

    def set_lora(self, factors: dict, source=None) -> None:
        """Make `factors` ({slot: (down [r, K], up [N, r])}, runtime/loras.py) this model's LoRAs:
        set on the op library once (difflite.LoRA slots) or fed at every call (--no-fuse factor
        inputs); {} is no LoRA. `source`, a callable giving the same factors again (for a new
        delegate, or to restore them), lets the caller drop its arrays: without one this model
        keeps `factors`. A BadInput leaves the previous LoRAs in place."""
        if self.closed:
            raise RuntimeError(f"{self.path}: the component was closed")
        previous = self._lora_source
        changed = self.lora.change(factors)
        self._lora_source = source if source is not None else (lambda: factors)
        if self.lora.form != "custom":
            return
        try:
            self._set_on_delegate(changed)
        except BadInput:
            self._lora_source = previous
            self._set_on_delegate(self.lora.change(previous() if previous is not None else {}))
            raise

    def lora_bytes(self) -> int:
        """Bytes held for run-time LoRAs: what the op library keeps for this model's slots (the
        active LoRAs' factors), or the factor inputs fed at every call (--no-fuse files: held, as
        zeros, with no LoRA too); 0 without slots."""
        if self.lora.form != "custom":
            return sum(a.nbytes for a in self.lora.feeds().values())
        from difflite.runtime.lora_factors import factor_bytes

        return factor_bytes(self.library, self.delegate)

    def _set_on_delegate(self, changed: dict) -> None:
        from difflite.runtime.lora_factors import set_factors

        for slot, pair in changed.items():
            down, up = pair if pair is not None else (None, None)
            try:
                set_factors(self.library, self.delegate, slot, down, up)
            except BadInput as exc:
                raise BadInput(f"{self.path}: {exc}") from exc

    @property
    def closed(self) -> bool:
        return self.interpreter is None

    def close(self) -> None:
        """Free the model now: the signature runner and the interpreter go before the delegate
        they run on, then the delegate's stats file. Calling the component afterwards fails;
        closing twice is harmless."""
        self.runner = None
        self.interpreter = None
        self.delegate = None
        gc.collect()
        self._remove_stats()

    def delegate_stats(self) -> dict:
        """The OpenCL delegate's memory report ({} for other backends, and after close());
        written once the delegate has prepared, i.e. after the first call."""
        try:
            return read_json(self.stats_path, what="op library stats")
        except BadInput:
            return {}

    def __call__(self, **inputs) -> dict[str, np.ndarray]:
        if self.closed:
            raise RuntimeError(f"{self.path}: the component was closed")
        feeds = self.entry.to_file_layout(inputs, {name: self.input_details[name]["dtype"] for name in inputs})
        feeds.update(self.lora.feeds())
        try:
            outputs = self.runner(**feeds)
        except RuntimeError as exc:
            reason = f"{self.path}: failed while running on the {self.backend} backend ({runtime_error_text(exc)})"
            if self.backend == "cpu" or self.fallback != "cpu":
                raise BadInput(reason) from exc
            self._fall_back(reason)
            outputs = self.runner(**feeds)
        if not self._ran:
            # the first call prepared the model (on OpenCL: built its programs); what that freed
            # stays resident in the heap unless given back
            self._ran = True
            return_freed_heap()
        return self.entry.from_file_layout(outputs)
