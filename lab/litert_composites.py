"""Benchmark: which LiteRT builds run StableHLO composites (issue 20, item 5).

For each kind it writes two .tflite files in the form /work/shared/FACTS.md ("StableHLO composites
in .tflite") describes:

- composite: one STABLEHLO_COMPOSITE operator in "main" whose decomposition subgraph computes the
  op from builtins:
    groupnorm  `odml.group_norm`, x [N,H,W,C], gamma, beta; num_groups, epsilon, channel_axis and
               `_TENSOR_V1_reduction_axes` = [rank-1] (GroupNorm);
    layernorm  `odml.group_norm`, x [B,T,C], gamma, beta; num_groups 1, epsilon, channel_axis, no
               reduction axes (LayerNorm over the last axis);
    sdpa       `odml.scaled_dot_product_attention`, q, k, v [B,T,N,H]; scale;
- decomposed: the same builtins in "main", no composite: what the composite is timed against.

Every file then runs on every LiteRT given (--runtime DIR: a folder holding an ai_edge_litert
package, put first on the child's PYTHONPATH; default this environment's) and accelerator, each in
a child process (lab/litert_composites_child.py): cpu is the Interpreter, gpu the
CompiledModel on HardwareAccelerator.GPU with enforce_f32, gpu-fp16 the same without it. A row is
run, wrong (ran, error over the accelerator's tolerance), fallback (the GPU reports the model not
fully accelerated), error (an exception: its text), crash (the child died of a signal: its name) or
timeout, with the error against a float64 NumPy reference and ms per run. A crash is data, so the
exit status is 0 whatever the rows say; 2 (one line) for bad arguments.

    python lab/litert_composites.py [--small] [--runtime DIR ...]
        [--accelerator cpu|gpu|gpu-fp16 ...] [--axes-encoding blob|vector ...] [--runs 20]
        [--timeout 300] [--out DIR] [--save FILE.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.compiler.tflite.builder import ModelBuilder  # noqa: E402

CHILD = Path(__file__).with_name("litert_composites_child.py")
CHILD_PREFIX = "litert_composites:"
KINDS = ("groupnorm", "layernorm", "sdpa")
ACCELERATORS = ("cpu", "gpu", "gpu-fp16")
DEFAULT_ACCELERATORS = ("cpu", "gpu")
# How `_TENSOR_V1_reduction_axes`' TENSOR_DATA is stored: FACTS says raw bytes (a FlexBuffer
# blob); ML Drift's GroupNorm support check reads it as a FlexBuffer vector of ints.
AXES_ENCODINGS = ("blob", "vector")
GROUP_NORM = "odml.group_norm"
SDPA = "odml.scaled_dot_product_attention"
# (default, --small): the SD 1.5 sizes of FACTS, and odd tiny ones for tests and the CPU.
SHAPES = {
    "groupnorm": ((2, 64, 64, 320), (2, 6, 5, 24)),
    "layernorm": ((2, 4096, 320), (2, 37, 24)),
    "sdpa": ((2, 4096, 8, 40), (2, 33, 2, 8)),
}
GROUPS = (32, 6)
EPSILON = 1e-5
# Largest error (relative to max |reference|) of a row that counts as "run"; fp16 is half
# storage and arithmetic on the GPU.
TOLERANCE = {"cpu": 1e-4, "gpu": 1e-3, "gpu-fp16": 3e-2}


# -- the computations ------------------------------------------------------------------------

@dataclass
class Case:
    kind: str
    composite: str
    inputs: dict[str, np.ndarray]  # the signature's inputs, float32
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # constant operands (gamma, beta)
    groups: int = 1
    scale: float = 0.0

    def operands(self) -> dict[str, np.ndarray]:
        """The composite's operands in order: the inputs, then the weights."""
        return {**self.inputs, **self.weights}

    def output_shape(self) -> tuple[int, ...]:
        return next(iter(self.inputs.values())).shape


def make_case(kind: str, small: bool, seed: int = 0) -> Case:
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    shape = SHAPES[kind][small]
    if kind == "sdpa":
        inputs = {name: rng.standard_normal(shape).astype(np.float32) for name in ("q", "k", "v")}
        return Case(kind, SDPA, inputs, scale=1.0 / math.sqrt(shape[-1]))
    channels = shape[-1]
    # Off-centre input and non-trivial gamma / beta: a dropped mean, scale or shift shows.
    x = (1.5 * rng.standard_normal(shape) + 0.3).astype(np.float32)
    weights = {"gamma": (1.0 + 0.2 * rng.standard_normal(channels)).astype(np.float32),
               "beta": (0.2 * rng.standard_normal(channels)).astype(np.float32)}
    groups = GROUPS[small] if kind == "groupnorm" else 1
    return Case(kind, GROUP_NORM, {"x": x}, weights, groups=groups)


