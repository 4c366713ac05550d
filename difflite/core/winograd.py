"""Winograd F(4x4, 3x3): the canonical transform matrices and the weight transform shared by the
compiler pass (difflite/passes/winograd.py), the tests (tests/support/winograd_ref.py re-exports these names) and,
by its definition, the C++ kernel of difflite.WinogradConv3x3 (DESIGN §2).

Interpolation points 0, 1, -1, 2, -2 and infinity. For one 6x6 input tile d and one 3x3 filter g
(cross-correlation, as in deep-learning convolutions):

    y (4x4) = A^T [ (G g G^T) * (B^T d B) ] A        (* = elementwise)

The transformed weights of difflite.WinogradConv3x3 are U = G g G^T laid out as [36, Cin, Cout]
with position index 6*i + j; in its filter form the op takes g itself and its kernels compute U.
"""
from __future__ import annotations

import numpy as np

TILE = 4  # output tile (m); the input tile is TILE + 2
POSITIONS = (TILE + 2) ** 2  # 36 transformed positions per tile
# The OpenCL op's bound on the transformed tiles V + M it holds at once (winograd_conv3x3_opencl.cc:
# kScratchBytes; DIFFLITE_WINOGRAD_SCRATCH_BYTES replaces it at run time): it runs the tiles in bands
# of whole tile rows within it (band_tiles).
SCRATCH_BYTES = 67108864  # 64 MiB

# Input transform B^T (6x6).
BT = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)

# Filter transform G (6x3).
G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    dtype=np.float64,
)

# Output transform A^T (4x6).
AT = np.array(
    [
        [1, 1, 1, 1, 1, 0],
        [0, 1, -1, 2, -2, 0],
        [0, 1, 1, 4, 4, 0],
        [0, 1, -1, 8, -8, 1],
    ],
    dtype=np.float64,
)


def transform_weights(w_oihw: np.ndarray) -> np.ndarray:
    """[Cout, Cin, 3, 3] conv weights -> [36, Cin, Cout] float32 (U = G g G^T, computed in float64)."""
    w = np.asarray(w_oihw, dtype=np.float64)
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise ValueError(f"expected [Cout, Cin, 3, 3] weights, got {w.shape}")
    cout, cin = w.shape[:2]
    # U[a, b, i, o] = sum_kl G[a, k] G[b, l] w[o, i, k, l]: one [36, 9] x [9, Cin*Cout] product
    # with the Kronecker product G (x) G (the same G g G^T, far faster than a 3-operand einsum).
    kron = np.einsum("ak,bl->abkl", G, G).reshape(POSITIONS, 9)
    u = kron @ w.transpose(2, 3, 1, 0).reshape(9, cin * cout)  # [36, Cin*Cout]
    return np.ascontiguousarray(u.reshape(POSITIONS, cin, cout), dtype=np.float32)


def transform_macs() -> tuple[int, int]:
    """Multiply-adds of the input transform (B^T d B, per input tile and channel) and of the output
    transform (A^T m A, per tile and output channel) with zero entries of B and A skipped."""
    bt_nonzero = int(np.count_nonzero(BT))  # per column of d, then per row of (B^T d)
    at_nonzero = int(np.count_nonzero(AT))
    side = TILE + 2
    input_macs = 2 * side * bt_nonzero  # B^T d: 6 columns; (B^T d) B: 6 rows
    output_macs = side * at_nonzero + TILE * at_nonzero  # A^T m: 6 columns; (A^T m) A: 4 rows
    return input_macs, output_macs


def filter_transform_macs() -> int:
    """Multiply-adds of U = G g G^T per (Cin, Cout) pair, as the filter-form kernel computes it:
    each of the 36 positions a weighted sum of the 9 taps, zero coefficients skipped."""
    return int(np.count_nonzero(np.einsum("ak,bl->abkl", G, G)))


def band_tiles(n: int, h: int, w: int, cin: int, cout: int, elem: int, bound: int = SCRATCH_BYTES) -> int:
    """Output tiles per band of the OpenCL op (winograd_conv3x3_opencl.cc: BandTiles): all
    N ceil(H/4) ceil(W/4) tiles where their V + M (POSITIONS (cin + cout) elements of `elem` bytes a
    tile) fit `bound`; else the fewest bands of whole tile rows of ceil(W/4) tiles within it (at
    least one row a band), the rows shared evenly. Its V + M scratch is
    POSITIONS * band_tiles(...) * (cin + cout) * elem bytes."""
    tiles_w = -(-w // TILE)
    rows = n * -(-h // TILE)
    fit = int(bound // (POSITIONS * tiles_w * (cin + cout) * elem))
    if fit >= rows:
        return rows * tiles_w
    bands = -(-rows // max(fit, 1))
    return -(-rows // bands) * tiles_w
