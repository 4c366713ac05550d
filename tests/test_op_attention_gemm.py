"""difflite.Attention's partial softmax as GEMMs (attention_opencl.cc: InitGemm / RunGemm; the
harness's Runner.attention with a plan of gemm=True), on devices with tiled kernels: through the
library with kernels=tiled (which PoCL runs too) and through the harness with its plan's
flat=False. S = q k^T by the backend's GEMM into scratch, attn_softmax_rows in place, O = P v by a
second GEMM (into o at N = 1, else O' and attn_scatter_rows), chunk by chunk of query rows under a
bound on S's scratch (DIFFLITE_ATTN_SCORES_BYTES lowers it here so that small shapes take several
chunks). Against the float64 reference (support.numerics.attention_ref): float32 storage within
TOL, float16 storage within HALF_TOL of the half-rounded inputs' reference (test_op_attention.py's
tolerances)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.numerics import attention_ref, rel_err
from support.opencl_helpers import TOL, run_delegate
from test_op_attention import HALF_TOL, large_logit_inputs, qkv_inputs

GEMM_LABELS = {"attention.scores", "attention.softmax", "attention.pv"}

# name: (N, Lq, Lk, heads, Dk, Dv, causal, S bound in bytes per float32 element (0: the default))
CASES = {
    "heads8": (1, 70, 90, 8, 40, 40, False, 0),
    "heads8_causal": (1, 90, 90, 8, 40, 40, True, 0),
    # a wide head, Lq = Lk: 3 chunks of 64 rows (and a shorter last one) under the lowered bound
    "wide_chunks": (1, 150, 150, 1, 512, 512, False, 64 * 150),
    "wide_chunks_causal": (1, 150, 150, 1, 512, 512, True, 64 * 150),
    "cross": (2, 130, 77, 8, 40, 40, False, 0),  # Lk = 77, Lq != Lk, batch 2 (O' + scatter)
    "cross_chunks": (2, 130, 77, 8, 40, 40, False, 2 * 8 * 64 * 77),
    "batch2_causal_chunks": (2, 150, 150, 2, 24, 40, True, 2 * 2 * 64 * 150),  # Dk != Dv
    "dk_ne_dv": (1, 37, 19, 3, 5, 6, True, 0),
}


def _run(tmp_path, lib, monkeypatch, case, precision="fp32", inputs=None):
    n, lq, lk, heads, dk, dv, causal, bound = CASES[case]
    elem = 2 if precision == "fp16" else 4
    if bound:
        monkeypatch.setenv("DIFFLITE_ATTN_SCORES_BYTES", str(bound * elem))
    else:
        monkeypatch.delenv("DIFFLITE_ATTN_SCORES_BYTES", raising=False)
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "partial")  # the GEMM form for narrow heads too
    r = np.random.default_rng(lq + lk + dv)
    q, k, v = inputs or qkv_inputs(r, n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    out, stats = run_delegate(
        tmp_path, lib, "difflite.Attention",
        {"heads": heads, "scale": scale, "causal": causal, "variant": "partial_softmax"},
        [("q", q, False), ("k", k, False), ("v", v, False)], (n, lq, heads * dv), [q, k, v], stats=True,
        kernels="tiled", profile=2, precision=precision)
    assert stats.get("nodes_claimed") == 1, stats
    ran = {key.rsplit(" ", 1)[-1] for key in stats["profile_ms_per_invoke"] if key.startswith("difflite.Attention")}
    want = GEMM_LABELS | ({"attention.scatter"} if n > 1 else set())
    assert want <= ran <= want | {"attention.pv", "attention.scores"}, ran
    return (q, k, v), scale, causal, out, stats


@pytest.mark.parametrize("case", list(CASES))
def test_delegate_attention_gemm(tmp_path, opencl_lib, monkeypatch, runner, launch, case):
    (q, k, v), scale, causal, out, stats = _run(tmp_path, opencl_lib, monkeypatch, case)
    heads = CASES[case][3]
    assert rel_err(out, attention_ref(q, k, v, heads, scale, causal)) < TOL
    n, lq, lk, _, dk, dv, _, bound = CASES[case]
    rows = launch.attention_chunk_rows(n, heads, lq, lk, 4, bound * 4 if bound else launch.SCORES_BYTES)
    if bound:
        assert rows < lq and rows % 64 == 0
    # S and O' of a chunk (O' only at N > 1), plus the GEMMs' split-K partials (slot 2)
    assert stats["scratch_bytes"] >= n * heads * rows * (lk + (dv if n > 1 else 0)) * 4, stats
    assert stats["scratch_bytes"] == runner.attention_gemm_scratch(
        n, lq, lk, heads, dk, dv, bound * 4 if bound else launch.SCORES_BYTES), stats


@pytest.mark.parametrize("case", ["heads8_causal", "wide_chunks", "cross_chunks", "batch2_causal_chunks"])
def test_delegate_attention_gemm_fp16(tmp_path, opencl_lib, monkeypatch, case):
    n, lq, lk, heads, dk, dv, causal, _ = CASES[case]
    r = np.random.default_rng(lq + lk + dv)
    q, k, v = qkv_inputs(r, n, lq, lk, heads, dk, dv)
    _, scale, causal, out, stats = _run(tmp_path, opencl_lib, monkeypatch, case, "fp16", (q, k, v))
    assert stats["storage"] == "float16", stats
    want = attention_ref(*(x.astype(np.float16).astype(np.float32) for x in (q, k, v)), heads, scale, causal)
    assert rel_err(out, want) < HALF_TOL, rel_err(out, want)


def test_delegate_attention_gemm_large_logits(tmp_path, opencl_lib, monkeypatch):
    """Logits up to ~300 (exp overflows float past ~88): the softmax subtracts each row's max."""
    n, lq, lk, heads, dk, dv, causal, _ = CASES["batch2_causal_chunks"]
    inputs = large_logit_inputs(np.random.default_rng(5), n, lq, lk, heads, dk, dv)
    (q, k, v), scale, causal, out, _ = _run(tmp_path, opencl_lib, monkeypatch, "batch2_causal_chunks",
                                            inputs=inputs)
    assert rel_err(out, attention_ref(q, k, v, heads, scale, causal)) < TOL


