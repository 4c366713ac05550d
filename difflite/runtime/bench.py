"""`difflite bench OUT`: time the components of an output folder, and estimate one image.

On the host each component is loaded with ai-edge-litert (plus the op library when it has difflite
custom ops or the backend is not cpu), warmed up, then timed on seeded random inputs of the
manifest's shapes and dtypes. Start-up and memory are measured, not estimated: load_ms covers the
interpreter, the delegate and allocate_tensors (where the OpenCL backend uploads the weights);
first_ms the first call; the resident set comes from /proc (VmHWM reset before each component,
anonymous and file-backed pages sampled every 10 ms, difflite/core/procmem.py) and the device
allocations from the op library's stats_path report. With --adb SERIAL the .tflite files and the
Android arm64 op library are pushed to a phone and TFLite's benchmark_model times each component
there (Init, first inference, its sampled peak memory).

The pipeline estimate for one image of S steps: the text encoder once per prompt batch (twice with
classifier-free guidance and a batch-1 text encoder: the prompt and the negative prompt), the UNet
S times (twice per step with guidance and a batch-1 UNet, once with a batch-2 UNet), the VAE
decoder once. It is reported as the sum of median times and, on the host, as one measured run of
the components in that order (a plain Euler-like latent update, no scheduler; an inpainting UNet
gets a fixed random mask and masked picture's latents beside the latents)."""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import click

from difflite.core.conditioning import (
    TIMESTEP_COND,
    check_guidance,
    guidance_embedding,
)
from difflite.core import lora
from difflite.core.errors import BadInput
from difflite.core.jsonfile import loads_json, read_json
from difflite.folder.output_folder import ComponentEntry, OutputFolder
from difflite.runtime.backend import HELP as BACKEND_HELP
from difflite.runtime.backend import BackendChoice
from difflite.runtime.backend import choose as choose_backend

BACKENDS = ("auto", "cpu", "opencl", "litert-gpu")
# Where an Android device keeps the OpenCL driver the op library's OpenCL backend loads
PHONE_OPENCL_LIBRARIES = ("/vendor/lib64/libOpenCL.so", "/system/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so")
PRECISIONS = ("fp32", "fp16")
MATHS = ("auto", "fp32")
PIPELINE = ("text_encoder", "unet", "vae_decoder")
SDXL_PIPELINE = ("text_encoder", "text_encoder_2", "unet", "vae_decoder")
FALLBACK_VOCAB = 256
LIBRARY_ON_DEVICE = "libdifflite_delegate.so"
MIB = 1 << 20
MAX_STEPS = 1000
MAX_THREADS = 256  # LiteRT hangs creating a pool of 100000


