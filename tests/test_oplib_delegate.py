"""The op library's delegate (custom_ops/) on the CPU backend, beyond any one op: chains that need
delegate-owned intermediates, threaded kernels on larger shapes, re-prepare after an input resize,
the ABI header against two runtimes (ai_edge_litert and tensorflow's tf.lite), refusals that must
not crash, corrupted custom options, a model of builtins only, delegate options and loading. Each
op against its reference on both backends: tests/test_op_<op>.py.

Tolerance: max |err| <= 1e-4 * max |reference| (support.oplib_helpers.check) on random non-zero
inputs with odd sizes; outputs are poisoned with NaN before every run.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from support import child_env, winograd_ref
from support.numerics import attention_ref, geglu_ref, gelu_ref, group_norm_ref, nonzero, rng
from support.oplib_helpers import (
    TinyModel,
    check,
    load_runtime,
    make_interpreter,
    run_tflite,
    single_op_model,
)


# --------------------------------------------------------------------------
# Chains: tensors between two delegated ops are owned by the delegate


def _gn_params(r, c):
    return nonzero(r, (c,), 1.5), nonzero(r, (c,))


GN_OPTS = {"groups": 4, "epsilon": 1e-6, "activation": "silu"}


def test_chain_gelu_groupnorm(lib, runtime, tmp_path, capfd):
    r = rng(7)
    shape = (2, 5, 7, 12)
    x = nonzero(r, shape, 2.0)
    gamma, beta = _gn_params(r, 12)
    m = TinyModel()
    xi = m.activation("x", shape)
    t = m.activation("gelu_out", shape)
    y = m.activation("y", shape)
    m.custom("difflite.Gelu", [xi], [t], {"approximate": "tanh"})
    m.custom("difflite.GroupNorm", [t, m.constant("gamma", gamma), m.constant("beta", beta)], [y], GN_OPTS)
    p = m.save(tmp_path / "chain.tflite", [xi], [y])
    (got,) = run_tflite(p, lib, [x], runtime, {"backend": "cpu", "verbose": "1"}, repeats=2)
    want = group_norm_ref(gelu_ref(x, "tanh"), gamma, beta, 4, 1e-6, "silu")
    check(got, want)
    err = capfd.readouterr().err
    # one partition holding both nodes; the Gelu output is delegate-owned
    assert re.search(rf"partition nodes=\[0,1\] inputs=\[[0-9,]+\] outputs=\[{y}\] delegate_owned=\[{t}\]", err), err


def test_chain_add_custom_custom_add(lib, runtime, tmp_path, capfd):
    r = rng(8)
    shape = (1, 6, 5, 16)
    x = nonzero(r, shape)
    c1 = nonzero(r, shape)
    c2 = nonzero(r, (16,))
    gamma, beta = _gn_params(r, 16)
    m = TinyModel()
    xi = m.activation("x", shape)
    a = m.activation("add1", shape)
    g = m.activation("gelu", shape)
    n = m.activation("gn", shape)
    y = m.activation("y", shape)
    m.add(xi, m.constant("c1", c1), a)
    m.custom("difflite.Gelu", [a], [g], {"approximate": "erf"})
    m.custom("difflite.GroupNorm", [g, m.constant("gamma", gamma), m.constant("beta", beta)], [n], GN_OPTS)
    m.add(n, m.constant("c2", c2), y)
    p = m.save(tmp_path / "chain2.tflite", [xi], [y])
    (got,) = run_tflite(p, lib, [x], runtime, {"backend": "cpu", "verbose": "1"}, repeats=2)
    want = group_norm_ref(gelu_ref(x.astype(np.float64) + c1, "erf"), gamma, beta, 4, 1e-6, "silu") + c2
    check(got, want)
    err = capfd.readouterr().err
    assert re.search(rf"partition nodes=\[1,2\] inputs=\[{a}(,\d+)*\] outputs=\[{n}\] delegate_owned=\[{g}\]", err), err


def test_chain_three_ops_with_visible_intermediate(lib, runtime, tmp_path, capfd):
    """GeGLU -> Gelu -> Attention(q=k=v=...) where the GeGLU output is also a
    graph output: it is interpreter-allocated and read inside the partition."""
    r = rng(9)
    x = nonzero(r, (1, 11, 2 * 12), 2.0)
    m = TinyModel()
    xi = m.activation("x", x.shape)
    a = m.activation("geglu", (1, 11, 12))
    b = m.activation("gelu", (1, 11, 12))
    y = m.activation("y", (1, 11, 12))
    m.custom("difflite.GeGLU", [xi], [a], {"approximate": "sigmoid"})
    m.custom("difflite.Gelu", [a], [b], {"approximate": "erf"})
    m.custom("difflite.Attention", [b, a, b], [y],
             {"heads": 3, "scale": 0.5, "causal": True, "variant": "auto"})
    p = m.save(tmp_path / "chain3.tflite", [xi], [y, a])
    got_y, got_a = run_tflite(p, lib, [x], runtime, {"backend": "cpu", "verbose": "1"}, repeats=2)
    want_a = geglu_ref(x, "sigmoid")
    want_b = gelu_ref(want_a, "erf")
    check(got_a, want_a)
    check(got_y, attention_ref(want_b, want_a, want_b, 3, 0.5, True))
    err = capfd.readouterr().err
    assert re.search(rf"partition nodes=\[0,1,2\] .* delegate_owned=\[{b}\]", err), err


def test_builtin_between_custom_ops_gives_two_partitions(lib, runtime, tmp_path, capfd):
    r = rng(15)
    shape = (2, 3, 10)
    x = nonzero(r, shape, 2.0)
    c = nonzero(r, shape)
    m = TinyModel()
    xi = m.activation("x", shape)
    a = m.activation("a", shape)
    b = m.activation("b", shape)
    y = m.activation("y", (2, 3, 5))
    m.custom("difflite.Gelu", [xi], [a], {"approximate": "sigmoid"})
    m.add(a, m.constant("c", c), b)
    m.custom("difflite.GeGLU", [b], [y], {"approximate": "tanh"})
    p = m.save(tmp_path / "split.tflite", [xi], [y])
    (got,) = run_tflite(p, lib, [x], runtime, {"backend": "cpu", "verbose": "1"})
    check(got, geglu_ref(gelu_ref(x, "sigmoid") + c, "tanh"))
    err = capfd.readouterr().err
    assert re.search(r"partition nodes=\[0\] .* delegate_owned=\[\]", err), err
    assert re.search(r"partition nodes=\[2\] .* delegate_owned=\[\]", err), err


@pytest.mark.parametrize("threads", ["1", "3"])
def test_threaded_kernels_on_larger_shapes(lib, tmp_path, threads):
    """Shapes big enough that ParallelFor really splits the work."""
    r = rng(16)
    opts = {"backend": "cpu", "num_threads": threads}
    # GroupNorm
    x = nonzero(r, (2, 24, 20, 32), 2.0, 0.3)
    gamma, beta = _gn_params(r, 32)
    p = single_op_model(tmp_path / "gn.tflite", "difflite.GroupNorm", GN_OPTS,
                        [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], x.shape)
    check(run_tflite(p, lib, [x], options=opts)[0], group_norm_ref(x, gamma, beta, 4, 1e-6, "silu"))
    # Gelu / GeGLU
    x = nonzero(r, (3, 97, 211), 3.0)
    p = single_op_model(tmp_path / "gelu.tflite", "difflite.Gelu", {"approximate": "erf"}, [("x", x, False)], x.shape)
    check(run_tflite(p, lib, [x], options=opts)[0], gelu_ref(x, "erf"))
    p = single_op_model(tmp_path / "geglu.tflite", "difflite.GeGLU", {"approximate": "erf"}, [("x", x[..., :210], False)],
                        (3, 97, 105))
    check(run_tflite(p, lib, [x[..., :210]], options=opts)[0], geglu_ref(x[..., :210], "erf"))
    # Attention
    q = nonzero(r, (2, 77, 4 * 16))
    k = nonzero(r, (2, 131, 4 * 16))
    v = nonzero(r, (2, 131, 4 * 9))
    p = single_op_model(tmp_path / "attn.tflite", "difflite.Attention",
                        {"heads": 4, "scale": 0.25, "causal": False, "variant": "auto"},
                        [("q", q, False), ("k", k, False), ("v", v, False)], (2, 77, 36))
    check(run_tflite(p, lib, [q, k, v], options=opts)[0], attention_ref(q, k, v, 4, 0.25, False))
    # Winograd
    x = nonzero(r, (1, 30, 23, 16))
    wt = nonzero(r, (12, 16, 3, 3))
    bias = nonzero(r, (12,))
    p = single_op_model(tmp_path / "wino.tflite", "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
                        [("x", x, False), ("w", winograd_ref.transform_weights(wt), True), ("bias", bias, True)],
                        (1, 30, 23, 12))
    check(run_tflite(p, lib, [x], options=opts)[0], winograd_ref.conv3x3_nhwc(x, wt, bias))


def test_resize_input_reprepares_partition(lib, tmp_path):
    """Changing the input shape after creation re-runs the delegate kernel's
    Prepare: output resized, delegate-owned intermediate re-sized."""
    r = rng(10)
    gamma, beta = _gn_params(r, 8)
    m = TinyModel()
    xi = m.activation("x", (1, 3, 3, 8))
    t = m.activation("t", (1, 3, 3, 8))
    y = m.activation("y", (1, 3, 3, 8))
    m.custom("difflite.Gelu", [xi], [t], {"approximate": "erf"})
    m.custom("difflite.GroupNorm", [t, m.constant("gamma", gamma), m.constant("beta", beta)], [y], GN_OPTS)
    p = m.save(tmp_path / "resize.tflite", [xi], [y])
    interp = make_interpreter(p, lib, "litert")
    for shape in [(1, 3, 3, 8), (2, 5, 9, 8), (1, 2, 2, 8)]:
        interp.resize_tensor_input(xi, list(shape))
        interp.allocate_tensors()
        x = nonzero(r, shape)
        interp.set_tensor(xi, x)
        view = interp.tensor(interp.get_output_details()[0]["index"])()
        view[...] = np.nan
        del view
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])
        assert got.shape == shape
        check(got, group_norm_ref(gelu_ref(x, "erf"), gamma, beta, 4, 1e-6, "silu"))


# --------------------------------------------------------------------------
# ABI round trip: what the delegate reads through its own header (shapes,
# types, custom options) equals what the model says, in both runtimes.


def test_abi_round_trip(lib, runtime, tmp_path, capfd):
    r = rng(11)
    x = nonzero(r, (2, 3, 5, 12))
    gamma, beta = _gn_params(r, 12)
    p = single_op_model(tmp_path / "abi.tflite", "difflite.GroupNorm",
                        {"groups": 3, "epsilon": 0.25, "activation": "none"},
                        [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], x.shape)
    q = nonzero(r, (1, 4, 6))
    pa = single_op_model(tmp_path / "abi2.tflite", "difflite.Attention",
                         {"heads": 2, "scale": 0.125, "causal": True, "variant": "partial_softmax"},
                         [("q", q, False), ("k", q, False), ("v", q, False)], (1, 4, 6))
    run_tflite(p, lib, [x], runtime, {"backend": "cpu", "verbose": "1"})
    run_tflite(pa, lib, [q, q, q], runtime, {"backend": "cpu", "verbose": "1"})
    err = capfd.readouterr().err
    assert ("claim node 0 difflite.GroupNorm inputs=(float32[2,3,5,12], float32[12], float32[12]) "
            "outputs=(float32[2,3,5,12]) attrs={groups=3, epsilon=0.25, activation=none}") in err, err
    assert ("claim node 0 difflite.Attention inputs=(float32[1,4,6], float32[1,4,6], float32[1,4,6]) "
            "outputs=(float32[1,4,6]) attrs={heads=2, scale=0.125, causal=true, variant=partial_softmax}") in err, err


# --------------------------------------------------------------------------
# Refusals: the node stays with TFLite (unresolved custom op), the reason is
# on stderr, nothing crashes.

_REFUSAL_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from support.oplib_helpers import make_interpreter
    try:
        interp = make_interpreter(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
    except Exception as e:
        print("CREATE_FAILED:", type(e).__name__, e)
        sys.exit(3)
    try:
        interp.allocate_tensors()
    except RuntimeError as e:
        print("ALLOCATE_FAILED:", e)
        sys.exit(0)
    print("ALLOCATED")
    sys.exit(4)
    """
)


