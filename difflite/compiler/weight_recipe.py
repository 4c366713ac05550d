"""The mixes' recipes (--weights int4 / int8, issue 21): which convolution / linear weights stay wider.

A recipe has a low width, the one --weights asks for, and a high one a layer may stay at instead:
int4 mixes keep layers int8, int8 mixes keep them float (as --precision stores them: float32, or
float16 at fp16). Below, "int4" / "int8" are the int4 mix's; the int8 mix's are "int8" / "float".

With every eligible weight at int4 a component's output drifts too far from PyTorch's; a few
layers cause most of it. The recipe is computed on the torch component, before export:

1. Layers: the nn.Linear / nn.Conv2d (groups 1) weights the component's forward uses and the
   writer would quantize (WeightQuantization.applies; int4 only where its blocks tile the input
   axis, else the writer stores int8 anyway: "fixed"), and the nn.Embedding tables it reads rows
   of that the writer stores as int8 rows (WeightQuantization.lookup_width: the token embedding;
   "fixed" at int8, its error measured and counted like any fixed layer's). Each is known by quantize.weight_digest
   of its values in the writer's layout (torch Linear [out, in] is the writer's [N, K]; Conv2d
   [O, I, kh, kw] is stored OHWI = permute(0, 2, 3, 1)), so the writer finds it whatever name
   the exporter gave its tensor; the torch name is kept beside it for people.
2. Sensitivity: per layer, the output error when its weight alone is what the file will hold at
   the low width (quantize, then dequantize, in the writer's layout), on P seeded probes
   (export.component_spec's inputs: random latents, timesteps in [1, 999], text embeddings;
   random ids for the text encoder) at a reduced latent size: that layer's cost at that width.
   It is estimated for every layer at once, to first order, from random vector-Jacobian products
   (`vjp_errors`: one forward and VJP_DRAWS backward passes an output, where a forward a layer
   before took the SDXL UNet's 794 int4 layers ~4 s each on 2 cores, 53 minutes); the mix
   itself is then measured, not estimated. At the high width the cost is scaled from the low
   one's by the ratio of the two widths' rounding error powers in the weight (the output error
   is linear in a small weight error).
3. Choice: errors are assumed to add. Starting from all int4, layers move to int8 by error saved
   per extra byte until the predicted SNR (the worst probe and output) reaches the target plus a
   margin; promotions that the goal no longer needs are then undone, costliest first. The real mix
   is then measured; if it falls short, more layers move (the goal raised by the shortfall) and
   it is measured again.

The recipe is a JSON object (FORMAT): {"format", "component", "width", "block", "target_snr_db",
"predicted_snr_db", "measured_snr_db", "probes", "layers": [{"name", "digest", "shape", "width",
"int4_error_db", "int8_error_db", "bytes"}], "seconds"}; int8 recipes have "width" "int8", no
"block", a "precision" (float's bytes and, at fp16, its error), "int8_error_db" and "float_error_db"
(None at fp32: no error), layers' widths "int8" or "float". error_db is the layer's error power
over the output's power, alone, in dB. convert writes every component's recipe into the manifest
("weights_recipe") and into OUT/weights_recipe.json; `--weights-recipe` reads either back."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from difflite.compiler import export
from difflite.compiler.tflite import quantize
from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json

FORMAT = 1
FILE = "weights_recipe.json"
DEFAULT_TARGET_DB = 28.0  # issue 21's bar for the int4 mix (verify's int4 SNR)
TARGETS_DB = {"int4": DEFAULT_TARGET_DB, "int8": 35.0}  # per mix: verify's bars (verify.MIN_SNR_DB)
HIGH = {"int4": "int8", "int8": "float"}  # the width a mix's layers may stay at instead
DEFAULT_MARGIN_DB = 1.0  # the probes are not verify's inputs
DEFAULT_PROBES = 2
PROBE_LATENT = 16  # probes' latent height and width at most (the conversion's size if smaller)
PROBE_SEED = 1000  # probe i uses component_spec(seed=PROBE_SEED + i): not verify's seeds
MAX_ROUNDS = 8  # measurements of the mix after the first
VJP_DRAWS = 32  # random vector-Jacobian products an output for the layers' errors (vjp_errors)


def db(value: float) -> float | None:
    """dB for JSON: rounded; None where infinite (no error at all, or no layer to quantize)."""
    return round(value, 2) if math.isfinite(value) else None


# -- layouts and digests ---------------------------------------------------------------------
def writer_layout(weight: torch.Tensor) -> np.ndarray:
    """A torch Linear [out, in] or Conv2d [O, I, kh, kw] weight as the writer stores it ([N, K],
    OHWI), float32, C order."""
    array = weight.detach().to(torch.float32).cpu()
    if array.dim() == 4:
        array = array.permute(0, 2, 3, 1)
    return np.ascontiguousarray(array.numpy())


def torch_layout(array: np.ndarray) -> torch.Tensor:
    """The inverse of writer_layout."""
    array = np.asarray(array, dtype=np.float32)
    if array.ndim == 4:
        array = array.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(array))


def stored(array: np.ndarray, width: str, block: int, precision: str = "fp32",
           int4_scales: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """What DEQUANTIZE gives back for a writer-layout weight stored at `width` (float: as
    `precision` stores it). `int4_scales` (block -> scales, a Layer's): the int4 block scales
    quantize_int4 searched the first time for this weight, reused and kept there (a recipe stores
    a layer at int4 four times or more; the weight does not change while its Layer lives)."""
    if width == "int8":
        return quantize.dequantize(quantize.quantize_int8(array, 0))
    if width == "int4":
        dtype = quantize.scale_dtype(precision)
        known = int4_scales.get(block) if int4_scales is not None else None
        stored4 = quantize.quantize_int4(array, block, dtype, known)
        if int4_scales is not None:
            int4_scales[block] = stored4.scales.astype(dtype)  # float16 holds float16 scales exactly
        return quantize.dequantize(stored4).reshape(array.shape)
    if precision == "fp16":  # the writer's float16 + DEQUANTIZE (every weight a recipe sees is large)
        return array.astype(np.float16).astype(np.float32)
    return array


def stored_bytes(shape, width: str, block: int, precision: str = "fp32") -> int:
    """The writer's bytes for a weight at `width` (values + scales: int8's float32, int4's as
    `precision` stores weights); float as `precision`."""
    size = int(np.prod(shape))
    if width == "int8":
        return size + 4 * int(shape[0])
    if width == "int4":
        return (size + 1) // 2 + quantize.scale_bytes(precision) * (size // block)
    return (2 if precision == "fp16" else 4) * size


# -- the layers ------------------------------------------------------------------------------
class Layer:
    """One weight the writer would quantize."""

    def __init__(self, name: str, module: torch.nn.Module, quant: quantize.WeightQuantization,
                 precision: str = "fp32"):
        self.name = name  # the weight's name in the component module (torch FQN)
        self.module = module
        self.precision = precision  # how a float weight is stored
        self.lookup = isinstance(module, torch.nn.Embedding)  # a table GATHER reads rows of
        array = writer_layout(module.weight)
        self.shape = tuple(array.shape)
        self.digest = quantize.weight_digest(array)
        # the writer stores int8 where int4 blocks do not tile the input axis, and tables as int8 rows
        fits = quant.width != "int4" or quantize.int4_blocks_fit(self.shape, quant.block)
        self.fixed = "int8" if self.lookup or not fits else None
        self.fixed_why = ("a lookup table: int8 rows" if self.lookup
                          else "int4 blocks do not tile the input axis" if self.fixed else None)
        self.bytes = {w: stored_bytes(self.shape, w, quant.block, precision) for w in ("int4", "int8", "float")}
        self.int4_scales: dict[int, np.ndarray] = {}  # block -> the weight's int4 scales (stored())

    def weight_at(self, width: str, block: int) -> torch.Tensor:
        array = writer_layout(self.module.weight)
        if self.lookup and width == "int8":  # context.lookup: per-row scales stored as the weights are
            array = quantize.dequantize(quantize.quantize_int8(array, 0, quantize.scale_dtype(self.precision)))
        else:
            array = stored(array, width, block, self.precision, self.int4_scales)
        return torch_layout(array).to(self.module.weight.dtype)

    def noise_ratio(self, high: str, low: str, block: int) -> float:
        """The weight's rounding error power at `high` over that at `low`: what the output error at
        `high` is, relative to `low`'s, where the error is linear in the weight's (small errors)."""
        weight = writer_layout(self.module.weight)
        exact = weight.astype(np.float64)
        power = {w: float(np.sum((stored(weight, w, block, self.precision, self.int4_scales).astype(np.float64)
                                 - exact) ** 2))
                 for w in (high, low)}
        return power[high] / power[low] if power[low] > 0 else 0.0


@contextmanager
def stored_weights(layers: list[Layer], widths: dict[str, str], block: int) -> Iterator[None]:
    """Within: each layer's weight is what the file stores at `widths[name]`, built when the layer
    runs and dropped when it returns, so one layer's copy exists at a time (all of the SDXL UNet's
    at once were ~10 GB of float32 beside the loaded pipeline: issue 32's int8 conversion ran out
    of memory)."""
    saved: dict[int, torch.Tensor] = {}

    def swap_in(layer: Layer, width: str):
        def hook(module, args):
            replacement = layer.weight_at(width, block)
            saved[id(module)] = module.weight.data
            module.weight.data = replacement
        return hook

    def swap_back(module, args, output):
        module.weight.data = saved.pop(id(module))

    hooks = []
    try:
        for layer in layers:
            hooks.append(layer.module.register_forward_pre_hook(swap_in(layer, widths[layer.name])))
            hooks.append(layer.module.register_forward_hook(swap_back))
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for layer in layers:  # a forward that raised leaves its layer swapped
            if id(layer.module) in saved:
                layer.module.weight.data = saved.pop(id(layer.module))


def used_layers(module: torch.nn.Module, inputs: tuple) -> list[tuple[str, torch.nn.Module]]:
    """The nn.Linear / nn.Conv2d (groups 1) submodules one forward on `inputs` calls, and the
    nn.Embedding ones it calls with rows chosen by an input (the token ids; a table read at fixed
    rows, like the position embedding, is a constant to the writer, not a lookup), in module order
    (the VAE decoder's wrapper holds the encoder too)."""
    candidates = {id(m): (n, m) for n, m in module.named_modules()
                  if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))
                  or (isinstance(m, torch.nn.Conv2d) and m.groups == 1)}
    storages = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
    called: set[int] = set()

    def record(mod, args, out):
        if not isinstance(mod, torch.nn.Embedding) or args[0].untyped_storage().data_ptr() in storages:
            called.add(id(mod))
    hooks = [m.register_forward_hook(record) for _, m in candidates.values()]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return [(n, m) for key, (n, m) in candidates.items() if key in called]