@dataclass
class BenchOptions:
    backend: str = "auto"  # resolved by bench(): host, backend.choose; phone, phone_backend
    precision: str | None = None  # None: the conversion's (the manifest's options.precision)
    math: str = "auto"  # opencl: auto (half multiply-adds at fp16 where the GPU has cl_khr_fp16) | fp32
    runs: int = 10
    warmup: int = 2
    steps: int = 20
    guidance: float = 7.5
    components: tuple[str, ...] | None = None
    seed: int = 0
    threads: int | None = None
    oplib: str | None = None
    # --adb
    serial: str | None = None
    device_dir: str = "/data/local/tmp/difflite"
    benchmark_model: str = "/data/local/tmp/benchmark_model"
    tflite_gpu: bool = False

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInput(f"--backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise BadInput(f"--precision {self.precision!r}: choose from {', '.join(PRECISIONS)}")
        if self.math not in MATHS:
            raise BadInput(f"--math {self.math!r}: choose from {', '.join(MATHS)}")
        self.check_math()
        if self.runs < 1:
            raise BadInput(f"--runs {self.runs}: must be at least 1")
        if self.warmup < 0:
            raise BadInput(f"--warmup {self.warmup}: must be 0 or more")
        if not 1 <= self.steps <= MAX_STEPS:
            raise BadInput(f"--steps {self.steps}: must be from 1 to {MAX_STEPS} (the timesteps SD is trained on)")
        check_guidance(self.guidance)
        if not 0 <= self.seed < 2**64:
            raise BadInput(f"--seed {self.seed}: must be from 0 to 2^64-1")
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise BadInput(f"--threads {self.threads}: must be from 1 to {MAX_THREADS}")
        if self.tflite_gpu and not self.serial:
            raise BadInput("--tflite-gpu runs TFLite's GPU delegate in benchmark_model on a phone: "
                           "it needs --adb SERIAL (on this machine: --backend litert-gpu)")
        if self.serial is not None and not self.device_dir.startswith("/"):
            raise BadInput(f"--device-dir {self.device_dir!r}: must be an absolute path on the device")

    def check_math(self) -> None:
        if self.math != "auto" and self.backend not in ("opencl", "auto"):
            raise BadInput(f"--math {self.math} applies to --backend opencl only (backend: {self.backend})")

    def delegate_options(self) -> dict[str, str]:
        """The op library's options (math only where it is not the default)."""
        opts = {"backend": self.backend, "precision": self.precision}
        if self.math != "auto":
            opts["math"] = self.math
        return opts

    @property
    def guided(self) -> bool:
        return self.guidance > 1.0


# --------------------------------------------------------------------------------------------
# What to run


def select_components(folder: OutputFolder, names: tuple[str, ...] | None) -> list[str]:
    available = list(folder.components)
    if not names:
        return available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise BadInput(f"--components: {', '.join(unknown)} not in this output folder "
                       f"(it has {', '.join(available) or 'none'})")
    return [n for n in available if n in names]


def pipeline_components(folder: OutputFolder) -> tuple[str, ...]:
    """The models one picture runs, in order (SDXL: both text encoders)."""
    return SDXL_PIPELINE if folder.family == "sdxl" else PIPELINE


def batch_of(entry: ComponentEntry, input_name: str) -> int:
    chosen = entry.input(input_name) or (entry.inputs[0] if entry.inputs else None)
    return chosen.shape[0] if chosen is not None and chosen.shape else 1


def pipeline_plan(entries: dict[str, ComponentEntry], steps: int, guided: bool) -> dict:
    """Calls per image of each pipeline component, and why."""
    calls, notes = {}, []
    if guided and "unet" in entries and entries["unet"].timestep_cond_dim:
        guided = False
        notes.append("guidance enters the UNet as its timestep_cond embedding (LCM-distilled): no classifier-free "
                     "guidance")
    prompts = 2 if guided else 1
    if "text_encoder_2" in entries:  # SDXL: the second encoder reads the same prompts
        calls["text_encoder_2"] = math.ceil(prompts / batch_of(entries["text_encoder_2"], "input_ids"))
    if "text_encoder" in entries:
        te_batch = batch_of(entries["text_encoder"], "input_ids")
        calls["text_encoder"] = math.ceil(prompts / te_batch)
        if guided:
            notes.append(f"text_encoder x{calls['text_encoder']}: guidance encodes the prompt and the negative "
                         f"prompt, {te_batch} per call"
                         + (" (an app that caches the negative prompt's embedding needs x1)"
                            if calls["text_encoder"] > 1 else ""))
        else:
            notes.append("text_encoder x1: no guidance, one prompt")
    if "unet" in entries:
        unet_batch = batch_of(entries["unet"], "sample")
        per_step = math.ceil(prompts / unet_batch)
        calls["unet"] = steps * per_step
        if guided and unet_batch == 1:
            notes.append(f"unet x{per_step} per step: guidance with a batch-1 UNet runs the unconditional "
                         f"and the conditional pass separately")
        elif guided:
            notes.append(f"unet x{per_step} per step: the batch-{unet_batch} UNet runs both guidance passes "
                         f"in one call")
        elif unet_batch > 1:
            notes.append(f"unet x{per_step} per step: no guidance, but the UNet is batch {unet_batch} "
                         f"(convert with --batch 1 to halve the work)")
        else:
            notes.append("unet x1 per step: no guidance")
    if "vae_decoder" in entries:
        calls["vae_decoder"] = 1
    return {"steps": steps, "guidance": guided, "calls": calls, "notes": notes}


def vocab_size(out: Path) -> int:
    try:
        vocab = read_json(out / "tokenizer" / "vocab.json", what="tokenizer vocabulary")
    except BadInput:
        return FALLBACK_VOCAB
    return max(2, len(vocab)) if isinstance(vocab, dict) else FALLBACK_VOCAB


def random_feeds(entry: ComponentEntry, rng, vocab: int) -> dict:
    """Seeded random inputs in the stored layout (NHWC where the manifest says so)."""
    import numpy as np

    feeds = {}
    for spec in entry.inputs:
        dtype = np.dtype(spec.dtype)
        if lora.is_factor_input(spec.name):  # a --no-fuse file's LoRA factors: zeros, no LoRA
            value = np.zeros(spec.shape)
        elif dtype.kind in "iu":
            value = rng.integers(0, vocab, size=spec.shape)
        elif spec.name == "timestep":
            value = rng.uniform(0, 1000, size=spec.shape)
        else:
            value = rng.standard_normal(size=spec.shape)
        feeds[spec.name] = np.ascontiguousarray(value.astype(dtype))
    return feeds


# --------------------------------------------------------------------------------------------
# Host


def host_library(options: BenchOptions) -> Path:
    """--oplib, else the source tree's op library (built here when missing or stale)."""
    from difflite.runtime.component import check_host_library, find_oplib

    return check_host_library(Path(options.oplib), "--oplib") if options.oplib else find_oplib()


def host_delegate(options: BenchOptions, stats_path: Path | None = None):
    from ai_edge_litert.interpreter import load_delegate

    library = host_library(options)
    delegate_options = options.delegate_options()
    if stats_path is not None:
        delegate_options["stats_path"] = str(stats_path)
    try:
        return load_delegate(str(library), delegate_options)
    except ValueError as exc:
        described = " ".join(f"{k}={v}" for k, v in delegate_options.items())
        raise BadInput(f"{library}: the op library refused {described}: "
                       f"{str(exc).splitlines()[0]}") from exc


def load_runner(entry: ComponentEntry, options: BenchOptions, stats_path: Path | None = None):
    """The model's signature runner (inputs and outputs in the stored layout), its tensors
    allocated: the OpenCL backend prepares its partitions and uploads the weights then; LiteRT's
    GPU accelerator compiles its programs."""
    from ai_edge_litert.interpreter import Interpreter

    from difflite.folder.schema import SIGNATURE_KEY

    path = entry.path
    if not path.is_file():
        raise BadInput(f"{path}: no such model file (named by the manifest)")
    if options.backend == "litert-gpu":
        from difflite.runtime import litert_gpu

        weights = "int8" if entry.quantized_weights else "float"  # any quantized width: float arithmetic
        return litert_gpu.LiteRtComponent(entry, litert_gpu.accelerator_for(options.precision, weights)).runner
    from difflite.runtime.component import uses_oplib

    delegates = [host_delegate(options, stats_path)] if uses_oplib(entry, options.backend) else []
    try:
        interpreter = Interpreter(model_path=str(path), experimental_delegates=delegates,
                                  num_threads=options.threads or os.cpu_count())
        interpreter.allocate_tensors()
        return interpreter.get_signature_runner(SIGNATURE_KEY)
    except (ValueError, RuntimeError) as exc:
        raise BadInput(f"{path}: cannot load ({str(exc).splitlines()[0]})") from exc


def stats_ms(samples: list[float]) -> dict:
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "mean_ms": statistics.fmean(samples),
            "std_ms": statistics.pstdev(samples) if len(samples) > 1 else 0.0}


