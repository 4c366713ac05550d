"""`difflite convert`: model -> ONNX export -> passes -> .tflite per component -> output folder.

Every component is exported first and the torch models are released before the graphs are
rewritten and written, so the peak memory is that of the largest single stage."""

from __future__ import annotations

import gc
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from difflite.compiler import export, export_cache, half_range, models, weight_recipe
from difflite.compiler.tflite import quantize
from difflite.compiler.tflite.builder import WEIGHT_LAYOUTS
from difflite.compiler.tflite.writer import load_onnx, write_tflite
from difflite.core import control, lora, procmem, profiles
from difflite.core.custom_ops import FUSE_KINDS
from difflite.core.errors import BadInput
from difflite.core.finite import NonFiniteWeights
from difflite.folder import manifest, memory
from difflite.folder.reader import read_tflite

DEFAULT_COMPONENTS = ("text_encoder", "unet", "vae_decoder")
# An inpainting UNet's default adds the VAE encoder: generate --mask encodes the picture with it.
INPAINT_COMPONENTS = (*DEFAULT_COMPONENTS, "vae_encoder")
# SDXL (issue 32): both text encoders, and the VAE encoder (generate --init-image)
SDXL_COMPONENTS = ("text_encoder", "text_encoder_2", "unet", "vae_decoder", "vae_encoder")
# What diffusers' SDXL pipelines take from their own config (model_index.json), at diffusers'
# defaults where the source says nothing (a loader may set Pipeline.pipeline_config): the zero
# unconditional embeddings without a negative prompt, and img2img's aesthetic-score time ids
SDXL_PIPELINE_FLAGS = {"force_zeros_for_empty_prompt": True, "requires_aesthetics_score": False}
# Recognised even when not fused (the writer decomposes them). layernorm is not among them: an
# unfused LayerNormalization keeps the writer's own lowering (no reshapes around it).
CANONICAL_KINDS = ("gelu", "groupnorm", "attention")
DEFAULT_FUSE = FUSE_KINDS  # every kind
DEFAULT_PROFILE = "generic"
PRECISIONS = ("fp32", "fp16")
VERSION = "0.1.0"
VAE_DECODER_FLOAT = ("decoder.conv_in.", "decoder.conv_out.")
WINOGRAD_OFF = "off"  # a component's --winograd-budget-mb: no Winograd there, in either form
# Under --weights int8 / int4 the Winograd budget (float transformed filters) defaults to 0: the
# filter form, which adds no weight memory, gives the speed back (H100, 2026-11: int4 UNet step
# 73.5 ms against fp16's 73.7). And these components
# default to no Winograd at all at these widths: with the filter form's half-storage transforms
# the int8 VAE decoder measured 34.9 dB against its 35 dB bar (36.3 without Winograd).
WINOGRAD_OFF_BY_DEFAULT = {"int8": ("vae_decoder",)}


def parse_winograd_budget(text: str | None) -> tuple[float | str | None, dict[str, float | str]]:
    """--winograd-budget-mb: "N" (MB for every component), "COMPONENT=N,..." or both
    ("150,vae_decoder=0"), N a number of MB or "off" (no Winograd, in either form): (the budget
    for components not named or None, {component: MB or "off"})."""
    if text is None:
        return None, {}
    default, per_component = None, {}
    for part in (p.strip() for p in str(text).split(",")):
        name, _, value = part.rpartition("=")
        try:
            budget = WINOGRAD_OFF if value.strip() == WINOGRAD_OFF else float(value)
        except ValueError:
            raise BadInput(f"--winograd-budget-mb {text!r}: {value!r} is not a number of MB or "
                           f"{WINOGRAD_OFF!r} (N, or COMPONENT=N, comma-separated)") from None
        if not name and default is not None or name in per_component:
            raise BadInput(f"--winograd-budget-mb {text!r}: {name or 'the default'} is given twice")
        if name:
            per_component[name.strip()] = budget
        else:
            default = budget
    return default, per_component


