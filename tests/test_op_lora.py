"""difflite.LoRA, out = y + (x D^T) U^T with the factors D [r, K], U [N, r] set per slot at run time
(difflite_lora_set, through difflite.runtime.lora_factors.set_factors), against float64 NumPy
references on every path of the op library:

* the CPU backend (TestCpuBackend), on both runtimes (`runtime`): a FULLY_CONNECTED ([B, L, C]) or a
  1x1 CONV_2D (NHWC) whose output and input feed the op, two slots in one model; no factors: the
  output is y bit for bit; factors: max |err| <= 1e-4 x max |ref|; rank 4, then 16, then 0 (y
  again, exactly); slots independent; every error of difflite_lora_set returns nonzero with its line
  and leaves the slot's factors working; float16 tensors refused (the CPU kernels are float32);
* the OpenCL kernel (custom_ops/ops/lora/lora.cl) launched directly with pyopencl on PoCL
  (benchmarks/gpu_kernels_harness/launch.py): float32 storage < TOL, half storage (half_runner)
  < HALF_TOL; odd sizes, more ranks than one launch takes, in place (y and out one buffer), the
  smaller plans;
* the op through the library with backend=opencl (test_delegate_*), float and half storage
  (precision=fp16): the same checks, and: no factors costs no kernel (profile=1) and no buffer (the
  output is y's: arena bytes); a y that a later node reads, or that is a graph output, keeps its
  values (the plan declines the in-place alias); several partitions; float16 tensors.

Outputs are poisoned with NaN before every run; sizes are odd. No OpenCL is a failure with the
reason, never a skip (tests/support/opencl_fixtures.py).
"""
from __future__ import annotations

import ctypes
import gc
import json

import numpy as np
import pytest

from difflite.core.errors import BadInput
from difflite.runtime.lora_factors import delegate_pointer, set_factors
from support.numerics import VALID, fc_ref, nonzero, rel_err, rng
from support.opencl_helpers import HALF_TOL, TOL, OpModel, halved
from support.oplib_helpers import INT_POISON, check, load_runtime

LORA = "difflite.LoRA"
CPU = {"backend": "cpu", "num_threads": "2"}


# ---------------------------------------------------------------------------
# Models, references, a loaded model