def _run_refusal(model: Path, lib: Path, runtime: str) -> subprocess.CompletedProcess:
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", _REFUSAL_SCRIPT, str(model), str(lib), runtime],
                          capture_output=True, text=True, timeout=300, env=env)


def _gn_model(path, options, gamma_len=24, x_dtype=np.float32):
    x = np.ones((1, 5, 7, 24), dtype=x_dtype)
    gamma = np.ones(gamma_len, dtype=np.float32)
    beta = np.zeros(24, dtype=np.float32)
    return single_op_model(path, "difflite.GroupNorm", options,
                           [("x", x, False), ("gamma", gamma, True), ("beta", beta, True)], x.shape,
                           output_dtype=x_dtype)


def _wino_model(path, w_shape, bias_len=3):
    """A WinogradConv3x3 on x [1,4,4,2] with a constant w of `w_shape`."""
    return single_op_model(path, "difflite.WinogradConv3x3", {"tile": 4, "activation": "none"},
                           [("x", np.ones((1, 4, 4, 2), np.float32), False), ("w", np.ones(w_shape, np.float32), True),
                            ("bias", np.ones(bias_len, np.float32), True)], (1, 4, 4, 3))


REFUSALS = {
    # name: (model factory, expected reason or tuple of acceptable reasons)
    "wrong_attr_type": (lambda p: _gn_model(p, {"groups": "8", "epsilon": 1e-5, "activation": "none"}),
                        "attribute 'groups' must be an int, got string"),
    "missing_attr": (lambda p: _gn_model(p, {"groups": 8, "activation": "none"}),
                     "missing attribute 'epsilon'"),
    "bad_gamma_shape": (lambda p: _gn_model(p, {"groups": 8, "epsilon": 1e-5, "activation": "none"}, gamma_len=23),
                        "gamma must be [24], got [23]"),
    "groups_not_dividing": (lambda p: _gn_model(p, {"groups": 5, "epsilon": 1e-5, "activation": "none"}),
                            "channels 24 not divisible by groups 5"),
    "bad_enum": (lambda p: _gn_model(p, {"groups": 8, "epsilon": 1e-5, "activation": "relu"}),
                 "activation must be \"none\" or \"silu\""),
    "non_ascii_value": (lambda p: _gn_model(p, {"groups": 8, "epsilon": 1e-5, "activation": "s\u00edlu"}),
                        'got "s\\xc3\\xadlu"'),
    "float16": (lambda p: _gn_model(p, {"groups": 8, "epsilon": 1e-5, "activation": "none"}, x_dtype=np.float16),
                "x is float16"),
    "not_a_flexbuffer": (lambda p: _gn_model(p, b"\x07\xff\x13garbage\x00\x01"),
                         ("custom options are not a valid FlexBuffer", "custom options must be a FlexBuffer map")),
    "no_options": (lambda p: _gn_model(p, None), "missing attribute 'groups'"),
    "winograd_tile": (lambda p: single_op_model(
        p, "difflite.WinogradConv3x3", {"tile": 2, "activation": "none"},
        [("x", np.ones((1, 4, 4, 2), np.float32), False), ("w", np.ones((36, 2, 3), np.float32), True),
         ("bias", np.ones(3, np.float32), True)], (1, 4, 4, 3)), "tile must be 4"),
    "winograd_w_rank_4_not_3x3": (lambda p: _wino_model(p, (3, 2, 2, 2)),
                                  "w must be [36,2,Cout] (transformed filters) or [Cout,3,3,2] (the 3x3 "
                                  "filter, OHWI), got [3,2,2,2]"),
    "winograd_w_filter_cin": (lambda p: _wino_model(p, (3, 3, 3, 5)), "or [Cout,3,3,2] (the 3x3 filter, OHWI), "
                              "got [3,3,3,5]"),
    "winograd_w_rank_5": (lambda p: _wino_model(p, (3, 3, 3, 2, 1)), "w must be [36,2,Cout]"),
    "winograd_filter_bias": (lambda p: _wino_model(p, (3, 3, 3, 2), bias_len=4), "bias must be [3], got [4]"),
    "unknown_op": (lambda p: single_op_model(p, "difflite.NoSuchOp", {"a": 1},
                                             [("x", np.ones((2, 3), np.float32), False)], (2, 3)),
                   "unknown difflite op"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusal_does_not_crash(lib, tmp_path, case):
    factory, reason = REFUSALS[case]
    model = factory(tmp_path / f"{case}.tflite")
    proc = _run_refusal(model, lib, "litert")
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    assert "ALLOCATE_FAILED" in proc.stdout and "unresolved custom op" in proc.stdout, proc.stdout
    reasons = reason if isinstance(reason, tuple) else (reason,)
    assert "difflite: not delegating node 0" in proc.stderr, proc.stderr
    assert any(r in proc.stderr for r in reasons), proc.stderr


def test_refusal_under_tensorflow(lib, tmp_path):
    load_runtime("tf")
    factory, reason = REFUSALS["bad_gamma_shape"]
    proc = _run_refusal(factory(tmp_path / "bad.tflite"), lib, "tf")
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    assert "unresolved custom op" in proc.stdout and reason in proc.stderr, proc.stderr


_FUZZ_SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    import numpy as np
    from flatbuffers import flexbuffers
    from support.oplib_helpers import make_interpreter, single_op_model
    lib = Path(sys.argv[1])
    r = np.random.default_rng(17)
    good = flexbuffers.Dumps({"groups": 8, "epsilon": 1e-5, "activation": "silu"})
    d = tempfile.mkdtemp()
    ran = refused = 0
    for i in range(60):
        if i % 2:
            raw = bytes(r.integers(0, 256, size=int(r.integers(1, 40)), dtype=np.uint8))
        else:
            b = bytearray(good)
            for _ in range(int(r.integers(1, 4))):
                b[int(r.integers(0, len(b)))] = int(r.integers(0, 256))
            raw = bytes(b)
        x = np.ones((1, 5, 7, 24), np.float32)
        p = single_op_model(os.path.join(d, "m.tflite"), "difflite.GroupNorm", raw,
                            [("x", x, False), ("g", np.ones(24, np.float32), True),
                             ("b", np.ones(24, np.float32), True)], x.shape)
        it = make_interpreter(p, lib, "litert")
        try:
            it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            ran += 1
        except RuntimeError:
            refused += 1
    print("FUZZ_DONE", ran, refused)
    """
)


def test_corrupted_options_never_crash(lib):
    """Random and bit-flipped custom_options: each node is either run or
    refused with an error; the process survives and errors stay decodable."""
    proc = subprocess.run([sys.executable, "-c", _FUZZ_SCRIPT, str(lib)], capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert proc.returncode == 0 and "FUZZ_DONE" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_builtin_only_model_untouched(lib, tmp_path):
    r = rng(12)
    m = TinyModel()
    xi = m.activation("x", (2, 3))
    y = m.activation("y", (2, 3))
    c = nonzero(r, (2, 3))
    m.add(xi, m.constant("c", c), y)
    p = m.save(tmp_path / "add.tflite", [xi], [y])
    x = nonzero(r, (2, 3))
    (got,) = run_tflite(p, lib, [x])
    check(got, x.astype(np.float64) + c)


# --------------------------------------------------------------------------
# Options and loading


@pytest.mark.parametrize("opts,msg", [
    ({"backend": "cpu", "colour": "red"}, "unknown option 'colour'"),
    ({"backend": "cpu", "device": "0"}, "apply to backend=opencl only"),
    ({"backend": "tpu"}, "backend must be cpu or opencl"),
    ({"precision": "int8"}, "precision must be fp32 or fp16"),
    ({"verbose": "yes"}, "verbose must be 0 or 1"),
])
def test_bad_options_are_reported(lib, opts, msg):
    _, load_delegate = load_runtime("litert")
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_delegate(str(lib), opts)


def test_fp16_precision_option_accepted(lib, tmp_path):
    x = nonzero(rng(13), (4, 9))
    p = single_op_model(tmp_path / "g.tflite", "difflite.Gelu", {"approximate": "erf"}, [("x", x, False)], x.shape)
    (y,) = run_tflite(p, lib, [x], options={"backend": "cpu", "precision": "fp16", "num_threads": "2"})
    check(y, gelu_ref(x, "erf"))


def test_exports_exactly_the_plugin_and_lora_interface(lib):
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("nm (binutils) is needed to list the library's exports")
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    # The plugin interface and the run-time LoRA entry points (difflite.runtime.lora_factors).
    assert names == ["difflite_lora_bytes", "difflite_lora_error", "difflite_lora_set", "tflite_plugin_create_delegate",
                     "tflite_plugin_destroy_delegate"], names


def test_loads_without_opencl(lib, tmp_path):
    """No link-time OpenCL dependency, and backend=cpu works with no OpenCL
    platform visible (ICD loader pointed at an empty vendor dir)."""
    readelf = shutil.which("readelf")
    if readelf is not None:
        dyn = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        assert "OpenCL" not in dyn, dyn
    x = nonzero(rng(14), (3, 5))
    model = single_op_model(tmp_path / "g.tflite", "difflite.Gelu", {"approximate": "tanh"}, [("x", x, False)], x.shape)
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(
        f"""
        import sys, numpy as np
        from pathlib import Path
        from support.oplib_helpers import run_tflite
        x = np.load({str(tmp_path / 'x.npy')!r})
        (y,) = run_tflite({str(model)!r}, Path({str(lib)!r}), [x], "litert", {{"backend": "cpu"}})
        np.save({str(tmp_path / 'y.npy')!r}, y)
        print("OK")
        """
    )
    empty = tmp_path / "no_icds"
    empty.mkdir()
    env = child_env(OCL_ICD_VENDORS=str(empty), OCL_ICD_FILENAMES="", LD_PRELOAD="")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr
    check(np.load(tmp_path / "y.npy"), gelu_ref(x, "tanh"))
