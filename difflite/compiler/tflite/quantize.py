"""Weight-only quantization of convolution and linear weights in TFLite's standard forms.

- int8: symmetric, one scale per output channel (per-axis affine quantization, zero points 0,
  on the stored tensor's output axis), then DEQUANTIZE to float32.
- int4: symmetric and blockwise along the input dimension: the stored tensor's last axis is the
  input one (OHWI filters, [N, K] fully-connected weights), so blocks of B consecutive values
  are rows of the weight seen as [size / B, B] (written [size / B, 1, 1, B]: stock LiteRT's GPU
  takes 4-D runtime weights only). That tensor is stored as INT4 (two values a byte, the even
  element in the low nibble) with one per-tensor scale of 1, DEQUANTIZEd to its integers as
  floats, multiplied (MUL, broadcast) by a [size / B, 1, 1, 1] constant of block scales
  stored as --precision stores weights (float16 + DEQUANTIZE at fp16), then RESHAPEd back to
  the weight's shape. Every stock TFLite runtime runs these as plain ops; the op library folds
  the chain back into one quantized weight (custom_ops/delegate/opencl/claim.cc). Each block's
  scale is the one, among a few candidates rounded as stored, whose integers in [-8, 7] give the
  least squared error (quantize_int4): ~1 dB more SNR than max|w| / 7 on Gaussian weights.

Why not per-axis scales on the [size / B, B] tensor (the plain TFLite form): TFLite stores a
float32 scale and an int64 zero point per quantized index, 12 bytes a block, so int4 at block 32
would cost 4 + 3 bits a weight on disk, and every runtime copies them into its own host memory
at load. Block scales as a float16 tensor cost 4 + 0.5 bits. TFLite's BlockwiseQuantization
details exist in the schema, but LiteRT 2.3's DEQUANTIZE ignores them (probed: zeros out).
Layers too small to matter, and those named to stay float, are left to --precision.

Per-layer widths (the int4 mix's recipe, difflite/compiler/weight_recipe.py) are keyed by weight_digest:
a digest of the weight's float32 values in the writer's layout, so that a layer is found whatever
name the exporter gave its tensor."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

WIDTHS = ("float", "int8", "int4")
DEFAULT_BLOCK = 32
MIN_ELEMENTS = 4096  # smaller weights stay float: the saving is noise, the scales are not
INT8_MAX, INT4_MIN, INT4_MAX = 127, -8, 7
# int4 block scale candidates max|w| / t (quantize_int4): 7 first (the largest value on +-7, kept
# on ties), 8 puts a negative largest value on -8; 7.5 and 8.5 clip a few; then INT4_REFINE
# least-squares rounds from the best. Seeded Gaussian blocks of 32: 20.26 dB at max / 7 alone,
# 20.92 with 8 too, 21.27 with all of these (a fine grid of t from 6 to 10.5: 21.32).
INT4_DIVISORS = (7.0, 7.5, 8.0, 8.5)
INT4_REFINE = 1
INT4_CHUNK_ROWS = 4096  # blocks quantized at a time: the search's buffers stay in the CPU's cache


@dataclass(frozen=True)
class WeightQuantization:
    """What --weights asks of the writer."""
    width: str = "float"
    block: int = DEFAULT_BLOCK
    keep_float: tuple[str, ...] = ()  # weights whose name contains one of these stay float
    min_elements: int = MIN_ELEMENTS
    # weight_digest -> "float" / "int8" / "int4" for the weights `applies` to (the int4 mix)
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)

    def applies(self, name: str, size: int) -> bool:
        return (self.width != "float" and size >= self.min_elements
                and not any(part in name for part in self.keep_float))

    def width_for(self, name: str, array: np.ndarray, digest: str | None = None) -> str:
        """The storage width of one weight in the writer's layout (OHWI / [N, K]): "float" where
        quantization does not apply, else its override or `width`; int4 falls back to int8 where
        the blocks do not tile the input axis. `digest`: weight_digest(array), if known."""
        if not self.applies(name, array.size):
            return "float"
        width = self.width
        if self.overrides:
            width = self.overrides.get(digest or weight_digest(array), width)
        if width == "int4" and not int4_blocks_fit(tuple(array.shape), self.block):
            width = "int8"
        return width


    def lookup_width(self, name: str, size: int) -> str:
        """The storage of a table that GATHER reads rows of (the text encoder's token embedding):
        int8 rows under the int4 and int8 mixes; float otherwise. The mixes' recipes measure the
        table's error with the layers' (weight_recipe), so a text encoder near its bar keeps more
        layers float instead: at int8 the float table was the largest single cost over the int8
        floor (SDXL's two encoders: 96 MiB, issue 32's 3.6 GB pipeline)."""
        return "int8" if self.width in ("int4", "int8") and self.applies(name, size) else "float"


def weight_digest(array: np.ndarray) -> str:
    """A layer's identity: SHA-256 (first 24 hex digits) of its shape and float32 values in C
    order, in the writer's layout (OHWI filters, [N, K] linear weights)."""
    values = np.asarray(array, dtype=np.float32)
    digest = hashlib.sha256(("x".join(map(str, values.shape)) + ":").encode())
    digest.update(np.ascontiguousarray(values).data)
    return digest.hexdigest()[:24]


def value_bytes(width: str, block: int = DEFAULT_BLOCK, scale_bytes: int = 4) -> float | None:
    """Bytes a weight value takes in storage at `width` (scales of `scale_bytes` included); None
    for float."""
    return {"int8": 1.0, "int4": 0.5 + scale_bytes / block}.get(width)


def scale_dtype(precision: str) -> type:
    """The storage type of int4's block scales: that of the weights at --precision."""
    return np.float16 if precision == "fp16" else np.float32


def scale_bytes(precision: str) -> int:
    return np.dtype(scale_dtype(precision)).itemsize


@dataclass
class Quantized:
    """One quantized weight: the stored integers (int8 values; int4 packed) and its scales."""
    width: str
    shape: tuple[int, ...]  # the shape the stored tensor has (int4: [size / block, block])
    data: np.ndarray  # int8 values, or uint8 bytes of packed int4
    scales: np.ndarray  # float32 (int4: values of its scale dtype), one per index of `axis`
    axis: int
    scale_bytes: int = 4  # per scale as stored: int8's float32 quantization parameters; int4's
    # block scales as float16 or float32

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def total_bytes(self) -> int:
        """Values and scales as the file stores them."""
        return self.nbytes + self.scale_bytes * int(self.scales.size)


def _scales(magnitude: np.ndarray, top: float) -> np.ndarray:
    """Symmetric scales magnitude / top from each group's largest magnitude; an all-zero group
    gets scale 1 (its values quantize to 0 either way) so that no scale is 0 or denormal."""
    scales = (magnitude / np.float64(top)).astype(np.float32)
    # (NaN and infinite scales are kept: the builder refuses them, naming the weight)
    return np.where(scales < np.finfo(np.float32).tiny, np.float32(1.0), scales).astype(np.float32)


def _half_scales(magnitude: np.ndarray, top: float) -> np.ndarray:
    """Symmetric scales magnitude / top that float16 holds exactly (as float32 values): rounded
    to float16, and at least its smallest normal (a tinier block's values then round to a few
    steps of it; an all-zero block quantizes to 0 either way). One beyond float16's range stays infinite (and
    a NaN stays NaN): the builder refuses it, naming the weight."""
    with np.errstate(over="ignore"):
        scales = (magnitude / np.float64(top)).astype(np.float16)
    tiny = np.finfo(np.float16).tiny
    return np.where(scales < tiny, np.float16(tiny), scales).astype(np.float32)


def quantize_int8(weight: np.ndarray, axis: int = 0, scales_as=np.float32) -> Quantized:
    """Per-channel symmetric int8 along `axis`, with scales that `scales_as` holds exactly."""
    w = np.asarray(weight, dtype=np.float32)
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    magnitude = np.abs(moved).max(axis=1).astype(np.float64)
    half = np.dtype(scales_as) == np.float16
    scales = _half_scales(magnitude, INT8_MAX) if half else _scales(magnitude, INT8_MAX)
    q = np.clip(np.rint(moved / scales[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    q = np.moveaxis(q.reshape(np.moveaxis(w, axis, 0).shape), 0, axis)
    return Quantized("int8", w.shape, np.ascontiguousarray(q), scales, axis, 2 if half else 4)


def int4_blocks_fit(shape: tuple[int, ...], block: int) -> bool:
    return len(shape) >= 2 and block > 0 and shape[-1] % block == 0


def quantize_int4(weight: np.ndarray, block: int = DEFAULT_BLOCK, scales_as=np.float32,
                  scales: np.ndarray | None = None) -> Quantized:
    """Blockwise symmetric int4 along the last axis, as [size / block, block] rows, with one
    scale a row that `scales_as` (float32 or float16, scale_dtype) holds exactly.

    Each row's scale is the candidate, rounded as stored, whose integers clip(rint(w / scale),
    -8, 7) give the least squared error (_int4_scales): max|w| / t for t in INT4_DIVISORS, 7
    first and kept on ties (so never a larger error than max / 7's, but for the float32
    rounding of the sums compared), 8 using -8 for a negative largest value, then INT4_REFINE
    least-squares refinements <w, q> / <q, q> of the best. Rows are quantized INT4_CHUNK_ROWS
    at a time. As _scales / _half_scales round: an all-zero row
    quantizes to 0; a float16 scale is at least float16's smallest normal; a row whose max / 7
    scale is not finite (a NaN, or past float16's range) keeps that scale (the builder refuses
    it, naming the weight).

    `scales`: this weight's scales from an earlier quantize_int4 at the same block and scales_as
    (in any float dtype that holds them exactly), to store it again without the search (the
    recipe's layers, stored at int4 several times: weight_recipe.Layer)."""
    w = np.asarray(weight, dtype=np.float32)
    if not int4_blocks_fit(w.shape, block):
        raise ValueError(f"int4 blocks of {block} do not tile the last axis of {w.shape}")
    rows = w.reshape(-1, block)
    half = np.dtype(scales_as) == np.float16
    search = scales is None
    if search:
        scales = np.empty(rows.shape[0], np.float32)
    else:
        scales = np.asarray(scales).astype(np.float32)
        if scales.shape != (rows.shape[0],):
            raise ValueError(f"{scales.shape} scales for {rows.shape[0]} int4 blocks")
    q = np.empty(rows.shape, np.int8)
    work = np.empty((min(INT4_CHUNK_ROWS, rows.shape[0]), block), np.float32)
    for start in range(0, rows.shape[0], INT4_CHUNK_ROWS):
        part = rows[start:start + INT4_CHUNK_ROWS]
        span = slice(start, start + part.shape[0])
        x = work[:part.shape[0]]
        if search:
            scales[span] = _int4_scales(part, half, x)
        with np.errstate(invalid="ignore", divide="ignore"):  # a refused NaN / infinite scale's row
            q[span] = _int4_levels(part, scales[span], x)
    return Quantized("int4", rows.shape, pack_int4(q), scales, 0, 2 if half else 4)


def _int4_levels(rows: np.ndarray, scales: np.ndarray, out: np.ndarray) -> np.ndarray:
    """clip(rint(rows / scales), -8, 7) into `out` (float32, rows' shape): the stored integers."""
    np.divide(rows, scales[:, None], out=out)
    np.rint(out, out=out)
    return np.clip(out, INT4_MIN, INT4_MAX, out=out)


def _int4_error(rows: np.ndarray, scales: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Each row's squared error when stored at `scales` (float32, as dequantize computes it)."""
    _int4_levels(rows, scales, work)
    np.multiply(work, scales[:, None], out=work)
    np.subtract(work, rows, out=work)
    return np.einsum("ij,ij->i", work, work)


def _int4_scales(rows: np.ndarray, half: bool, work: np.ndarray) -> np.ndarray:
    """The least-squared-error scale of each row among quantize_int4's candidates, each rounded
    as stored (float16 values where `half`); `work`: a float32 buffer of rows' shape."""
    rounded = _half_scales if half else _scales
    magnitude = np.abs(rows).max(axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        best = rounded(magnitude, INT4_DIVISORS[0])
        # a row whose first scale is not finite keeps it: no candidate compares below -inf
        least = np.where(np.isfinite(best), _int4_error(rows, best, work), -np.inf)

        def consider(candidate: np.ndarray) -> None:
            nonlocal best, least
            error = _int4_error(rows, candidate, work)
            better = error < least
            best = np.where(better, candidate, best)
            least = np.where(better, error, least)

        for divisor in INT4_DIVISORS[1:]:
            consider(rounded(magnitude, divisor))
        for _ in range(INT4_REFINE):  # the scale that fits the best's integers in least squares
            levels = _int4_levels(rows, best, work)
            wq = np.einsum("ij,ij->i", rows, levels).astype(np.float64)
            qq = np.einsum("ij,ij->i", levels, levels).astype(np.float64)
            consider(rounded(np.where(qq > 0, wq / np.where(qq > 0, qq, 1.0), 0.0), 1.0))
    return best


def pack_int4(values: np.ndarray) -> np.ndarray:
    """int8 values in [-8, 7] -> bytes, two a byte: even elements in the low nibble."""
    flat = np.asarray(values, dtype=np.int8).reshape(-1)
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.int8)])
    low = flat[0::2].astype(np.uint8) & 0x0F
    high = (flat[1::2].astype(np.uint8) & 0x0F) << 4
    return (low | high).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """The inverse of pack_int4: `count` sign-extended int8 values."""
    raw = np.asarray(packed, dtype=np.uint8)
    low = (raw & 0x0F).astype(np.int8)
    high = (raw >> 4).astype(np.int8)
    values = np.empty(raw.size * 2, np.int8)
    values[0::2] = np.where(low > 7, low - 16, low)
    values[1::2] = np.where(high > 7, high - 16, high)
    return values[:count]


def dequantize(q: Quantized) -> np.ndarray:
    """The float32 weight a runtime's DEQUANTIZE gives (int4: in the stored [rows, block] shape)."""
    count = int(np.prod(q.shape))
    values = unpack_int4(q.data, count).reshape(q.shape) if q.width == "int4" else q.data
    shape = [1] * len(q.shape)
    shape[q.axis] = -1
    return values.astype(np.float32) * q.scales.reshape(shape)
