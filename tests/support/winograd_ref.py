"""Winograd F(4x4, 3x3) in NumPy: the weight transform shared by the tests and
the compiler pass (defined in difflite/core/winograd.py), plus a slow reference of the whole algorithm.

Interpolation points 0, 1, -1, 2, -2 and infinity. For one 6x6 input tile d and
one 3x3 filter g (cross-correlation, as in deep-learning convolutions):

    y (4x4) = A^T [ (G g G^T) * (B^T d B) ] A        (* = elementwise)

The transformed weights for difflite.WinogradConv3x3 are U = G g G^T laid out
as [36, Cin, Cout] with position index 6*i + j.
"""
from __future__ import annotations

import numpy as np

# The matrices and the weight transform live in difflite/core/winograd.py (one definition shared with
# the compiler pass); re-exported here under the same public names.
from difflite.core.winograd import (
    AT,
    BT,
    G,  # noqa: F401
    transform_weights,  # noqa: F401
)


def conv3x3_nhwc(x: np.ndarray, w_oihw: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Direct 3x3, stride 1, pad 1 convolution in float64 (NHWC in and out)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w_oihw, dtype=np.float64)
    n, h, wd, _ = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros((n, h, wd, w.shape[0]))
    for dy in range(3):
        for dx in range(3):
            y += np.einsum("nhwc,oc->nhwo", xp[:, dy : dy + h, dx : dx + wd, :], w[:, :, dy, dx])
    return y + np.asarray(bias, dtype=np.float64)


def winograd_conv3x3_nhwc(x: np.ndarray, u: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The Winograd algorithm itself in float64, on transformed weights u
    [36, Cin, Cout]; equals conv3x3_nhwc up to rounding."""
    x = np.asarray(x, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64).reshape(6, 6, u.shape[1], u.shape[2])
    n, h, wd, _ = x.shape
    th, tw = -(-h // 4), -(-wd // 4)
    xp = np.zeros((n, 4 * th + 2, 4 * tw + 2, x.shape[3]))
    xp[:, 1 : h + 1, 1 : wd + 1, :] = x
    y = np.zeros((n, 4 * th, 4 * tw, u.shape[3]))
    for ty in range(th):
        for tx in range(tw):
            d = xp[:, 4 * ty : 4 * ty + 6, 4 * tx : 4 * tx + 6, :]  # [n,6,6,ci]
            v = np.einsum("ik,nklc,jl->nijc", BT, d, BT)
            m = np.einsum("nijc,ijco->nijo", v, u)
            y[:, 4 * ty : 4 * ty + 4, 4 * tx : 4 * tx + 4, :] = np.einsum("ai,nijo,bj->nabo", AT, m, AT)
    return y[:, :h, :wd, :] + np.asarray(bias, dtype=np.float64)