def time_runner(runner, feeds: dict, runs: int, warmup: int) -> dict:
    first_ms = None
    for _ in range(warmup):
        start = time.perf_counter()
        runner(**feeds)
        first_ms = first_ms if first_ms is not None else (time.perf_counter() - start) * 1e3
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        runner(**feeds)
        samples.append((time.perf_counter() - start) * 1e3)
    return {"runs": runs, "warmup": warmup, "first_ms": first_ms if first_ms is not None else samples[0],
            **stats_ms(samples)}


def run_pipeline(runners: dict, entries: dict[str, ComponentEntry], plan: dict, guidance: float, rng,
                 vocab: int) -> dict:
    """One image through the text encoder(s), S UNet steps and the VAE decoder; wall time in ms
    and the call counts actually made (they must match the plan). An SDXL folder's context is both
    encoders' hidden states side by side, with text_encoder_2's text_embeds and SDXL's default
    time ids (the image size, no crop) as the UNet's other inputs."""
    import numpy as np

    from difflite.runtime.loras import SlotFactors

    te, unet, vae = (entries[n] for n in PIPELINE)
    te2 = entries.get("text_encoder_2")
    te_in, te_out = te.inputs[0], te.outputs[0].name
    unet_names = {spec.name: spec for spec in unet.inputs}
    needs = ("sample", "timestep", "encoder_hidden_states") + (("text_embeds", "time_ids") if te2 else ())
    for needed in needs:
        if needed not in unet_names:
            raise BadInput(f"unet: no input named {needed!r} in the manifest; cannot run the pipeline")
    unet_out, vae_in = unet.outputs[0].name, vae.inputs[0].name
    te_batch, unet_batch = te_in.shape[0], unet_names["sample"].shape[0]
    cond_dim = unet.timestep_cond_dim
    prompts = 2 if plan["guidance"] else 1
    ids = rng.integers(0, vocab, size=(prompts, *te_in.shape[1:])).astype(te_in.dtype)
    sample_spec = unet_names["sample"]
    latents = rng.standard_normal(size=(1, *unet.outputs[0].shape[1:])).astype(sample_spec.dtype)
    # an inpainting UNet's sample has more channels than the latents (mask, masked picture's latents)
    channel_axis = -1 if sample_spec.layout == "NHWC" else 1
    extra_shape = list(sample_spec.shape)
    extra_shape[0] = 1
    extra_shape[channel_axis] -= latents.shape[channel_axis]
    extra = rng.standard_normal(size=extra_shape).astype(sample_spec.dtype)
    timesteps = np.linspace(999, 0, plan["steps"], dtype=np.float32)
    made = {name: 0 for name in (SDXL_PIPELINE if te2 else PIPELINE)}
    # a UNet converted with ControlNets runs here as without a control image (zero residuals); the
    # ControlNets themselves are measured per call (--components controlnet_0,...)
    residuals = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in unet.control_residuals}
    # a --no-fuse file's LoRA factor inputs: zeros (no LoRA), made once as a caller would
    no_lora = {entry.name: SlotFactors(entry).feeds() for entry in (te, te2, unet) if entry is not None}

    start = time.perf_counter()
    embeddings = []
    for first in range(0, prompts, te_batch):
        chunk = ids[first:first + te_batch]
        out = runners["text_encoder"](**{te_in.name: pad_rows(chunk, te_batch)}, **no_lora[te.name])[te_out]
        embeddings.append(out[:len(chunk)])
        made["text_encoder"] += 1
    embeddings = np.concatenate(embeddings)
    sdxl_inputs = {}
    if te2 is not None:
        embeddings, sdxl_inputs, made["text_encoder_2"] = sdxl_encode(runners["text_encoder_2"], te2, ids, embeddings,
                                                                      no_lora[te2.name], unet_names)
    for t in timesteps:
        predictions = []
        for first in range(0, prompts, unet_batch):
            rows = embeddings[first:first + unet_batch]
            sample = np.concatenate([latents, extra], axis=channel_axis)
            feeds = {"sample": np.repeat(sample, unet_batch, axis=0),
                     "timestep": np.full((unet_batch,), t, dtype=unet_names["timestep"].dtype),
                     "encoder_hidden_states": pad_rows(rows, unet_batch),
                     **{name: pad_rows(value[first:first + unet_batch], unet_batch)
                        for name, value in sdxl_inputs.items()}}
            if cond_dim:
                feeds[TIMESTEP_COND] = np.repeat(guidance_embedding([guidance], cond_dim), unet_batch, axis=0)
            feeds.update(residuals)
            feeds.update(no_lora[unet.name])
            predictions.append(runners["unet"](**feeds)[unet_out][:len(rows)])
            made["unet"] += 1
        noise = np.concatenate(predictions)
        if plan["guidance"]:
            noise = noise[0:1] + guidance * (noise[1:2] - noise[0:1])
        latents = (latents - noise[0:1] / plan["steps"]).astype(latents.dtype)
    image = runners["vae_decoder"](**{vae_in: latents})
    made["vae_decoder"] += 1
    elapsed = (time.perf_counter() - start) * 1e3
    if not all(np.isfinite(v).all() for v in image.values()):
        raise BadInput("the pipeline run produced a non-finite image")
    return {"measured_ms": elapsed, "measured_calls": made}


