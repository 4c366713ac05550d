"""`difflite verify`: each emitted component against the PyTorch module it came from, on the same
seeded random inputs. Tolerances (DESIGN §7), by what the conversion stored: fp32 max |err| <=
1e-3 x max |ref|; fp16 weights PSNR >= 40 dB; int8 weights SNR >= 35 dB; int4 weights SNR >= 28 dB.
Each check says which it applied."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from difflite.core.errors import BadInput
from difflite.folder.output_folder import ComponentEntry, OutputFolder
from difflite.runtime.component import find_oplib, uses_oplib

FP32_RELATIVE_TOLERANCE = 1e-3
FP16_MIN_PSNR_DB = 40.0
MIN_SNR_DB = {"int8": 35.0, "int4": 28.0}  # quantized weights: signal over error power


def tolerance(options: dict) -> str:
    """The bar a conversion is held to, as text: what `compare` applies and the table shows."""
    weights = options.get("weights", "float")
    if weights in MIN_SNR_DB:
        return f"SNR >= {MIN_SNR_DB[weights]:g} dB ({weights} weights)"
    if options.get("precision") == "fp16":
        return f"PSNR >= {FP16_MIN_PSNR_DB:g} dB (fp16 weights)"
    return f"max |err| <= {FP32_RELATIVE_TOLERANCE:g} x max |ref| (fp32)"


@dataclass
class Check:
    component: str
    output: str
    seed: int
    max_abs_error: float
    max_abs_reference: float
    relative_error: float
    psnr_db: float
    snr_db: float
    passed: bool
    tolerance: str = ""


def compare(reference: np.ndarray, actual: np.ndarray, precision: str,
            weights: str = "float") -> tuple[float, float, float, float, float, bool]:
    """(max |err|, max |ref|, relative error, PSNR, SNR, passed) under the bar of `tolerance`."""
    reference = reference.astype(np.float64)
    actual = actual.astype(np.float64)
    if reference.shape != actual.shape:
        raise BadInput(f"output shape {actual.shape} differs from PyTorch's {reference.shape}")
    error = float(np.abs(reference - actual).max())
    peak = float(np.abs(reference).max())
    relative = error / peak if peak > 0 else error
    rmse = float(np.sqrt(np.mean((reference - actual) ** 2)))
    psnr = math.inf if rmse == 0 else 20 * math.log10(peak / rmse) if peak > 0 else -math.inf
    noise = float(np.sum((reference - actual) ** 2))
    signal = float(np.sum(reference ** 2))
    snr = math.inf if noise == 0 else 10 * math.log10(signal / noise) if signal > 0 else -math.inf
    finite = bool(np.isfinite(actual).all())
    if weights in MIN_SNR_DB:
        passed = snr >= MIN_SNR_DB[weights]
    elif precision == "fp32":
        passed = relative <= FP32_RELATIVE_TOLERANCE
    else:
        passed = psnr >= FP16_MIN_PSNR_DB
    return error, peak, relative, psnr, snr, finite and passed


def recorded_vae(source: dict) -> str | None:
    """The --vae a conversion recorded: the loader's {"path", "sha256"} (what the manifest holds),
    or a bare path."""
    vae = source.get("vae")
    return vae.get("path") if isinstance(vae, dict) else vae


def load_source(folder: OutputFolder, model: str | None, config: str | None):
    from difflite.compiler import models

    source = folder.source
    # --model replaces the base checkpoint only: the VAE, prediction type, LoRAs and ControlNets
    # (re-loaded from their recorded sources) of the conversion apply to it as they did then.
    loras = tuple(models.LoraSpec(entry["path"], float(entry["scale"])) for entry in source.get("loras", []))
    controlnets = tuple(entry["model"] for entry in source.get("controlnets", []))
    pipe = models.load_pipeline(model or source["model"], config or source.get("config"),
                                folder.options.get("seed", 0), vae=recorded_vae(source),
                                prediction_type=source.get("prediction_type"), loras=loras,
                                controlnets=controlnets)
    for recorded, loaded in zip(source.get("controlnets", []), pipe.details.get("controlnets", [])):
        if loaded["sha256"] != recorded.get("sha256"):
            raise BadInput(f"{recorded['model']}: the weights of {loaded['component']} changed since conversion "
                           f"(hash differs)")
    if model is None and pipe.source_hash != source["sha256"]:
        raise BadInput(f"{source['model']}: weights changed since conversion (hash differs); "
                       f"pass --model to verify against another source")
    return pipe


def verify(out, model: str | None = None, config: str | None = None, backend: str = "cpu",
           seeds=(0, 1), components=None, memory_out: dict | None = None) -> list[Check]:
    """`memory_out`, when given, receives per component the OpenCL delegate's memory report, or
    (backend litert-gpu) whether stock LiteRT's GPU accelerator ran it fully accelerated.
    The folder, its files and the op library are checked before torch is imported and the
    source is loaded (seconds to minutes)."""
    folder = OutputFolder.read(out, components)
    selected = {name: e for name, e in folder.components.items() if not components or name in components}
    if backend == "litert-gpu":
        from difflite.runtime import litert_gpu

        for entry in selected.values():
            litert_gpu.check_runnable(entry)
    elif any(uses_oplib(e, backend) for e in selected.values()):
        find_oplib()
    import torch

    from difflite.compiler import export

    options = folder.options
    pipe = load_source(folder, model, config)
    checks = []
    memory: dict[str, dict] = {}
    for name, entry in selected.items():
        specs = [export.component_spec(pipe, name, options["height"], options["width"],
                                       options["batch"] if export.takes_batch(name) else 1, seed=seed)
                 for seed in seeds]
        feeds = [{n: t.numpy() for n, t in zip(spec.input_names, spec.example_inputs)} for spec in specs]
        actuals, memory[name] = run_component(entry, backend, folder.precision, feeds, folder.weights)
        for seed, spec, actual in zip(seeds, specs, actuals):
            with torch.no_grad():
                reference = spec.module(*spec.example_inputs)
            if isinstance(reference, torch.Tensor):
                reference = (reference,)
            for output_name, ref in zip(spec.output_names, reference):
                result = compare(ref.numpy(), actual[output_name], options["precision"],
                                 options.get("weights", "float"))
                checks.append(Check(name, output_name, seed, *result, tolerance=tolerance(options)))
    if memory_out is not None:
        memory_out.update({k: v for k, v in memory.items() if v})
    return checks


def run_component(entry: ComponentEntry, backend: str, precision: str,
                  feeds: list[dict], weights: str = "float") -> tuple[list[dict], dict]:
    """The component's outputs for each feed set, and what its runtime reports: the OpenCL
    delegate's memory, or whether LiteRT's GPU accelerator ran it fully accelerated."""
    if backend == "litert-gpu":
        from difflite.runtime import litert_gpu
        from difflite.runtime.loras import SlotFactors

        no_lora = SlotFactors(entry).feeds()  # a --no-fuse file's LoRA factor inputs: zeros
        run = litert_gpu.run(entry.path, [{**entry.to_file_layout(f), **no_lora} for f in feeds],
                             litert_gpu.accelerator_for(precision, weights))
        return [entry.from_file_layout(o) for o in run.outputs], {
            "litert_gpu": {"fully_accelerated": run.fully_accelerated, "accelerator": run.accelerator}}
    from difflite.runtime.component import Component

    runner = Component(entry, backend=backend, precision=precision)
    return [runner(**f) for f in feeds], runner.delegate_stats()


def as_rows(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
