"""The checks that weights are finite: after merging a LoRA, after swapping in a VAE, on every
convolution and linear weight the TFLite writer stores, and on every constant whose storage
(float16: beyond +-65504) would turn a finite value into an infinity; and no constant may hold a
NaN. Other graph constants may be infinite on purpose (an attention mask's -inf): those are
written as they are."""

from __future__ import annotations

import numpy as np

from difflite.core.errors import BadInput

FLOAT16_MAX = float(np.finfo(np.float16).max)


class NonFiniteWeights(BadInput):
    """Weights with NaN or infinite values (exit 2: the input, or what it was merged with, makes them)."""


def check_finite(values, what: str) -> None:
    """Raise NonFiniteWeights naming `what` where any of `values` (a float NumPy array, or a
    detached CPU torch tensor: read in place) is NaN or infinite."""
    array = np.asarray(values)
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return
    bad = array.size - int(np.count_nonzero(np.isfinite(array)))
    where = f" stored as float16 (at most +-{FLOAT16_MAX:g})" if array.dtype == np.float16 else ""
    raise NonFiniteWeights(f"{what}{where}: {bad} of its {array.size} values are NaN or infinite")


def check_storable(source, stored, what: str) -> None:
    """Raise NonFiniteWeights naming `what` where storing made a finite value of `source` infinite
    (`stored` is `source` converted to the storage type)."""
    source, stored = np.asarray(source), np.asarray(stored)
    overflowed = np.isfinite(source) & ~np.isfinite(stored)
    if overflowed.any():
        raise NonFiniteWeights(f"{what} stored as {stored.dtype} (at most +-{float(np.finfo(stored.dtype).max):g}): "
                               f"{int(overflowed.sum())} of its {source.size} values overflow")


def check_no_nan(values, what: str) -> None:
    """Raise NonFiniteWeights naming `what` where any of the float `values` is NaN."""
    array = np.asarray(values)
    if array.dtype.kind == "f" and np.isnan(array).any():
        raise NonFiniteWeights(f"{what}: {int(np.isnan(array).sum())} of its {array.size} values are NaN")
