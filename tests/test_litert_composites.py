"""lab/litert_composites.py (issue 20): its composite files are STABLEHLO_COMPOSITE operators
with a decomposition subgraph, as FACTS describes them, its decomposed files have none, and the CPU
interpreter runs both to the float64 reference; a runtime that kills the child is a row, not a
failure of the script."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import flexbuffers

SCRIPT = Path(__file__).resolve().parent.parent / "lab" / "litert_composites.py"
COMPOSITE_NAMES = {"groupnorm": "odml.group_norm", "layernorm": "odml.group_norm",
                   "sdpa": "odml.scaled_dot_product_attention"}


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("litert_composites")
    done = run_script("--small", "--accelerator", "cpu", "--axes-encoding", "blob", "--axes-encoding", "vector",
                      "--runs", "3", "--out", str(out / "files"), "--save", str(out / "rows.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "files", json.loads((out / "rows.json").read_text())


def read_model(path: Path) -> schema.ModelT:
    return schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)


def composite_ops(model: schema.ModelT) -> list[schema.OperatorT]:
    return [op for sub in model.subgraphs for op in sub.operators
            if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.STABLEHLO_COMPOSITE]


def test_every_file_runs_on_the_cpu_interpreter(cpu_run):
    _, saved = cpu_run
    rows = saved["rows"]
    assert {(r["kind"], r["variant"]) for r in rows} == {
        ("groupnorm", "decomposed"), ("groupnorm", "composite"), ("groupnorm", "composite-vector"),
        ("layernorm", "decomposed"), ("layernorm", "composite"), ("sdpa", "decomposed"), ("sdpa", "composite")}
    for row in rows:
        assert row["status"] == "run", row
        assert row["rel_err"] <= 1e-4, row
        assert row["ms"] > 0
        assert row["version"].startswith("ai-edge-litert")
        if row["composite"]:
            assert row["decomposed_ms"] > 0, row
    assert saved["host"] and saved["date"] and saved["versions"]["default"]


@pytest.mark.parametrize("kind", sorted(COMPOSITE_NAMES))
def test_the_composite_file_holds_one_stablehlo_composite(cpu_run, kind):
    files, _ = cpu_run
    model = read_model(files / f"{kind}_composite.tflite")
    main = model.subgraphs[0]
    (op,) = composite_ops(model)
    assert main.operators == [op]
    code = model.operatorCodes[op.opcodeIndex]
    assert code.builtinCode == 206 and code.deprecatedBuiltinCode == 127
    assert op.builtinOptionsType == schema.BuiltinOptions.NONE
    assert op.builtinOptions2Type == schema.BuiltinOptions2.StableHLOCompositeOptions
    options = op.builtinOptions2
    assert options.name.decode() == COMPOSITE_NAMES[kind]
    assert 0 < options.decompositionSubgraphIndex < len(model.subgraphs)
    decomposition = model.subgraphs[options.decompositionSubgraphIndex]
    # operands map 1:1 onto the decomposition's inputs (weights included), outputs likewise
    assert len(decomposition.inputs) == len(op.inputs) and len(decomposition.outputs) == len(op.outputs)
    for outer, inner in zip(op.inputs, decomposition.inputs):
        assert list(main.tensors[outer].shape) == list(decomposition.tensors[inner].shape)
    assert len(decomposition.operators) > 3
    assert options.compositeAttributesFormat == schema.CustomOptionsFormat.FLEXBUFFERS
    attributes = flexbuffers.Loads(bytes(options.compositeAttributes))
    if kind == "sdpa":
        assert set(attributes) == {"scale"}
        assert attributes["scale"] == pytest.approx(1 / 8 ** 0.5, rel=1e-6)  # --small: head depth 8
    else:
        assert attributes["num_groups"] == (6 if kind == "groupnorm" else 1)
        assert attributes["epsilon"] == pytest.approx(1e-5, rel=1e-6)
        assert attributes["channel_axis"] == len(main.tensors[op.inputs[0]].shape) - 1
        assert ("_TENSOR_V1_reduction_axes" in attributes) == (kind == "groupnorm")


def test_group_norm_reduction_axes_in_both_encodings(cpu_run):
    files, _ = cpu_run
    axes = {}
    for variant in ("composite", "composite_vector"):
        (op,) = composite_ops(read_model(files / f"groupnorm_{variant}.tflite"))
        axes[variant] = flexbuffers.Loads(bytes(op.builtinOptions2.compositeAttributes))["_TENSOR_V1_reduction_axes"]
    assert axes["composite"] == {"TENSOR_SHAPE": [1], "TENSOR_TYPE": schema.TensorType.INT64,
                                 "TENSOR_DATA": (3).to_bytes(8, "little")}
    assert axes["composite_vector"] == {**axes["composite"], "TENSOR_DATA": [3]}


@pytest.mark.parametrize("kind", sorted(COMPOSITE_NAMES))
def test_the_decomposed_file_has_no_composite(cpu_run, kind):
    files, _ = cpu_run
    model = read_model(files / f"{kind}_decomposed.tflite")
    assert len(model.subgraphs) == 1
    assert all(code.builtinCode != schema.BuiltinOperator.STABLEHLO_COMPOSITE for code in model.operatorCodes)


def test_a_runtime_that_kills_the_child_is_a_crash_row(tmp_path):
    package = tmp_path / "site" / "ai_edge_litert"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "interpreter.py").write_text(
        "import ctypes\n\nclass Interpreter:\n    def __init__(self, *args, **kwargs):\n"
        "        ctypes.string_at(0)  # a null read: SIGSEGV while loading\n")
    done = run_script("--small", "--accelerator", "cpu", "--runs", "1", "--runtime", str(package.parent),
                      "--out", str(tmp_path / "files"), "--save", str(tmp_path / "rows.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert len(rows) == 6
    assert all(r["status"] == "crash" and r["detail"].startswith("SIGSEGV in load") for r in rows), rows
    assert all(r["runtime"] == str(package.parent) for r in rows)
    assert "| crash |" in done.stdout


def test_a_missing_runtime_folder_is_one_line_and_exit_2(tmp_path):
    done = run_script("--runtime", str(tmp_path / "absent"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no such directory" in done.stderr