def default_components(pipe) -> tuple[str, ...]:
    """What convert writes without --components: the text-to-image components, and the VAE
    encoder too for an inpainting UNet (which only generate --mask runs, and --mask needs it);
    for an SDXL pipeline its second text encoder and the VAE encoder (generate --init-image)."""
    if pipe.family == "sdxl":
        return SDXL_COMPONENTS
    return INPAINT_COMPONENTS if pipe.inpainting else DEFAULT_COMPONENTS


@dataclass
class ConvertOptions:
    # None: the model's default_components (the command line's default)
    components: tuple[str, ...] | None = DEFAULT_COMPONENTS
    height: int | None = None  # None: the model's own size (its UNet's sample_size, in pixels)
    width: int | None = None
    batch: int = 1
    precision: str = "fp32"
    fuse: tuple[str, ...] = DEFAULT_FUSE
    device_profile: str = DEFAULT_PROFILE
    winograd_budget_mb: float | str | None = None  # None: the default (winograd_setting); "off"
    # per component, overriding the one above (e.g. {"vae_decoder": 0.0}): parse_winograd_budget
    winograd_budgets_mb: dict[str, float | str] = field(default_factory=dict)
    keep_onnx: bool = False
    seed: int = 0  # the preset's weights
    weights: str = "float"  # convolution / linear weights: float (as --precision), int8 or int4
    weights_block: int = quantize.DEFAULT_BLOCK  # int4: input values a scale covers
    # int4 / int8: the mix's recipe (difflite/compiler/weight_recipe.py), read from this file, else computed
    weights_recipe: str | None = None
    # int4 / int8: the SNR the computed recipe aims at (None: 28 dB for int4, 35 for int8, as
    # weight_recipe.TARGETS_DB; convert records the value used); 0: no recipe, all int4 / int8
    weights_target_db: float | None = None
    weights_probes: int = 2  # int4 / int8: probes the computed recipe measures on
    # where each file keeps its weights (tflite/builder.py WEIGHT_LAYOUTS): auto, inline or appended
    weights_layout: str = "auto"
    # run-time LoRA slots (core/lora.py): auto or none; None: core.lora.DEFAULT_SET by form
    lora_slots: str | None = None
    # the largest rank (summed over the LoRAs at once) a slot takes; None: core.lora.DEFAULT_MAX_RANK
    lora_rank: int | None = None

    def validate(self) -> None:
        unknown = [c for c in self.components or () if not export.is_component(c)]
        if unknown or self.components == ():
            raise BadInput(f"unknown component(s) {unknown} (choose from {', '.join(export.KNOWN)})")
        if self.precision not in PRECISIONS:
            raise BadInput(f"precision {self.precision!r} must be one of {', '.join(PRECISIONS)}")
        bad = [k for k in self.fuse if k not in FUSE_KINDS]
        if bad:
            raise BadInput(f"unknown fusion kind(s) {bad} (choose from {', '.join(FUSE_KINDS)})")
        if self.batch not in (1, 2):
            raise BadInput(f"batch {self.batch} must be 1 or 2")
        profiles.load_profile(self.device_profile)
        for where, budget in [(None, self.winograd_budget_mb), *self.winograd_budgets_mb.items()]:
            if where is not None and not export.is_component(where):
                raise BadInput(f"--winograd-budget-mb: unknown component {where!r} "
                               f"(choose from {', '.join(export.KNOWN)}, controlnet_N)")
            if budget is not None and budget != WINOGRAD_OFF and not 0 <= budget < math.inf:
                raise BadInput(f"--winograd-budget-mb {budget} must be a finite number >= 0")
        if self.weights not in quantize.WIDTHS:
            raise BadInput(f"--weights {self.weights!r} must be one of {', '.join(quantize.WIDTHS)}")
        if not (isinstance(self.weights_block, int) and 2 <= self.weights_block <= 4096
                and self.weights_block % 2 == 0):
            raise BadInput(f"--weights-block {self.weights_block!r} must be an even number from 2 to 4096")
        if self.weights_layout not in WEIGHT_LAYOUTS:
            raise BadInput(f"--weights-layout {self.weights_layout!r} must be one of {', '.join(WEIGHT_LAYOUTS)}")
        if self.weights_recipe is not None and self.weights not in weight_recipe.HIGH:
            raise BadInput(f"--weights-recipe {self.weights_recipe}: a recipe is for --weights int4 or int8 "
                           f"(not {self.weights})")
        if self.weights_target_db is not None and not (
                isinstance(self.weights_target_db, (int, float)) and 0 <= self.weights_target_db <= 200):
            raise BadInput(f"--weights-target-db {self.weights_target_db!r} must be a number of dB from 0 to 200")
        if self.weights_recipe is not None and self.weights_target_db == 0:
            raise BadInput("--weights-recipe and --weights-target-db 0 (no recipe) exclude each other")
        if not (isinstance(self.weights_probes, int) and 1 <= self.weights_probes <= 64):
            raise BadInput(f"--weights-probes {self.weights_probes!r} must be from 1 to 64")
        if self.lora_slots is not None and self.lora_slots not in lora.SETS:
            raise BadInput(f"--lora-slots {self.lora_slots!r} must be one of {', '.join(lora.SETS)}")
        if self.lora_rank is not None and not (isinstance(self.lora_rank, int)
                                               and 1 <= self.lora_rank <= lora.MAX_RANK_LIMIT):
            raise BadInput(f"--lora-rank {self.lora_rank!r} must be from 1 to {lora.MAX_RANK_LIMIT}")

    def lora_slot_set(self) -> str:
        return self.lora_slots or lora.DEFAULT_SET[self.lora_form()]

    def max_lora_rank(self) -> int:
        return self.lora_rank or lora.DEFAULT_MAX_RANK[self.lora_form()]

    def lora_form(self) -> str:
        """How slots are written: difflite.LoRA ops where the files need the op library anyway,
        factor inputs in --no-fuse files (stock LiteRT)."""
        return "custom" if self.fuse else "inputs"

    def quantization(self, component: str, recipe: dict | None = None) -> quantize.WeightQuantization:
        """The writer's weight quantization for one component: the VAE decoder's first and last
        convolutions (the latent in, the pixels out) stay float; `recipe` (int4 / int8) sets
        per-layer widths by weight digest."""
        keep = VAE_DECODER_FLOAT if component == "vae_decoder" else ()
        widths = weight_recipe.overrides(recipe) if recipe else {}
        return quantize.WeightQuantization(self.weights, self.weights_block, keep, overrides=widths)

    def target_db(self) -> float | None:
        """The SNR a computed recipe aims at: the option, else the --weights mix's default (None
        for float weights)."""
        if self.weights_target_db is not None:
            return self.weights_target_db
        return weight_recipe.TARGETS_DB.get(self.weights)

    def winograd_setting(self, component: str | None = None) -> float | str:
        """The Winograd budget of `component` in MB, or "off": its own when given, else the
        option's, else (int8 / int4 weights) off for WINOGRAD_OFF_BY_DEFAULT's components and 0
        for the others, else the device profile's."""
        if component in self.winograd_budgets_mb:
            return self.winograd_budgets_mb[component]
        if self.winograd_budget_mb is not None:
            return self.winograd_budget_mb
        if self.weights != "float":
            return WINOGRAD_OFF if component in WINOGRAD_OFF_BY_DEFAULT.get(self.weights, ()) else 0.0
        return profiles.load_profile(self.device_profile).winograd_budget_mb

    def winograd_off(self, component: str | None = None) -> bool:
        return self.winograd_setting(component) == WINOGRAD_OFF

    def budget_mb(self, component: str | None = None) -> float:
        """The Winograd weight budget of `component` (0 where it is off)."""
        setting = self.winograd_setting(component)
        return 0.0 if setting == WINOGRAD_OFF else setting

    def manifest_dict(self) -> dict:
        d = asdict(self)
        if str(self.device_profile).endswith(".json"):
            d["device_profile"] = profiles.load_profile(self.device_profile).name
        d["components"] = list(self.components)
        d["fuse"] = sorted(self.fuse)
        d["winograd_budget_mb"] = self.winograd_setting()
        d["winograd_budgets_mb"] = {c: self.winograd_setting(c) for c in self.components}
        d["lora_slots"] = self.lora_slot_set()
        d["lora_rank"] = self.max_lora_rank()
        if self.weights_recipe is not None:
            d["weights_recipe"] = str(Path(self.weights_recipe).expanduser().absolute())
        return d