def test_delegate_attention_recompute(tmp_path, opencl_lib, monkeypatch):
    """DIFFLITE_ATTN_KERNEL=recompute keeps attn_rowstats + attn_output with tiled kernels."""
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "recompute")
    n, lq, lk, heads, dk, dv = 2, 37, 70, 2, 40, 40
    q, k, v = qkv_inputs(np.random.default_rng(3), n, lq, lk, heads, dk, dv)
    out, stats = run_delegate(
        tmp_path, opencl_lib, "difflite.Attention",
        {"heads": heads, "scale": 0.3, "causal": True, "variant": "partial_softmax"},
        [("q", q, False), ("k", k, False), ("v", v, False)], (n, lq, heads * dv), [q, k, v], stats=True,
        kernels="tiled", profile=2)
    ran = {key.rsplit(" ", 1)[-1] for key in stats["profile_ms_per_invoke"] if key.startswith("difflite.Attention")}
    assert ran == {"attention.rowstats", "attention.output"}, ran
    assert rel_err(out, attention_ref(q, k, v, heads, 0.3, True)) < TOL
    assert stats["scratch_bytes"] == 8 * n * heads * lq


CHILD = """
import sys
import numpy as np
from pathlib import Path
sys.path.insert(0, {tests!r})
from support.opencl_helpers import run_delegate
from test_op_attention import qkv_inputs
q, k, v = qkv_inputs(np.random.default_rng(1), 1, 150, 150, 1, 512, 512)
out, _ = run_delegate(Path({work!r}), Path({lib!r}), "difflite.Attention",
                      {{"heads": 1, "scale": 0.05, "causal": False, "variant": "partial_softmax"}},
                      [("q", q, False), ("k", k, False), ("v", v, False)], (1, 150, 512), [q, k, v], kernels="tiled")
np.save({work!r} + "/out.npy", out)
np.save({work!r} + "/qkv.npy", np.stack([q, k, v]))
"""