def reference(case: Case) -> np.ndarray:
    """The op in float64 NumPy."""
    if case.kind == "sdpa":
        return reference_attention(*(case.inputs[n].astype(np.float64) for n in ("q", "k", "v")), case.scale)
    x = case.inputs["x"].astype(np.float64)
    if case.kind == "groupnorm":
        grouped = x.reshape(x.shape[0], -1, case.groups, x.shape[-1] // case.groups)
        normed = standardize(grouped, (1, 3)).reshape(x.shape)
    else:
        normed = standardize(x, (x.ndim - 1,))
    return normed * case.weights["gamma"] + case.weights["beta"]


def standardize(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + EPSILON)


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """softmax(scale q k^T) v per batch and head of [B,T,N,H] tensors, one (batch, head) at a
    time: the whole [B,N,T,T] score tensor in float64 would be 2 GiB at the default size."""
    out = np.empty(q.shape[:3] + v.shape[3:], np.float64)
    for b in range(q.shape[0]):
        for n in range(q.shape[2]):
            scores = scale * q[b, :, n] @ k[b, :, n].T
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[b, :, n] = (probs / probs.sum(axis=-1, keepdims=True)) @ v[b, :, n]
    return out


# -- the .tflite files -----------------------------------------------------------------------

class CompositeModelBuilder(ModelBuilder):
    """ModelBuilder with decomposition subgraphs after "main" (which keeps the signature);
    buffers and operator codes belong to the model, shared by every subgraph."""

    def __init__(self):
        super().__init__("difflite lab/litert_composites.py")
        self._decompositions: list[schema.SubGraphT] = []

    @contextlib.contextmanager
    def decomposition(self, name: str):
        """Ops, tensors, inputs and outputs inside the block go to a new subgraph; yields its
        index. "main" is the current subgraph again after the block."""
        main = (self.tensors, self.operators, self.inputs, self.outputs)
        self.tensors, self.operators, self.inputs, self.outputs = [], [], [], []
        try:
            yield len(self._decompositions) + 1
            subgraph = self._subgraph()
            subgraph.name = name
            self._decompositions.append(subgraph)
        finally:
            self.tensors, self.operators, self.inputs, self.outputs = main

    def composite_op(self, name: str, subgraph: int, attributes: bytes, inputs: list[int],
                     outputs: list[int]) -> None:
        options = schema.StableHLOCompositeOptionsT()
        options.name = name
        options.decompositionSubgraphIndex = subgraph
        options.compositeAttributes = list(attributes)
        options.compositeAttributesFormat = schema.CustomOptionsFormat.FLEXBUFFERS
        operator = schema.OperatorT()
        operator.opcodeIndex = self._opcode(schema.BuiltinOperator.STABLEHLO_COMPOSITE, None)
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        operator.builtinOptions2Type = schema.BuiltinOptions2.StableHLOCompositeOptions
        operator.builtinOptions2 = options
        self.operators.append(operator)

    def _model(self) -> schema.ModelT:
        model = super()._model()
        model.subgraphs = [*model.subgraphs, *self._decompositions]
        return model


def emit(b: ModelBuilder, op: str, inputs: list[int], shape, **options) -> int:
    """Builtin `op` into the current subgraph; returns its new float32 output tensor."""
    out = b.tensor(f"{op.lower()}_{len(b.tensors)}", shape, np.float32)
    b.op(op, inputs, [out], **options)
    return out


def constant(b: ModelBuilder, values, dtype) -> int:
    return b.constant(f"const_{len(b.tensors)}", np.asarray(values, dtype))


def reshape(b: ModelBuilder, x: int, shape) -> int:
    shape = [int(d) for d in shape]
    return emit(b, "RESHAPE", [x, constant(b, shape, np.int32)], shape, newShape=shape)


def standardized(b: ModelBuilder, x: int, axes: list[int]) -> int:
    """(x - mean) * rsqrt(biased variance + epsilon) over `axes`, as difflite's own writer
    decomposes a norm (difflite/compiler/tflite/ops/norm.py)."""
    shape = b.shape_of(x)
    reduced = [1 if i in axes else d for i, d in enumerate(shape)]
    axes_tensor = constant(b, sorted(axes), np.int32)
    mean = emit(b, "MEAN", [x, axes_tensor], reduced, keepDims=True)
    centered = emit(b, "SUB", [x, mean], shape)
    square = emit(b, "MUL", [centered, centered], shape)
    variance = emit(b, "MEAN", [square, axes_tensor], reduced, keepDims=True)
    epsilon = constant(b, np.full((1,) * len(shape), EPSILON), np.float32)
    rstd = emit(b, "RSQRT", [emit(b, "ADD", [variance, epsilon], reduced)], reduced)
    return emit(b, "MUL", [centered, rstd], shape)


def decompose_norm(b: ModelBuilder, case: Case, x: int, gamma: int, beta: int) -> int:
    shape = b.shape_of(x)
    if case.kind == "groupnorm":
        n, *spatial, channels = shape
        grouped = reshape(b, x, (n, math.prod(spatial), case.groups, channels // case.groups))
        normed = reshape(b, standardized(b, grouped, [1, 3]), shape)
    else:
        normed = standardized(b, x, [len(shape) - 1])
    return emit(b, "ADD", [emit(b, "MUL", [normed, gamma], shape), beta], shape)


def decompose_attention(b: ModelBuilder, case: Case, q: int, k: int, v: int) -> int:
    """difflite's own attention decomposition (difflite/compiler/tflite/ops/custom.py) on [B,T,N,H]."""
    batch, length, heads, depth = b.shape_of(q)
    heads_first = (batch, heads, length, depth)
    scores_shape = (batch, heads, length, b.shape_of(k)[1])
    qh, kh, vh = (emit(b, "TRANSPOSE", [t, constant(b, [0, 2, 1, 3], np.int32)], heads_first) for t in (q, k, v))
    scores = emit(b, "BATCH_MATMUL", [qh, kh], scores_shape, adjX=False, adjY=True)
    scaled = emit(b, "MUL", [scores, constant(b, np.full((1, 1, 1, 1), case.scale), np.float32)], scores_shape)
    probs = emit(b, "SOFTMAX", [scaled], scores_shape, beta=1.0)
    context = emit(b, "BATCH_MATMUL", [probs, vh], heads_first, adjX=False, adjY=False)
    return emit(b, "TRANSPOSE", [context, constant(b, [0, 2, 1, 3], np.int32)], b.shape_of(q))


def decompose(b: ModelBuilder, case: Case, operands: list[int]) -> int:
    if case.kind == "sdpa":
        return decompose_attention(b, case, *operands)
    return decompose_norm(b, case, *operands)


def tensor_attribute(fbb: flexbuffers.Builder, name: str, values: np.ndarray, encoding: str) -> None:
    """An integer-list attribute as FACTS describes it: a nested map `_TENSOR_V1_<name>` of
    TENSOR_SHAPE, TENSOR_TYPE (a tflite TensorType) and TENSOR_DATA."""
    with fbb.Map(f"_TENSOR_V1_{name}"):
        fbb.VectorFromElements("TENSOR_SHAPE", [int(d) for d in values.shape])
        fbb.Int("TENSOR_TYPE", int(schema.TensorType.INT64))
        if encoding == "blob":
            fbb.Blob("TENSOR_DATA", values.astype("<i8").tobytes())
        else:
            fbb.VectorFromElements("TENSOR_DATA", [int(v) for v in values])


def composite_attributes(case: Case, axes_encoding: str) -> bytes:
    """The FlexBuffer map of the composite's attributes: ints as Int, floats as 32-bit Float."""
    fbb = flexbuffers.Builder()
    with fbb.Map():
        if case.kind == "sdpa":
            fbb.Float("scale", case.scale, 4)
        else:
            rank = len(case.output_shape())
            fbb.Int("num_groups", case.groups)
            fbb.Float("epsilon", EPSILON, 4)
            fbb.Int("channel_axis", rank - 1)
            if case.kind == "groupnorm":  # its absence is what makes it a LayerNorm
                tensor_attribute(fbb, "reduction_axes", np.array([rank - 1], np.int64), axes_encoding)
    return bytes(fbb.Finish())


def main_operands(b: ModelBuilder, case: Case) -> list[int]:
    """The signature's inputs, then the weights as constants: the composite's operands."""
    operands = []
    for name, array in case.inputs.items():
        index = b.tensor(name, array.shape, np.float32)
        b.inputs.append((name, index))
        operands.append(index)
    return operands + [b.constant(name, array) for name, array in case.weights.items()]


def decomposed_model(case: Case) -> bytes:
    b = CompositeModelBuilder()
    b.outputs.append(("y", decompose(b, case, main_operands(b, case))))
    return bytes(b.serialize())


def composite_model(case: Case, axes_encoding: str) -> bytes:
    b = CompositeModelBuilder()
    operands = main_operands(b, case)
    with b.decomposition(f"{case.composite}.impl") as index:
        inner = []
        for name, array in case.operands().items():
            inner.append(b.tensor(name, array.shape, np.float32))
            b.inputs.append((name, inner[-1]))
        b.outputs.append(("y", decompose(b, case, inner)))
    y = b.tensor("y", case.output_shape(), np.float32)
    b.composite_op(case.composite, index, composite_attributes(case, axes_encoding), operands, [y])
    b.outputs.append(("y", y))
    return bytes(b.serialize())


@dataclass
class ModelFile:
    kind: str
    variant: str  # "decomposed", "composite" (blob axes, FACTS) or "composite-vector"
    composite: str | None
    path: Path
    io: Path  # inputs and float64 reference (.npz), shared by the kind's files


def variant_name(axes_encoding: str) -> str:
    return "composite" if axes_encoding == "blob" else f"composite-{axes_encoding}"


def write_files(out: Path, small: bool, axes_encodings: list[str]) -> list[ModelFile]:
    files = []
    for kind in KINDS:
        case = make_case(kind, small)
        io = out / f"{kind}_io.npz"
        np.savez(io, reference=reference(case), **{f"in_{n}": a for n, a in case.inputs.items()})
        path = out / f"{kind}_decomposed.tflite"
        path.write_bytes(decomposed_model(case))
        files.append(ModelFile(kind, "decomposed", None, path, io))
        # LayerNorm and SDPA have no tensor attribute: one composite file whatever the encoding.
        composites = ([(variant_name(e), e) for e in axes_encodings] if kind == "groupnorm"
                      else [("composite", axes_encodings[0])])
        for variant, encoding in composites:
            path = out / f"{kind}_{variant.replace('-', '_')}.tflite"
            path.write_bytes(composite_model(case, encoding))
            files.append(ModelFile(kind, variant, case.composite, path, io))
    return files


# -- running them ----------------------------------------------------------------------------

def child_env(runtime: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if runtime is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [runtime, env.get("PYTHONPATH")]))
    return env


def child_facts(stdout: str) -> dict:
    facts = {}
    for line in stdout.splitlines():
        if line.startswith(CHILD_PREFIX):
            facts.update(json.loads(line[len(CHILD_PREFIX):]))
    return facts


# A runtime's own error lines on stderr: its log's ERROR, absl's E/F lines, CHECK failures.
ERROR_LINE = re.compile(r"^(ERROR:|[EF]\d{4} |Check failed|Fatal|Segmentation|Aborted)")


def stderr_reason(stderr: str) -> str:
    """The first error line the runtime logged (the cause, before the cascade), else its last
    line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    reason = errors[0] if errors else lines[-1] if lines else ""
    return reason[:300]


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def classify(facts: dict, returncode: int, stderr: str, accelerator: str) -> tuple[str, str]:
    """(status, detail) of one child."""
    reason = stderr_reason(stderr)
    if returncode < 0:
        where = f" in {facts['stage']}" if "stage" in facts else ""
        return "crash", joined(signal_name(returncode) + where, reason)
    if "status" not in facts:
        return "error", joined(f"exit {returncode}", reason)
    if facts["status"] == "error":
        return "error", joined(facts.get("error", ""), reason)
    if facts.get("fully_accelerated") is False:
        return "fallback", "not fully accelerated"
    if not facts["rel_err"] <= TOLERANCE[accelerator]:
        return "wrong", f"error over {TOLERANCE[accelerator]:g}"
    return "run", ""


def run_child(model: ModelFile, runtime: str | None, accelerator: str, runs: int, timeout: float) -> dict:
    row = {"runtime": runtime or "default", "kind": model.kind, "composite": model.composite,
           "variant": model.variant, "accelerator": accelerator, "file": str(model.path)}
    args = [sys.executable, str(CHILD), str(model.path), str(model.io), accelerator, str(runs)]
    start = time.perf_counter()
    try:
        done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout,
                              env=child_env(runtime))
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        facts = child_facts(stdout)
        return {**row, "version": facts.get("version"), "status": "timeout",
                "detail": f"over {timeout:g} s in {facts.get('stage', 'start')}",
                "seconds": round(time.perf_counter() - start, 2)}
    except OSError as exc:  # no child at all (out of processes or memory): that row only
        return {**row, "version": None, "status": "error", "detail": f"child not started: {exc}", "seconds": 0.0}
    facts = child_facts(done.stdout)
    status, detail = classify(facts, done.returncode, done.stderr, accelerator)
    row.update(version=facts.get("version"), module=facts.get("module"), status=status, detail=detail,
               seconds=round(time.perf_counter() - start, 2))
    for key in ("rel_err", "ms", "read_ms", "fully_accelerated", "precision"):
        if key in facts:
            row[key] = facts[key]
    return row


def attach_decomposed_ms(rows: list[dict]) -> None:
    """Each composite row gets the ms of its kind's decomposed file on the same runtime and
    accelerator, where that ran."""
    decomposed = {(r["runtime"], r["kind"], r["accelerator"]): r.get("ms") for r in rows
                  if r["variant"] == "decomposed"}
    for row in rows:
        if row["composite"]:
            row["decomposed_ms"] = decomposed.get((row["runtime"], row["kind"], row["accelerator"]))


def gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


# -- output ----------------------------------------------------------------------------------

def fixed(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def scientific(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| LiteRT | kind | file | accelerator | status | rel. error | ms | decomposed ms | detail |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        version = r.get("version") or r["runtime"]
        if r["runtime"] != "default":
            version = f"{version} ({r['runtime']})"
        detail = r.get("detail", "").replace("|", "/")
        lines.append(f"| {version} | {r['kind']} | {r['variant']} | {r['accelerator']} | {r['status']} | "
                     f"{scientific(r.get('rel_err'))} | {fixed(r.get('ms'))} | "
                     f"{fixed(r.get('decomposed_ms')) if r['composite'] else ''} | {detail} |")
    return "\n".join(lines)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="litert_composites.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny shapes (tests, CPU)")
    parser.add_argument("--runtime", action="append", metavar="DIR",
                        help="a folder holding an ai_edge_litert package (e.g. pip install --target DIR), "
                             "put first on the child's PYTHONPATH; repeatable (default: this environment's)")
    parser.add_argument("--accelerator", action="append", choices=ACCELERATORS,
                        help=f"repeatable (default: {' and '.join(DEFAULT_ACCELERATORS)})")
    parser.add_argument("--axes-encoding", action="append", choices=AXES_ENCODINGS,
                        help="how GroupNorm's reduction_axes TENSOR_DATA is stored: blob (raw int64 bytes, "
                             "FACTS; default) or vector (a FlexBuffer vector of ints); both: one file each")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child")
    parser.add_argument("--out", type=Path, help="folder for the .tflite files (default: a new temporary one)")
    parser.add_argument("--save", type=Path, help="write every row, versions, host and date as JSON")
    args = parser.parse_args(argv)
    for runtime in args.runtime or []:
        if not Path(runtime).is_dir():
            parser.error(f"--runtime {runtime}: no such directory")
        if not (Path(runtime) / "ai_edge_litert").is_dir():
            parser.error(f"--runtime {runtime}: holds no ai_edge_litert package")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runtimes = [str(Path(r).resolve()) for r in args.runtime] if args.runtime else [None]
    accelerators = list(dict.fromkeys(args.accelerator or DEFAULT_ACCELERATORS))
    out = args.out or Path(tempfile.mkdtemp(prefix="litert_composites_"))
    out.mkdir(parents=True, exist_ok=True)
    files = write_files(out, args.small, list(dict.fromkeys(args.axes_encoding or ["blob"])))
    print(f"files in {out}", file=sys.stderr)
    rows = []
    for runtime in runtimes:
        for model in files:
            for accelerator in accelerators:
                rows.append(run_child(model, runtime, accelerator, args.runs, args.timeout))
                print(f"{rows[-1]['runtime']} {model.path.name} {accelerator}: {rows[-1]['status']}",
                      file=sys.stderr, flush=True)
    attach_decomposed_ms(rows)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "platform": platform.platform(), "gpu": gpu_name(), "python": platform.python_version(),
            "small": args.small, "runs": args.runs, "files": str(out),
            "shapes": {kind: SHAPES[kind][args.small] for kind in KINDS},
            "tolerance": TOLERANCE,
            "versions": {r["runtime"]: r.get("version") for r in rows if r.get("version")},
            "rows": rows}, indent=2) + "\n")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