@dataclass
class StageLog:
    """Wall time and peak RSS per (component, stage)."""
    entries: dict = field(default_factory=dict)

    def run(self, component: str, stage: str, fn: Callable, *args, **kwargs):
        procmem.reset_high_water_mark()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.entries.setdefault(component, {})[stage] = {
            "seconds": round(time.perf_counter() - start, 3), "peak_rss_mb": round(procmem.peak_rss_mb(), 1)}
        return result

    def peak_rss_mb(self) -> float:
        """The whole run's peak: the largest stage peak (ru_maxrss is reset with the stages)."""
        return max((s["peak_rss_mb"] for stages in self.entries.values() for s in stages.values()), default=0.0)


def convert(model: str, out, options: ConvertOptions, config: str | None = None,
            log: Callable[[str], None] = lambda message: None, vae: str | None = None,
            prediction_type: str | None = None, loras: tuple[models.LoraSpec, ...] = (),
            export_cache_dir: str | None = None, controlnets: tuple[str, ...] = ()) -> dict:
    """Convert `model` into the output folder `out`; returns the report. `vae`, `prediction_type`
    and `loras` change the loaded pipeline before export (models.load_pipeline); each of
    `controlnets` adds a component controlnet_N, and the UNet then takes their residuals; exports
    are reused from and kept in `export_cache_dir` when given (difflite/compiler/export_cache.py)."""
    options.validate()
    check_controlnet_components(options, len(controlnets))
    manifest.check_writable_folder(out)  # before minutes of loading and exporting
    if export_cache_dir is not None and Path(export_cache_dir).expanduser().exists() \
            and not Path(export_cache_dir).expanduser().is_dir():
        raise BadInput(f"--export-cache {export_cache_dir}: not a folder")
    options = replace(options, weights_target_db=options.target_db())
    given_recipes = weight_recipe.read(options.weights_recipe) if options.weights_recipe else {}
    for name, recipe in given_recipes.items():  # an int4 recipe is no int8 one, nor the reverse
        weight_recipe.check_width(recipe, options.weights, f"--weights-recipe {options.weights_recipe} ({name})")
    configs = None if vae else models.peek_configs(model)
    if configs and options.height is not None and options.width is not None:
        export.check_size_of(model, *configs, options.height, options.width, options.batch)  # before loading
    stages = StageLog()
    started = time.perf_counter()
    log(f"loading {model}")
    pipe = stages.run("pipeline", "load", models.load_pipeline, model, config, options.seed, vae=vae,
                      prediction_type=prediction_type, loras=tuple(loras), controlnets=tuple(controlnets))
    for line in describe_source(pipe):
        log(line)
    options = replace(options, height=pipe.default_size if options.height is None else options.height,
                      width=pipe.default_size if options.width is None else options.width,
                      components=(*(default_components(pipe) if options.components is None else options.components),
                                  *(control.controlnet_name(i) for i in range(len(controlnets)))))
    if pipe.inpainting and "vae_encoder" not in options.components:
        log("note: an inpainting UNet: generate --mask needs vae_encoder, which --components leaves out")
    export.check_size(pipe, options.height, options.width, options.batch)
    if "text_encoder_2" in options.components and pipe.text_encoder_2 is None:
        raise BadInput(f"{model}: --components text_encoder_2 is SDXL's second text encoder; this pipeline has none")
    # before the recipes and the exports: both must see the rescaled weights
    half_ranges = fit_half_range(pipe, options, stages, log)
    recipes = {}
    if options.weights in weight_recipe.HIGH and options.weights_target_db == 0:
        log(f"--weights-target-db 0: no {options.weights} mix recipe, every eligible layer {options.weights}")
    elif options.weights in weight_recipe.HIGH:  # the mix's recipe needs the torch modules
        for name in options.components:
            recipes[name] = stages.run(name, "recipe", mix_recipe, pipe, name, options,
                                       given_recipes.get(name), log)
    with manifest.StagedFolder(Path(out)) as staged:
        pipe.save_tokenizer(staged.path("tokenizer"))
        if pipe.tokenizer_2 is not None:
            pipe.save_tokenizer(staged.path("tokenizer_2"), pipe.tokenizer_2)
        pipe.save_scheduler(staged.path("scheduler"))
        onnx_dir = staged.path("onnx")
        for name in options.components:
            spec = export.component_spec(pipe, name, options.height, options.width, options.batch)
            export_component(spec, onnx_dir / f"{name}.onnx", stages, export_cache_dir, log)
            del spec
        latent = latent_info(pipe, options)
        conditioning = {name: conditioning_info(pipe, name, options) for name in options.components
                        if control.controlnet_index(name) is not None}
        source = {"model": pipe.source, "sha256": pipe.source_hash,
                  "config": str(Path(config).absolute()) if config else None,
                  "vae": str(Path(vae).expanduser().absolute()) if vae else None,
                  "prediction_type": prediction_type, **pipe.details}
        del pipe
        gc.collect()
        entries, reports = {}, {}
        for name in options.components:
            log(f"rewriting and writing {name}.tflite")
            try:
                entries[name], reports[name] = stages.run(
                    name, "write", write_component, name, onnx_dir / f"{name}.onnx", staged, options,
                    recipes.get(name))
            except NonFiniteWeights as exc:
                raise NonFiniteWeights(f"{name}: {exc}{changed_by(source)}") from exc
            if name in conditioning:
                entries[name]["conditioning"] = conditioning[name]
            if name in half_ranges:
                reports[name]["half_range"] = half_ranges[name]
                entries[name].update(half_range.manifest_entry(half_ranges[name]))
        if not options.keep_onnx:
            shutil.rmtree(onnx_dir)
        for name in options.components:
            reports[name]["stages"] = stages.entries[name]
        man = {
            "format": manifest.FORMAT, "format_version": manifest.FORMAT_VERSION,
            "difflite_version": VERSION, "source": source, "options": options.manifest_dict(),
            "latent": latent, "components": entries,
        }
        if recipes:
            man["weights_recipe"] = recipes
            staged.write_json(weight_recipe.FILE, weight_recipe.file_document(recipes))
        report = {"components": reports, "pipeline": stages.entries.get("pipeline", {}),
                  "total_seconds": round(time.perf_counter() - started, 3),
                  "peak_rss_mb": stages.peak_rss_mb()}
        staged.write_json(manifest.REPORT, report)
        staged.write_json(manifest.MANIFEST, man)
        staged.commit()
    return report


