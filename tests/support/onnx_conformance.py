"""The TFLite writer against the ONNX node test cases of the installed onnx package (issue 20).

Every node test case that onnx.backend.test.case.node generates (inputs and expected outputs are
computed locally by the onnx package; nothing is downloaded) whose graph holds at least one op the
writer registers (difflite.compiler.tflite.ops.LOWERINGS) is written the way `convert` writes one ONNX
model with cleanup and no fusion (difflite.passes.cleanup, then write_tflite at fp32), run on LiteRT's CPU
interpreter and compared with the expected outputs. Each case ends as one of:

  matched  the outputs agree: the case's own tolerances (assert_allclose with its rtol / atol), or
           DESIGN §7's (max |err| <= 1e-3 x max |expected|); integers and booleans exactly, and
           each output's type is what the writer promises for the ONNX type (int64 -> int32,
           double -> float32, else the same type)
  refused  writing raised difflite.core.errors.BadInput (exit 2 in the CLI) whose message names the
           op type, the node and a reason
  failed   anything else: another exception, a message not naming the op and node, an interpreter
           that fails to load or to invoke, wrong numbers or types, or a process killed by a signal

Crash isolation: `run_all` starts worker processes (`python -m onnx_conformance worker`), each
importing a share of the node test modules (collection itself costs ~13 s of one core), running
its cases in turn and printing one JSON line before and after each. A worker killed by a signal
leaves a started case without an ending: that case is run once more alone in a fresh process (to
name it the crasher, or clear it), and a new worker takes the rest of the share.

    python3 tests/support/onnx_conformance.py            # summary and every failure
    python3 tests/support/onnx_conformance.py -v         # every case's outcome
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The checkout whose writer is measured (another one's for a before / after comparison).
ROOT = Path(os.environ.get("DIFFLITE_CONFORMANCE_ROOT") or Path(__file__).resolve().parents[2])
NODE_PACKAGE = "onnx.backend.test.case.node"
ONNX_DOMAINS = ("", "ai.onnx")
DESIGN_RTOL = 1e-3  # DESIGN §7: max |err| <= 1e-3 relative to the output's max magnitude
WORKERS = 2
STATUSES = ("matched", "refused", "failed")


# -- collecting the cases -------------------------------------------------------------------------

def node_test_modules() -> list[str]:
    """The modules of onnx's node test package, each of which registers its cases on import."""
    import onnx.backend.test.case.node as package
    found = [(m.module_finder.path, m.name) for m in pkgutil.iter_modules(package.__path__)
             if not m.name.startswith("ai_onnx_ml")]
    # Biggest files first: they tend to take longest to generate, and the pool then ends evenly.
    found.sort(key=lambda f: (-_size(Path(f[0]) / f"{f[1]}.py"), f[1]))
    return [f"{NODE_PACKAGE}.{name}" for _, name in found]


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def registered_ops() -> set[str]:
    from difflite.compiler.tflite.ops import LOWERINGS
    return {op for domain, op in LOWERINGS if domain == ""}


def graph_ops(model) -> set[tuple[str, str]]:
    return {(n.domain, n.op_type) for n in model.graph.node}


def touches_writer(model, registered: set[str]) -> bool:
    """True when the case's graph holds a node of an ONNX op the writer registers."""
    return any(domain in ONNX_DOMAINS and op in registered for domain, op in graph_ops(model))


def collect(modules) -> list[tuple[str, object]]:
    """(module, TestCase) for the cases that importing `modules` registers, in import order. A
    case is attributed to the module whose import registered it (a module importing another one
    registers that one's cases too: importing the module again in a fresh process repeats them)."""
    node = importlib.import_module(NODE_PACKAGE)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts and divide by zero on purpose
        with np.errstate(all="ignore"):
            for name in modules:
                before = len(node._NodeTestCases)
                importlib.import_module(name)
                out += [(name, case) for case in node._NodeTestCases[before:]]
    return out


# -- running one case -----------------------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    status: str  # matched | refused | failed
    ops: list[str] = field(default_factory=list)
    detail: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "ops": self.ops, "detail": self.detail}


def written_dtype(dtype) -> np.dtype:
    """The type the writer gives a graph input / output of numpy type `dtype` (context.py)."""
    dtype = np.dtype(dtype)
    return {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.float64): np.dtype(np.float32)}.get(dtype, dtype)