def pad_rows(rows, size: int):
    """`rows` filled up to a file's batch of `size` by repeating the last row."""
    import numpy as np

    return np.concatenate([rows] + [rows[-1:]] * (size - len(rows))) if len(rows) < size else rows


def sdxl_encode(runner, entry: ComponentEntry, ids, hidden_1, no_lora: dict, unet_names: dict) -> tuple:
    """text_encoder_2 over the prompts' ids (batched as its file takes them): the context (both
    encoders' hidden states side by side) and the UNet's text_embeds and time_ids per prompt,
    the time ids SDXL's defaults for the converted size (original = target = the image, no crop);
    and the calls it made."""
    import numpy as np

    from difflite.runtime.sdxl import PENULTIMATE, TEXT_EMBEDS, TIME_IDS

    ids_in = entry.inputs[0]
    batch = ids_in.shape[0]
    hidden_2, pooled = [], []
    for first in range(0, len(ids), batch):
        chunk = ids[first:first + batch]
        out = runner(**{ids_in.name: pad_rows(chunk, batch).astype(ids_in.dtype)}, **no_lora)
        hidden_2.append(out[PENULTIMATE][:len(chunk)])
        pooled.append(out[TEXT_EMBEDS][:len(chunk)])
    context = np.concatenate([hidden_1, np.concatenate(hidden_2)], axis=-1)
    sample = unet_names["sample"]
    height, width = (sample.shape[1:3] if sample.layout == "NHWC" else sample.shape[2:4])
    size = [8 * height, 8 * width]
    time_ids = np.tile(np.asarray([size + [0, 0] + size], unet_names[TIME_IDS].dtype), (len(ids), 1))
    inputs = {TEXT_EMBEDS: np.concatenate(pooled).astype(unet_names[TEXT_EMBEDS].dtype), TIME_IDS: time_ids}
    return context, inputs, len(pooled)


def device_memory(stats: dict | None) -> dict | None:
    """The op library's stats_path report as MB: weights, intermediates (its arena, which holds
    the op scratch lent there too), the op scratch in buffers of its own, and their total; the
    scratch lent apart ("scratch_lent_mb", within the intermediates), with the whole report under
    "stats" (None where it wrote none)."""
    if not stats:
        return None
    parts = {"weights_mb": stats.get("weights_bytes", 0) / MIB,
             "intermediates_mb": stats.get("arena_bytes", 0) / MIB,
             "scratch_mb": stats.get("scratch_held_bytes", 0) / MIB}
    return {**parts, "total_mb": sum(parts.values()), "scratch_lent_mb": stats.get("scratch_lent_bytes", 0) / MIB,
            "stats": stats}