def fit_half_range(pipe, options: ConvertOptions, stages: StageLog, log: Callable[[str], None]) -> dict:
    """At fp16: each VAE component's activations measured and, where they pass half's range (for
    unfused GroupNorms, the range of their squares), its weights rescaled in place
    (difflite/compiler/half_range.py); {component: report record}."""
    if options.precision != "fp16":
        return {}
    decomposed = "groupnorm" not in options.fuse  # the writer's builtins hold (x - mean)^2 in half
    return {name: stages.run(name, "half_range", half_range.fit, pipe, name, options.height, options.width, log=log,
                             decomposed_norms=decomposed)
            for name in options.components if half_range.applies(name)}


def check_controlnet_components(options: ConvertOptions, count: int) -> None:
    """Before anything loads: --components names no controlnet_N itself (each of the `count`
    --controlnet adds one, after the components asked for, once they are known) and must hold the
    unet, which takes the residuals; a --winograd-budget-mb of controlnet_N needs that many
    ControlNets. (The model's default components, options.components None, hold the unet.)"""
    components = DEFAULT_COMPONENTS if options.components is None else options.components
    named = [c for c in components if control.controlnet_index(c) is not None]
    if named:
        raise BadInput(f"--components {','.join(components)}: {named[0]} comes from --controlnet (each "
                       f"--controlnet adds a component controlnet_N), not from --components")
    budgets = [c for c in options.winograd_budgets_mb
               if control.controlnet_index(c) is not None and control.controlnet_index(c) >= count]
    if budgets:
        raise BadInput(f"--winograd-budget-mb: {budgets[0]}, but the conversion has {count} --controlnet")
    if count and "unet" not in components:
        raise BadInput(f"--controlnet needs the unet among --components (it takes the ControlNets' residuals), "
                       f"got --components {','.join(components)}")


