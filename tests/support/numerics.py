"""Random inputs, float64 references and the error measure that the op tests share (the ops'
tests/test_op_*.py on both backends, the OpenCL builtins', the quantized-weight tests).

Layouts are TFLite's: activations NHWC, convolution filters OHWI, fully connected weights
[out, in]. Every reference computes in float64."""

from __future__ import annotations

import math

import numpy as np

SAME, VALID = 0, 1  # schema Padding


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def nonzero(r: np.random.Generator, shape, scale=1.0, offset=0.0) -> np.ndarray:
    """float32 values in +-[0.1, 1] x scale, + offset: bounded away from zero, random signs."""
    v = r.uniform(0.1, 1.0, size=shape) * r.choice([-1.0, 1.0], size=shape)
    return (v * scale + offset).astype(np.float32)


def rel_err(got, want) -> float:
    """max |got - want| / max |want|, after checking the shapes agree and that every element of
    `got` is finite (the runners poison outputs with NaN: one left unwritten fails here)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), "non-finite output (an element left unwritten?)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def psnr(a, b) -> float:
    """PSNR in dB of two pictures in [0, 1] (inf where they are equal)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def assert_close(got, want, tol: float) -> None:
    """rel_err(got, want) <= tol."""
    err = rel_err(got, want)
    assert err <= tol, f"relative error {err:.3g} > {tol}"


_erf = np.vectorize(math.erf)


def erf(x) -> np.ndarray:
    return _erf(np.asarray(x, dtype=np.float64))


def gelu_ref(x, approximate: str) -> np.ndarray:
    """difflite.Gelu: approximate "erf", "tanh", or else the sigmoid form x * sigmoid(1.702 x)."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "erf":
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return x / (1.0 + np.exp(-1.702 * x))


def geglu_ref(x, approximate: str) -> np.ndarray:
    """difflite.GeGLU: the first half of the last axis times gelu_ref of the second half."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1] // 2
    return x[..., :d] * gelu_ref(x[..., d:], approximate)


def group_norm_ref(x, gamma, beta, groups: int, eps: float, activation: str = "none") -> np.ndarray:
    """difflite.GroupNorm over channels-last x ([N, ..., C]); biased variance; activation "silu"
    or "none"."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[0], x.shape[-1]
    xr = x.reshape(n, -1, groups, c // groups)
    mean = xr.mean(axis=(1, 3), keepdims=True)
    var = xr.var(axis=(1, 3), keepdims=True)
    y = ((xr - mean) / np.sqrt(var + eps)).reshape(x.shape) * gamma + beta
    if activation == "silu":
        y = y / (1.0 + np.exp(-y))
    return y


def attention_ref(q, k, v, heads: int, scale: float, causal: bool) -> np.ndarray:
    """difflite.Attention: q [N, Lq, heads x dk], k [N, Lk, heads x dk], v [N, Lk, heads x dv]."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n, lq, hdk = q.shape
    lk = k.shape[1]
    dk, dv = hdk // heads, v.shape[2] // heads
    qh = q.reshape(n, lq, heads, dk).transpose(0, 2, 1, 3)
    kh = k.reshape(n, lk, heads, dk).transpose(0, 2, 1, 3)
    vh = v.reshape(n, lk, heads, dv).transpose(0, 2, 1, 3)
    s = scale * qh @ kh.transpose(0, 1, 3, 2)
    if causal:
        s = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None], -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(n, lq, heads * dv)


def conv_ref(x, w, b, stride=(1, 1), dilation=(1, 1), padding=SAME) -> np.ndarray:
    """CONV_2D: x NHWC, w OHWI, b [O] or None; TFLite's SAME (total padding // 2 before) or
    VALID."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, h, wd, c = x.shape
    o, kh, kw, _ = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    ekh, ekw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if padding == SAME:
        oh, ow = -(-h // sh), -(-wd // sw)
        pt, pl = max((oh - 1) * sh + ekh - h, 0) // 2, max((ow - 1) * sw + ekw - wd, 0) // 2
    else:
        oh, ow, pt, pl = (h - ekh) // sh + 1, (wd - ekw) // sw + 1, 0, 0
    xp = np.zeros((n, max(pt + h, (oh - 1) * sh + ekh), max(pl + wd, (ow - 1) * sw + ekw), c))
    xp[:, pt:pt + h, pl:pl + wd] = x
    out = np.zeros((n, oh, ow, o))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            out += np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :])
    return out + (0 if b is None else b)


def fc_ref(x, w, b, keep_num_dims: bool = False) -> np.ndarray:
    """FULLY_CONNECTED: x [..., in] flattened to [-1, in] (or its leading dimensions kept), w
    [out, in], b [out] or None."""
    y = np.asarray(x, dtype=np.float64).reshape(-1, w.shape[1]) @ np.asarray(w, dtype=np.float64).T
    y = y + (0 if b is None else b)
    return y.reshape(*x.shape[:-1], w.shape[0]) if keep_num_dims else y
