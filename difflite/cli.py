"""The difflite command line (DESIGN §4). Exit codes: 0 ok, 1 a verification or benchmark target
failed, 2 bad input (one line naming the file, the layer or the op)."""

from __future__ import annotations

import json
import os
import sys

import click

from difflite.core import lora
from difflite.core.errors import BadInput, VerificationFailed
from difflite.runtime import backend

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def fail_bad_input(message: str) -> None:
    click.echo(f"difflite: error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def usage_line(exc: click.UsageError) -> str:
    """click's usage error as one line (click prints the usage, a hint and the error on four)."""
    where = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
    return f"{exc.format_message()}{where}"


class Group(click.Group):
    """Turns BadInput and click's usage errors into exit 2 and VerificationFailed into exit 1,
    each with one line and without a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            fail_bad_input(usage_line(exc))
        except BadInput as exc:
            fail_bad_input(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except VerificationFailed as exc:
            click.echo(f"difflite: {exc}", err=True)
            sys.exit(EXIT_FAILED)
        except KeyboardInterrupt:
            click.echo("difflite: interrupted", err=True)
            sys.exit(130)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 160)


def table(title: str, columns: list[str], rows: list[list]):
    from rich.table import Table
    t = Table(title=title)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="difflite")
def main():
    """difflite: compile a diffusers Stable Diffusion pipeline into TFLite models with fused,
    GPU-aware custom ops, and verify, inspect and benchmark the result."""


def parse_fuse(fuse: str | None, no_fuse: bool) -> tuple[str, ...]:
    from difflite.compiler.convert import DEFAULT_FUSE
    from difflite.core.custom_ops import FUSE_KINDS
    if no_fuse:
        if fuse:
            raise BadInput("--fuse and --no-fuse exclude each other")
        return ()
    if fuse is None:
        return DEFAULT_FUSE
    kinds = tuple(k.strip() for k in fuse.split(",") if k.strip())
    bad = [k for k in kinds if k not in FUSE_KINDS]
    if bad:
        raise BadInput(f"--fuse: unknown kind(s) {', '.join(bad)} (choose from {', '.join(FUSE_KINDS)})")
    return kinds


@main.command()
@click.argument("model")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False),
              help="Output folder (created; existing difflite files in it are replaced).")
@click.option("--config", type=click.Path(), default=None,
              help="Diffusers folder with the configs, for a single .safetensors/.ckpt MODEL [default: the "
                   "architecture is inferred from the checkpoint's keys]; SD 1.x / 2.x only (SDXL files are "
                   "inferred).")
@click.option("--vae", type=click.Path(), default=None,
              help="A separate VAE to use instead of MODEL's: a diffusers vae folder or a .safetensors/.ckpt "
                   "file (original or diffusers keys).")
@click.option("--prediction-type", type=click.Choice(["epsilon", "v_prediction"]), default=None,
              help="What the UNet predicts, for the scheduler [default: the config's; for a single file, "
                   "inferred (SD 2.x: v_prediction at 768 unless the file says otherwise; SDXL: epsilon unless "
                   "it has a v_pred key)].")
@click.option("--lora", "loras", multiple=True, metavar="FILE[:SCALE]",
              help="Merge a LoRA (diffusers/PEFT or kohya/A1111 .safetensors; for SDXL its text_encoder_2 "
                   "layers too) into the weights before export, scaled by SCALE (default 1.0; finite, from -1000 to 1000); repeatable. To choose LoRAs per "
                   "picture instead, see --lora-slots and generate --lora.")
@click.option("--lora-slots", type=click.Choice(lora.SETS), default=None,
              help="Layers that take a LoRA at run time (generate --lora, LitePipeline.set_loras): auto, every "
                   "layer kohya and diffusers LoRAs train (the UNet transformers' attention projections, "
                   "feed-forward and proj_in/proj_out; the text encoder's attention and MLP linears); none "
                   "[default: auto; none with --no-fuse]. Without a LoRA they cost nothing in fused files (a "
                   "difflite.LoRA op that passes its input through); --no-fuse files take the factors as graph "
                   "inputs of --lora-rank (zeros: no LoRA), which stock LiteRT runs, at the cost of two matrix "
                   "products per slot at every call (SD 1.5's UNet on LiteRT's GPU engine, rank 32: 1.87x the step).")
@click.option("--lora-rank", default=None, type=int,
              help="The largest LoRA rank a slot takes at run time, summed over the LoRAs active at once "
                   f"(1 to {lora.MAX_RANK_LIMIT}) [default: {lora.DEFAULT_MAX_RANK['custom']}; --no-fuse: "
                   f"{lora.DEFAULT_MAX_RANK['inputs']}, the size of its factor inputs, which cost two products of "
                   "that rank per slot at every call].")
@click.option("--controlnet", "controlnets", multiple=True, metavar="CN",
              help="Add a ControlNet, written as the component controlnet_N (N counting the --controlnet given, "
                   "from 0): a diffusers ControlNetModel folder, an original-format ControlNet 1.x file "
                   "(.safetensors/.pth/.ckpt: architecture inferred from its tensors) or preset:controlnet / "
                   "preset:controlnet-tiny (preset:sd15's / preset:tiny's ControlNet, seeded random weights). It "
                   "must fit MODEL's UNet (channels, layers, input channels, cross-attention width). Its inputs "
                   "are the UNet's and the control image (controlnet_cond, [0, 1]); its outputs, the residuals "
                   "down_residual_0 .. and mid_residual at conditioning scale 1, which the UNet then takes as "
                   "inputs. Needs the unet in --components (refused without it); repeatable.")
@click.option("--components", default=None,
              help="Comma-separated: text_encoder, text_encoder_2 (SDXL), unet, vae_decoder, vae_encoder [default: "
                   "text_encoder,unet,vae_decoder; for an inpainting model (a 9-channel UNet) vae_encoder too, "
                   "which generate --mask needs; add vae_encoder for generate --init-image; for SDXL "
                   "text_encoder,text_encoder_2,unet,vae_decoder,vae_encoder; each --controlnet adds controlnet_N].")
@click.option("--height", default=None, type=int,
              help="Image height in pixels [default: the model's own size: 512, 768 for SD 2.x 768 "
                   "models, 1024 for SDXL].")
@click.option("--width", default=None, type=int, help="Image width in pixels [default: the model's own size].")
@click.option("--batch", default=1, show_default=True, type=int,
              help="UNet batch (2 = classifier-free guidance in one call).")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="Weight storage: fp16 stores float16 weights + DEQUANTIZE. At fp16 the VAE's weights are "
                   "rescaled by exact powers of two where its activations, measured on probes, would pass "
                   "half's range / 16 (with --no-fuse: where GroupNorm's squares would; report.json's half_range).")
@click.option("--weights", "weights", type=click.Choice(["float", "int8", "int4"]), default="float",
              show_default=True,
              help="Storage of the convolution and linear weights: float follows --precision; int8 (one scale per "
                   "output channel) and int4 (a scale per --weights-block input values, stored as --precision "
                   "stores weights) store them quantized, with TFLite's DEQUANTIZE to float after them (int4: "
                   "times its block scales, MUL). Both are mixes: the layers most sensitive to "
                   "int4 stay int8, those most sensitive to int8 stay float (as --precision stores them), as a "
                   "recipe says (computed on the PyTorch model for --weights-target-db, or read from "
                   "--weights-recipe; written to OUT/weights_recipe.json and the manifest). Both also store "
                   "the text encoders' token tables as int8 rows (a scale a row; not in --no-fuse files). Every other "
                   "weight (norms, biases, embeddings, the VAE decoder's first and last convolutions) and the "
                   "activations follow --precision; so do Winograd's transformed weights, where the budget buys "
                   "them: a quantized Winograd convolution otherwise keeps its filter as stored, transformed at "
                   "every call, at no weight memory.")
@click.option("--weights-block", default=32, show_default=True, type=int,
              help="int4: how many consecutive input values share a scale (a float16 each at --precision fp16, "
                   "else a float32).")
@click.option("--weights-recipe", "weights_recipe", type=click.Path(), default=None,
              help="int4 / int8: reuse the per-layer choice of an earlier conversion at the same --weights: its "
                   "weights_recipe.json, its manifest.json or its output folder. Layers are matched by a digest of "
                   "their values; a recipe of the other width, matching none of this model's layers or made for "
                   "another --weights-block is refused, a partial match warns (unmatched layers are int4 / int8). "
                   "Components the file has no recipe for get one computed.")
@click.option("--weights-target-db", default=None, type=float,
              help="int4 / int8: the SNR against PyTorch a computed recipe aims at, plus 1 dB: layers move to "
                   "the wider width until its probes measure it [default: verify's bar, 28 for int4, 35 for "
                   "int8]; 0: no recipe, every layer at --weights.")
@click.option("--weights-probes", default=2, show_default=True, type=int,
              help="int4 / int8: seeded random inputs the recipe measures each layer's sensitivity on (at latents of at "
                   "most 16x16); more is slower and steadier.")
@click.option("--weights-layout", type=click.Choice(["auto", "inline", "appended"]), default="auto",
              show_default=True,
              help="Where each .tflite keeps its weights: inline (inside the flatbuffer: every TFLite runtime "
                   "reads it), appended (after the flatbuffer, located by Buffer.offset: runtimes that read "
                   "offset buffers, as files past 2 GiB need; building an interpreter then maps almost none of the "
                   "weights' pages, which keeps them out of the host's peak where the GPU has its own memory) "
                   "or auto (inline, appended past the flatbuffer's 2 GiB limit).")
@click.option("--fuse", default=None,
              help="Comma-separated fusions into difflite custom ops: gelu, groupnorm, layernorm, attention, "
                   "winograd [default: all five; layernorm runs as GroupNorm(groups=1); winograd only where "
                   "the device profile and budget say].")
@click.option("--device-profile", default="generic", show_default=True,
              help="Target GPU profile (difflite/core/device_profiles.json): generic, adreno-740, mali-g715, ...; "
                   "it picks Winograd convolutions and attention variants.")
@click.option("--winograd-budget-mb", default=None,
              help="Extra weight memory Winograd may add per component (its transformed weights are 4x a 3x3 "
                   "conv's; the candidates it does not buy keep their filter, transformed at every call where "
                   "that still pays, which adds none; with --weights int8|int4 those come first): N MB for "
                   "each, or per component, e.g. "
                   "150,vae_decoder=0 (the UNet and text encoder 150, the VAE decoder no transformed "
                   "filters; a ControlNet: controlnet_0=N); 'off': no "
                   "Winograd in either form, e.g. vae_decoder=off [default: the device profile's budget, "
                   "200 MB (4000 on nvidia-h100); with --weights int8|int4, 0, and off for the int8 VAE "
                   "decoder, whose filter-form Winograd measured under its 35 dB bar].")
@click.option("--no-fuse", is_flag=True, help="Builtin TFLite ops only (recognised patterns are decomposed "
                                                "into NHWC-friendly builtins), in the forms stock LiteRT's GPU "
                                                "accelerator compiles: with --weights, linear layers as 1x1 "
                                                "convolutions.")
@click.option("--keep-onnx", is_flag=True, help="Keep the exported ONNX graphs in OUT/onnx/.")
@click.option("--export-cache", "export_cache_dir", type=click.Path(file_okay=False), default=None,
              envvar="DIFFLITE_EXPORT_CACHE", show_envvar=True,
              help="Keep each component's ONNX export in this folder and reuse it when the same model is "
                   "converted again at the same size and batch (exporting is most of a conversion's time; "
                   "--precision, --weights, --fuse and budgets apply after it). Entries are checked by sha256 "
                   "before reuse; nothing is pruned (SD 1.5's UNet: 3.4 GB).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of a preset's random weights.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def convert(model, out, config, vae, prediction_type, loras, lora_slots, lora_rank, controlnets, components, height,
            width, batch, precision, weights, weights_block, weights_recipe, weights_target_db, weights_probes,
            weights_layout, fuse, no_fuse, device_profile, winograd_budget_mb, keep_onnx, export_cache_dir, seed, as_json):
    """Convert MODEL into .tflite files in OUT.

    MODEL is a local diffusers folder (SD 1.x / 2.x, or SDXL base or inpainting:
    StableDiffusionXLPipeline's layout), a .safetensors/.ckpt file (original LDM layout: SD 1.x, 2.x
    or SDXL, text-to-image or inpainting, inferred from its keys and shapes; or --config FOLDER; the
    SDXL refiner is refused), or preset:NAME (preset:tiny, preset:sd15, preset:sd21,
    preset:sd21-768, preset:sd15-inpaint, preset:tiny-inpaint: real architectures, seeded random
    weights; preset:sdxl, preset:sdxl-tiny, preset:sdxl-inpaint, preset:sdxl-tiny-inpaint: SDXL,
    whose folder adds text_encoder_2 and vae_encoder and which generate runs as diffusers'
    StableDiffusionXLPipeline / ...InpaintPipeline). Each
    --controlnet adds a component controlnet_N and residual inputs to the UNet.
    """
    from difflite.compiler.convert import ConvertOptions, parse_winograd_budget
    from difflite.compiler.convert import convert as run_convert

    budget, budgets = parse_winograd_budget(winograd_budget_mb)

    options = ConvertOptions(
        components=None if components is None else tuple(c.strip() for c in components.split(",") if c.strip()),
        height=height, width=width, batch=batch, precision=precision,
        fuse=parse_fuse(fuse, no_fuse), device_profile=device_profile, winograd_budget_mb=budget,
        winograd_budgets_mb=budgets,
        keep_onnx=keep_onnx, seed=seed, weights=weights, weights_block=weights_block, weights_recipe=weights_recipe,
        weights_target_db=weights_target_db, weights_probes=weights_probes, weights_layout=weights_layout,
        lora_slots=lora_slots,
        lora_rank=lora_rank)
    quiet = as_json

    def log(message):
        if not quiet:
            click.echo(f"[difflite] {message}", err=True)

    report = run_convert(model, out, options, config=config, log=log, vae=vae, prediction_type=prediction_type,
                         loras=tuple(lora.parse_spec(spec) for spec in loras), export_cache_dir=export_cache_dir,
                         controlnets=tuple(controlnets))
    if as_json:
        print_json(report)
        return
    rows = []
    for name, r in report["components"].items():
        stages = r["stages"]
        rows.append([name, r["ops"], ", ".join(f"{k}:{v}" for k, v in r["op_histogram"].items() if k.startswith("difflite.")) or "-",
                     f"{r['weights_mb']:.1f}", f"{r['intermediate_mb']:.1f}",
                     f"{stages['export']['seconds']:.1f}+{stages['write']['seconds']:.1f}"])
    console().print(table(f"difflite convert {model} -> {out}",
                          ["component", "ops", "custom ops", "weights MB", "intermediates MB", "export+write s"], rows))
    for name, r in report["components"].items():
        recipe, widths = r.get("weights_recipe"), r["weight_widths"]
        if recipe and not recipe["layers_by_width"]:
            click.echo(f"{name}: no convolution/linear weight to quantize (all follow --precision)")
        elif recipe:
            counts = ", ".join(f"{n} {w}" for w, n in recipe["layers_by_width"].items())
            snr = " / ".join("-" if v is None else f"{v:.1f}" for v in (recipe["predicted_snr_db"],
                                                                           recipe["measured_snr_db"]))
            click.echo(f"{name}: {weights} mix {widths['mb']:.2f} MB (all int8 {widths['all_int8_mb']:.2f}, float "
                       f"{widths['float_mb']:.2f}) for convolution/linear weights; {counts}; "
                       f"SNR predicted / measured {snr} dB (target {recipe['target_snr_db']:g}), recipe "
                       f"{recipe['source']} in {recipe['seconds']:.1f} s")
    click.echo(f"total {report['total_seconds']:.1f} s, peak RSS {report['peak_rss_mb']:.0f} MB")


@main.command()
@click.argument("target", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--estimate", "estimate_profile", metavar="PROFILE", default=None,
              help="Instead: estimate the time of one of OUT's pictures (20 guided steps) on a device "
                   "profile (a name as --device-profile takes, or a profile .json), per component, from the "
                   "kernels' FLOPs and bytes against its published peaks, with efficiencies fitted on the H200.")
def inspect(target, as_json, estimate_profile):
    """Show ops, custom ops, signatures, weights and planned memory of OUT or FILE.tflite."""
    from difflite.runtime.inspect import inspect_target

    if estimate_profile is not None:
        print_estimate(target, estimate_profile, as_json)
        return
    info = inspect_target(target)
    if as_json:
        print_json(info)
        return
    out = console()
    for name, c in info["models"].items():
        out.print(f"[bold]{name}[/bold]  {c['file']}  {c['file_mb']:.2f} MB, weights {c['weights_mb']:.2f} MB "
                  f"({c['weight_layout']}), "
                  f"planned intermediates {c['intermediate_mb']:.2f} MB "
                  f"({c['shared_buffers_mb']:.2f} MB as shared OpenCL buffers), {c['ops']} ops")
        for sig, io in c["signatures"].items():
            for kind in ("inputs", "outputs"):
                tensors = [t for t in io[kind] if not lora.is_factor_input(t["name"])]
                for t in tensors:
                    out.print(f"  {kind[:-1]:6} {t['name']:24} {t['dtype']:8} {t['shape']}")
                if len(tensors) < len(io[kind]):
                    out.print(f"  {kind[:-1]:6} lora_down_S, lora_up_S      {len(io[kind]) - len(tensors)} LoRA factor "
                              f"inputs (zeros: no LoRA)")
        out.print("  ops: " + ", ".join(f"{k} x{v}" for k, v in c["op_histogram"].items()))
        out.print("  weights by stored type: " + ", ".join(
            f"{k} {v['tensors']} tensors {v['mb']:.2f} MB" for k, v in c["weight_widths"].items()))
        for (name, options), count in custom_op_lines(c["custom_ops"]).items():
            out.print(f"  custom {name} {options}" + (f" x{count}" if count > 1 else ""))


def custom_op_lines(ops: list[dict]) -> dict[tuple[str, str], int]:
    """(name, options) -> how many ops have them, a LoRA slot's number left out (one line, not 192)."""
    lines: dict[tuple[str, str], int] = {}
    for op in ops:
        options = {k: v for k, v in op["options"].items() if k != "slot"} if isinstance(op["options"], dict) \
            else op["options"]
        key = (op["name"], str(options))
        lines[key] = lines.get(key, 0) + 1
    return lines


def print_estimate(target, profile: str, as_json: bool) -> None:
    from difflite.runtime.estimate import estimate_folder

    est = estimate_folder(target, profile)
    if as_json:
        print_json(est)
        return
    out = console()
    out.print(f"[bold]estimate[/bold] for {est['gpu']} ({est['profile']}): {est['precision']} storage, "
              f"{est['arithmetic']} arithmetic at {est['peak_gflops']:g} GFLOP/s, {est['bandwidth_gbps']:g} GB/s, "
              f"{est['steps']} guided steps (UNet batch {est['unet_batch']})")
    out.print(f"  {'component':14} {'calls':>5} {'ms/call':>10} {'s/picture':>10} {'memory-bound':>13}")
    for name, c in est["components"].items():
        out.print(f"  {name:14} {c['calls']:5d} {c['ms_per_call']:10.1f} {c['seconds_per_picture']:10.2f} "
                  f"{c['memory_bound_share']:12.0%}")
    out.print(f"  {'picture':14} {'':5} {'':10} {est['picture_seconds']:10.2f}")
    cal = est["calibration"]
    out.print(f"estimate: a roofline of the files' kernels at the profile's peaks, calibrated on the "
              f"{cal['device']} ({cal['measured'].split(',')[0]}); not a measurement")


def parse_seeds(seeds: str) -> tuple[int, ...]:
    """--seeds, checked before verify imports torch."""
    from difflite.runtime.noise import check_seed

    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError as exc:
        raise BadInput(f"--seeds: {seeds!r} is not a comma-separated list of integers") from exc
    if not seed_list:
        raise BadInput("--seeds: no seed given")
    for seed in seed_list:
        check_seed(seed, "--seeds:")
    return seed_list


@main.command()
@click.argument("out", type=click.Path())
@click.option("--model", default=None, help="Verify against this source instead of the one in the manifest.")
@click.option("--config", default=None, help="Config folder for a single-file --model.")
@click.option("--backend", "backend_name", type=click.Choice(backend.CHOICES), default="auto", show_default=True,
              help=backend.HELP + " verify runs litert-gpu's components each in a child process, says whether "
                   "it ran fully accelerated, exit 2 where there is none; fp16 files run with its half arithmetic, "
                   "fp32 and int8 / int4 files with float arithmetic (their bars measure the weights).")
@click.option("--seeds", default="0,1", show_default=True, help="Comma-separated input seeds.")
@click.option("--components", default=None, help="Comma-separated subset of the components.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify(out, model, config, backend_name, seeds, components, as_json):
    """Run each component in OUT against PyTorch; exit 1 if any error is over tolerance."""
    seed_list = parse_seeds(seeds)
    from difflite.verify import as_rows
    from difflite.verify import verify as run_verify

    choice = backend.choose(backend_name)
    memory: dict = {}
    checks = run_verify(out, model=model, config=config, backend=choice.backend, seeds=seed_list,
                        components=components.split(",") if components else None, memory_out=memory)
    if not as_json:
        click.echo(choice.line(), err=True)
    if as_json:
        print_json({"passed": all(c.passed for c in checks), "checks": as_rows(checks), "gpu_memory": memory,
                    "backend_choice": choice.as_dict()})
    else:
        console().print(table(f"difflite verify {out} (backend {choice.backend})",
                              ["component", "output", "seed", "max |err|", "max |ref|", "rel err", "PSNR dB",
                               "SNR dB", "ok"],
                              [[c.component, c.output, c.seed, f"{c.max_abs_error:.3g}", f"{c.max_abs_reference:.3g}",
                                f"{c.relative_error:.3g}", f"{c.psnr_db:.1f}", f"{c.snr_db:.1f}",
                                "yes" if c.passed else "NO"]
                               for c in checks]))
        if checks:
            click.echo(f"tolerance: {checks[0].tolerance}")
        for name, stats in memory.items():
            if "litert_gpu" in stats:
                gpu = stats["litert_gpu"]
                accelerated = {True: "yes", False: "NO (some ops on the CPU)", None: "unknown"}[gpu["fully_accelerated"]]
                click.echo(f"{name}: LiteRT GPU accelerator ({gpu['accelerator']}), fully accelerated: {accelerated}")
                continue
            click.echo(f"{name}: GPU arena {stats.get('arena_bytes', 0) / 2**20:.1f} MiB, weights "
                       f"{stats.get('weights_bytes', 0) / 2**20:.1f} MiB, op scratch of its own "
                       f"{stats.get('scratch_held_bytes', 0) / 2**20:.1f} MiB, "
                       f"{stats.get('nodes_claimed')}/{stats.get('nodes_total')} nodes in {stats.get('partitions')} partition(s), "
                       f"{stats.get('storage', '?')} storage, {stats.get('arithmetic', '?')} arithmetic")
    if not all(c.passed for c in checks):
        raise VerificationFailed("verification failed: error over tolerance")


@main.group()
def oplib():
    """Build the C++ op library (libdifflite_delegate.so)."""


@oplib.command("build")
@click.option("--target", type=click.Choice(["host", "android-arm64"]), default="host", show_default=True,
              help="android-arm64 uses the NDK's CMake toolchain from ANDROID_NDK_HOME.")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False), default=None,
              help="Copy the library into this folder (default: leave it in custom_ops/build).")
def oplib_build(target, out):
    """Configure and build the op library with CMake; print the library's path."""
    from pathlib import Path

    from difflite.folder.manifest import check_writable_folder
    from difflite.runtime.oplib import BuildFailed, build, copy_library

    if out:
        check_writable_folder(out)  # before a build of minutes
    try:
        library = build(target)
    except BuildFailed as exc:
        click.echo(f"difflite: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if out:
        library = copy_library(library, Path(out))
    click.echo(str(library))


# Commands defined next to their implementation register here.
from difflite.runtime.bench import bench_command  # noqa: E402
from difflite.runtime.generate import generate_command  # noqa: E402
from difflite.runtime import schedulers  # noqa: E402
from difflite import diffusers_schedulers  # noqa: E402

main.add_command(generate_command, "generate")
# generate's runtime has NumPy ports of the schedulers; a config none reproduces goes to diffusers.
schedulers.use_fallback(diffusers_schedulers.build)
main.add_command(bench_command, "bench")


def run() -> None:
    """The entry point of `difflite` and `python -m difflite`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(prog_name="difflite")