def read_stats_file(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        stats = read_json(path, what="op library stats")
    except BadInput:
        return None
    return stats if isinstance(stats, dict) else None


def bench_component(entry: ComponentEntry, feeds: dict, options: BenchOptions,
                    stats_path: Path | None) -> tuple:
    """Load (interpreter, delegate, allocated tensors), first call and timed runs of one
    component, with this process's memory measured across them: (runner, result). With the
    OpenCL backend, `device` holds what the op library allocated and, where nvidia-smi lists
    this process, the GPU memory it holds (every component loaded so far)."""
    from difflite.core import procmem

    with procmem.MeasuredMemory() as memory:
        start = time.perf_counter()
        runner = load_runner(entry, options, stats_path)
        load_ms = (time.perf_counter() - start) * 1e3
        memory.mark("after_load")
        try:
            timing = time_runner(runner, feeds, options.runs, options.warmup)
        except (ValueError, RuntimeError) as exc:
            raise BadInput(f"{entry.file}: running it failed ({str(exc).splitlines()[0]})") from exc
    device = device_memory(read_stats_file(stats_path))
    if device is not None:
        device["nvidia_smi_mb"] = procmem.nvidia_smi_mb()
    return runner, {"load_ms": load_ms, **timing, **memory.report(), "device": device}


def measure_pipeline(runners: dict, entries: dict[str, ComponentEntry], plan: dict, options: BenchOptions,
                     vocab: int) -> dict:
    """The pipeline run with every component resident: its wall time, call counts and this
    process's memory across it."""
    import numpy as np

    from difflite.core import procmem

    try:
        with procmem.MeasuredMemory() as memory:
            measured = run_pipeline(runners, entries, plan, options.guidance,
                                    np.random.default_rng(options.seed + 1000), vocab)
    except (ValueError, RuntimeError) as exc:
        raise BadInput(f"the pipeline run failed ({str(exc).splitlines()[0]})") from exc
    gpu = procmem.nvidia_smi_mb() if options.backend in ("opencl", "litert-gpu") else None
    return {**measured, "memory": {**memory.report(), "nvidia_smi_mb": gpu}}


def bench_host(folder: OutputFolder, names: list[str], options: BenchOptions, log) -> dict:
    import numpy as np

    from difflite.runtime.component import uses_oplib

    vocab = vocab_size(folder.path)
    entries = {name: folder.components[name] for name in names}
    if any(uses_oplib(entry, options.backend) for entry in entries.values()):
        options = replace(options, oplib=str(host_library(options)))  # any build happens before timing
    runners, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="difflite-bench-") as private:
        for index, name in enumerate(names):
            entry = entries[name]
            stats_path = Path(private) / f"stats_{name}.json" if options.backend == "opencl" else None
            feeds = random_feeds(entry, np.random.default_rng(options.seed + index), vocab)
            log(f"loading and timing {name} ({entry.file}): {options.warmup} warm-up + {options.runs} runs")
            runners[name], measured = bench_component(entry, feeds, options, stats_path)
            results[name] = {"file": entry.file, "custom_ops": list(entry.custom_ops), **measured}
        plan = pipeline_plan(entries, options.steps, options.guided)
        if any(n not in runners for n in pipeline_components(folder)):
            plan["measured_ms"] = None
        else:
            log(f"running the pipeline once: {options.steps} steps")
            plan.update(measure_pipeline(runners, entries, plan, options, vocab))
        runners.clear()
    peaks = [r["peak_rss_mb"] for r in results.values()] + [plan.get("memory", {}).get("peak_rss_mb")]
    return {"components": results, "pipeline": plan,
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                     "threads": options.threads or os.cpu_count()},
            "peak_rss_mb": max((p for p in peaks if p is not None), default=None)}


# --------------------------------------------------------------------------------------------
# Phone over adb


def phone_backend(device, requested: str) -> BackendChoice:
    """--backend on a phone: auto is the op library's OpenCL backend where the phone has an OpenCL
    driver (the library loads it by name at run time), else its CPU backend."""
    if requested != "auto":
        return BackendChoice(requested, requested, "as asked")
    for path in PHONE_OPENCL_LIBRARIES:
        status, _ = device.shell(f"[ -f {shlex.quote(path)} ]", timeout=60)
        if status == 0:
            return BackendChoice("opencl", "auto", f"auto: the phone has an OpenCL driver ({path})")
    return BackendChoice("cpu", "auto", "auto: no OpenCL driver on the phone (" + ", ".join(PHONE_OPENCL_LIBRARIES) + ")")


def android_library(options: BenchOptions) -> Path:
    from difflite.runtime import adb, oplib

    path = Path(options.oplib) if options.oplib else oplib.default_build_dir("android-arm64") / oplib.LIBRARY_NAME
    return adb.check_android_library(path)


def read_device_stats(device, path: str) -> dict | None:
    """The OpenCL backend's stats_path JSON on the phone (None where it wrote none)."""
    status, text = device.shell(f"cat {shlex.quote(path)}", timeout=60)
    if status != 0:
        return None
    try:
        stats = loads_json(text, source=path, what="op library stats")
    except BadInput:
        return None
    return stats if isinstance(stats, dict) else None


def stats_line(name: str, device: dict) -> str:
    """One line of what the op library reported: the GPU, storage and arithmetic, and memory."""
    stats = device["stats"]
    return (f"{name}: {stats.get('device', '?')} ({stats.get('platform', '?')}), storage "
            f"{stats.get('storage', '?')}, arithmetic {stats.get('arithmetic', '?')}, "
            f"{stats.get('nodes_claimed', '?')}/{stats.get('nodes_total', '?')} nodes in "
            f"{stats.get('partitions', '?')} partition(s); intermediates {fmt(device['intermediates_mb'])} MB "
            f"(op scratch lent there: {fmt(device['scratch_lent_mb'])} MB) + op scratch of its own "
            f"{fmt(device['scratch_mb'])} MB + weights {fmt(device['weights_mb'])} MB "
            f"= device {fmt(device['total_mb'])} MB")


def benchmark_model_fields(parsed, options: BenchOptions) -> dict:
    """One component's result from benchmark_model's log: load_ms is its start-up (Init),
    peak_mb the peak RSS its monitor sampled (None where it printed none)."""
    median = parsed.median_ms if parsed.median_ms is not None else parsed.avg_ms
    return {"runs": parsed.runs if parsed.runs is not None else options.runs, "warmup": options.warmup,
            "median_ms": median, "median_from": "median" if parsed.median_ms is not None else "avg",
            "min_ms": parsed.min_ms, "max_ms": parsed.max_ms, "mean_ms": parsed.avg_ms, "std_ms": parsed.std_ms,
            "first_ms": parsed.first_ms, "warmup_avg_ms": parsed.warmup_avg_ms, "load_ms": parsed.init_ms,
            "peak_mb": parsed.memory_peak_mb, "memory_init_mb": parsed.memory_init_mb,
            "memory_overall_mb": parsed.memory_overall_mb, "delegations": parsed.delegations}