def changed_by(source: dict) -> str:
    """What changed the source's weights (the LoRAs merged, the VAE swapped), as the end of an
    error's line."""
    changes = [f"the LoRA {merged['path']} merged at scale {merged['scale']:g}" for merged in source.get("loras", [])]
    vae = source.get("vae")
    if vae:
        changes.append(f"the VAE {vae['path'] if isinstance(vae, dict) else vae}")
    return f" (the weights as changed by {' and '.join(changes)})" if changes else ""


def export_component(spec: export.ComponentSpec, path: Path, stages: StageLog, cache: str | None,
                     log: Callable[[str], None]) -> None:
    """The export stage of one component: from the export cache where it holds this export; the
    report's stage says which ("cached")."""
    if cache is None:
        log(f"exporting {spec.name} to ONNX")
        stages.run(spec.name, "export", export.export_onnx, spec, path)
        return
    log(f"exporting {spec.name} to ONNX (or reusing it from {cache})")
    hit = stages.run(spec.name, "export", export_cache.export_cached, spec, path, Path(cache), warn=log)
    stages.entries[spec.name]["export"]["cached"] = hit
    if hit:
        log(f"{spec.name}: the export cache held this export")


def weight_width_summary(widths: list[dict]) -> dict:
    """Per storage width: layers and MB of the convolution / linear weights, the MB they would
    take at the float precision, and every layer (name, shape, width, bytes). Totals: MB as
    written, with every quantized layer at int8 instead ("all_int8_mb"), and at the float
    precision ("float_mb")."""
    by_width: dict[str, dict] = {}
    for w in widths:
        entry = by_width.setdefault(w["width"], {"layers": 0, "mb": 0.0, "float_mb": 0.0})
        entry["layers"] += 1
        entry["mb"] += w["bytes"] / 2**20
        entry["float_mb"] += w["float_bytes"] / 2**20
    saved = sum(w["float_bytes"] - w["bytes"] for w in widths) / 2**20
    all_int8 = sum(weight_recipe.stored_bytes(w["shape"], "int8", 1) if w["width"] in ("int8", "int4")
                   else w["bytes"] for w in widths) / 2**20
    return {"by_width": {k: {**v, "mb": round(v["mb"], 3), "float_mb": round(v["float_mb"], 3)}
                         for k, v in sorted(by_width.items())},
            "mb": round(sum(w["bytes"] for w in widths) / 2**20, 3), "all_int8_mb": round(all_int8, 3),
            "float_mb": round(sum(w["float_bytes"] for w in widths) / 2**20, 3),
            "saved_mb": round(saved, 3), "layers": widths}