def factors(seed: int, rank: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """D [rank, k], U [n, rank]: non-zero, of a size that moves the output visibly."""
    r = rng(seed)
    return nonzero(r, (rank, k), 0.5), nonzero(r, (n, rank), 0.5)


def lora_ref(y, x, down=None, up=None) -> np.ndarray:
    """y + (x D^T) U^T in float64 over the rows of y [..., N] and x [..., K]."""
    y = np.asarray(y, np.float64)
    if down is None:
        return y
    x = np.asarray(x, np.float64).reshape(-1, down.shape[1])
    return y + (x @ down.T.astype(np.float64) @ up.T.astype(np.float64)).reshape(y.shape)


def lora_only_model(path, y_shape, x_shape, slot: int = 0, dtype=np.float32):
    """Graph inputs y and x -> LoRA -> out."""
    m = OpModel()
    y = m.activation("y", y_shape, dtype)
    x = m.activation("x", x_shape, dtype)
    out = m.activation("out", y_shape, dtype)
    m.custom(LORA, [y, x], [out], {"slot": slot})
    return m.save(path, [y, x], [out])


def fc_model(path, x, w, b, slot: int):
    """x [B, L, K] -> FULLY_CONNECTED (w [N, K], b, leading dims kept) -> y; LoRA(y, x) -> out."""
    m = OpModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", (*x.shape[:-1], w.shape[0]))
    out = m.activation("out", (*x.shape[:-1], w.shape[0]))
    m.builtin("FULLY_CONNECTED", [xi, m.constant("w", w), m.constant("b", b)], [y], keepNumDims=True)
    m.custom(LORA, [y, xi], [out], {"slot": slot})
    return m.save(path, [xi], [out])


def conv_model(path, x, w, b, slot: int):
    """x [B, H, W, K] -> CONV_2D 1x1 (w [N, 1, 1, K], b) -> y; LoRA(y, x) -> out (NHWC)."""
    m = OpModel()
    xi = m.activation("x", x.shape)
    y = m.activation("y", (*x.shape[:-1], w.shape[0]))
    out = m.activation("out", (*x.shape[:-1], w.shape[0]))
    m.builtin("CONV_2D", [xi, m.constant("w", w), m.constant("b", b)], [y], padding=VALID, strideH=1,
              strideW=1, dilationHFactor=1, dilationWFactor=1)
    m.custom(LORA, [y, xi], [out], {"slot": slot})
    return m.save(path, [xi], [out])


class TwoSlots:
    """x [2, 7, 13] -> FC1 (13 -> 9) -> y1; LoRA(y1, x, slot 2) -> o1; FC2(o1) (9 -> 11) -> y2;
    LoRA(y2, o1, slot 40000) -> o2. Outputs o1 and o2. With `between`, a builtin the OpenCL
    backend does not run (ELU) takes o1 first: FC2 and the second LoRA read ELU(o1), and the model
    is two partitions on OpenCL."""
    SLOTS = (2, 40000)

    def __init__(self, path, between: bool = False):
        r = rng(40)
        self.x = nonzero(r, (2, 7, 13))
        self.w1, self.b1 = nonzero(r, (9, 13), 0.5), nonzero(r, (9,))
        self.w2, self.b2 = nonzero(r, (11, 9), 0.5), nonzero(r, (11,))
        self.between = between
        m = OpModel()
        xi = m.activation("x", self.x.shape)
        y1, o1 = m.activation("y1", (2, 7, 9)), m.activation("o1", (2, 7, 9))
        y2, o2 = m.activation("y2", (2, 7, 11)), m.activation("o2", (2, 7, 11))
        m.builtin("FULLY_CONNECTED", [xi, m.constant("w1", self.w1), m.constant("b1", self.b1)], [y1],
                  keepNumDims=True)
        m.custom(LORA, [y1, xi], [o1], {"slot": self.SLOTS[0]})
        h = o1
        if between:
            h = m.activation("e", (2, 7, 9))
            m.builtin("ELU", [o1], [h])
        m.builtin("FULLY_CONNECTED", [h, m.constant("w2", self.w2), m.constant("b2", self.b2)], [y2],
                  keepNumDims=True)
        m.custom(LORA, [y2, h], [o2], {"slot": self.SLOTS[1]})
        self.path = m.save(path, [xi], [o1, o2])

    def ref(self, f1=None, f2=None) -> list[np.ndarray]:
        o1 = lora_ref(fc_ref(self.x, self.w1, self.b1, True), self.x, *(f1 or ()))
        h = np.where(o1 > 0, o1, np.expm1(o1)) if self.between else o1
        return [o1, lora_ref(fc_ref(h, self.w2, self.b2, True), h, *(f2 or ()))]


class Loaded:
    """A model on the op library's delegate: the interpreter, its tensors allocated (so the library
    knows the slots), and the delegate its factors are set on."""

    def __init__(self, path, lib, runtime: str = "litert", options=None):
        interp_cls, load_delegate = load_runtime(runtime)
        self.lib = lib
        self.delegate = load_delegate(str(lib), dict(options or CPU))
        self.interp = interp_cls(model_path=str(path), experimental_delegates=[self.delegate])
        self.interp.allocate_tensors()

    def set(self, slot: int, down, up) -> None:
        set_factors(self.lib, self.delegate, slot, down, up)

    def run(self, *feeds) -> list[np.ndarray]:
        """Feeds the graph inputs in order, poisons the outputs (NaN), invokes; the outputs."""
        for detail, value in zip(self.interp.get_input_details(), feeds):
            self.interp.set_tensor(detail["index"], np.ascontiguousarray(value, dtype=detail["dtype"]))
        outs = self.interp.get_output_details()
        for d in outs:
            view = self.interp.tensor(d["index"])()
            view[...] = np.nan if np.issubdtype(view.dtype, np.floating) else INT_POISON
            del view
        self.interp.invoke()
        return [self.interp.get_tensor(d["index"]).copy() for d in outs]

    def close(self) -> None:
        self.interp = None
        self.delegate = None
        gc.collect()


def c_library(lib):
    """The library's LoRA entry points through ctypes, for what set_factors never passes (NULL
    factors, a negative rank)."""
    c = ctypes.CDLL(str(lib))
    c.difflite_lora_set.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                    ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
    c.difflite_lora_set.restype = ctypes.c_int
    c.difflite_lora_error.restype = ctypes.c_char_p
    return c


def check_errors(loaded: Loaded, slot: int, k: int, n: int, feeds, want, tol) -> None:
    """Every refusal of difflite_lora_set on `loaded` (whose slot `slot`, a k -> n layer, holds the
    factors behind `want`): nonzero with its line, and the factors still working afterwards."""
    d, u = factors(7, 4, k, n)
    refusals = [
        ((slot + 1, d, u), f"slot {slot + 1}: this model has no LoRA op of that slot"),
        ((slot, factors(7, 4, k + 1, n)[0], u),
         f"slot {slot}: factors are [4 x {k + 1}] and [{n} x 4] but the slot's layer is {k} -> {n}"),
        ((slot, d, factors(7, 4, k, n + 2)[1]),
         f"slot {slot}: factors are [4 x {k}] and [{n + 2} x 4] but the slot's layer is {k} -> {n}"),
        ((70000, d, u), "slot 70000 out of range (0..65535)"),
        ((-1, d, u), "slot -1 out of range (0..65535)"),
        ((slot, np.where(np.arange(d.size).reshape(d.shape) == 5, np.inf, d), u),
         f"slot {slot}: down holds a value that is not finite (element 5)"),
        ((slot, d, np.full_like(u, np.nan)), f"slot {slot}: up holds a value that is not finite (element 0)"),
    ]
    for args, message in refusals:
        with pytest.raises(BadInput) as info:
            loaded.set(*args)
        assert str(info.value) == message
        check(loaded.run(*feeds)[0], want, tol)
    with pytest.raises(BadInput, match="ranks differ"):  # the binding's own check
        loaded.set(slot, d, u[:, :3])
    with pytest.raises(BadInput, match="both LoRA factors"):
        loaded.set(slot, d, None)
    c = c_library(loaded.lib)
    pointer = delegate_pointer(loaded.delegate)
    down = d.ctypes.data_as(ctypes.c_void_p)
    upp = u.ctypes.data_as(ctypes.c_void_p)
    for args, message in [
        ((pointer, slot, -1, k, n, down, upp), "rank -1 out of range (0..65536)"),
        ((pointer, slot, 65537, k, n, down, upp), "rank 65537 out of range (0..65536)"),
        ((pointer, slot, 4, k, n, None, None), f"slot {slot}: down is NULL for rank 4"),
        ((pointer, slot, 4, k, n, down, None), f"slot {slot}: up is NULL for rank 4"),
        ((None, slot, 4, k, n, down, upp), "not a difflite delegate"),
        ((pointer + 8, slot, 4, k, n, down, upp), "not a difflite delegate"),
        ((id(loaded), slot, 4, k, n, down, upp), "not a difflite delegate"),
    ]:
        assert c.difflite_lora_set(*args) != 0, message
        assert c.difflite_lora_error().decode() == message
        check(loaded.run(*feeds)[0], want, tol)
    with pytest.raises(BadInput, match="^not a difflite delegate$"):
        set_factors(loaded.lib, pointer + 16, slot, d, u)


# ---------------------------------------------------------------------------
# The CPU backend


class TestCpuBackend:
    """backend=cpu on both runtimes (`runtime`): max |err| <= 1e-4 x max |ref|
    (support.oplib_helpers.check). A class of its own: the OpenCL tests below share names."""

    def test_no_factors_is_y_bit_for_bit(self, lib, runtime, tmp_path):
        r = rng(1)
        y, x = nonzero(r, (3, 5, 8), 4.0), nonzero(r, (3, 5, 6))
        loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=65535), lib, runtime)
        (out,) = loaded.run(y, x)
        assert np.array_equal(out, y)
        d, u = factors(2, 3, 6, 8)
        loaded.set(65535, d, u)
        check(loaded.run(y, x)[0], lora_ref(y, x, d, u))
        loaded.set(65535, None, None)
        assert np.array_equal(loaded.run(y, x)[0], y)

    def test_fully_connected_rank_changes(self, lib, runtime, tmp_path):
        """rank 4, then 16, then 0: y again, bit for bit."""
        r = rng(3)
        x, w, b = nonzero(r, (2, 7, 13)), nonzero(r, (9, 13), 0.5), nonzero(r, (9,))
        y = fc_ref(x, w, b, True)
        loaded = Loaded(fc_model(tmp_path / "fc.tflite", x, w, b, slot=5), lib, runtime)
        (plain,) = loaded.run(x)
        check(plain, y)
        for rank in (4, 16):
            d, u = factors(rank, rank, 13, 9)
            loaded.set(5, d, u)
            check(loaded.run(x)[0], lora_ref(y, x, d, u))
        loaded.set(5, None, None)
        assert np.array_equal(loaded.run(x)[0], plain)

    def test_conv_1x1_nhwc(self, lib, runtime, tmp_path):
        r = rng(4)
        x, w, b = nonzero(r, (2, 5, 3, 11)), nonzero(r, (7, 1, 1, 11), 0.5), nonzero(r, (7,))
        y = fc_ref(x, w.reshape(7, 11), b, True)
        loaded = Loaded(conv_model(tmp_path / "conv.tflite", x, w, b, slot=0), lib, runtime)
        (plain,) = loaded.run(x)
        d, u = factors(5, 3, 11, 7)
        loaded.set(0, d, u)
        check(loaded.run(x)[0], lora_ref(y, x, d, u))
        loaded.set(0, np.zeros((0, 11), np.float32), np.zeros((7, 0), np.float32))  # rank 0 clears too
        assert np.array_equal(loaded.run(x)[0], plain)

    def test_two_slots_independent(self, lib, runtime, tmp_path):
        """Each partition (a LoRA between FCs that TFLite runs) holds its own slot."""
        model = TwoSlots(tmp_path / "two.tflite")
        loaded = Loaded(model.path, lib, runtime)
        a, b = model.SLOTS
        f1, f2 = factors(8, 4, 13, 9), factors(9, 6, 9, 11)
        for want_f1, want_f2, step in [(f1, None, (a, *f1)), (f1, f2, (b, *f2)), (None, f2, (a, None, None))]:
            loaded.set(*step)
            for got, want in zip(loaded.run(model.x), model.ref(want_f1, want_f2)):
                check(got, want)

    def test_errors_leave_the_factors(self, lib, runtime, tmp_path):
        r = rng(5)
        x, w, b = nonzero(r, (2, 7, 13)), nonzero(r, (9, 13), 0.5), nonzero(r, (9,))
        loaded = Loaded(fc_model(tmp_path / "fc.tflite", x, w, b, slot=5), lib, runtime)
        d, u = factors(6, 4, 13, 9)
        loaded.set(5, d, u)
        check_errors(loaded, 5, 13, 9, [x], lora_ref(fc_ref(x, w, b, True), x, d, u), 1e-4)

    def test_slot_goes_with_its_model(self, lib, tmp_path):
        """The model freed, its slots are unknown; the delegate destroyed, its pointer is no longer
        one of the library's."""
        r = rng(6)
        y, x = nonzero(r, (4, 3)), nonzero(r, (4, 5))
        loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=9), lib)
        d, u = factors(1, 2, 5, 3)
        loaded.set(9, d, u)
        loaded.interp = None
        gc.collect()
        with pytest.raises(BadInput, match="^slot 9: this model has no LoRA op of that slot$"):
            loaded.set(9, d, u)
        pointer = delegate_pointer(loaded.delegate)
        loaded.close()
        with pytest.raises(BadInput, match="^not a difflite delegate$"):
            set_factors(lib, pointer, 9, d, u)

    def test_factor_count_overflow(self, lib, tmp_path):
        """rank x K past 2^31 - 1 values is refused before the arrays are read."""
        r = rng(7)
        y, x = nonzero(r, (1, 3)), nonzero(r, (1, 40000))
        loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=0), lib)
        c = c_library(lib)
        dummy = np.zeros(4, np.float32).ctypes.data_as(ctypes.c_void_p)
        assert c.difflite_lora_set(delegate_pointer(loaded.delegate), 0, 65536, 40000, 3, dummy, dummy) != 0
        assert c.difflite_lora_error().decode() == (
            "slot 0: factors of rank 65536 for a 40000 -> 3 layer hold more than 2^31 - 1 values")
        assert np.array_equal(loaded.run(y, x)[0], y)

    def test_float16_tensors_refused(self, lib, tmp_path, capfd):
        """float16 activations keep the contract; the CPU kernels compute float32 only, so the node
        stays with TFLite, which has no kernel for it."""
        path = lora_only_model(tmp_path / "h.tflite", (3, 4), (3, 5), dtype=np.float16)
        with pytest.raises((RuntimeError, ValueError)):
            Loaded(path, lib)
        assert "y is float16: the CPU kernels compute float32 only" in capfd.readouterr().err