def bench_adb(folder: OutputFolder, names: list[str], options: BenchOptions, log) -> dict:
    from difflite.runtime import adb

    out = folder.path
    device = adb.Device.connect(options.serial)
    choice = phone_backend(device, options.backend)
    log(choice.line().removeprefix("[difflite] "))
    options = replace(options, backend="cpu" if choice.backend == "litert-gpu" else choice.backend,
                      tflite_gpu=options.tflite_gpu or choice.backend == "litert-gpu")
    options.check_math()
    entries = {name: folder.components[name] for name in names}
    for entry in entries.values():
        if not entry.path.is_file():
            raise BadInput(f"{entry.path}: no such model file (named by the manifest)")
        if options.tflite_gpu and entry.custom_ops:
            raise BadInput(f"{entry.file} has difflite custom ops ({', '.join(entry.custom_ops)}): TFLite's "
                           f"GPU delegate cannot run them; convert with --no-fuse to compare against it")
    needs_library = not options.tflite_gpu and (options.backend != "cpu" or
                                                any(e.custom_ops for e in entries.values()))
    library = android_library(options) if needs_library else None
    if not device.is_executable(options.benchmark_model):
        raise BadInput(f"benchmark_model is missing or not executable at {options.benchmark_model} on "
                       f"{options.serial}: download TFLite's prebuilt android_aarch64_benchmark_model "
                       f"({adb.BENCHMARK_MODEL_URL}), `adb push` it there and `adb shell chmod +x` it, "
                       f"or pass --benchmark-model PATH")
    directory = options.device_dir.rstrip("/") or "/"
    device.mkdir(directory)
    files = {e.path: f"{directory}/{e.file}" for e in entries.values()}
    if library is not None:
        files[library] = f"{directory}/{LIBRARY_ON_DEVICE}"
    pushed = adb.sync_files(device, files, log)
    vocab = vocab_size(out)
    results = {}
    for name, entry in entries.items():
        ranges = {spec.name: (0, vocab - 1) for spec in entry.inputs if spec.dtype.startswith(("int", "uint"))}
        # The OpenCL backend reports what it ran and allocated (stats_path): read back afterwards.
        stats_file = f"{directory}/stats_{name}.json" if library is not None and options.backend == "opencl" else None
        delegate_options = options.delegate_options()
        if stats_file:
            device.shell(f"rm -f {shlex.quote(stats_file)}", timeout=60)
            delegate_options["stats_path"] = stats_file
            # Android has no user cache folder the op library could default to: compiled programs
            # are kept beside the models, so the second start on the phone loads them.
            delegate_options["cache_dir"] = f"{directory}/program_cache"
        command = adb.benchmark_command(
            options.benchmark_model, f"{directory}/{entry.file}", options.runs, options.warmup,
            threads=options.threads,
            delegate_path=f"{directory}/{LIBRARY_ON_DEVICE}" if library is not None else None,
            delegate_options=delegate_options,
            use_gpu=options.tflite_gpu, gpu_fp16=options.precision == "fp16",
            value_ranges=ranges, library_dir=directory)
        log(f"benchmark_model {entry.file} on {options.serial}: {options.warmup} warm-up + {options.runs} runs")
        status, output = device.shell(command)
        try:
            parsed = adb.parse_benchmark_model(output)
        except ValueError:
            raise BadInput(f"benchmark_model failed on {entry.file} (exit {status}): "
                           f"{adb.error_line(output)}") from None
        if status != 0:
            raise BadInput(f"benchmark_model exited {status} on {entry.file}: {adb.error_line(output)}")
        results[name] = {"file": entry.file, "custom_ops": list(entry.custom_ops),
                         **benchmark_model_fields(parsed, options),
                         "device": device_memory(read_device_stats(device, stats_file) if stats_file else None),
                         "command": command}
    plan = pipeline_plan(entries, options.steps, options.guided)
    plan["measured_ms"] = None
    plan["notes"].append("no measured pipeline run on the phone: benchmark_model times one component at a time")
    peaks = [r["peak_mb"] for r in results.values()]
    return {"components": results, "pipeline": plan, "backend_choice": choice.as_dict(),
            "device": {"serial": options.serial, "model": device.getprop("ro.product.model"),
                       "soc": device.getprop("ro.soc.model") or device.getprop("ro.board.platform"),
                       "abi": device.getprop("ro.product.cpu.abi"), "device_dir": directory,
                       "benchmark_model": options.benchmark_model,
                       "delegate": ("tflite-gpu" if options.tflite_gpu else
                                    f"{directory}/{LIBRARY_ON_DEVICE}" if library is not None else None),
                       "pushed": pushed},
            "peak_rss_mb": max((p for p in peaks if p is not None), default=None)}


# --------------------------------------------------------------------------------------------
# Both


