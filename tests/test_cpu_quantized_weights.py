"""backend=cpu on files whose weights are int8 / int4 (issue 21 item 2): the CPU backend claims
every FULLY_CONNECTED / CONV_2D whose weight is a quantized constant (and GATHER of a quantized
table), with the weight's chain
(DEQUANTIZE, int4's MUL by block scales, RESHAPE), reads the integers as the file stores them and
never holds a float copy of a weight (custom_ops/delegate/cpu/quantized_claim.cc, custom_ops/cpu_builtins/).

* Kernels: randomized shapes (seeded per case), int8 (per output channel, per tensor) and int4
  (compact form with float16 or float32 block scales, blocks of 16 and 32; per axis), odd sizes,
  with and without bias and fused activation, keep_num_dims; CONV_2D with strides, dilations and
  both paddings. Each against the float64 reference of the dequantized weights and against stock
  LiteRT (XNNPACK) on the same file; every node claimed (the delegate's verbose log); outputs
  poisoned with NaN before each of two runs. The int4 mix's int8 token table: its GATHER reads the
  rows as stored, bit for bit TFLite's numbers.
* difflite.WinogradConv3x3 with its 3x3 filter ([Cout, 3, 3, Cin], the contract's second form)
  quantized in every weight form: claimed with the filter's chain and run as the quantized 3x3
  CONV_2D (SAME, stride 1), against the float64 convolution of the dequantized filter; a float16
  filter, a chain that does not fold and a quantized transformed weight stay the op registry's
  custom op (on TFLite's float32 DEQUANTIZE).
* The claim: the weights cross partitions (a TFLite builtin between the claimed nodes puts every
  DEQUANTIZE in the first partition) and come out right; a folded weight that is also a graph
  output, or that a TFLite node reads, is TFLite's; parameters or forms the kernels do not run
  stay with TFLite.
* The second runtime (tensorflow's tf.lite).
* Memory: tens of MB of quantized weights in a fresh process (MEMORY_BOUND says why), read by
  FULLY_CONNECTEDs and by WinogradConv3x3s.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from support.numerics import SAME, VALID, conv_ref, fc_ref, nonzero, rel_err, rng
from support.opencl_helpers import run_reference
from support.oplib_helpers import make_interpreter, run_tflite
from support.quantized_helpers import (
    QModel,
    dequantize,
    int4_blocks,
    quantize,
    write_int4_lookup,
)
from support.winograd_ref import transform_weights as winograd_transform
from support.winograd_ref import winograd_conv3x3_nhwc

TOL = 1e-5
NONE, RELU, RELU_N1_TO_1, RELU6 = 0, 1, 2, 3  # schema ActivationFunctionType
CPU = {"backend": "cpu", "verbose": "1"}


def activate(y, activation):
    return {NONE: y, RELU: np.maximum(y, 0), RELU_N1_TO_1: np.clip(y, -1, 1), RELU6: np.clip(y, 0, 6)}[activation]


WEIGHT_FORMS = ["int8", "int8_tensor", "int4", "int4_f32", "int4_b16", "int4_axis"]


def weight(m, r, name, shape, form):
    """A random weight of `shape` ([N, K] or OHWI) in `form`: (tensor, float64 dequantized)."""
    wf = nonzero(r, shape)
    if form.startswith("int8"):
        axis = None if form == "int8_tensor" else 0
        q, scale = quantize(wf, axis, 8)
        return (m.int8_weight(name, q, scale, axis=0 if axis is None else axis),
                dequantize(q, scale, np.zeros(scale.size), axis))
    q, scale = int4_blocks(wf, 16 if form == "int4_b16" else 32)
    wd = dequantize(q, scale, np.zeros(scale.size), 0).reshape(shape)
    if form == "int4_axis":
        return m.int4_weight(name, shape, q, scale, "per_axis"), wd
    return m.int4_weight(name, shape, q, scale, scale_type=np.float32 if form == "int4_f32" else np.float16), wd


def run_cpu(lib, path, feeds, capfd, runtime="litert"):
    """(outputs of the delegate at backend=cpu, its stderr)."""
    capfd.readouterr()
    got = run_tflite(path, lib, feeds, runtime=runtime, options=CPU, repeats=2)
    return got, capfd.readouterr().err


def claimed(err: str) -> dict[int, str]:
    """node -> op of the verbose log's claims ("DEQUANTIZE folded" for a folded one)."""
    found = {}
    for node, op, rest in re.findall(r"claim node (\d+) (\S+)(.*)", err):
        found[int(node)] = op + (" folded" if rest.endswith("folded") else "")
    return found