def mix_recipe(pipe, name: str, options: ConvertOptions, given: dict | None,
               log: Callable[[str], None]) -> dict:
    """One component's int4 / int8 mix recipe: `given` (from --weights-recipe) matched to this
    model, else computed on the torch component (difflite/compiler/weight_recipe.py)."""
    quant = options.quantization(name)
    where = f"--weights-recipe {options.weights_recipe}"
    mix = options.weights
    if given is not None:
        recipe = weight_recipe.apply(pipe, name, given, quant, options.height, options.width,
                                     options.weights_probes, where=where, log=log, precision=options.precision)
        log(f"{name}: {mix} mix from {options.weights_recipe}: {weight_recipe.describe(recipe)}")
        return recipe
    if options.weights_recipe:
        log(f"{name}: {where} has no {name} recipe: computing one")
    log(f"{name}: computing the {mix} mix recipe (target SNR {options.target_db():g} dB, "
        f"{options.weights_probes} probes)")
    recipe = weight_recipe.compute(pipe, name, quant, options.height, options.width, options.target_db(),
                                   options.weights_probes, log=log, precision=options.precision)
    log(f"{name}: {mix} mix: {weight_recipe.describe(recipe)}")
    return recipe


def describe_source(pipe) -> list[str]:
    """What the summary says of the source beyond its name: the inferred architecture and why,
    the LoRAs merged."""
    lines = []
    arch = pipe.details.get("architecture")
    if arch:
        lines.append(f"architecture: {arch['summary']} ({'; '.join(arch['reasons'])})")
    for merged in pipe.details.get("loras", []):
        lines.append(f"merged LoRA {merged['file']} x{merged['scale']:g} ({merged['summary']})")
    for controlnet in pipe.details.get("controlnets", []):
        lines.append(f"{controlnet['component']}: {controlnet['model']} ({controlnet['architecture']['summary']})")
    return lines


