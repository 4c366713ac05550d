"""`--backend litert-gpu`: components on stock LiteRT's GPU accelerator (ML Drift), the runtime
app developers ship `--no-fuse` files with.

`verify` runs each component in a child process (difflite/runtime/litert_gpu_child.py) that imports only numpy and
the runtime, so that a runtime that crashes on a file (FACTS: several forms do) costs a clear
error, not the verify process; `generate` and `bench` run them in process (LiteRtComponent).
fp32 files run with enforce_f32, fp16-storage files in the
accelerator's half precision. A file that the accelerator refuses to load is told apart from a
machine without a GPU accelerator by loading a one-op file the same way."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from difflite.core.errors import BadInput
from difflite.folder.output_folder import ComponentEntry
from difflite.runtime.litert_gpu_child import PREFIX
from difflite.runtime.loras import SlotFactors

PROBE_MODEL = Path(__file__).with_name("accelerator_probe.tflite")
TIMEOUT_S = 900  # SD 1.5's UNet compiles its GPU programs in well under a minute on the H100
GLOG_HEADER = re.compile(r"^[EWIF]\d{4} [\d:.]+ +\d+ \S+\] ")
REASON_MARKERS = ("Failed", "ERROR", "Error", "error", "Couldn't", "No adapters")


@dataclass
class GpuRun:
    outputs: list[dict[str, np.ndarray]]  # one per feed set, by output name
    fully_accelerated: bool | None
    accelerator: str


def accelerator_for(precision: str, weights: str = "float") -> str:
    """Half arithmetic for fp16 files (the fp16 bar covers it); float arithmetic for fp32 files and
    for int8 / int4 ones, whose SNR bars measure the weights' error: LiteRT's half arithmetic alone
    takes SD 1.5's UNet to 34 dB SNR, under the int8 bar whatever the weights (LiteRT 2.3.0 on
    an H100, 2026-11)."""
    return "gpu-fp16" if precision == "fp16" and weights == "float" else "gpu-fp32"


def check_runnable(entry: ComponentEntry) -> None:
    """Stock LiteRT has no kernels for difflite's custom ops."""
    if entry.custom_ops:
        raise BadInput(f"{entry.path}: has difflite custom ops ({', '.join(entry.custom_ops)}), which stock "
                       "LiteRT cannot run: convert with --no-fuse for it")


def run(path: Path, feeds: list[dict[str, np.ndarray]], accelerator: str) -> GpuRun:
    """The model at `path` on `accelerator` (gpu-fp32, gpu-fp16; cpu for tests), once per feed
    set. BadInput (one line) where it crashes, cannot load or fails, or where there is no GPU."""
    result, reason = _child(Path(path), feeds, accelerator)
    if result is not None:
        return result
    if accelerator != "cpu" and not _accelerator_present(accelerator):
        raise BadInput(f"{path}: no LiteRT GPU accelerator on this machine ({reason})")
    raise BadInput(f"{path}: LiteRT's GPU accelerator cannot run it: {reason}")


def _child(path: Path, feeds: list[dict[str, np.ndarray]], accelerator: str) -> tuple[GpuRun | None, str]:
    with tempfile.TemporaryDirectory(prefix="difflite-litert-gpu-") as tmp:
        in_path, out_path = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(in_path, **{f"{i}/{name}": value for i, f in enumerate(feeds) for name, value in f.items()})
        try:
            child = subprocess.run(
                [sys.executable, "-m", "difflite.runtime.litert_gpu_child", str(path), str(in_path), str(out_path),
                 accelerator], capture_output=True, text=True, timeout=TIMEOUT_S,
                cwd=Path(__file__).resolve().parents[2])
        except subprocess.TimeoutExpired:
            return None, f"no result after {TIMEOUT_S} s"
        lines = [json.loads(line[len(PREFIX):]) for line in child.stdout.splitlines() if line.startswith(PREFIX)]
        done = lines[-1] if lines and "status" in lines[-1] else None
        if child.returncode < 0 or done is None:
            stage = next((line["stage"] for line in reversed(lines) if "stage" in line), "starting")
            how = (f"killed by {signal.Signals(-child.returncode).name}" if child.returncode < 0
                   else f"exited {child.returncode}")
            said = _stderr_reason(child.stderr)
            return None, f"the runtime {how} at {stage}" + (f": {said}" if said else "")
        if done["status"] != "run":
            return None, _stderr_reason(child.stderr) or done.get("error", "failed")
        with np.load(out_path) as data:
            outputs = [{} for _ in feeds]
            for key in data.files:
                index, name = key.split("/", 1)
                outputs[int(index)][name] = data[key]
        return GpuRun(outputs, done.get("fully_accelerated"), accelerator), ""


