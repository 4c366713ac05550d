"""The one check that weights about to be used or written are finite: after merging a LoRA,
after swapping in a VAE, and on every float constant the TFLite writer stores (where float16
storage turns a value beyond +-65504 into an infinity)."""

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