def test_delegate_attention_gemm_chunks_make_no_sub_buffer(tmp_path, opencl_lib):
    """Each chunk's GEMMs read q and write o from the chunk's first row (builtin::GemmRows): the
    driver trace (DIFFLITE_CL_TRACE=1, in a child process: the trace is installed when the
    library loads) shows the chunked GEMMs and no clCreateSubBuffer at all (PoCL's CUDA driver
    crashed on the sub-buffers the chunks used to take), and the output is right."""
    env = {**os.environ, "DIFFLITE_CL_TRACE": "1", "DIFFLITE_ATTN_KERNEL": "partial",
           "DIFFLITE_ATTN_SCORES_BYTES": str(64 * 150 * 4)}  # 3 chunks: 64, 64, 22 rows
    code = CHILD.format(tests=str(Path(__file__).parent), work=str(tmp_path), lib=str(opencl_lib))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    trace = [line.split() for line in run.stderr.splitlines() if line.startswith("difflite-cl: ")]
    launches = [t[2] for t in trace if t[1] == "launch"]
    assert launches.count("attn_softmax_rows") == 3, launches
    assert sum(name.startswith("gemm") for name in launches) >= 6, launches
    assert [t for t in trace if t[1] == "sub"] == []
    q, k, v = np.load(tmp_path / "qkv.npy")
    assert rel_err(np.load(tmp_path / "out.npy"), attention_ref(q, k, v, 1, 0.05, False)) < TOL


def test_delegate_attention_bad_scores_bytes(tmp_path, opencl_lib, monkeypatch):
    monkeypatch.setenv("DIFFLITE_ATTN_SCORES_BYTES", "lots")
    monkeypatch.setenv("DIFFLITE_ATTN_KERNEL", "partial")
    q, k, v = qkv_inputs(np.random.default_rng(0), 1, 5, 6, 1, 8, 8)
    with pytest.raises(RuntimeError, match="DIFFLITE_ATTN_SCORES_BYTES=lots"):
        run_delegate(tmp_path, opencl_lib, "difflite.Attention",
                     {"heads": 1, "scale": 0.3, "causal": False, "variant": "partial_softmax"},
                     [("q", q, False), ("k", k, False), ("v", v, False)], (1, 5, 8), [q, k, v], kernels="tiled")


# ---------------------------------------------------------------------------
# The harness (Runner.attention with a tiled-kernel plan: flat=False)


@pytest.mark.parametrize("case", ["heads8_causal", "wide_chunks_causal", "cross_chunks", "batch2_causal_chunks",
                                  "dk_ne_dv"])
def test_harness_attention_gemm(runner, launch, case):
    n, lq, lk, heads, dk, dv, causal, bound = CASES[case]
    plan = launch.attention_plan(dk, dv, "partial_softmax", runner.local_mem, flat=False, max_wg=runner.max_wg,
                                 kernel="partial")
    assert plan.variant == "partial_softmax" and plan.gemm
    unforced = launch.attention_plan(dk, dv, "partial_softmax", runner.local_mem, flat=False, max_wg=runner.max_wg)
    assert unforced.gemm == (max(dk, dv) >= launch.GEMM_MIN_HEAD)
    assert not launch.attention_plan(dk, dv, "partial_softmax", runner.local_mem, flat=True).gemm
    q, k, v = qkv_inputs(np.random.default_rng(lq + dv), n, lq, lk, heads, dk, dv)
    scale = 1.0 / math.sqrt(dk)
    o = runner.empty((n, lq, heads * dv))
    events = runner.attention(runner.upload(q), runner.upload(k), runner.upload(v), o, n, lq, lk, heads, dk, dv,
                              scale, causal, plan=plan, scores_bytes=bound * 4 if bound else None)
    chunks = math.ceil(lq / launch.attention_chunk_rows(n, heads, lq, lk, 4,
                                                       bound * 4 if bound else launch.SCORES_BYTES))
    assert chunks > 1 or not bound
    assert len(events) >= 3 * chunks
    ref = attention_ref(q, k, v, heads, scale, causal)
    assert rel_err(runner.download(o, ref.shape), ref) < TOL