def clean_refusal(exc, graphs) -> str | None:
    """None when `exc` is a refusal as the CLI reports one (exit 2): UnsupportedOp naming an op
    type of the graph (as given, or after cleanup: `graphs`), one of its nodes (by name, or by
    its first output where the node has none) and a reason; else what is wrong with it."""
    from difflite.core.errors import BadInput, UnsupportedOp
    if not isinstance(exc, BadInput):
        return f"{type(exc).__name__} (not BadInput)"
    if not isinstance(exc, UnsupportedOp):
        return "BadInput naming no op and node"
    ops, names, outputs = {"Constant"}, set(), set()
    for graph in graphs:
        for node in graph.node:
            ops.add(node.op_type)
            names.add(node.name)
            outputs.update(node.output)
        outputs.update(o.name for o in graph.output)
    output = getattr(exc, "output", None)
    detail = getattr(exc, "detail", str(exc).partition("': ")[2])
    if exc.op_type not in ops:
        return f"refusal names op {exc.op_type!r}, which is not in the graph"
    if not (exc.node_name and exc.node_name in names) and output not in outputs:
        return f"refusal names node {exc.node_name!r} / output {output!r}, not in the graph"
    if not detail.strip():
        return "refusal gives no reason"
    return None


def write_case(model, cleaned: list):
    """What `convert` does to one ONNX graph, without fusion: cleanup, then the fp32 writer.
    The graph after cleanup is appended to `cleaned` (as a ModelProto's graph)."""
    import onnx_ir as ir

    from difflite.compiler.tflite.writer import write_tflite
    from difflite.passes import cleanup
    graph = ir.serde.deserialize_model(model)
    try:
        cleanup.cleanup(graph)
    finally:
        cleaned.append(ir.serde.serialize_model(graph).graph)
    return write_tflite(graph, precision="fp32")


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[str | None, str]:
    """(None, the bar met) when `got` (as run) matches `want` (as ONNX expects it), else (why not,
    ""). Bars, in order: exact (integers, booleans); the case's own (assert_allclose with rtol,
    atol; NaN matches NaN); DESIGN §7's on the finite values, where NaN and infinities agree:
    max |err| <= 1e-3 x max |expected| for float32 / float64 outputs, PSNR >= 40 dB for float16
    ones (§7's fp16 bar; an fp16 graph computes in fp16, a few ulps off after each op)."""
    from difflite.verify import compare as design_compare
    if got.dtype != written_dtype(want.dtype):
        return f"{name}: type {got.dtype}, expected {written_dtype(want.dtype)} for ONNX {want.dtype}", ""
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {got.shape}, expected {want.shape}", ""
    if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        wrong = got.astype(np.int64) != want.astype(np.int64)
        if wrong.any():
            return (f"{name}: {int(wrong.sum())} of {want.size} values differ "
                    f"(got {got[wrong][:4].tolist()}, expected {want[wrong][:4].tolist()})"), ""
        return None, "exact"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
        return None, "case"
    finite = np.isfinite(w)
    if not (np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(g[~finite & ~np.isnan(w)],
                                                                         w[~finite & ~np.isnan(w)])):
        return f"{name}: NaN or infinities differ", ""
    if not np.isfinite(g[finite]).all():
        return f"{name}: non-finite values where finite ones are expected", ""
    if not finite.any():
        return None, "case"
    precision = "fp16" if want.dtype == np.float16 else "fp32"
    error, peak, relative, psnr, _, passed = design_compare(w[finite], g[finite], precision)
    if passed:
        return None, f"DESIGN §7 {precision} (max |err| {error:.3g} of {peak:.3g}, PSNR {psnr:.1f} dB)"
    return (f"{name}: max |err| {error:.3g} over max |expected| {peak:.3g} (PSNR {psnr:.1f} dB; "
            f"case rtol {rtol:g}, atol {atol:g})"), ""


def as_array(value) -> np.ndarray:
    """A case's input or expected output as an array (some cases give TensorProtos)."""
    from onnx import TensorProto, numpy_helper
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def feed_value(entry: dict, value) -> np.ndarray:
    """`value` as the written model takes it: NHWC for rank 4, the writer's type; values that
    the writer's type cannot hold exactly (int64 beyond int32) are an error."""
    x = as_array(value)
    dtype = np.dtype(entry["dtype"])
    if np.issubdtype(x.dtype, np.integer) and x.size and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if x.min() < info.min or x.max() > info.max:
            raise ValueError(f"input {entry['name']!r} holds values outside {dtype}")
    if entry["layout"] == "NHWC":
        x = x.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x.astype(dtype))