# ---------------------------------------------------------------------------
# The OpenCL kernel, launched directly (pyopencl on PoCL)


CASES = [  # rows, K, N, rank: odd sizes; row and column tails of the GEMM tiles; ranks past a
    # multiple of 4 and a tile's 16-deep k slice; few rows over a long K (the down GEMM split over K)
    (1, 1, 1, 1), (37, 13, 9, 5), (33, 40, 130, 64), (45, 17, 200, 70), (9, 5, 7, 130), (70, 77, 33, 32),
    (23, 30, 50, 33), (5, 3, 6, 300), (20, 1100, 24, 8)]


@pytest.mark.parametrize("rows,k,n,rank", CASES)
def test_lora(runner, rows, k, n, rank):
    r = rng(rows + rank)
    x, y = nonzero(r, (rows, k)), nonzero(r, (rows, n), 2.0)
    d, u = factors(rank, rank, k, n)
    out = runner.empty((rows, n))
    runner.lora(runner.upload(x), runner.upload(y), out, *runner.lora_factors(d, u), rows, k, n, rank)
    assert rel_err(runner.download(out, (rows, n)), lora_ref(y, x, d, u)) < TOL


def test_lora_in_place(runner):
    """y and out one buffer (the library's alias): the accumulating GEMM reads each output where it
    stores it."""
    rows, k, n, rank = 29, 21, 150, 170
    r = rng(11)
    x, y = nonzero(r, (rows, k)), nonzero(r, (rows, n))
    d, u = factors(12, rank, k, n)
    yo = runner.upload(y)
    runner.lora(runner.upload(x), yo, yo, *runner.lora_factors(d, u), rows, k, n, rank)
    assert rel_err(runner.download(yo, (rows, n)), lora_ref(y, x, d, u)) < TOL