def eligible_layers(module: torch.nn.Module, inputs: tuple, quant: quantize.WeightQuantization,
                    precision: str = "fp32") -> list[Layer]:
    """The used layers whose weight the writer quantizes at --weights int4 / int8 (`quant`)."""
    layers = []
    for name, m in used_layers(module, inputs):
        weight_name = f"{name}.weight"
        if isinstance(m, torch.nn.Embedding):
            quantized = quant.lookup_width(weight_name, m.weight.numel()) == "int8"
        else:
            quantized = quant.applies(weight_name, m.weight.numel())
        if quantized:
            layers.append(Layer(weight_name, m, quant, precision))
    return layers


# -- probes and errors -----------------------------------------------------------------------
def probe_size(pipe, height: int, width: int) -> tuple[int, int]:
    """Probe image size in pixels: latents of at most PROBE_LATENT a side (the conversion's own
    if smaller), a multiple of what the VAE and UNet need."""
    multiple = export.size_multiple(pipe)
    scale = pipe.vae_scale_factor

    def side(pixels: int) -> int:
        want = min(pixels, PROBE_LATENT * scale)
        return max(multiple, -(-want // multiple) * multiple)
    return side(height), side(width)


def outputs_of(result) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


class Probes:
    """A component's seeded inputs and its float outputs on them; errors per (probe, output).
    The probes run as one batch (each sample's output is its own: no component mixes them)."""

    def __init__(self, pipe, component: str, height: int, width: int, count: int, seed: int = PROBE_SEED):
        self.height, self.width = probe_size(pipe, height, width)
        self.latent = export.latent_size(pipe, self.height, self.width)
        specs = [export.component_spec(pipe, component, self.height, self.width, 1, seed=seed + i)
                 for i in range(count)]
        self.module = specs[0].module.eval()
        self.inputs = tuple(torch.cat(parts) for parts in zip(*(spec.example_inputs for spec in specs)))
        self.count, self.seed = count, seed
        self.runs = 0
        with torch.no_grad():
            self.reference = [o.detach().to(torch.float64) for o in outputs_of(self.module(*self.inputs))]
        self.signal = self._powers(self.reference)

    def _powers(self, outputs: list[torch.Tensor]) -> np.ndarray:
        """Power per (probe, output), probe-major."""
        per_output = [(o ** 2).reshape(self.count, -1).sum(dim=1) for o in outputs]
        return torch.stack(per_output, dim=1).reshape(-1).numpy()

    def error(self, layers: list[Layer], widths: dict[str, str], block: int) -> np.ndarray:
        """Error power per (probe, output) with each of `layers` stored at its width in `widths`."""
        with torch.no_grad(), stored_weights(layers, widths, block):
            got = outputs_of(self.module(*self.inputs))
        self.runs += 1
        return self._powers([g.to(torch.float64) - r for g, r in zip(got, self.reference)])

    def snr_db(self, error: np.ndarray) -> float:
        """The worst (probe, output) SNR, as verify checks each one."""
        ratios = [math.inf if e <= 0 else s / e for s, e in zip(self.signal, error)]
        return min(10 * math.log10(r) if r > 0 else -math.inf for r in ratios)

    def relative_db(self, error: np.ndarray) -> float:
        """Error power over signal power, all probes and outputs together, in dB."""
        total = float(np.sum(error))
        return -math.inf if total <= 0 else 10 * math.log10(total / float(np.sum(self.signal)))

    def describe(self) -> dict:
        return {"count": self.count, "seeds": [self.seed + i for i in range(self.count)],
                "image_size": [self.height, self.width], "latent_size": list(self.latent),
                "note": f"export.component_spec's seeded inputs at latents of at most {PROBE_LATENT} a side "
                        "(the conversion's own if smaller), one batch"}


# -- the choice --------------------------------------------------------------------------------
def choose(errors: dict[str, dict[str, np.ndarray]], costs: dict[str, int], base: np.ndarray,
           signal: np.ndarray, goal_db: float, chosen: set[str] | None = None, prune: bool = True,
           low: str = "int4", high: str = "int8") -> set[str]:
    """The layers to keep at `high` (int8) rather than `low` (int4) so that the predicted SNR
    (errors add; the worst entry) reaches `goal_db`: `chosen` plus more, by error saved per extra
    byte; then (prune) promotions the goal does not need are undone, the costliest first. `errors[name]`: {low, high} error
    vectors; `costs[name]`: high bytes - low bytes; `base`: the error of the layers that have
    no choice."""
    chosen = set(chosen or ())

    def predicted(selection) -> float:
        total = base + sum((errors[n][high if n in selection else low] for n in errors), np.zeros_like(base))
        return min(10 * math.log10(s / e) if e > 0 else math.inf for s, e in zip(signal, total))

    order = by_saving(errors, costs, signal, exclude=chosen, low=low, high=high)
    for name in order:
        if predicted(chosen) >= goal_db:
            break
        if saving(errors[name], costs[name], signal, low, high) > 0:
            chosen.add(name)
    if prune:
        for name in sorted(chosen, key=lambda n: (-costs[n], n)):  # a set: order by name too
            if predicted(chosen - {name}) >= goal_db:
                chosen.discard(name)
    return chosen


def saving(error: dict[str, np.ndarray], cost: int, signal: np.ndarray, low: str = "int4",
           high: str = "int8") -> float:
    """Error saved per extra byte by `high` over `low`, each (probe, output) relative to its signal."""
    return float(np.sum((error[low] - error[high]) / np.maximum(signal, 1e-300))) / max(cost, 1)


def by_saving(errors: dict, costs: dict, signal: np.ndarray, exclude=(), low: str = "int4",
              high: str = "int8") -> list[str]:
    return sorted((n for n in errors if n not in exclude),
                  key=lambda n: saving(errors[n], costs[n], signal, low, high), reverse=True)


def layer_change(layer: Layer, x: torch.Tensor, width: str, block: int) -> torch.Tensor:
    """dY: the change of the layer's output on its input `x` when its weight is stored at `width`
    (the bias is unchanged, so it cancels)."""
    module = layer.module
    delta = layer.weight_at(width, block) - module.weight.detach()
    if isinstance(module, torch.nn.Linear):
        return torch.nn.functional.linear(x, delta)
    if isinstance(module, torch.nn.Embedding):
        return torch.nn.functional.embedding(x, delta)
    return torch.nn.functional.conv2d(x, delta, None, module.stride, module.padding, module.dilation, module.groups)


def vjp_errors(probe: Probes, layers: list[Layer], widths: dict[str, str], block: int,
               draws: int = VJP_DRAWS, seed: int = PROBE_SEED) -> dict[str, np.ndarray]:
    """Each layer's output error power per (probe, output) with its weight alone at widths[name],
    to first order: the output changes by J dY (dY: layer_change, J: the rest of the component),
    and for r of independent standard normal entries E[(r . J dY)^2] = |J dY|^2, where
    r . J dY = (J^T r) . dY and J^T r, the gradient of r . y at the layer's output, comes for every
    layer from one backward pass. The mean over `draws` r (a chi-square of that many degrees:
    +-25 % at 32); the probes are independent samples of one batch, so each has its own sum; each
    output has its own r. Checked against the exact per-layer runs in tests/test_weight_recipe.py
    (lab/recipe_vjp_estimate.py: the tiny and SDXL-tiny UNets within +-1.2 dB for 80 % of the
    layers, rank correlation 0.995)."""
    saved: dict[str, torch.Tensor] = {}
    outs: dict[str, torch.Tensor] = {}

    def hook_for(layer: Layer):
        def hook(module, args, out):
            saved[layer.name] = args[0].detach()
            if not out.requires_grad:  # fed by integer ids only: make what follows differentiable
                out.requires_grad_(True)
            outs[layer.name] = out
        return hook

    hooks = [layer.module.register_forward_hook(hook_for(layer)) for layer in layers]
    try:
        with torch.enable_grad():
            feeds = [x.detach().requires_grad_(True) if x.is_floating_point() else x for x in probe.inputs]
            outputs = outputs_of(probe.module(*feeds))
    finally:
        for hook in hooks:
            hook.remove()
    probe.runs += 1
    names = [layer.name for layer in layers if layer.name in outs]
    changes = {layer.name: layer_change(layer, saved.pop(layer.name), widths[layer.name], block)
               for layer in layers if layer.name in outs}
    generator = torch.Generator().manual_seed(seed)
    power = {name: np.zeros((probe.count, len(outputs))) for name in names}
    for o, output in enumerate(outputs):
        for _ in range(draws):
            r = torch.randn(output.shape, generator=generator, dtype=output.dtype)
            grads = torch.autograd.grad(output, [outs[n] for n in names], grad_outputs=r, retain_graph=True,
                                        allow_unused=True)
            for name, grad in zip(names, grads):
                if grad is not None:
                    dots = (grad * changes[name]).reshape(probe.count, -1).sum(dim=1).double().numpy()
                    power[name][:, o] += dots ** 2 / draws
    return {layer.name: power[layer.name].reshape(-1) if layer.name in power else np.zeros_like(probe.signal)
            for layer in layers}


def predict_db(probes: Probes, layers: list[Layer], errors: dict, widths: dict[str, str]) -> float:
    total = np.zeros_like(probes.signal)
    for layer in layers:
        total = total + errors[layer.name][widths[layer.name]]
    return probes.snr_db(total)


def compute(pipe, component: str, quant: quantize.WeightQuantization, height: int, width: int,
            target_db: float | None = None, probes: int = DEFAULT_PROBES,
            margin_db: float = DEFAULT_MARGIN_DB, log: Callable[[str], None] = lambda message: None,
            precision: str = "fp32") -> dict:
    """The recipe of one component of `pipe` converted at `height` x `width` pixels with `quant`
    (--weights int4 or int8, the mix's low width, and the component's keep-float list) and
    `precision` (how float weights are stored). `target_db` None: the width's TARGETS_DB."""
    started = time.perf_counter()
    low = quant.width
    if low not in HIGH:
        raise ValueError(f"a recipe is for --weights int4 or int8, not {low}")
    high = HIGH[low]
    target_db = TARGETS_DB[low] if target_db is None else target_db
    probe = Probes(pipe, component, height, width, probes)
    layers = eligible_layers(probe.module, probe.inputs, quant, precision)
    free = [layer for layer in layers if layer.fixed is None]
    block = quant.block
    goal = target_db + margin_db
    errors: dict[str, dict[str, np.ndarray]] = {}
    # Every layer at the low width first (one forward run): where that already meets the goal
    # (SD 1.5's UNet at int8), the per-layer sweep (two runs a layer) would only confirm it.
    widths = {layer.name: layer.fixed or low for layer in layers}
    measured = probe.snr_db(probe.error(layers, widths, block)) if layers else math.inf
    predicted = measured
    rounds = [{f"{high}_layers": 0, "predicted_snr_db": None, "measured_snr_db": db(measured)}]
    chosen: set = set()
    if measured < goal:
        base = np.zeros_like(probe.signal)
        # Every layer's error at once, to first order (vjp_errors); the high width's scaled from
        # the low one's by the weight's rounding error (the mix is measured below, so an estimate
        # off by a little costs a promotion round, not quality).
        estimated = vjp_errors(probe, layers, {layer.name: layer.fixed or low for layer in layers}, block)
        for layer in layers:
            error = estimated[layer.name]
            if layer.fixed:
                errors[layer.name] = {"int8": error}
                base = base + error
                continue
            errors[layer.name] = {low: error, high: error * layer.noise_ratio(high, low, block)}
        costs = {layer.name: layer.bytes[high] - layer.bytes[low] for layer in free}
        free_errors = {layer.name: errors[layer.name] for layer in free}
        chosen = choose(free_errors, costs, base, probe.signal, goal, low=low, high=high)
        while True:
            widths = {layer.name: layer.fixed or (high if layer.name in chosen else low) for layer in layers}
            predicted = predict_db(probe, layers, errors, widths)
            measured = probe.snr_db(probe.error(layers, widths, block)) if layers else math.inf
            rounds.append({f"{high}_layers": sum(w == high for w in widths.values()),
                           "predicted_snr_db": db(predicted), "measured_snr_db": db(measured)})
            if measured >= goal or len(chosen) == len(free) or len(rounds) > MAX_ROUNDS:
                break
            # the errors did not add up to what was measured: ask the prediction for the shortfall more
            shortfall = goal - measured
            grown = choose(free_errors, costs, base, probe.signal, predicted + shortfall, chosen, prune=False,
                           low=low, high=high)
            if grown == chosen:  # the prediction is already there: promote the next ones regardless
                rest = by_saving(free_errors, costs, probe.signal, exclude=chosen, low=low, high=high)
                grown = chosen | set(rest[:max(1, len(rest) // 8)])
            chosen = grown
    seconds = time.perf_counter() - started
    if measured < target_db:
        why = f"even with every layer {high}" if len(chosen) == len(free) else f"after {len(rounds)} measurements"
        log(f"warning: {component}: the {low} mix's SNR on the probes, {measured:.1f} dB, is under the "
            f"{target_db:g} dB target {why}")
    recipe = {
        "format": FORMAT, "component": component, "width": low,
        **({"block": block} if low == "int4" else {"precision": precision}),
        "target_snr_db": target_db, "margin_db": margin_db,
        "predicted_snr_db": db(predicted), "measured_snr_db": db(measured),
        f"all_{low}_measured_snr_db": rounds[0]["measured_snr_db"],
        "probes": probe.describe(), "rounds": rounds, "forward_runs": probe.runs,
        "layer_errors": (f"first order, {VJP_DRAWS} vector-Jacobian products an output" if errors
                         else "not needed: the all-low mix met the goal"),
        "layers": [{"name": layer.name, "digest": layer.digest, "shape": list(layer.shape),
                    "width": widths[layer.name],
                    **{f"{w}_error_db": db(probe.relative_db(errors[layer.name][w]))
                       if w in errors.get(layer.name, {}) else None for w in (low, high)},
                    "bytes": layer.bytes[widths[layer.name]],
                    **({"fixed": layer.fixed_why} if layer.fixed else {})}
                   for layer in layers],
        "seconds": round(seconds, 2),
    }
    return recipe


# -- reuse -------------------------------------------------------------------------------------
def overrides(recipe: dict) -> dict[str, str]:
    """digest -> width for the writer (WeightQuantization.overrides); where two layers share a
    digest (identical weights), the wider width wins."""
    rank = {"int4": 0, "int8": 1, "float": 2}
    widths: dict[str, str] = {}
    for layer in recipe["layers"]:
        digest, width = layer["digest"], layer["width"]
        if digest not in widths or rank[width] > rank[widths[digest]]:
            widths[digest] = width
    return widths


def read(path) -> dict[str, dict]:
    """Recipes per component from FILE: a weights_recipe.json convert wrote, a manifest.json with a
    "weights_recipe" key, one recipe, or an output folder holding either."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in (FILE, "manifest.json"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise BadInput(f"{path}: no {FILE} or manifest.json in this folder")
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    data = read_json(path, what="weights recipe")
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a weights recipe")
    if isinstance(data.get("weights_recipe"), dict):  # a manifest: {component: recipe}
        recipes = data["weights_recipe"]
    elif "component" in data and "layers" in data:  # a single recipe
        recipes = {data["component"]: data}
    elif isinstance(data.get("recipes"), dict):
        if data.get("format") != FORMAT:
            raise BadInput(f"{path}: weights recipe format {data.get('format')!r} is unknown (this difflite "
                           f"reads {FORMAT})")
        recipes = data["recipes"]
    elif data.get("format") == "difflite-output":
        raise BadInput(f"{path}: this conversion has no weights recipe (it was not --weights int4 or int8)")
    else:
        raise BadInput(f"{path}: not a weights recipe (no \"recipes\", \"weights_recipe\" or \"layers\")")
    for component, recipe in recipes.items():
        check(recipe, f"{path} ({component})")
    return recipes


def check_width(recipe: dict, width: str, where: str) -> None:
    """A recipe is for the --weights it was computed at (int4 recipes before int8 ones had none)."""
    got = recipe.get("width", "int4")
    if got != width:
        raise BadInput(f"{where}: an {got} recipe (--weights {got}), not for --weights {width}")


def check(recipe: dict, where: str) -> None:
    if not isinstance(recipe, dict) or recipe.get("format") != FORMAT:
        got = recipe.get("format") if isinstance(recipe, dict) else None
        raise BadInput(f"{where}: weights recipe format {got!r} is unknown (this difflite reads {FORMAT})")
    if not isinstance(recipe.get("block", quantize.DEFAULT_BLOCK), int):
        raise BadInput(f"{where}: weights recipe block {recipe.get('block')!r} is not an integer")
    layers = recipe.get("layers")
    if not isinstance(layers, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("digest"), str)
            and entry.get("width") in quantize.WIDTHS for entry in layers):
        raise BadInput(f"{where}: weights recipe layers must each have a digest and a width "
                       f"({', '.join(quantize.WIDTHS)})")


def file_document(recipes: dict[str, dict]) -> dict:
    """What convert writes to OUT/weights_recipe.json."""
    return {"format": FORMAT, "recipes": recipes}


def apply(pipe, component: str, recipe: dict, quant: quantize.WeightQuantization, height: int, width: int,
          probes: int = DEFAULT_PROBES, where: str = "--weights-recipe",
          log: Callable[[str], None] = lambda message: None, precision: str = "fp32") -> dict:
    """Reuse `recipe` for `component` of `pipe`: match its digests to this model's layers (none:
    BadInput; some: a warning with the counts) and measure the mix it gives on the probes.
    Returns the recipe as it applies here (its matched layers' widths, the measured SNR)."""
    started = time.perf_counter()
    low = quant.width
    check_width(recipe, low, f"{where} ({component})")
    if low == "int4" and recipe.get("block", quant.block) != quant.block:
        raise BadInput(f"{where}: the {component} recipe is for int4 blocks of {recipe.get('block')}, "
                       f"not --weights-block {quant.block}")
    probe = Probes(pipe, component, height, width, probes)
    layers = eligible_layers(probe.module, probe.inputs, quant, precision)
    wanted = overrides(recipe)
    matched = [layer for layer in layers if layer.digest in wanted]
    if not matched and (layers or wanted):
        raise BadInput(f"{where}: the {component} recipe's {len(wanted)} layer digests match none of this "
                       f"model's {len(layers)} quantizable layers (a recipe of another model?)")
    if len(matched) < len(layers) or len({layer.digest for layer in matched}) < len(wanted):  # partial
        log(f"warning: {where}: the {component} recipe matches {len(matched)} of this model's {len(layers)} "
            f"quantizable layers ({len(wanted) - len({layer.digest for layer in matched})} of its "
            f"{len(wanted)} digests unused); the other layers are {low}")
    widths = {}
    for layer in layers:
        width = wanted.get(layer.digest, low)
        widths[layer.name] = "int8" if layer.fixed and width == "int4" else width
    measured = probe.snr_db(probe.error(layers, widths, quant.block)) if layers else math.inf
    by_digest = {entry["digest"]: entry for entry in recipe["layers"]}
    applied = dict(recipe)
    complete = len(matched) == len(layers) and len({layer.digest for layer in matched}) == len(wanted)
    applied.update({
        # the recipe's prediction holds for this model only where it matches every layer
        "predicted_snr_db": recipe.get("predicted_snr_db") if complete else None,
        "measured_snr_db": db(measured), "probes": probe.describe(), "forward_runs": probe.runs,
        "reused": {"from": where, "matched_layers": len(matched), "model_layers": len(layers),
                   "recipe_layers": len(recipe["layers"]),
                   "recipe_measured_snr_db": recipe.get("measured_snr_db")},
        "layers": [{**by_digest.get(layer.digest, {f"{low}_error_db": None, f"{HIGH[low]}_error_db": None}),
                    "name": layer.name, "digest": layer.digest, "shape": list(layer.shape),
                    "width": widths[layer.name], "bytes": layer.bytes[widths[layer.name]]}
                   for layer in layers],
        "seconds": round(time.perf_counter() - started, 2),
    })
    return applied


def summary(recipe: dict) -> dict:
    """The report's view of a recipe: its SNRs, counts per width and cost."""
    counts: dict[str, int] = {}
    for layer in recipe["layers"]:
        counts[layer["width"]] = counts.get(layer["width"], 0) + 1
    return {"source": "file" if recipe.get("reused") else "computed",
            **({"reused": recipe["reused"]} if recipe.get("reused") else {}),
            "target_snr_db": recipe.get("target_snr_db"), "predicted_snr_db": recipe.get("predicted_snr_db"),
            "measured_snr_db": recipe.get("measured_snr_db"), "layers_by_width": dict(sorted(counts.items())),
            "probes": recipe.get("probes"), "seconds": recipe.get("seconds")}


def describe(recipe: dict) -> str:
    """One line for the log: the widths chosen and the SNRs."""
    s = summary(recipe)
    counts = ", ".join(f"{n} {w}" for w, n in s["layers_by_width"].items()) or "no layer to quantize"

    def show(value) -> str:
        return "-" if value is None else f"{value:.1f} dB"
    probes = recipe.get("probes") or {}
    return (f"{counts}; SNR predicted {show(s['predicted_snr_db'])}, measured {show(s['measured_snr_db'])} "
            f"(target {s['target_snr_db']:g} dB; {probes.get('count')} probes at "
            f"{'x'.join(map(str, probes.get('image_size', [])))} px; {s['seconds']:.1f} s)")