def run_case(name: str, model, data_sets, rtol: float, atol: float) -> Outcome:
    ops = sorted({op for domain, op in graph_ops(model) if domain in ONNX_DOMAINS})
    cleaned = []
    try:
        result = write_case(model, cleaned)
    except Exception as exc:  # noqa: BLE001 (what the writer raises is the finding)
        problem = clean_refusal(exc, [model.graph, *cleaned])
        if problem is None:
            return Outcome(name, "refused", ops, str(exc))
        return Outcome(name, "failed", ops, f"conversion: {problem}: {exc}")
    from ai_edge_litert.interpreter import Interpreter
    try:
        interpreter = Interpreter(model_content=bytes(result.data), num_threads=1)
        runner = interpreter.get_signature_runner("serving_default")
    except Exception as exc:  # noqa: BLE001
        return Outcome(name, "failed", ops, f"load: {type(exc).__name__}: {exc}")
    input_names = [i.name for i in model.graph.input]
    output_names = [o.name for o in model.graph.output]
    problems, bars = [], set()
    for inputs, outputs in data_sets:
        given = dict(zip(input_names, inputs))
        try:
            feeds = {e["name"]: feed_value(e, given[e["name"]]) for e in result.inputs}
        except Exception as exc:  # noqa: BLE001
            return Outcome(name, "failed", ops, f"feeding: {type(exc).__name__}: {exc}")
        try:
            got = runner(**feeds)
        except Exception as exc:  # noqa: BLE001
            return Outcome(name, "failed", ops, f"invoke: {type(exc).__name__}: {exc}")
        for entry, (out_name, want) in zip(result.outputs, zip(output_names, outputs)):
            y = np.asarray(got[entry["name"]])
            if entry["layout"] == "NHWC":
                y = y.transpose(0, 3, 1, 2)
            problem, bar = compare(out_name, y, as_array(want), rtol, atol)
            if problem:
                problems.append(problem)
            bars.add(bar)
    if problems:
        return Outcome(name, "failed", ops, "wrong output: " + "; ".join(problems))
    bar = next((b for b in sorted(bars) if b.startswith("DESIGN")), "case" if "case" in bars else "exact")
    return Outcome(name, "matched", ops, bar)


# -- the worker process -----------------------------------------------------------------------------

ABORT_HOOK = "DIFFLITE_CONFORMANCE_ABORT"  # a case name: the worker aborts there (tests the isolation)


def worker(commands, send) -> None:
    """Run the commands {"module": M, "skip": [...], "only": [...] | None} read one per line from
    `commands`; `send` gets {"start": case}, {"outcome": {...}} and {"done": M, "cases": n}."""
    registered = registered_ops()
    abort_at = os.environ.get(ABORT_HOOK)
    for line in commands:
        command = json.loads(line)
        module = command["module"]
        skip, only = set(command.get("skip", ())), command.get("only")
        count = 0
        for _, case in collect([module]):
            if not touches_writer(case.model, registered):
                continue
            count += 1
            if case.name in skip or (only is not None and case.name not in only):
                continue
            send({"start": case.name})
            if case.name == abort_at:
                os.abort()
            outcome = run_case(case.name, case.model, case.data_sets, case.rtol, case.atol)
            send({"outcome": outcome.as_dict()})
        send({"done": module, "cases": count})


def worker_main() -> None:
    # The protocol owns the process's original stdout; anything the libraries print goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(message):
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    worker(sys.stdin, send)


# -- the parent: a pool of workers, crash isolation -----------------------------------------------

@dataclass
class Report:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    cases_per_module: dict[str, int] = field(default_factory=dict)
    crashes: int = 0
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for outcome in self.outcomes.values():
            counts[outcome.status] += 1
        return counts

    def bars(self) -> dict[str, int]:
        """How the matched cases matched: exactly, within their own tolerances, or DESIGN §7's."""
        counts = {"exact": 0, "case": 0, "DESIGN §7": 0}
        for outcome in self.outcomes.values():
            if outcome.status == "matched":
                counts["DESIGN §7" if outcome.detail.startswith("DESIGN") else outcome.detail] += 1
        return counts

    def summary(self) -> str:
        counts, bars = self.counts(), self.bars()
        return (f"ONNX node test cases touching the writer's ops: {len(self.outcomes)}: "
                f"{counts['matched']} matched ({bars['exact']} exactly, {bars['case']} within the case's "
                f"tolerances, {bars['DESIGN §7']} within DESIGN §7's), {counts['refused']} refused, "
                f"{counts['failed']} failed ({self.crashes} worker crashes; {self.seconds:.1f} s)")


def _signal_name(returncode: int) -> str:
    import signal
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class _Worker:
    """One worker process. Its stdout is read in raw chunks split into lines here: a buffered
    readline() could pull two lines into Python's buffer while select() waits on the empty pipe."""

    def __init__(self, env):
        import tempfile
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env, text=True, bufsize=1, cwd=ROOT)
        self.pending = b""  # stdout read but not yet a whole line
        self.command: dict | None = None
        self.fresh = True  # no command given yet
        self.timed_out = False
        self.started: str | None = None
        self.finished: list[str] = []
        self.last_seen = time.monotonic()

    def give(self, command: dict) -> None:
        self.command, self.started, self.finished, self.fresh = command, None, [], False
        self.last_seen = time.monotonic()
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died: its stdout reaches EOF, and the command is taken as its last

    def stderr_tail(self, lines: int = 3) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip().splitlines()
        return " | ".join(t for t in text if "XNNPACK" not in t)[-400:] if text else ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.stderr.close()