def test_half_io_lora(half_runner):
    rows, k, n, rank = 37, 13, 9, 5
    r = rng(13)
    x, y = halved(nonzero(r, (rows, k))), halved(nonzero(r, (rows, n), 2.0))
    d, u = factors(14, rank, k, n)
    out = half_runner.empty((rows, n))
    half_runner.lora(half_runner.upload(x), half_runner.upload(y), out, *half_runner.lora_factors(d, u), rows, k,
                     n, rank)
    assert rel_err(half_runner.download(out, (rows, n)), lora_ref(y, x, d, u)) < HALF_TOL


# ---------------------------------------------------------------------------
# The op through the library (libdifflite_delegate.so, backend=opencl): lora_opencl.cc's host code
# (plan, slots, factor upload, launches) and the backend's memory plan on PoCL.


@pytest.mark.parametrize("kernels", ["flat", "tiled"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_delegate_lora(tmp_path, opencl_lib, precision, kernels):
    """y and x fed to the op: no factors, the output is y (in half storage: y rounded to half) bit for
    bit; rank 4, 16, 70, then 0; with the CPU-like devices' flat GEMM and the GPUs' tiled one."""
    half = precision == "fp16"
    r = rng(20)
    y, x = nonzero(r, (2, 9, 11), 3.0), nonzero(r, (2, 9, 14))
    if half:
        y, x = halved(y), halved(x)
    loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=1), opencl_lib,
                    options={"backend": "opencl", "precision": precision, "kernels": kernels})
    (out,) = loaded.run(y, x)
    assert np.array_equal(out, y)
    for rank in (4, 16, 70):
        d, u = factors(rank, rank, 14, 11)
        loaded.set(1, d, u)
        assert rel_err(loaded.run(y, x)[0], lora_ref(y, x, d, u)) < (HALF_TOL if half else TOL), rank
    loaded.set(1, None, None)
    assert np.array_equal(loaded.run(y, x)[0], y)


