"""An Android device over adb, and the output of TFLite's `benchmark_model` tool.

`difflite bench OUT --adb SERIAL` uses this to push the .tflite files and the Android arm64 op
library to the device, run benchmark_model there once per component and parse what it prints.
Every failure is a BadInput with one line that says what to do (exit 2)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from difflite.core.errors import BadInput
from difflite.folder.manifest import sha256_file

DEFAULT_DEVICE_DIR = "/data/local/tmp/difflite"
DEFAULT_BENCHMARK_MODEL = "/data/local/tmp/benchmark_model"
BENCHMARK_MODEL_URL = ("https://storage.googleapis.com/tensorflow-nightly-public/prod/tensorflow/release/"
                       "lite/tools/nightly/latest/android_aarch64_benchmark_model")
PLATFORM_TOOLS_URL = "https://developer.android.com/tools/releases/platform-tools"
EXIT_MARKER = "__difflite_exit="
EM_AARCH64 = 183
ELF_MACHINES = {3: "x86", 40: "arm (32-bit)", 62: "x86-64", 183: "aarch64", 243: "riscv"}


# --------------------------------------------------------------------------------------------
# The device


def adb_executable() -> str:
    adb = shutil.which("adb")
    if adb is None:
        raise BadInput(f"adb is not on PATH: install Android platform-tools ({PLATFORM_TOOLS_URL}, or "
                       f"apt-get install adb) and put adb on PATH")
    return adb


def list_devices(adb: str) -> dict[str, str]:
    """serial -> state ("device", "unauthorized", "offline", ...) from `adb devices`."""
    try:
        process = subprocess.run([adb, "devices"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise BadInput("`adb devices` did not answer within 60 s (restart the server: adb kill-server)") from exc
    if process.returncode != 0:
        raise BadInput(f"`adb devices` failed ({process.returncode}): {last_line(process.stderr or process.stdout)}")
    devices = {}
    for line in process.stdout.replace("\r", "").splitlines():
        line = line.strip()
        if not line or line.startswith("*") or line.lower().startswith("list of devices"):
            continue
        parts = line.split()
        if len(parts) >= 2:
            devices[parts[0]] = parts[1]
    return devices


def last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").replace("\r", "").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def error_line(text: str) -> str:
    """The first line of a tool's output that reports an error, else its last line."""
    lines = [line.strip() for line in (text or "").replace("\r", "").splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\b(ERROR|error|Error|FATAL|failed|Failed|not found|No such file)\b", line):
            return line
    return lines[-1] if lines else "(no output)"


@dataclass
class Device:
    """One device by serial. Commands run as `adb -s SERIAL ...`."""
    serial: str
    adb: str

    @classmethod
    def connect(cls, serial: str) -> "Device":
        adb = adb_executable()
        devices = list_devices(adb)
        state = devices.get(serial)
        if state is None:
            listed = ", ".join(f"{s} ({st})" for s, st in devices.items()) or "none"
            raise BadInput(f"device {serial} is not listed by `adb devices` (listed: {listed})")
        if state != "device":
            hint = {"unauthorized": ": accept the USB debugging prompt on the phone",
                    "offline": ": reconnect it or run adb reconnect"}.get(state, "")
            raise BadInput(f"device {serial} is {state}, not ready{hint}")
        return cls(serial, adb)

    def _run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.adb, "-s", self.serial, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BadInput(f"adb -s {self.serial} {args[0]} did not finish within {timeout:.0f} s") from exc

    def shell(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        """Run `command` in the device's shell; (its exit status, stdout and stderr together).
        The status comes from a marker line, so old adb servers without shell exit codes work."""
        process = self._run("shell", f"{command}; difflite_status=$?; echo; echo {EXIT_MARKER}$difflite_status",
                             timeout=timeout)
        output = process.stdout.replace("\r", "")
        match = last_match(re.compile(rf"^{EXIT_MARKER}(\d+)\s*$", re.M), output)
        if match is None:
            raise BadInput(f"adb -s {self.serial} shell failed ({process.returncode}): {error_line(output)}")
        body = output[:match.start()]
        return int(match.group(1)), body[:-1] if body.endswith("\n") else body

    def push(self, source: Path, destination: str, timeout: float | None = None) -> None:
        process = self._run("push", str(source), destination, timeout=timeout)
        if process.returncode != 0:
            raise BadInput(f"adb push {source} {destination} failed on {self.serial}: {error_line(process.stdout)}")

    def mkdir(self, folder: str) -> None:
        status, output = self.shell(f"mkdir -p {shlex.quote(folder)}", timeout=60)
        if status != 0:
            raise BadInput(f"cannot create {folder} on {self.serial}: {error_line(output)}")

    def is_executable(self, path: str) -> bool:
        status, _ = self.shell(f"[ -f {shlex.quote(path)} ] && [ -x {shlex.quote(path)} ]", timeout=60)
        return status == 0

    def sha256(self, paths: list[str]) -> dict[str, str]:
        """path -> sha256 of the files that exist on the device (empty where sha256sum is missing)."""
        if not paths:
            return {}
        _, output = self.shell("sha256sum " + " ".join(shlex.quote(p) for p in paths) + " 2>/dev/null",
                               timeout=600)
        digests = {}
        for line in output.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                digests[parts[1].strip()] = parts[0]
        return digests

    def getprop(self, name: str) -> str | None:
        try:
            status, output = self.shell(f"getprop {shlex.quote(name)} 2>/dev/null", timeout=30)
        except BadInput:
            return None
        value = output.strip()
        return value if status == 0 and value else None


def sync_files(device: Device, files: dict[Path, str], log=lambda message: None) -> dict[str, str]:
    """Push local files to device paths, skipping those whose sha256 already matches there.
    Returns device path -> "pushed" | "unchanged"."""
    remote = device.sha256(list(files.values()))
    actions = {}
    for local, target in files.items():
        if remote.get(target) == sha256_file(local):
            actions[target] = "unchanged"
            continue
        log(f"pushing {local.name} ({local.stat().st_size / 1e6:.1f} MB) to {device.serial}:{target}")
        device.push(local, target)
        actions[target] = "pushed"
    return actions


def elf_machine(path: Path) -> int | None:
    """The e_machine of an ELF file (None when it is not ELF)."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    order = "little" if header[5] == 1 else "big"
    return int.from_bytes(header[18:20], order)


def check_android_library(path: Path) -> Path:
    build_hint = ("run `difflite oplib build --target android-arm64` with ANDROID_NDK_HOME set to an "
                  "Android NDK, or pass --oplib PATH")
    if not path.is_file():
        raise BadInput(f"no Android arm64 op library at {path}: {build_hint}")
    machine = elf_machine(path)
    if machine != EM_AARCH64:
        kind = "not an ELF file" if machine is None else f"built for {ELF_MACHINES.get(machine, machine)}"
        raise BadInput(f"{path}: {kind}, not an arm64 (aarch64) library: {build_hint}")
    return path


# --------------------------------------------------------------------------------------------
# benchmark_model


def benchmark_command(binary: str, graph: str, runs: int, warmup: int, threads: int | None = None,
                      delegate_path: str | None = None, delegate_options: dict | None = None,
                      use_gpu: bool = False, gpu_fp16: bool = False,
                      value_ranges: dict[str, tuple[int, int]] | None = None,
                      library_dir: str | None = None) -> str:
    """The device shell command that benchmarks one graph: exactly `warmup` warm-up and `runs`
    timed runs (min_secs=0 so short models do not loop longer), the process's peak memory
    sampled by the tool's monitor thread, stdout and stderr together."""
    q = shlex.quote
    args = [q(binary), f"--graph={q(graph)}", f"--num_runs={runs}", f"--warmup_runs={warmup}",
            "--min_secs=0", "--warmup_min_secs=0", "--max_secs=3600", "--report_peak_memory_footprint=true"]
    if threads:
        args.append(f"--num_threads={threads}")
    if delegate_path:
        args.append(f"--external_delegate_path={q(delegate_path)}")
        if delegate_options:
            args.append("--external_delegate_options=" + q(";".join(f"{k}:{v}" for k, v in delegate_options.items())))
    if use_gpu:
        args += ["--use_gpu=true", f"--gpu_precision_loss_allowed={'true' if gpu_fp16 else 'false'}"]
    if value_ranges:
        args.append("--input_layer_value_range=" +
                    q(":".join(f"{name},{low},{high}" for name, (low, high) in value_ranges.items())))
    prefix = f"cd {q(library_dir)} && LD_LIBRARY_PATH={q(library_dir)}:$LD_LIBRARY_PATH " if library_dir else ""
    return prefix + " ".join(args) + " 2>&1"


NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
INITIALIZED = re.compile(rf"Initialized session in ({NUMBER})\s*ms")
TIMINGS = re.compile(rf"Inference timings in us:\s*Init:\s*({NUMBER}),\s*First inference:\s*({NUMBER}),"
                     rf"\s*Warmup \(avg\):\s*({NUMBER}|nan|-?inf),\s*Inference \(avg\):\s*({NUMBER})")
COUNT = re.compile(rf"\bcount=(\d+)((?:[ \t]+\w+={NUMBER})*)")
MEMORY_DELTA = re.compile(rf"(?:Memory footprint delta from the start of the tool|Peak memory footprint) \(MB\):"
                          rf"\s*init=({NUMBER})\s+overall=({NUMBER})")
MEMORY_PEAK = re.compile(rf"Overall peak memory footprint \(MB\) via periodic monitoring:\s*({NUMBER})")
DELEGATION = re.compile(r"Replacing (\d+) out of (\d+) node\(s\) with delegate \(([^)]*)\) node, "
                        r"yielding (\d+) partitions?")


@dataclass
class BenchmarkModelResult:
    """What one benchmark_model run printed, in milliseconds and MB. init_ms and initialized_ms
    are the same start-up time (interpreter, delegate, tensors), from the "Inference timings"
    line in us and from "Initialized session in X ms" (None where missing). memory_init_mb and
    memory_overall_mb grow the tool's max RSS from its start (after init, at the end);
    memory_peak_mb is the peak RSS its monitor thread sampled (--report_peak_memory_footprint)."""
    init_ms: float
    first_ms: float
    warmup_avg_ms: float | None
    avg_ms: float
    runs: int | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    median_ms: float | None = None   # printed by newer benchmark_model builds only
    std_ms: float | None = None
    memory_init_mb: float | None = None
    memory_overall_mb: float | None = None
    memory_peak_mb: float | None = None
    initialized_ms: float | None = None
    delegations: list = field(default_factory=list)


def parse_benchmark_model(text: str) -> BenchmarkModelResult:
    """Parse benchmark_model's log. Lines may carry prefixes ("INFO: ", "I tflite  : ") and
    CRLF endings; numbers may be in exponent form ("avg=1.24027e+06"). The statistics line of
    the timed runs is the last `count=` line (the first is the warm-up's). Raises ValueError
    when there is no "Inference timings in us" line."""
    text = text.replace("\r", "")
    timings = last_match(TIMINGS, text)
    if timings is None:
        raise ValueError("no 'Inference timings in us' line in benchmark_model's output")
    us = [float(x) for x in timings.groups()]
    result = BenchmarkModelResult(init_ms=us[0] / 1e3, first_ms=us[1] / 1e3,
                                  warmup_avg_ms=us[2] / 1e3 if us[2] == us[2] else None, avg_ms=us[3] / 1e3)
    counts = list(COUNT.finditer(text[:timings.start()]))
    if counts:
        last = counts[-1]
        stats = dict(re.findall(rf"(\w+)=({NUMBER})", last.group(2)))
        result.runs = int(last.group(1))
        for key, name in (("min", "min_ms"), ("max", "max_ms"), ("median", "median_ms"), ("std", "std_ms")):
            if key in stats:
                setattr(result, name, float(stats[key]) / 1e3)
    memory = last_match(MEMORY_DELTA, text)
    if memory:
        result.memory_init_mb, result.memory_overall_mb = float(memory.group(1)), float(memory.group(2))
    peak = last_match(MEMORY_PEAK, text)
    if peak:
        result.memory_peak_mb = float(peak.group(1))
    initialized = last_match(INITIALIZED, text)
    if initialized:
        result.initialized_ms = float(initialized.group(1))
    result.delegations = [{"delegate": d.group(3), "nodes": int(d.group(1)), "of": int(d.group(2)),
                           "partitions": int(d.group(4))} for d in DELEGATION.finditer(text)]
    return result
