"""The writer against every ONNX node test case of the installed onnx package that holds an op it
registers (issue 20): each case's file matches the expected outputs on LiteRT's CPU interpreter,
or conversion is refused with the CLI's exit-2 error naming the op, the node and the reason.
Nothing else: no crash, no error at load or invoke, no wrong number (tests/support/onnx_conformance.py).

The cases run once per session, in worker processes (a crash fails only its case); the counts are
printed, and each registered op gets a test of its own over the cases that hold it."""

from __future__ import annotations

import pytest

from difflite.compiler.tflite.ops import LOWERINGS

from support import onnx_conformance as conformance

REGISTERED = sorted(op for domain, op in LOWERINGS if domain == "")


@pytest.fixture(scope="module")
def report() -> conformance.Report:
    return conformance.run_all()


def test_node_test_cases_match_or_are_refused(report, capsys):
    with capsys.disabled():
        print(f"\n{report.summary()}")
    failed = sorted((o for o in report.outcomes.values() if o.status == "failed"), key=lambda o: o.name)
    assert not failed, f"{len(failed)} cases failed:\n" + "\n".join(f"{o.name}: {o.detail}" for o in failed)
    # every case the workers collected has an outcome, and the run did real work
    assert sum(report.cases_per_module.values()) == len(report.outcomes)
    assert len(report.cases_per_module) == len(conformance.node_test_modules())
    assert report.counts()["matched"] > 0 and report.crashes == 0


@pytest.mark.parametrize("op_type", REGISTERED)
def test_op(report, op_type):
    """No failure among the cases holding `op_type`."""
    cases = [o for o in report.outcomes.values() if op_type in o.ops]
    if not cases:
        pytest.skip(f"no node test case holds {op_type}")
    failed = [o for o in cases if o.status == "failed"]
    assert not failed, "\n".join(f"{o.name}: {o.detail}" for o in failed)


def test_a_crash_fails_only_its_case():
    """A worker killed inside a case: that case is re-run alone in a fresh process and reported
    failed with the signal, the module's other cases still run (the abort is injected)."""
    module = "onnx.backend.test.case.node.add"
    report = conformance.run_all([module], workers=1, env_extra={conformance.ABORT_HOOK: "test_add_bcast"})
    crashed = report.outcomes["test_add_bcast"]
    assert crashed.status == "failed" and "SIGABRT" in crashed.detail and "alone" in crashed.detail
    assert report.crashes == 2  # in the batch, then alone
    others = {name: o.status for name, o in report.outcomes.items() if name != "test_add_bcast"}
    assert len(others) == report.cases_per_module[module] - 1 >= 3
    assert others["test_add"] == "matched" and "failed" not in others.values()


def test_refusals_must_name_op_node_and_reason():
    """The harness's bar for a refusal: an UnsupportedOp naming an op and node of the graph with
    a reason; other exceptions and vaguer refusals are failures."""
    from onnx import helper

    from difflite.core.errors import BadInput, UnsupportedOp
    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g", [], [])
    assert conformance.clean_refusal(UnsupportedOp("Hardmax", "hm", "no TFLite lowering"), [graph]) is None
    assert conformance.clean_refusal(UnsupportedOp("Hardmax", "", "no lowering", output="y"), [graph]) is None
    assert "not BadInput" in conformance.clean_refusal(KeyError("x"), [graph])
    assert "no op and node" in conformance.clean_refusal(BadInput("bad"), [graph])
    assert "not in the graph" in conformance.clean_refusal(UnsupportedOp("?", "?", "why"), [graph])
    assert "not in the graph" in conformance.clean_refusal(UnsupportedOp("Hardmax", "", "why"), [graph])
    assert "no reason" in conformance.clean_refusal(UnsupportedOp("Hardmax", "hm", ""), [graph])


def test_comparison_bars():
    """Wrong integers, types and shapes fail; floats pass within the case's tolerances or DESIGN §7's
    (1e-3 of the largest magnitude; PSNR >= 40 dB for float16), not beyond."""
    import numpy as np
    want = np.array([1.0, -2.0, 100.0], np.float32)
    assert conformance.compare("y", want.copy(), want, 1e-3, 1e-7) == (None, "case")
    assert conformance.compare("y", want + np.float32(0.05), want, 1e-3, 1e-7)[1].startswith("DESIGN §7 fp32")
    assert conformance.compare("y", want + np.float32(0.5), want, 1e-3, 1e-7)[0] is not None
    ints = np.array([1, 2, 3], np.int64)
    assert conformance.compare("y", ints.astype(np.int32), ints, 1e-3, 1e-7) == (None, "exact")
    assert "differ" in conformance.compare("y", np.array([1, 2, 4], np.int32), ints, 1e-3, 1e-7)[0]
    assert "type" in conformance.compare("y", ints.astype(np.float32), ints, 1e-3, 1e-7)[0]
    assert "shape" in conformance.compare("y", want[:2], want, 1e-3, 1e-7)[0]
    half = np.linspace(-1, 1, 64).astype(np.float16)
    assert conformance.compare("y", half + np.float16(2e-3), half, 1e-3, 1e-7)[1].startswith("DESIGN §7 fp16")
    assert conformance.compare("y", half + np.float16(0.05), half, 1e-3, 1e-7)[0] is not None
    nan = np.array([np.nan, np.inf, 1.0], np.float32)
    assert conformance.compare("y", nan.copy(), nan, 1e-3, 1e-7)[0] is None
    assert "NaN" in conformance.compare("y", np.array([0, np.inf, 1], np.float32), nan, 1e-3, 1e-7)[0]