def test_delegate_lora_on_tensor_core_tiles(tmp_path, opencl_lib, monkeypatch):
    """At half storage the two GEMMs, the up one adding into y in place (GEMM_ACC), take the
    tensor-core tiles (gemm_mma.cl; emulated in OpenCL C where the device has none): rows and
    columns past 16, ranks past one 32-deep slice."""
    monkeypatch.setenv("DIFFLITE_TENSOR_CORES", "emulate")
    r = rng(21)
    y, x = halved(nonzero(r, (2, 40, 36), 3.0)), halved(nonzero(r, (2, 40, 48)))
    loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=1), opencl_lib,
                    options={"backend": "opencl", "precision": "fp16", "kernels": "tiled"})
    for rank in (24, 70):
        d, u = factors(rank, rank, 48, 36)
        loaded.set(1, d, u)
        assert rel_err(loaded.run(y, x)[0], lora_ref(y, x, d, u)) < HALF_TOL, rank


def test_delegate_half_factors(tmp_path, opencl_lib):
    """Half storage keeps the factors in half: D and U are balanced first, so a LoRA whose up weights
    lie in half's subnormals (5e-7) and whose down weights would overflow half's t (5e4) still adds
    its delta to half's precision; factors whose balanced values pass half's range are refused in
    one line, and the slot keeps what it had."""
    r = rng(24)
    y, x = halved(nonzero(r, (3, 7, 10))), halved(nonzero(r, (3, 7, 12)))
    loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=2), opencl_lib,
                    options={"backend": "opencl", "precision": "fp16"})
    d, u = factors(25, 8, 12, 10)
    d, u = d * 1e5, u * 1e-6
    loaded.set(2, d, u)
    want = lora_ref(y, x, d, u)
    assert rel_err(loaded.run(y, x)[0] - y, want - y) < 1e-2
    with pytest.raises(BadInput, match="^slot 2's factors exceed half precision's range"):
        loaded.set(2, d, u * 1e12)
    assert rel_err(loaded.run(y, x)[0] - y, want - y) < 1e-2