def fuse_kind_of(census_kind: str) -> str:
    """The --fuse keyword of a report kind (geglu is part of gelu, groupnorm_silu of groupnorm)."""
    return {"geglu": "gelu", "groupnorm_silu": "groupnorm"}.get(census_kind, census_kind)


def latent_info(pipe, options: ConvertOptions) -> dict:
    h, w = export.latent_size(pipe, options.height, options.width)
    return {"channels": int(pipe.vae.config.latent_channels), "height": h, "width": w,
            # the UNet's sample: the latents, or for an inpainting UNet the latents, the mask and
            # the masked picture's latents
            "unet_channels": int(pipe.unet.config.in_channels), "inpainting": pipe.inpainting,
            "vae_scale_factor": pipe.vae_scale_factor,
            "scaling_factor": float(pipe.vae.config.scaling_factor),
            "text_length": int(pipe.text_encoder.config.max_position_embeddings),
            "text_hidden": int(pipe.text_encoder.config.hidden_size),
            "image_height": options.height, "image_width": options.width, "batch": options.batch,
            **sdxl_latent_info(pipe)}


def sdxl_latent_info(pipe) -> dict:
    """What an SDXL folder's manifest adds to "latent": its family (generate runs "sdxl" as
    diffusers' SDXL pipelines; bench refuses it), the UNet's context width (both encoders' hidden
    sizes), text_encoder_2's width and its projection (the UNet's text_embeds), the time ids, and
    the pipeline's own flags (SDXL_PIPELINE_FLAGS)."""
    if pipe.family != "sdxl":
        return {}
    from difflite.compiler.presets import SDXL_TIME_IDS

    given = getattr(pipe, "pipeline_config", None) or {}
    flags = {name: bool(given.get(name, default)) for name, default in SDXL_PIPELINE_FLAGS.items()}
    return {"family": "sdxl", "context_hidden": int(pipe.unet.config.cross_attention_dim),
            "text_hidden_2": int(pipe.text_encoder_2.config.hidden_size),
            "text_embeds": int(pipe.text_encoder_2.config.projection_dim), "time_ids": SDXL_TIME_IDS,
            "addition_time_embed_dim": int(pipe.unet.config.addition_time_embed_dim), **flags}


