"""verify --backend litert-gpu's accelerator probe (difflite/runtime/litert_gpu.py): the packaged
one-op model is what the writer makes of x + 1 today, and LiteRT's CPU runs it."""

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from difflite.compiler.tflite.builder import ModelBuilder
from difflite.runtime import litert_gpu


def test_probe_model_is_the_writers_x_plus_one(tmp_path):
    builder = ModelBuilder("difflite accelerator probe", spool_dir=tmp_path)
    x = builder.tensor("x", (1, 4), np.float32)
    one = builder.constant("one", np.ones((1, 4), np.float32))
    y = builder.tensor("y", (1, 4), np.float32)
    builder.op("ADD", [x, one], [y])
    builder.inputs.append(("x", x))
    builder.outputs.append(("y", y))
    written = tmp_path / "probe.tflite"
    with open(written, "wb") as f:
        builder.write(f)
    assert litert_gpu.PROBE_MODEL.read_bytes() == written.read_bytes()


def test_probe_model_runs_on_the_cpu():
    runner = Interpreter(model_path=str(litert_gpu.PROBE_MODEL)).get_signature_runner("serving_default")
    x = np.array([[0.5, -2.0, 3.0, 0.0]], np.float32)
    np.testing.assert_array_equal(runner(x=x)["y"], x + 1)