@pytest.mark.parametrize("precision,width", [("fp32", 4), ("fp16", 2)])
def test_delegate_counts_its_factor_bytes(tmp_path, opencl_lib, precision, width):
    """difflite_lora_bytes: the factors as the device holds them, in the storage type (half storage:
    a half-precision LoRA file's own bytes), 0 once cleared; -1 (BadInput) for a pointer that is
    not a live delegate."""
    from difflite.runtime.lora_factors import factor_bytes

    loaded = Loaded(lora_only_model(tmp_path / "m.tflite", (4, 11), (4, 14), slot=5), opencl_lib,
                    options={"backend": "opencl", "precision": precision})
    assert factor_bytes(opencl_lib, loaded.delegate) == 0
    loaded.set(5, *factors(26, 6, 14, 11))
    assert factor_bytes(opencl_lib, loaded.delegate) == (14 * 6 + 6 * 11) * width
    loaded.set(5, None, None)
    assert factor_bytes(opencl_lib, loaded.delegate) == 0
    with pytest.raises(BadInput, match="not a live difflite delegate"):
        factor_bytes(opencl_lib, 16)


@pytest.mark.parametrize("model", [fc_model, conv_model])
def test_delegate_layers(tmp_path, opencl_lib, model):
    """The op after the layer it belongs to, both on the device: a FULLY_CONNECTED ([B, L, C]) and a
    1x1 CONV_2D (NHWC)."""
    r = rng(21)
    if model is fc_model:
        x, w, b = nonzero(r, (3, 5, 19)), nonzero(r, (23, 19), 0.5), nonzero(r, (23,))
    else:
        x, w, b = nonzero(r, (1, 6, 5, 19)), nonzero(r, (23, 1, 1, 19), 0.5), nonzero(r, (23,))
    y = fc_ref(x, w.reshape(23, 19), b, True)
    loaded = Loaded(model(tmp_path / "m.tflite", x, w, b, slot=3), opencl_lib, options={"backend": "opencl"})
    (plain,) = loaded.run(x)
    assert rel_err(plain, y) < TOL
    d, u = factors(22, 8, 19, 23)
    loaded.set(3, d, u)
    assert rel_err(loaded.run(x)[0], lora_ref(y, x, d, u)) < TOL
    loaded.set(3, None, None)
    assert np.array_equal(loaded.run(x)[0], plain)