def check(lib, tmp_path, m, name, xi, y, x, want, capfd, readers, stock_runs=True):
    """Runs the model delegated and stock; values against the reference and stock; every node
    claimed, `readers` (FULLY_CONNECTED / CONV_2D nodes) as such and the rest folded.
    stock_runs False: a model stock TFLite refuses (its CONV_2D requires a bias)."""
    path = m.save(tmp_path / f"{name}.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd)
    assert rel_err(got, want) <= TOL, rel_err(got, want)
    if stock_runs:
        (stock,) = run_reference(path, [x])
        assert rel_err(stock, want) <= TOL, "stock LiteRT disagrees with the float64 reference"
        assert rel_err(got, stock) <= TOL, rel_err(got, stock)
    assert "not delegating" not in err, err
    ops = claimed(err)
    assert len(ops) == len(m.operators), (ops, err)
    assert {n: op for n, op in ops.items() if not op.endswith("folded")} == readers, err
    return err


# --------------------------------------------------------------------------
# Kernels


def fc_case(seed):
    r = rng(seed)
    form = WEIGHT_FORMS[seed % len(WEIGHT_FORMS)]
    rows = [1, 3, 5, 17, 40, 77][seed % 6]  # < 16 rows: the dot kernel; more: the panel kernel
    n = int(r.integers(3, 60)) | 1
    k = int(r.choice([32, 64, 96, 160])) if form.startswith("int4") else int(r.integers(5, 200))
    return form, rows, n, k, bool(seed % 3), [NONE, RELU, RELU6, RELU_N1_TO_1][seed % 4], seed % 5 == 4


@pytest.mark.parametrize("seed", range(12))
def test_fully_connected(lib, tmp_path, capfd, seed):
    form, rows, n, k, bias, act, keep = fc_case(seed)
    r = rng(100 + seed)
    m = QModel()
    x = nonzero(r, (2, (rows + 1) // 2, k) if keep else (rows, k))
    w, wd = weight(m, r, "w", (n, k), form)
    b = nonzero(r, (n,)) if bias else None
    want = activate(fc_ref(x, wd, b, keep), act)
    xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
    m.builtin("FULLY_CONNECTED", [xi, w, m.constant("b", b) if bias else -1], [y],
              fusedActivationFunction=act, keepNumDims=keep)
    check(lib, tmp_path, m, f"fc{seed}", xi, y, x, want, capfd, {len(m.operators) - 1: "FULLY_CONNECTED"})


def conv_case(seed):
    r = rng(200 + seed)
    form = WEIGHT_FORMS[seed % len(WEIGHT_FORMS)]
    kh, kw = [(3, 3), (1, 1), (1, 3), (3, 3), (5, 5), (3, 1)][seed % 6]
    cin = int(r.choice([32, 64])) if form.startswith("int4") else int(r.integers(3, 40))
    return dict(form=form, batch=1 + seed % 2, h=int(r.integers(5, 12)), w=int(r.integers(4, 12)),
                cin=cin, cout=int(r.integers(2, 40)), kh=kh, kw=kw,
                stride=[(1, 1), (2, 2), (1, 2)][seed % 3], dilation=[(1, 1), (1, 1), (2, 1), (2, 2)][seed % 4],
                padding=[SAME, VALID][seed % 2], bias=seed % 3 != 1, act=[NONE, RELU6, RELU, RELU_N1_TO_1][seed % 4])


@pytest.mark.parametrize("seed", range(12))
def test_conv_2d(lib, tmp_path, capfd, seed):
    c = conv_case(seed)
    r = rng(300 + seed)
    m = QModel()
    x = nonzero(r, (c["batch"], c["h"], c["w"], c["cin"]))
    w, wd = weight(m, r, "w", (c["cout"], c["kh"], c["kw"], c["cin"]), c["form"])
    b = nonzero(r, (c["cout"],)) if c["bias"] else None
    want = activate(conv_ref(x, wd, b, c["stride"], c["dilation"], c["padding"]), c["act"])
    xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
    # no bias: two inputs (TFLite's CONV_2D takes no omitted bias)
    m.builtin("CONV_2D", [xi, w, m.constant("b", b)] if c["bias"] else [xi, w], [y], padding=c["padding"],
              strideH=c["stride"][0], strideW=c["stride"][1], dilationHFactor=c["dilation"][0],
              dilationWFactor=c["dilation"][1], fusedActivationFunction=c["act"])
    check(lib, tmp_path, m, f"conv{seed}", xi, y, x, want, capfd, {len(m.operators) - 1: "CONV_2D"},
          stock_runs=c["bias"])


def test_a_long_reduction_with_many_channels(lib, tmp_path, capfd):
    """K = 2880 (SD's 3x3 convolutions over 320 channels): the weight columns a task dequantizes are
    narrowed to fit its buffer; rows and channels not multiples of any tile."""
    r = rng(7)
    m = QModel()
    x = nonzero(r, (1, 7, 9, 320))
    w, wd = weight(m, r, "w", (45, 3, 3, 320), "int4")
    b = nonzero(r, (45,))
    want = conv_ref(x, wd, b, (1, 1), (1, 1), SAME)
    xi, y = m.activation("x", x.shape), m.activation("y", want.shape)
    m.builtin("CONV_2D", [xi, w, m.constant("b", b)], [y], padding=SAME, strideH=1, strideW=1, dilationHFactor=1,
              dilationWFactor=1)
    check(lib, tmp_path, m, "long", xi, y, x, want, capfd, {len(m.operators) - 1: "CONV_2D"})


# difflite.WinogradConv3x3 whose w is the quantized 3x3 filter: (form, batch, h, w, cin, cout); int4's
# blocks tile each output channel's 9 * cin values
WINOGRAD_CASES = [("int8", 1, 9, 11, 5, 7), ("int8_tensor", 2, 6, 5, 13, 3), ("int4", 1, 7, 10, 32, 9),
                  ("int4_f32", 1, 5, 13, 64, 21), ("int4_b16", 2, 4, 4, 16, 6), ("int4_axis", 1, 8, 3, 32, 5)]
WINOGRAD = "difflite.WinogradConv3x3"
WINOGRAD_ATTRS = {"tile": 4, "activation": "none"}
AS_CONV = r"as CONV_2D \(tile=4, activation=none\)"


def winograd_layer(m, r, x, form, name="w", cin=None):
    """A WinogradConv3x3 on tensor `x` with a `form` filter [Cout, 3, 3, Cin] and a bias: (output
    tensor, float64 filter OHWI, bias)."""
    n, h, w, c = m.tensors[x].shape
    cout = cin or c
    wq, wd = weight(m, r, name, (cout, 3, 3, c), form)
    b = nonzero(r, (cout,))
    y = m.activation(name + "_y", (n, h, w, cout))
    m.custom(WINOGRAD, [x, wq, m.constant(name + "_b", b)], [y], WINOGRAD_ATTRS)
    return y, wd, b


@pytest.mark.parametrize("case", WINOGRAD_CASES, ids=[c[0] for c in WINOGRAD_CASES])
def test_winograd_quantized_filter(lib, tmp_path, capfd, case):
    """Claimed with its filter's chain and run as the quantized 3x3 CONV_2D: SAME padding, stride 1,
    no activation, the bias input 2; H, W and the channels no multiples of 4."""
    form, batch, h, w, cin, cout = case
    r = rng(400 + cin)
    m = QModel()
    x = nonzero(r, (batch, h, w, cin))
    xi = m.activation("x", x.shape)
    y, wd, b = winograd_layer(m, r, xi, form, cin=cout)
    want = conv_ref(x, wd, b, (1, 1), (1, 1), SAME)
    err = check(lib, tmp_path, m, f"wino_{form}", xi, y, x, want, capfd, {len(m.operators) - 1: WINOGRAD},
                stock_runs=False)  # stock TFLite has no kernel for the custom op
    assert re.search(rf"claim node {len(m.operators) - 1} {WINOGRAD} inputs=\(float32\[{batch},{h},{w},{cin}\], "
                     rf"float32\[{cout},3,3,{cin}\], float32\[{cout}\]\) outputs=\(float32\[{batch},{h},{w},{cout}\]\) "
                     r"attrs=\{filter=.* padding=same, stride=1x1, dilation=1x1, activation=none\} " + AS_CONV, err), err


def test_winograd_filters_cross_partitions(lib, tmp_path, capfd):
    """int8 WinogradConv3x3 -> TANH -> int4 WinogradConv3x3 -> TANH -> CONV_2D (int8): TFLite's
    TANHs between the claimed nodes, the folded filters crossing partitions without storage."""
    r = rng(27)
    m = QModel()
    x = nonzero(r, (1, 6, 9, 32))
    xi = m.activation("x", x.shape)
    cur, ref, readers = xi, x.astype(np.float64), {}
    for i, form in enumerate(["int8", "int4"]):
        y, wd, b = winograd_layer(m, r, cur, form, f"w{i}")
        readers[len(m.operators) - 1] = WINOGRAD
        z = m.activation(f"z{i}", m.tensors[y].shape)
        m.builtin("TANH", [y], [z])
        cur, ref = z, np.tanh(conv_ref(ref, wd, b, (1, 1), (1, 1), SAME))
    w, wd = weight(m, r, "wc", (8, 3, 3, 32), "int8")
    b = nonzero(r, (8,))
    y = m.activation("y", (1, 6, 9, 8))
    m.builtin("CONV_2D", [cur, w, m.constant("b", b)], [y], padding=SAME, strideH=1, strideW=1, dilationHFactor=1,
              dilationWFactor=1)
    readers[len(m.operators) - 1] = "CONV_2D"
    want = conv_ref(ref, wd, b, (1, 1), (1, 1), SAME)
    path = m.save(tmp_path / "wino_parts.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd)
    assert rel_err(got, want) <= TOL, rel_err(got, want)
    ops = claimed(err)
    assert {n: op for n, op in ops.items() if not op.endswith("folded")} == readers, err
    assert len(ops) == len(m.operators) - 2 and "not delegating" not in err, err  # all but the TANHs
    assert len(re.findall(r"partition nodes=", err)) == 3, err


def _winograd_float_model(kind, m, r):
    """A WinogradConv3x3 the op registry runs on a float32 w: (x tensor, y tensor, feed, reference,
    expected log)."""
    cin, cout = 12, 7
    x = nonzero(r, (1, 7, 6, cin))
    xi = m.activation("x", x.shape)
    wf = nonzero(r, (cout, 3, 3, cin))
    if kind == "float16_filter":  # a float model at fp16: a folded float16 DEQUANTIZE
        half = m.constant("w16", wf.astype(np.float16))
        w = m.activation("w", wf.shape)
        m.builtin("DEQUANTIZE", [half], [w])
        wd, reason = wf.astype(np.float16).astype(np.float64), None
    elif kind == "zero_points":  # not a chain the CPU backend folds
        q, scale = quantize(wf, 0, 8)
        q = np.clip(q.astype(np.int16) + 3, -128, 127).astype(np.int8)
        zero = np.arange(cout) % 5 - 2
        w, wd = m.int8_weight("w", q, scale, zero_point=zero), dequantize(q, scale, zero, 0)
        reason = r"not folding node 0 \(DEQUANTIZE\): its int8 constant: zero point 0 is not 0"
    else:  # transformed weights [36, Cin, Cout], quantized: not the filter form
        u = winograd_transform(wf.transpose(0, 3, 1, 2))
        q, scale = quantize(u, None, 8)
        w, ud = m.int8_weight("w", q, scale), dequantize(q, scale, np.zeros(1), None)
        b = nonzero(r, (cout,))
        y = m.activation("y", (1, 7, 6, cout))
        m.custom(WINOGRAD, [xi, w, m.constant("b", b)], [y], WINOGRAD_ATTRS)
        return xi, y, x, winograd_conv3x3_nhwc(x, ud, b), (
            rf"node 1 \({WINOGRAD}\) does not read its quantized filter as stored: w \[36,{cin},{cout}\] is "
            r"not the 3x3 filter \[Cout,3,3,Cin\] .*; the custom op reads TFLite's float32 DEQUANTIZE of it\n"
            r"(.*\n)*.*not folding node 0: node 1, a difflite op reading it as float32, reads its output")
    b = nonzero(r, (cout,))
    y = m.activation("y", (1, 7, 6, cout))
    m.custom(WINOGRAD, [xi, w, m.constant("b", b)], [y], WINOGRAD_ATTRS)
    return xi, y, x, conv_ref(x, wd, b, (1, 1), (1, 1), SAME), reason


@pytest.mark.parametrize("kind", ["float16_filter", "zero_points", "transformed_int8"])
def test_winograd_on_a_float_filter_is_the_custom_op(lib, tmp_path, capfd, kind):
    """A float filter, a quantized one whose chain does not fold, and quantized transformed weights:
    the op registry's WinogradConv3x3 claims the node and reads TFLite's float32 DEQUANTIZE (which
    TFLite runs: it is not claimed)."""
    m = QModel()
    xi, y, x, want, reason = _winograd_float_model(kind, m, rng(28))
    path = m.save(tmp_path / f"{kind}.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd)
    assert rel_err(got, want) <= 1e-4, rel_err(got, want)  # the Winograd kernel's bar
    if reason:
        assert re.search(reason, err), err
    assert claimed(err) == {1: WINOGRAD}, err
    assert re.search(rf"claim node 1 {WINOGRAD} inputs=.* attrs=\{{tile=4, activation=none\}}$", err, re.M), err
    assert "as CONV_2D" not in err and "not delegating" not in err, err


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_token_table_rows_are_gathered_from_the_integers(lib, tmp_path, capfd, precision):
    """The int4 mix's token table as the writer stores it (difflite/compiler/tflite/context.py lookup):
    DEQUANTIZE of int8 rows of scale 1, GATHER, MUL by the gathered row scales (TFLite's). The
    GATHER reads the int8 table as stored: the same numbers as stock LiteRT, bit for bit; an index
    outside the table fails the call, as TFLite's GATHER does."""
    vocab, dim = 1000, 64
    r = rng(11)
    path = tmp_path / "lookup.tflite"
    table = write_int4_lookup(path, precision, r, vocab, dim)
    ids = r.integers(0, vocab, (1, 77)).astype(np.int32)
    ids[0, :3] = (0, vocab - 1, 0)
    (got,), err = run_cpu(lib, path, [ids], capfd)
    assert sorted(claimed(err).values()) == ["DEQUANTIZE folded", "GATHER"], err
    (stock,) = run_reference(path, [ids])
    assert np.abs(stock).max() > 0 and np.array_equal(got, stock)
    # the GATHER alone (the writer's form also gathers the row scales, with TFLite's GATHER)
    m = QModel()
    q, scale = quantize(table, 0, 8)
    w = m.int8_weight("table", q, scale)
    ii, rows = m.activation("ids", ids.shape, np.int32), m.activation("rows", (*ids.shape, dim))
    m.builtin("GATHER", [w, ii], [rows], axis=0)
    path = m.save(tmp_path / "gather.tflite", [ii], [rows])
    (got,), err = run_cpu(lib, path, [ids], capfd)
    assert claimed(err) == {0: "DEQUANTIZE folded", 1: "GATHER"}, err
    assert np.array_equal(got, (q.astype(np.float32) * scale[:, None])[ids])
    ids[0, 5] = vocab
    with pytest.raises(RuntimeError, match=r"index 1000 \(position 5\) is outside \[0, 1000\)"):
        run_tflite(path, lib, [ids], options=CPU)


# --------------------------------------------------------------------------
# The claim


def three_layers(m, r, x_shape=(5, 64)):
    """x -> FC (int8) -> TANH -> FC (int4 blocks of 16, float16 scales) -> TANH -> FC (int8 per
    tensor): TFLite's TANH between the claimed nodes. (x, y tensors, feed, reference, the
    FULLY_CONNECTED nodes)."""
    x = nonzero(r, x_shape)
    xi = m.activation("x", x.shape)
    cur, ref, readers = xi, x.astype(np.float64), []
    for i, (n, form) in enumerate([(48, "int8"), (40, "int4_b16"), (24, "int8_tensor")]):
        w, wd = weight(m, r, f"w{i}", (n, ref.shape[-1]), form)
        b = nonzero(r, (n,))
        y = m.activation(f"y{i}", (x.shape[0], n))
        readers.append(len(m.operators))
        m.builtin("FULLY_CONNECTED", [cur, w, m.constant(f"b{i}", b)], [y])
        cur, ref = y, fc_ref(ref, wd, b)
        if i < 2:
            z = m.activation(f"z{i}", (x.shape[0], n))
            m.builtin("TANH", [y], [z])
            cur, ref = z, np.tanh(ref)
    return xi, cur, x, ref, readers


def test_weights_cross_partitions_without_storage(lib, tmp_path, capfd):
    """TFLite's greedy partitioning puts every DEQUANTIZE of a constant in the first partition and
    each reader after a TANH in a later one: the weights are partition outputs, given no storage,
    and the readers compute from the integers."""
    m = QModel()
    xi, y, x, want, readers = three_layers(m, rng(20))
    path = m.save(tmp_path / "three.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd)
    (stock,) = run_reference(path, [x])
    assert rel_err(got, want) <= TOL and rel_err(got, stock) <= TOL
    ops = claimed(err)
    assert {n for n, op in ops.items() if not op.endswith("folded")} == set(readers), err
    assert len(ops) == len(m.operators) - 2 and "not delegating" not in err, err  # all but the TANHs
    parts = re.findall(r"partition nodes=\[([\d,]*)\] inputs=\[[\d,]*\] outputs=\[([\d,]*)\] "
                       r"delegate_owned=\[[\d,]*\] unallocated=\[([\d,]*)\]", err)
    assert len(parts) == 3, err
    first = [set(map(int, filter(None, p.split(",")))) for p in parts[0]]
    assert readers[0] in first[0] and not set(readers[1:]) & first[0], err
    # the second and the third weight leave the first partition for their readers, without storage
    assert len(first[1] & first[2]) == 2, err


def test_a_folded_weight_another_node_reads_stays_with_tflite(lib, tmp_path, capfd):
    """A DEQUANTIZE whose output is also a graph output, and one whose output a TFLite node (ADD)
    also reads: TFLite computes those (exactly its own values), the FULLY_CONNECTED readers still
    read the integers."""
    r = rng(21)
    n, k = 9, 40
    x = nonzero(r, (3, k))
    q1, s1 = quantize(nonzero(r, (n, k)), 0, 8)
    q2, s2 = quantize(nonzero(r, (n, k)), 0, 8)
    m = QModel()
    xi = m.activation("x", x.shape)
    w1 = m.int8_weight("w1", q1, s1)  # node 0, its output a graph output
    w2 = m.int8_weight("w2", q2, s2)  # node 1, its output read by ADD
    y1, y2, t = m.activation("y1", (3, n)), m.activation("y2", (3, n)), m.activation("t", (n, k))
    m.builtin("FULLY_CONNECTED", [xi, w1, -1], [y1])
    m.builtin("FULLY_CONNECTED", [xi, w2, -1], [y2])
    m.builtin("ADD", [w2, m.constant("one", np.ones((n, k), np.float32))], [t])
    path = m.save(tmp_path / "shared.tflite", [xi], [y1, y2, w1, t])
    capfd.readouterr()
    # not poisoned: TFLite computes a DEQUANTIZE of a constant once, when it prepares
    interp = make_interpreter(path, lib, options=CPU)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]
    err = capfd.readouterr().err
    stock = run_reference(path, [x])
    assert claimed(err) == {2: "FULLY_CONNECTED", 3: "FULLY_CONNECTED"}, err
    assert "not folding node 0: its output is a graph output" in err, err
    assert "not folding node 1: node 4, left to TFLite, reads its output" in err, err
    assert np.array_equal(got[2], q1.astype(np.float32) * s1[:, None])
    assert np.array_equal(got[3], q2.astype(np.float32) * s2[:, None] + np.float32(1))
    for i, wd in enumerate([dequantize(q1, s1, np.zeros(n), 0), dequantize(q2, s2, np.zeros(n), 0)]):
        assert rel_err(got[i], fc_ref(x, wd, None)) <= TOL and rel_err(got[i], stock[i]) <= TOL


def _refused_model(kind, m, r):
    """(x tensor, y tensor, feed, float64 reference or None, expected log) of a model the CPU
    backend leaves to TFLite."""
    n, k = 11, 64
    if kind == "grouped":  # CONV_2D over two groups of 16 channels: TFLite runs it, the kernels do not
        x = nonzero(r, (1, 6, 7, 2 * 16))
        xi, y = m.activation("x", x.shape), m.activation("y", (1, 6, 7, 8))
        w, _ = weight(m, r, "w", (8, 3, 3, 16), "int8")
        m.builtin("CONV_2D", [xi, w, m.constant("b", nonzero(r, (8,)))], [y], padding=SAME, strideH=1,
                  strideW=1, dilationHFactor=1, dilationWFactor=1)
        return xi, y, x, None, (r"not delegating node 1 \(CONV_2D with quantized weights\): filter "
                                r"\[8,3,3,16\] does not match the input's 32 channels")
    x = nonzero(r, (4, k))
    xi, y = m.activation("x", x.shape), m.activation("y", (4, n))
    if kind == "zero_points":
        q, scale = quantize(nonzero(r, (n, k)), 0, 8)
        q = np.clip(q.astype(np.int16) + 3, -128, 127).astype(np.int8)
        zero = np.arange(n) % 5 - 2
        w, wd = m.int8_weight("w", q, scale, zero_point=zero), dequantize(q, scale, zero, 0)
        reason = r"not folding node 0 \(DEQUANTIZE\): its int8 constant: zero point 0 is not 0"
    else:  # a look-alike of int4's compact form: per-tensor scale 0.5
        q, scale = int4_blocks(nonzero(r, (n, k)))
        w, wd = m.int4_weight("w", (n, k), q, scale, unit=0.5), dequantize(q, scale, np.zeros(scale.size), 0)
        wd = wd.reshape(n, k)
        reason = r"not folding node 2 \(MUL\): its values are not int4's compact form"
    m.builtin("FULLY_CONNECTED", [xi, w, -1], [y])
    return xi, y, x, fc_ref(x, wd, None), reason


@pytest.mark.parametrize("kind", ["grouped", "zero_points", "unit_half"])
def test_what_the_kernels_do_not_run_stays_with_tflite(lib, tmp_path, capfd, kind):
    m = QModel()
    xi, y, x, want, reason = _refused_model(kind, m, rng(22))
    path = m.save(tmp_path / f"{kind}.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd)
    assert re.search(reason, err), err
    assert claimed(err) == {}, err
    assert np.array_equal(got, run_reference(path, [x])[0])  # TFLite ran it, as without the delegate
    if want is not None:
        assert rel_err(got, want) <= TOL


@pytest.mark.parametrize("runtime", ["litert", "tf"])
def test_tensors_inside_a_partition_live_in_tflites_arena(lib, tmp_path, capfd, runtime):
    """A claimed FULLY_CONNECTED feeding a difflite op in the same partition: the tensor between
    them is the partition node's temporary, which the interpreter's arena holds during that node
    only (and shares with every other node's tensors), not a buffer the delegate keeps for good:
    the interpreter gives it data. Values right on both runtimes."""
    r = rng(25)
    m = QModel()
    x = nonzero(r, (6, 64))
    xi = m.activation("x", x.shape)
    w, wd = weight(m, r, "w", (40, 64), "int8")
    inner, y = m.activation("inner", (6, 40)), m.activation("y", (6, 40))
    m.builtin("FULLY_CONNECTED", [xi, w, -1], [inner])
    m.custom("difflite.Gelu", [inner], [y], {"approximate": "tanh"})
    path = m.save(tmp_path / "inner.tflite", [xi], [y])
    capfd.readouterr()
    interp = make_interpreter(path, lib, runtime=runtime, options=CPU)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    err = capfd.readouterr().err
    assert re.search(rf"partition nodes=\[0,1,2\] .* delegate_owned=\[{inner}\]", err), err
    assert interp.get_tensor(inner).shape == (6, 40)  # the runtime's: not "Tensor data is null"
    z = fc_ref(x, wd, None)
    want = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    assert rel_err(got, want) <= TOL


def test_tensorflow_runtime(lib, tmp_path, capfd):
    """tensorflow's tf.lite with the delegate: the same claims and values (the quantization fields
    and the partitioning preview of tflite_abi.h, read at the same offsets there)."""
    m = QModel()
    xi, y, x, want, _ = three_layers(m, rng(23))
    path = m.save(tmp_path / "tf.tflite", [xi], [y])
    (got,), err = run_cpu(lib, path, [x], capfd, runtime="tf")
    assert len(claimed(err)) == len(m.operators) - 2 and "not delegating" not in err, err
    assert rel_err(got, want) <= TOL


# --------------------------------------------------------------------------
# Memory

# The bounds: the process's peak resident memory may grow by the model's weight bytes as the file
# stores them (its pages are read once) plus a quarter of the weights' float32 size for everything
# else (the interpreter, its arena, the kernels' buffers, libraries' pages touched); the bytes the
# process has malloc'ed and not freed (glibc's mallinfo2) by less than that quarter. One float32
# copy of the weights (what TFLite's DEQUANTIZE keeps, and XNNPACK packs another) is 4x the int8
# and 8x the int4 bytes: it cannot fit. The heap bound also catches a float tensor that is
# allocated but never written, which resident memory would not show (TFLite's arena holding the
# weights that cross partitions, if the delegate did not leave them without storage). The same
# model without the delegate is measured to show the bounds can fail.
MEMORY_LAYERS = [("int8", 2048), ("int4", 2048), ("int8", 2048), ("int4", 2048), ("int8", 2048), ("int8", 2048)]

CHILD = r"""
import ctypes, json, sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, load_delegate
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def status():
    s = {k: int(v.split()[0]) / 1024 for k, _, v in (l.partition(":") for l in open("/proc/self/status"))
         if k in ("VmRSS", "VmHWM")}
    heap = libc.mallinfo2()  # in use: mmapped chunks and the arenas' allocated chunks
    s["heap"] = (heap.hblkhd + heap.uordblks) / 2**20
    return s
path, lib = sys.argv[1], sys.argv[2]
delegates = [load_delegate(lib, {"backend": "cpu"})] if lib else []
before = status()
it = Interpreter(model_path=path, experimental_delegates=delegates, num_threads=2)
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.ones(it.get_input_details()[0]["shape"], np.float32))
it.invoke(); it.invoke()
out = it.get_tensor(it.get_output_details()[0]["index"])
print(json.dumps({"before": before, "after": status(), "finite": bool(np.isfinite(out).all())}))
"""


def measure(path, library: str) -> tuple[float, float]:
    """(peak resident growth MiB, heap growth MiB) of loading and running `path` twice in a fresh
    process, with the delegate at `library` ("" : stock TFLite)."""
    run = subprocess.run([sys.executable, "-c", CHILD, str(path), library], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["finite"], result
    return result["after"]["VmHWM"] - result["before"]["VmRSS"], result["after"]["heap"] - result["before"]["heap"]


def test_quantized_weights_take_no_float_copy(lib, tmp_path):
    r = rng(24)
    m = QModel()
    xi = m.activation("x", (4, MEMORY_LAYERS[0][1]))
    cur, stored, as_float = xi, 0, 0
    for i, (form, n) in enumerate(MEMORY_LAYERS):
        k = m.tensors[cur].shape[-1]
        w, _ = weight(m, r, f"w{i}", (n, k), form)
        y, z = m.activation(f"y{i}", (4, n)), m.activation(f"z{i}", (4, n))
        m.builtin("FULLY_CONNECTED", [cur, w, -1], [y])
        m.builtin("TANH", [y], [z])
        cur = z
        stored += n * k * (1 if form == "int8" else 0.5 + 2 / 32)
        as_float += 4 * n * k
    path = m.save(tmp_path / "big.tflite", [xi], [cur])
    growth, heap = {}, {}
    for name, library in (("delegate", str(lib)), ("stock", "")):
        growth[name], heap[name] = measure(path, library)
    mib = 1 << 20
    bound = (stored + as_float / 4) / mib
    assert growth["delegate"] < bound and heap["delegate"] < as_float / 4 / mib, (growth, heap, bound)
    assert growth["stock"] > as_float / mib and heap["stock"] > as_float / mib, (growth, heap)  # they can fail


WINOGRAD_MEMORY_LAYERS = ["int8", "int4", "int8", "int4", "int8", "int8"]  # 640 -> 640 channels each


def test_quantized_winograd_filters_take_no_float_copy(lib, tmp_path):
    """WinogradConv3x3 layers of quantized 3x3 filters, TANHs between: no float copy of a filter
    (nor of its Winograd transform, 4x that) exists. The bounds are the FULLY_CONNECTED test's. Stock
    TFLite has no kernel for the op: the same layers whose filters are also graph outputs (so TFLite
    dequantizes them and keeps the floats; the nodes still read the integers) show they can fail."""
    r = rng(29)
    m = QModel()
    c = 640
    xi = m.activation("x", (1, 8, 8, c))
    cur, stored, as_float, filters = xi, 0, 0, []
    for i, form in enumerate(WINOGRAD_MEMORY_LAYERS):
        y, _, _ = winograd_layer(m, r, cur, form, f"w{i}")
        filters.append(m.operators[-1].inputs[1])
        z = m.activation(f"z{i}", m.tensors[y].shape)
        m.builtin("TANH", [y], [z])
        cur = z
        stored += 9 * c * c * (1 if form == "int8" else 0.5 + 2 / 32)
        as_float += 4 * 9 * c * c
    growth, heap = {}, {}
    for name, outputs in (("delegate", [cur]), ("dequantized", [cur, *filters])):
        growth[name], heap[name] = measure(m.save(tmp_path / f"{name}.tflite", [xi], outputs), str(lib))
    mib = 1 << 20
    bound = (stored + as_float / 4) / mib
    assert growth["delegate"] < bound and heap["delegate"] < as_float / 4 / mib, (growth, heap, bound)
    assert growth["dequantized"] > as_float / mib and heap["dequantized"] > as_float / mib, (growth, heap)
