"""Gaussian noise equal to `torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))`
without importing torch (about 3 s and 220 MB of a process that only needs the numbers).

PyTorch's CPU generator is a 32-bit Mersenne Twister seeded with the low 32 bits of the seed
(init_genrand). A float32 `randn` of n >= 16 values draws n uniforms u = (word & 0xFFFFFF) / 2^24
and turns each block of 16 into normals by Box-Muller: for j < 8, with u1 = 1 - u[j] and
u2 = u[j + 8], r = sqrt(-2 log u1), out[j] = r cos(2 pi u2), out[j + 8] = r sin(2 pi u2). When n is
not a multiple of 16 it draws 16 more uniforms and redoes the last 16 values from them. Successive
draws continue the same stream, as successive `randn` calls on one generator do.

PyTorch evaluates log / cos / sin with its vectorised (SLEEF) float functions; NumPy's float32
functions differ from them by at most an ulp or two, so values agree to about 5e-7 (the tests
check it against torch), far below what a 20-step denoising loop or a PNG can show."""

from __future__ import annotations

import numpy as np

from difflite.core.errors import BadInput

_MIN_VALUES = 16  # below this torch takes a scalar double-precision path no caller here needs
SEEDS = range(-2**63, 2**64)  # what torch.Generator.manual_seed accepts


def check_seed(seed: int, option: str = "--seed") -> None:
    if seed not in SEEDS:
        raise BadInput(f"{option} {seed} is outside torch.Generator's seeds, -2^63 to 2^64-1")


class TorchGenerator:
    """A stand-in for `torch.Generator("cpu").manual_seed(seed)` that only draws `randn`."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._bits = np.random.MT19937(0)
        # torch keeps seeds in [-2^63, 2^64) as uint64 and seeds the twister with the low 32 bits
        self._bits._legacy_seeding(self.seed % 2**32)

    def _uniforms(self, count: int) -> np.ndarray:
        words = self._bits.random_raw(count).astype(np.uint32)
        return (words & np.uint32(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)

    def randn(self, shape) -> np.ndarray:
        """Standard normal float32 values of `shape`, as `torch.randn(shape, generator=g)`."""
        shape = tuple(int(d) for d in shape)
        count = int(np.prod(shape, dtype=np.int64))
        if count < _MIN_VALUES:
            raise ValueError(f"randn of {count} values: fewer than {_MIN_VALUES} is not supported")
        uniforms = self._uniforms(count)
        values = np.empty(count, dtype=np.float32)
        whole = count - count % 16
        values[:whole] = _box_muller_blocks(uniforms[:whole])
        if whole != count:
            values[count - 16:] = _box_muller_blocks(self._uniforms(16))
        return values.reshape(shape)


def _box_muller_blocks(uniforms: np.ndarray) -> np.ndarray:
    blocks = uniforms.reshape(-1, 16)
    radius = np.sqrt(np.float32(-2.0) * np.log(np.float32(1.0) - blocks[:, :8]))
    theta = np.float32(2.0 * np.pi) * blocks[:, 8:]
    return np.concatenate([radius * np.cos(theta), radius * np.sin(theta)], axis=1).reshape(-1)


__all__ = ["TorchGenerator"]