def _stderr_reason(stderr: str) -> str:
    """The runtime's own last word on stderr (it logs its reasons there; its exceptions carry
    source locations), without glog's "E0000 00:00:... file.cc:736]" header."""
    lines = [GLOG_HEADER.sub("", " ".join(line.split())) for line in stderr.splitlines()]
    said = [i for i, line in enumerate(lines) if any(m in line for m in REASON_MARKERS)
            and "Source Location" not in line and not line.startswith(("ERROR: [", "└"))]
    if not said:
        return ""
    reason, following = lines[said[-1]], lines[said[-1] + 1:said[-1] + 4]
    if reason.endswith(":"):  # "Following operations are not supported by GPU delegate:" + a line each
        reason += " " + "; ".join(line for line in following if line)
    return reason[:400]


def _accelerator_present(accelerator: str) -> bool:
    """Whether a one-op model (x + 1, written by the writer: tests/test_litert_gpu.py checks it is
    current) loads and runs on the accelerator."""
    result, _ = _child(PROBE_MODEL, [{"x": np.zeros((1, 4), np.float32)}], accelerator)
    return result is not None


class LiteRtComponent:
    """One component on stock LiteRT's CompiledModel in this process (`generate` and `bench`
    with --backend litert-gpu), called like runtime.component.Component: NCHW arrays in and out
    by name. `verify` runs each component in a child instead, where a crash costs one check."""

    backend = "litert-gpu"
    fallback_reason = None

    def __init__(self, entry: ComponentEntry, accelerator: str):
        from difflite.folder.manifest import check_model_file
        from difflite.runtime.litert_gpu_child import CompiledRunner

        check_runnable(entry)
        check_model_file(entry.path)
        self.entry, self.path, self.accelerator = entry, entry.path, accelerator
        try:
            self.runner = CompiledRunner(str(entry.path), accelerator)
        except Exception as exc:  # LiteRT raises its own types; all mean this file does not load here
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            if accelerator != "cpu" and not _accelerator_present(accelerator):
                raise BadInput(f"{entry.path}: no LiteRT GPU accelerator on this machine ({reason})") from exc
            raise BadInput(f"{entry.path}: LiteRT's GPU accelerator cannot load it: {reason}") from exc
        self.fully_accelerated = self.runner.fully_accelerated
        self.lora = SlotFactors(entry)

    def set_lora(self, factors: dict) -> None:
        """As Component.set_lora: a --no-fuse file's factor inputs, fed at every call."""
        self.lora.change(factors)

    @property
    def closed(self) -> bool:
        return self.runner is None

    def close(self) -> None:
        self.runner = None

    def delegate_stats(self) -> dict:
        return {}

    def __call__(self, **inputs) -> dict[str, np.ndarray]:
        if self.closed:
            raise RuntimeError(f"{self.path}: the component was closed")
        dtypes = {spec.name: spec.dtype for spec in self.entry.inputs}
        try:
            outputs = self.runner(**self.entry.to_file_layout(inputs, dtypes), **self.lora.feeds())
        except Exception as exc:
            raise BadInput(f"{self.path}: failed while running on LiteRT's GPU accelerator "
                           f"({' '.join(str(exc).split())[:300]})") from exc
        return self.entry.from_file_layout(outputs)