def test_delegate_no_factors_costs_nothing(tmp_path, opencl_lib):
    """No factors: no kernel (profile=1 lists none for the op) and no buffer (out is y's: the arena
    holds y and x only); factors set: the op's kernel runs."""
    r = rng(23)
    y, x = nonzero(r, (5, 7, 12)), nonzero(r, (5, 7, 10))
    stats_path = tmp_path / "stats.json"
    loaded = Loaded(lora_only_model(tmp_path / "m.tflite", y.shape, x.shape, slot=4), opencl_lib,
                    options={"backend": "opencl", "profile": "1", "stats_path": str(stats_path)})
    loaded.run(y, x)
    stats = json.loads(stats_path.read_text())
    assert stats["arena_bytes"] == (y.size + x.size) * 4, stats
    assert stats["invokes"] == 1 and LORA not in stats["profile_ms_per_invoke"], stats
    d, u = factors(24, 4, 10, 12)
    loaded.set(4, d, u)
    assert rel_err(loaded.run(y, x)[0], lora_ref(y, x, d, u)) < TOL
    stats = json.loads(stats_path.read_text())
    assert stats["invokes"] == 2 and LORA in stats["profile_ms_per_invoke"], stats


def test_delegate_y_read_elsewhere_keeps_its_values(tmp_path, opencl_lib):
    """Where y is a graph output, or a later node reads it, the op must not add into y's buffer:
    the plan declines the alias, and the op writes a buffer of its own (y copied without factors)."""
    r = rng(25)
    x, w, b = nonzero(r, (2, 3, 10)), nonzero(r, (6, 10), 0.5), nonzero(r, (6,))
    m = OpModel()
    xi = m.activation("x", x.shape)
    y, out = m.activation("y", (2, 3, 6)), m.activation("out", (2, 3, 6))
    s = m.activation("s", (2, 3, 6))
    m.builtin("FULLY_CONNECTED", [xi, m.constant("w", w), m.constant("b", b)], [y], keepNumDims=True)
    m.custom(LORA, [y, xi], [out], {"slot": 6})
    m.builtin("ADD", [y, out], [s])  # reads y after the op
    path = m.save(tmp_path / "m.tflite", [xi], [y, out, s])
    want_y = fc_ref(x, w, b, True)
    loaded = Loaded(path, opencl_lib, options={"backend": "opencl"})
    got_y, got_out, got_s = loaded.run(x)
    assert np.array_equal(got_out, got_y) and rel_err(got_y, want_y) < TOL
    d, u = factors(26, 5, 10, 6)
    loaded.set(6, d, u)
    got_y, got_out, got_s = loaded.run(x)
    want_out = lora_ref(want_y, x, d, u)
    assert rel_err(got_y, want_y) < TOL and rel_err(got_out, want_out) < TOL
    assert rel_err(got_s, want_y + want_out) < TOL


