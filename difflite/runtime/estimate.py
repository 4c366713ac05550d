"""`difflite inspect OUT --estimate PROFILE`: a picture's time on a GPU, predicted from the files.

No interpreter runs: each operator's work is counted from the .tflite (shapes, stored weight widths,
custom options), and priced against the profile's published peaks with efficiencies measured on
the NVIDIA H200 (estimate_calibration.json, written by benchmarks/estimate_calibration.py):

    kernel time = max(flops / (peak x eff_compute[kind]), bytes / (bandwidth x eff_memory))
    op time     = kernel time + kernels x launch_overhead_us

peak: the profile's fp16_gflops for an fp16 folder on a GPU with half arithmetic, else fp32_gflops.
kind: "gemm" (FULLY_CONNECTED, BATCH_MATMUL, convolutions, WinogradConv3x3), "attention"
(difflite.Attention) or "memory" (everything else). bytes: every input and output once,
activations at the folder's storage width, weights as stored (float16 / int8 / int4).
A picture: 20 guided steps (2 text-encoder calls, 40 batch-1 or 20 batch-2 UNet calls, one VAE
decode). It is an estimate: a roofline with H200-fitted efficiencies, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json
from difflite.core.profiles import Profile, load_profile
from difflite.folder.output_folder import OutputFolder
from difflite.folder.validate import read_checked

CALIBRATION_FILE = Path(__file__).with_name("estimate_calibration.json")
STEPS = 20
KINDS = ("gemm", "attention", "memory")
GEMM_OPS = {"FULLY_CONNECTED", "BATCH_MATMUL", "CONV_2D", "DEPTHWISE_CONV_2D", "difflite.WinogradConv3x3"}
ATTENTION_OP = "difflite.Attention"
# No kernel runs for these: views of the same buffer, and a LoRA slot without factors.
FREE_OPS = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "difflite.LoRA"}
# Arithmetic per output element of the memory-bound ops (1 for the rest: ADD, MUL, copies...).
FLOPS_PER_ELEMENT = {"difflite.GroupNorm": 8, "difflite.Gelu": 10, "difflite.GeGLU": 11, "GELU": 10,
                     "SOFTMAX": 5, "LOGISTIC": 4, "SIN": 8, "COS": 8, "TANH": 6, "EXP": 4, "RSQRT": 2}
# Kernels an op launches (the op library's OpenCL backend): Winograd's input transform, 36 GEMMs
# and output transform; attention's row statistics and output; one for the rest.
KERNELS = {"difflite.WinogradConv3x3": 3, ATTENTION_OP: 2}
# F(4x4,3x3) transforms, dense, per 4x4 tile: B^T d B on a 6x6 input tile per input channel,
# A^T m A to a 4x4 output tile per output channel, G g G^T per filter (filter form only).
WINOGRAD_INPUT_FLOPS = 2 * (6 * 6 * 6 + 6 * 6 * 6)
WINOGRAD_OUTPUT_FLOPS = 2 * (4 * 6 * 6 + 4 * 6 * 4)
WINOGRAD_FILTER_FLOPS = 2 * (6 * 3 * 3 + 6 * 6 * 3)


@dataclass(frozen=True)
class Operand:
    shape: tuple[int, ...]
    width: float  # bytes per element as the kernel reads it (int4: 0.5)

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> float:
        return self.elements * self.width


@dataclass(frozen=True)
class Work:
    name: str
    kind: str  # one of KINDS
    flops: float
    nbytes: float
    kernels: int


def op_work(name: str, inputs: Sequence[Operand | None], output: Operand, options: dict | None = None) -> Work | None:
    """The arithmetic (FLOPs, 2 per multiply-add) and the bytes one operator moves; None for one
    that runs no kernel. `inputs`: None for an omitted optional input (a bias)."""
    if name in FREE_OPS:
        return None
    present = [x for x in inputs if x is not None]
    nbytes = sum(x.nbytes for x in present) + output.nbytes
    kernels = KERNELS.get(name, 1)
    if name == "GATHER" and present:  # reads the gathered rows only, not the whole table
        nbytes -= present[0].nbytes - output.elements * present[0].width
    if name in GEMM_OPS:
        flops, extra = _gemm_flops(name, present, output)
        return Work(name, "gemm", flops, nbytes + extra, kernels)
    if name == ATTENTION_OP:
        return Work(name, "attention", _attention_flops(present, output, options or {}), nbytes, kernels)
    return Work(name, "memory", FLOPS_PER_ELEMENT.get(name, 1) * output.elements, nbytes, kernels)


def _gemm_flops(name: str, inputs: Sequence[Operand], output: Operand) -> tuple[float, float]:
    """(FLOPs, bytes beyond the operands: Winograd's transformed tiles through scratch)."""
    x, w = inputs[0], inputs[1]
    out = output.shape
    if name == "FULLY_CONNECTED":  # x [..., K], w [N, K]
        n, k = w.shape[0], w.shape[-1]
        return 2.0 * (output.elements // n) * n * k, 0.0
    if name == "BATCH_MATMUL":  # x [..., M, K] (or adjoint), y [..., K, N]
        m = out[-2]
        k = x.shape[-2] if x.shape[-1] == m and x.shape[-2] != m else x.shape[-1]
        return 2.0 * output.elements * k, 0.0
    if name == "CONV_2D":  # w [Cout, kh, kw, Cin]
        return 2.0 * output.elements * w.shape[1] * w.shape[2] * w.shape[3], 0.0
    if name == "DEPTHWISE_CONV_2D":  # w [1, kh, kw, Cout]
        return 2.0 * output.elements * w.shape[1] * w.shape[2], 0.0
    # difflite.WinogradConv3x3: x [N, H, W, Cin], w [36, Cin, Cout] or the filter [Cout, 3, 3, Cin]
    n, h, wd, cin = x.shape
    cout = out[-1]
    tiles = n * math.ceil(h / 4) * math.ceil(wd / 4)
    flops = 2.0 * 36 * tiles * cin * cout + tiles * (cin * WINOGRAD_INPUT_FLOPS + cout * WINOGRAD_OUTPUT_FLOPS)
    if len(w.shape) == 4:
        flops += WINOGRAD_FILTER_FLOPS * cin * cout
    scratch = 2.0 * 36 * tiles * (cin + cout) * x.width  # V and M written once, read once
    return flops, scratch


def _attention_flops(inputs: Sequence[Operand], output: Operand, options: dict) -> float:
    """q k^T and p v per head (2 N Lq Lk D each; heads x D = the channel width), plus the softmax
    (5 per score). The fused op never stores the Lq x Lk scores."""
    q, k = inputs[0], inputs[1]
    n, lq, width_qk = q.shape[0], q.shape[-2], q.shape[-1]
    lk, width_v = k.shape[-2], output.shape[-1]
    heads = int(options.get("heads", 1))
    return 2.0 * n * lq * lk * (width_qk + width_v) + 5.0 * n * heads * lq * lk


# ---- the .tflite's operators -------------------------------------------------------------------

def weights(summary) -> tuple[dict[int, float], set[int]]:
    """(tensor -> stored bytes, the ops folded into the weights): a constant, or what only
    constants feed (DEQUANTIZE, int4's block-scale MUL, RESHAPE: done when the weights load),
    counts at the width its constants are stored in."""
    stored: dict[int, float] = {i: t.nbytes for i, t in enumerate(summary.tensors) if t.constant}
    folded: set[int] = set()
    for index, op in enumerate(summary.ops):
        sources = [i for i in op.inputs if i >= 0]
        if sources and all(i in stored for i in sources):
            folded.add(index)
            for j in op.outputs:
                stored[j] = sum(stored[i] for i in sources)
    return stored, folded


def model_work(summary, activation_width: float) -> list[Work]:
    """Work of every operator of a read_tflite summary that runs a kernel."""
    tensors = summary.tensors
    stored, folded = weights(summary)

    def operand(i: int) -> Operand | None:
        if i < 0:
            return None
        shape = tuple(tensors[i].shape)
        return Operand(shape, stored[i] / max(1, math.prod(shape)) if i in stored else activation_width)

    works = []
    for index, op in enumerate(summary.ops):
        if index in folded or not op.outputs:
            continue
        output = Operand(tuple(tensors[op.outputs[0]].shape), activation_width)
        work = op_work(op.name, [operand(i) for i in op.inputs], output, op.custom_options)
        if work is not None:
            works.append(work)
    return works


def key_work(key: str, width: float, options: dict | None = None) -> Work | None:
    """The work of an op named as the op library's profile names it, "NAME IN1,IN2,...->OUT"
    (shapes as 1x64x64x320, an omitted input empty), every operand `width` bytes an element: how
    the calibration prices the H200's measured ops without the .tflite files."""
    name, _, shapes = key.partition(" ")
    ins, _, out = shapes.partition("->")

    def operand(text: str) -> Operand | None:
        return Operand(tuple(int(d) for d in text.split("x")), width) if text else None

    return op_work(name, [operand(s) for s in ins.split(",")], operand(out) or Operand((), width), options)


# ---- pricing -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Efficiency:
    compute: dict[str, float]  # per kind: the share of the peak FLOP rate reached
    memory: float  # the share of the peak bandwidth reached (one memory system: all kinds)


def kernel_seconds(work: Work, peak_gflops: float, bandwidth_gbps: float, eff: Efficiency) -> tuple[float, bool]:
    """(seconds without launches, whether the memory term bounds it)."""
    compute = work.flops / (peak_gflops * 1e9 * eff.compute[work.kind])
    memory = work.nbytes / (bandwidth_gbps * 1e9 * eff.memory)
    return max(compute, memory), memory >= compute


def component_time(works: Sequence[Work], profile: Profile, precision: str, eff: Efficiency) -> dict:
    """Seconds per call on `profile`: kernels plus launches, and the memory-bound share."""
    peak = profile.peak_gflops(precision)
    kernels = memory_bound = 0.0
    for work in works:
        seconds, by_memory = kernel_seconds(work, peak, profile.bandwidth_gbps, eff)
        kernels += seconds
        memory_bound += seconds if by_memory else 0.0
    launches = sum(w.kernels for w in works) * profile.launch_overhead_us * 1e-6
    return {"seconds": kernels + launches, "kernel_seconds": kernels, "launch_seconds": launches,
            "memory_bound_share": memory_bound / kernels if kernels else 0.0,
            "gflop": sum(w.flops for w in works) / 1e9, "mb_moved": sum(w.nbytes for w in works) / 1e6}


def calls_per_picture(component: str, unet_batch: int, steps: int = STEPS) -> int:
    """Calls of a component for one txt2img picture with classifier-free guidance."""
    if component == "text_encoder":
        return 2  # the prompt and the negative prompt
    if component == "unet" or component.startswith("controlnet_"):
        return steps * 2 // max(1, min(unet_batch, 2))
    if component == "vae_decoder":
        return 1
    return 0  # vae_encoder: img2img and inpainting only


def load_calibration(path: Path = CALIBRATION_FILE) -> tuple[Efficiency, dict]:
    data = read_json(path, what="estimate calibration")
    try:
        eff = data["efficiency"]
        efficiency = Efficiency({k: float(eff["compute"][k]) for k in KINDS}, float(eff["memory"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: no efficiency.compute per kind {KINDS} and efficiency.memory "
                       f"({type(exc).__name__}: {exc})") from exc
    if not all(0 < v <= 1 for v in (*efficiency.compute.values(), efficiency.memory)):
        raise BadInput(f"{path}: efficiencies must lie in (0, 1]")
    return efficiency, data


def picture_estimate(works_by_component: dict[str, list[Work]], profile: Profile, precision: str, unet_batch: int,
                     eff: Efficiency, steps: int = STEPS) -> dict:
    components = {}
    total = 0.0
    for name, works in works_by_component.items():
        per_call = component_time(works, profile, precision, eff)
        calls = calls_per_picture(name, unet_batch, steps)
        seconds = per_call["seconds"] * calls
        total += seconds
        components[name] = {"calls": calls, "ms_per_call": round(per_call["seconds"] * 1e3, 3),
                            "seconds_per_picture": round(seconds, 3),
                            "memory_bound_share": round(per_call["memory_bound_share"], 3),
                            "launch_ms_per_call": round(per_call["launch_seconds"] * 1e3, 3),
                            "gflop_per_call": round(per_call["gflop"], 3),
                            "mb_moved_per_call": round(per_call["mb_moved"], 3)}
    return {"components": components, "picture_seconds": round(total, 3), "steps": steps}


def estimate_folder(target, profile_name) -> dict:
    """The estimate for an output folder on a device profile (a name or a profile .json)."""
    profile = load_profile(profile_name)
    eff, calibration = load_calibration()
    target = Path(target)
    if not target.is_dir():
        raise BadInput(f"{target}: --estimate needs an output folder (a picture's calls come from its manifest)")
    folder = OutputFolder.read(target, check_models=False)
    width = 2 if folder.precision == "fp16" else 4
    works = {name: model_work(read_checked(entry.path), width) for name, entry in folder.components.items()}
    unet = folder.components.get("unet")
    batch = unet.batch if unet is not None else 1
    result = picture_estimate(works, profile, folder.precision, batch, eff)
    return {"estimate": True, "profile": profile.name, "gpu": profile.gpu, "precision": folder.precision,
            "arithmetic": "fp16" if folder.precision == "fp16" and profile.fp16 else "fp32",
            "peak_gflops": profile.peak_gflops(folder.precision), "bandwidth_gbps": profile.bandwidth_gbps,
            "launch_overhead_us": profile.launch_overhead_us, "unet_batch": batch, **result,
            "calibration": {"device": calibration.get("device", {}).get("name"), "measured": calibration.get("measured"),
                            "efficiency": {"compute": eff.compute, "memory": eff.memory}},
            "note": "an estimate: kernel work from the files priced at the profile's published peaks with "
                    "efficiencies fitted on the NVIDIA H200; not a measurement"}