def conditioning_info(pipe, name: str, options: ConvertOptions) -> dict:
    """What a ControlNet component's control image is: its input, channels, size and values."""
    controlnet = pipe.controlnets[control.controlnet_index(name)]
    return {"input": control.CONTROL_IMAGE, "channels": int(controlnet.config.conditioning_channels),
            "height": options.height, "width": options.width, "value_range": list(control.CONTROL_IMAGE_RANGE),
            "channel_order": "rgb"}


def write_component(name: str, onnx_path: Path, staged: manifest.StagedFolder,
                    options: ConvertOptions, recipe: dict | None = None) -> tuple[dict, dict]:
    from difflite.passes import run_passes
    from difflite.passes.lora import add_lora_slots

    graph = load_onnx(onnx_path)
    # Patterns are always recognised (the writer decomposes unfused kinds into builtins laid out
    # for NHWC); only the kinds in options.fuse become custom ops.
    decisions: dict = {}
    kinds = set(CANONICAL_KINDS) | set(options.fuse)
    if options.winograd_off(name):
        kinds.discard("winograd")
    fusion = run_passes(graph, kinds, profile=options.device_profile,
                        winograd_budget_mb=options.budget_mb(name), precision=options.precision,
                        details=decisions,
                        weight_value_bytes=quantize.value_bytes(options.weights, options.weights_block,
                                                                quantize.scale_bytes(options.precision)))
    for kind, counts in fusion.items():
        counts["custom_op"] = fuse_kind_of(kind) in kinds & set(options.fuse)
    slots = add_lora_slots(graph, name, options.lora_slot_set(), options.lora_form(), options.max_lora_rank())
    filename = f"{name}.tflite"
    path = staged.path(filename)
    result = write_tflite(graph, precision=options.precision, fuse=frozenset(options.fuse),
                          description=f"difflite {VERSION} {name}", path=path, weights=options.weights_layout,
                          quantization=options.quantization(name, recipe), stock_gpu_forms=not options.fuse)
    del graph
    summary = read_tflite(path)
    plan = memory.plan(summary)
    entry = {"file": filename, "sha256": manifest.sha256_file(path), "bytes": path.stat().st_size,
             "weights": result.weight_layout,
             "inputs": result.inputs, "outputs": result.outputs, "custom_ops": result.custom_ops,
             # int8 / int4 constants: the runtime's CPU backend then loads the op library to read them
             "quantized_weights": any(t.constant and t.dtype in ("int8", "int4") for t in summary.tensors)}
    if slots:
        entry["lora_slots"] = {"form": options.lora_form(), "max_rank": options.max_lora_rank(),
                               "slots": [slot.as_dict() for slot in slots]}
    winograd_mb = sum(d["extra_mb"] for d in decisions["winograd"])
    report = {"fusion": fusion, "op_histogram": result.op_histogram, "ops": sum(result.op_histogram.values()),
              "weight_widths": weight_width_summary(result.weight_widths),
              "winograd": {"convs": decisions["winograd"], "extra_weights_mb": round(winograd_mb, 3)},
              "attention_variants": decisions["attention_variants"], **plan.as_dict()}
    if recipe is not None:
        report["weights_recipe"] = {
            **weight_recipe.summary(recipe),
            # the recipe's layers the writer met (a transformed-form Winograd convolution's U stays float)
            "written_layers": sum(1 for w in result.weight_widths if w.get("digest") in
                                  {layer["digest"] for layer in recipe["layers"]})}
    return entry, report