@pytest.mark.parametrize("between", [False, True])
def test_delegate_two_slots_and_partitions(tmp_path, opencl_lib, between):
    """Two slots, set and cleared independently; with an ELU between (no OpenCL kernel) the model is
    two partitions, each holding its slot."""
    model = TwoSlots(tmp_path / "two.tflite", between)
    stats_path = tmp_path / "stats.json"
    loaded = Loaded(model.path, opencl_lib, options={"backend": "opencl", "stats_path": str(stats_path)})
    assert json.loads(stats_path.read_text())["partitions"] == (2 if between else 1)
    a, b = model.SLOTS
    f1, f2 = factors(27, 4, 13, 9), factors(28, 33, 9, 11)
    for want_f1, want_f2, step in [(None, None, (b, None, None)), (f1, None, (a, *f1)), (f1, f2, (b, *f2)),
                                   (None, f2, (a, None, None))]:
        loaded.set(*step)
        for got, want in zip(loaded.run(model.x), model.ref(want_f1, want_f2)):
            assert rel_err(got, want) < TOL


def test_delegate_errors_leave_the_factors(tmp_path, opencl_lib):
    r = rng(29)
    x, w, b = nonzero(r, (2, 7, 13)), nonzero(r, (9, 13), 0.5), nonzero(r, (9,))
    loaded = Loaded(fc_model(tmp_path / "fc.tflite", x, w, b, slot=8), opencl_lib, options={"backend": "opencl"})
    d, u = factors(30, 4, 13, 9)
    loaded.set(8, d, u)
    check_errors(loaded, 8, 13, 9, [x], lora_ref(fc_ref(x, w, b, True), x, d, u), TOL)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_delegate_float16_tensors(tmp_path, opencl_lib, precision):
    """float16 y, x and output (the contract allows them): held as floats in the storage type,
    converted at the partition's boundary."""
    r = rng(31)
    y, x = halved(nonzero(r, (3, 5, 7), 2.0)), halved(nonzero(r, (3, 5, 9)))
    loaded = Loaded(lora_only_model(tmp_path / "h.tflite", y.shape, x.shape, slot=2, dtype=np.float16), opencl_lib,
                    options={"backend": "opencl", "precision": precision})
    (out,) = loaded.run(y, x)
    assert out.dtype == np.float16 and np.array_equal(out.astype(np.float32), y)
    d, u = factors(32, 6, 9, 7)
    loaded.set(2, d, u)
    assert rel_err(loaded.run(y, x)[0], lora_ref(y, x, d, u)) < HALF_TOL