def bench(out, options: BenchOptions, log=lambda message: None) -> dict:
    options.validate()
    out = Path(out)
    folder = OutputFolder.read(out, check_files=False)
    folder.check_family()
    if options.precision is None:
        options = replace(options, precision=folder.precision)
    names = select_components(folder, options.components)
    if not names:
        raise BadInput(f"{out}: the manifest lists no components")
    folder.check_files(names)
    if options.serial:
        result = bench_adb(folder, names, options, log)
    else:
        choice = choose_backend(options.backend)
        log(choice.line().removeprefix("[difflite] "))
        options = replace(options, backend=choice.backend)
        options.check_math()
        result = bench_host(folder, names, options, log)
        result["backend_choice"] = choice.as_dict()
    plan = result["pipeline"]
    timed = result["components"]
    needed = pipeline_components(folder)
    missing = [n for n in needed if n not in timed]
    plan["sum_of_medians_ms"] = (None if missing else
                                 sum(timed[n]["median_ms"] * c for n, c in plan["calls"].items()))
    if missing:
        plan["notes"].append(f"no pipeline estimate: {', '.join(missing)} not benchmarked "
                             f"(it needs {', '.join(needed)})")
    for name, r in timed.items():
        r["calls_per_image"] = plan["calls"].get(name, 0)
    return {"out": str(out), "mode": "adb" if options.serial else "host", "backend": result["backend_choice"]["backend"],
            "precision": options.precision, "math": options.math, "runs": options.runs,
            "warmup": options.warmup,
            "seed": options.seed, "source": folder.source.get("model"), "fuse": folder.options.get("fuse"),
            **result}


def check_plot_target(path: str) -> Path:
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise BadInput(f"--plot {path}: the file name must end in .png")
    if not target.parent.is_dir():
        raise BadInput(f"--plot {path}: folder {target.parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise BadInput("--plot needs matplotlib: pip install matplotlib") from exc
    return target


def write_plot(result: dict, path: Path) -> Path:
    """Bar chart of the median ms per component (min-max whiskers), written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(result["components"])
    rows = [result["components"][n] for n in names]
    medians = [r["median_ms"] for r in rows]
    low = [max(0.0, r["median_ms"] - (r["min_ms"] if r["min_ms"] is not None else r["median_ms"])) for r in rows]
    high = [max(0.0, (r["max_ms"] if r["max_ms"] is not None else r["median_ms"]) - r["median_ms"]) for r in rows]
    figure = Figure(figsize=(max(4.0, 1.6 * len(names) + 2), 4.0), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    bars = axes.bar(names, medians, yerr=[low, high], capsize=4, color="#4c72b0")
    axes.bar_label(bars, labels=[fmt(m) for m in medians], padding=3)
    axes.set_ylabel("median ms per call (whiskers: min-max)")
    if result["mode"] == "adb":
        where = result["device"].get("model") or result["device"]["serial"]
    else:
        where = f"host {result['host']['machine']}"
    axes.set_title(f"difflite bench {Path(result['out']).name}: {where}, backend {result['backend']}, "
                   f"{result['runs']} runs", fontsize=10)
    axes.margins(y=0.15)
    figure.tight_layout()
    return write_atomic(path, figure.savefig)


def write_atomic(path: Path, data) -> Path:
    """Write bytes (or call data(handle)) to a temporary file next to path, then rename it; a
    failed write (a full disk) removes the temporary file and is a BadInput naming path."""
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(handle, format="png")
            else:
                handle.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise BadInput(f"{path}: cannot write ({exc.strerror or exc})") from exc
        raise
    return path


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.0f}"


def peak_cell(r: dict) -> str:
    """Host: peak RSS (peak anonymous / file-backed); phone: benchmark_model's sampled peak."""
    if "peak_rss_mb" not in r:
        return fmt(r.get("peak_mb"))
    return f"{fmt(r['peak_rss_mb'])} ({fmt(r['peak_anon_mb'])}/{fmt(r['peak_file_mb'])})"


def memory_line(memory: dict) -> str:
    line = (f"peak RSS {fmt(memory['peak_rss_mb'])} MB (anonymous {fmt(memory['peak_anon_mb'])}, "
            f"file-backed {fmt(memory['peak_file_mb'])}) from {fmt(memory['baseline_rss_mb'])} MB before")
    if not memory["peak_reset"]:
        line += "; the peak could not be reset (/proc/self/clear_refs): it is the process's since start"
    if memory.get("nvidia_smi_mb") is not None:
        line += f"; nvidia-smi {fmt(memory['nvidia_smi_mb'])} MB"
    return line


def render(result: dict) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    adb_mode = result["mode"] == "adb"
    where = (f"{result['device']['serial']} ({result['device'].get('model') or 'adb'})" if adb_mode
             else f"host {result['host']['machine']}, {result['host']['threads']} threads")
    table = Table(title=f"difflite bench {result['out']}: {where}, backend {result['backend']} "
                        f"{result['precision']}{'' if result['math'] == 'auto' else ' math ' + result['math']}, "
                        f"{result['warmup']} warm-up + {result['runs']} runs")
    columns = ["component", "median ms", "min ms", "max ms", "mean ms", "first ms", "load ms", "calls/image",
               "ms/image", "peak MB" if adb_mode else "peak MB (anon/file)", "device MB"]
    for column in columns:
        table.add_column(column, justify="left" if column == "component" else "right")
    for name, r in result["components"].items():
        table.add_row(name, fmt(r["median_ms"]), fmt(r["min_ms"]), fmt(r["max_ms"]), fmt(r["mean_ms"]),
                      fmt(r["first_ms"]), fmt(r["load_ms"]), str(r["calls_per_image"]),
                      fmt(r["median_ms"] * r["calls_per_image"]) if r["calls_per_image"] else "-",
                      peak_cell(r), fmt(r["device"]["total_mb"]) if r.get("device") else "-")
    console.print(table)
    plan = result["pipeline"]
    guidance = "with guidance" if plan["guidance"] else "without guidance"
    line = f"one image, {plan['steps']} steps {guidance}: " + (
        f"sum of medians {fmt(plan['sum_of_medians_ms'])} ms" if plan["sum_of_medians_ms"] is not None
        else "no estimate")
    if plan.get("measured_ms") is not None:
        line += f", measured end to end {fmt(plan['measured_ms'])} ms"
    console.print(line)
    if plan.get("memory"):
        console.print(f"  the measured run, every component loaded: {memory_line(plan['memory'])}")
    for note in plan["notes"]:
        console.print(f"  {note}")
    if result.get("peak_rss_mb") is not None:
        label = "largest benchmark_model peak memory" if adb_mode else "peak RSS"
        console.print(f"{label} {result['peak_rss_mb']:.0f} MB")
    reported = {n: r["device"] for n, r in result["components"].items() if r.get("device")}
    if reported:
        console.print(f"the op library{' on the phone' if adb_mode else ''} (stats_path):")
        for name, device in reported.items():
            console.print(f"  {stats_line(name, device)}")


@click.command("bench")
@click.argument("out", type=click.Path())
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help=BACKEND_HELP + " With --adb, auto is opencl where the phone has an OpenCL driver, and "
                   "litert-gpu is TFLite's GPU delegate in benchmark_model (as --tflite-gpu).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="Op library precision (delegate option precision=...) [default: the conversion's, "
                   "from OUT's manifest].")
@click.option("--math", type=click.Choice(MATHS), default="auto", show_default=True,
              help="--backend opencl: auto multiplies and adds in half in the GEMM tiles at fp16 where the "
                   "GPU has cl_khr_fp16 (phones); fp32 keeps float arithmetic (delegate option math=...).")
@click.option("--runs", default=10, show_default=True, type=int, help="Timed runs per component.")
@click.option("--warmup", default=2, show_default=True, type=int, help="Warm-up runs per component.")
@click.option("--steps", default=20, show_default=True, type=int, help="Denoising steps of the pipeline estimate.")
@click.option("--guidance", default=7.5, show_default=True, type=float,
              help="Guidance scale of the estimate; > 1 means classifier-free guidance (two UNet passes).")
@click.option("--components", default=None, help="Comma-separated subset of the components [default: all].")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--threads", default=None, type=int,
              help="CPU threads [default: host: all cores; phone: benchmark_model's].")