def run_all(modules=None, workers: int = WORKERS, case_timeout: float = 120.0,
            env_extra: dict | None = None, log=None) -> Report:
    """Every node test module (or `modules`) through `workers` worker processes. When a worker
    dies (a signal, or killed after `case_timeout` s of silence), the case it was running goes
    first to a fresh worker, alone, and the rest of its module back to the queue."""
    import selectors
    started_at = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **(env_extra or {})}
    queue = [{"module": m, "skip": []} for m in (modules or node_test_modules())]
    report = Report()
    selector = selectors.DefaultSelector()
    pool: list[_Worker] = []
    crashed_in_batch: dict[str, str] = {}  # case -> how its worker died

    def feed(w: _Worker) -> bool:
        # a case re-run alone goes only to a fresh worker, as its first command
        for i, command in enumerate(queue):
            if not command.get("alone") or w.fresh:
                w.give(queue.pop(i))
                return True
        return False

    def spawn() -> None:
        w = _Worker(env)
        pool.append(w)
        selector.register(w.process.stdout, selectors.EVENT_READ, w)
        if not feed(w):
            retire(w)

    def retire(w: _Worker) -> None:
        selector.unregister(w.process.stdout)
        pool.remove(w)
        w.close()

    def record(outcome: Outcome) -> None:
        if outcome.name in crashed_in_batch and outcome.status != "failed":
            outcome = Outcome(outcome.name, "failed", outcome.ops,
                              f"{crashed_in_batch[outcome.name]}; alone in a fresh process it {outcome.status}")
        report.outcomes[outcome.name] = outcome
        if log is not None and outcome.status == "failed":
            log(f"FAILED {outcome.name}: {outcome.detail}")

    def died(w: _Worker) -> None:
        report.crashes += 1
        why = "timed out" if w.timed_out else f"killed by {_signal_name(w.process.returncode)}"
        command, crasher, tail = w.command, w.started, w.stderr_tail()
        retire(w)
        if command is None:
            return
        module = command["module"]
        if crasher is None:  # outside a case: collecting the module
            record(Outcome(f"{module} (collection)", "failed", [], f"worker {why} collecting: {tail}"))
        elif command.get("alone"):
            record(Outcome(crasher, "failed", [], f"{crashed_in_batch.get(crasher, 'worker ' + why)}; "
                                                  f"alone in a fresh process {why} too: {tail}"))
        else:
            crashed_in_batch[crasher] = f"worker {why} running it ({tail})"
            queue.insert(0, {"module": module, "only": [crasher], "alone": True})
        if not command.get("alone"):
            done = set(command.get("skip", ())) | set(w.finished) | {crasher}
            rest = {"module": module, "skip": sorted(n for n in done if n)}
            if command.get("only") is not None:
                rest["only"] = [n for n in command["only"] if n not in done]
            if rest.get("only", True):
                queue.insert(1 if crasher and queue and queue[0].get("alone") else 0, rest)
        if queue:
            spawn()

    for _ in range(min(workers, len(queue))):
        spawn()
    while pool:
        for key, _ in selector.select(timeout=1.0):
            w: _Worker = key.data
            if w not in pool:
                continue
            chunk = os.read(w.process.stdout.fileno(), 1 << 16)  # never readline: see _Worker
            if not chunk:
                w.process.wait()
                died(w)
                continue
            w.last_seen = time.monotonic()
            *lines, w.pending = (w.pending + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "start" in message:
                    w.started = message["start"]
                elif "outcome" in message:
                    record(Outcome(**message["outcome"]))
                    w.finished.append(w.started)
                    w.started = None
                elif "done" in message:
                    report.cases_per_module[message["done"]] = max(
                        message["cases"], report.cases_per_module.get(message["done"], 0))
                    if not feed(w):
                        retire(w)
        for w in list(pool):
            if time.monotonic() - w.last_seen > case_timeout and not w.timed_out:
                w.timed_out = True
                w.process.kill()  # its stdout then reaches EOF: a death, handled above
    report.seconds = time.monotonic() - started_at
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "worker"))
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's outcome")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--json", help="write the outcomes to this file")
    args = parser.parse_args(argv)
    if args.mode == "worker":
        worker_main()
        return 0
    report = run_all(workers=args.workers, log=print)
    if args.verbose:
        for outcome in sorted(report.outcomes.values(), key=lambda o: o.name):
            print(f"{outcome.status:8s} {outcome.name} {outcome.detail}")
    if args.json:
        Path(args.json).write_text(json.dumps([o.as_dict() for o in report.outcomes.values()], indent=1))
    print(report.summary())
    return 1 if report.counts()["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