@click.option("--oplib", default=None, type=click.Path(dir_okay=False),
              help="The op library to use [host: the source tree's build; --adb: the android-arm64 build].")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (and nothing else on stdout).")
@click.option("--save", default=None, type=click.Path(dir_okay=False),
              help="Also write the JSON results to FILE (atomically), whatever is printed.")
@click.option("--plot", default=None, type=click.Path(dir_okay=False),
              help="Write a bar chart of the median ms per component to FILE.png (needs matplotlib).")
@click.option("--adb", "serial", default=None, metavar="SERIAL",
              help="Benchmark on this Android device with TFLite's benchmark_model instead of on the host.")
@click.option("--device-dir", default="/data/local/tmp/difflite", show_default=True,
              help="--adb: folder on the device for the models and the op library.")
@click.option("--benchmark-model", default="/data/local/tmp/benchmark_model", show_default=True,
              help="--adb: path of TFLite's benchmark_model binary on the device.")
@click.option("--tflite-gpu", is_flag=True,
              help="--adb: time TFLite's own GPU delegate (--use_gpu=true) instead of the op library "
                   "(models without difflite custom ops only: convert --no-fuse).")
def bench_command(out, backend, precision, math, runs, warmup, steps, guidance, components, seed, threads, oplib,
                  as_json, save, plot, serial, device_dir, benchmark_model, tflite_gpu):
    """Time each component of OUT and estimate one image (host, or a phone with --adb SERIAL).

    Per component: load ms (interpreter, delegate, tensor allocation), first-call ms, then
    warm-up and timed runs on seeded random inputs of the manifest's shapes (median/min/max ms),
    the measured peak resident memory (anonymous/file-backed) and, with --backend opencl, the
    device memory the op library allocated. Pipeline: text encoder, UNet x steps (x2 with
    guidance and a batch-1 UNet), VAE decoder, as a sum of medians and (host) one measured run.
    """
    options = BenchOptions(
        backend=backend, precision=precision, math=math, runs=runs, warmup=warmup, steps=steps, guidance=guidance,
        components=tuple(c.strip() for c in components.split(",") if c.strip()) if components else None,
        seed=seed, threads=threads, oplib=oplib, serial=serial, device_dir=device_dir,
        benchmark_model=benchmark_model, tflite_gpu=tflite_gpu)
    plot_path = check_plot_target(plot) if plot else None
    if save and not Path(save).parent.is_dir():
        raise BadInput(f"--save {save}: folder {Path(save).parent} does not exist")
    if save and not os.access(Path(save).parent, os.W_OK | os.X_OK):
        raise BadInput(f"--save {save}: folder {Path(save).parent} is not writable")

    def log(message):
        if not as_json:
            click.echo(f"[difflite] {message}", err=True)

    result = bench(out, options, log)
    if plot_path is not None:
        result["plot"] = str(write_plot(result, plot_path))
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if save:
        write_atomic(Path(save), (text + "\n").encode())
    if as_json:
        click.echo(text)
    else:
        render(result)
        if plot_path is not None:
            click.echo(f"plot written to {plot_path}")
        if save:
            click.echo(f"results written to {save}")
