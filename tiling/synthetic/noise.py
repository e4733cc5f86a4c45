"""Smooth random fields: fractal value noise on a hashed integer lattice.

A field's value at a point is a pure function of the point's coordinates in metres, the seed
and the field's name. Nothing is stored per world, so any window of an unbounded plane can be
rendered on its own and still meet its neighbours exactly: this is what lets synthetic forests
and lakes run across scene edges while only one scene is held in memory.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_HASH_Y, _HASH_X = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03)
_LACUNARITY = 2.13  # not 2: octave lattices never line up


def lattice_values(iy: I64, ix: I64, key: np.uint64) -> F32:
    """Uniform values in [-1, 1) at integer lattice points (iy, ix), broadcast together.

    A pure function of (iy, ix, key): a SplitMix64 hash, so no table is held and the lattice
    has no period within the int64 range.
    """
    h = (iy.astype(np.uint64) * _HASH_Y) ^ (ix.astype(np.uint64) * _HASH_X) ^ key
    h ^= h >> np.uint64(30)  # SplitMix64 finaliser
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return (h >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-23) - np.float32(1.0)


def smootherstep(t: F64) -> F32:
    """6t^5 - 15t^4 + 10t^3: 0 at t=0, 1 at t=1, with zero slope and curvature at both ends,
    so interpolated noise shows no creases along lattice lines."""
    return (t * t * t * (t * (t * 6 - 15) + 10)).astype(np.float32)


@dataclass(frozen=True, slots=True)
class NoiseField:
    """Fractal value noise in about [-1, 1]: `octaves` layers, the first with lattice points
    `spacing_m` apart, each next one 2.13 times finer and half as strong.

    `name` picks an independent field: two fields with the same seed but other names are
    uncorrelated.
    """

    name: str
    spacing_m: float
    octaves: int = 1

    def on_grid(self, seed: int, x_m: F64, y_m: F64) -> F32:
        """Values (y_m.size, x_m.size) on the grid of points (y_m[i], x_m[j]).

        Separable: each octave interpolates along x once per lattice row, then along y, so
        the cost is O(pixels) per octave.
        """
        total = np.zeros((y_m.size, x_m.size), dtype=np.float32)
        rows = np.empty_like(total)  # reused: fresh large arrays cost a page fault per 4 KiB
        for spacing, key, weight, shift in self._octave_params(seed):
            rx, tx, x0, nx = _axis(x_m / spacing + shift)
            ry, ty, y0, ny = _axis(y_m / spacing + shift)
            lattice = lattice_values(
                np.arange(y0, y0 + ny)[:, None], np.arange(x0, x0 + nx)[None, :], key
            )
            along_x = _lerp(lattice[:, rx], lattice[:, rx + 1], tx)
            along_x *= np.float32(weight)
            total += np.take(along_x, ry, axis=0, out=rows)
            np.take(np.diff(along_x, axis=0), ry, axis=0, out=rows)
            rows *= ty[:, None]
            total += rows
        return total

    def at(self, seed: int, x_m: F64, y_m: F64) -> F32:
        """Values at scattered points (x_m, y_m) of any one shape: the field `on_grid` samples,
        to float rounding (about 1e-6)."""
        total = np.zeros(x_m.shape, dtype=np.float32)
        for spacing, key, weight, shift in self._octave_params(seed):
            sx, sy = x_m / spacing + shift, y_m / spacing + shift
            ix, iy = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
            tx, ty = smootherstep(sx - ix), smootherstep(sy - iy)
            top = _lerp(lattice_values(iy, ix, key), lattice_values(iy, ix + 1, key), tx)
            bottom = _lerp(lattice_values(iy + 1, ix, key), lattice_values(iy + 1, ix + 1, key), tx)
            total += weight * _lerp(top, bottom, ty)
        return total

    def _octave_params(self, seed: int) -> list[tuple[float, np.uint64, float, float]]:
        """(lattice spacing in metres, hash key, weight, lattice offset in cells) per octave;
        the weights sum to 1."""
        name_crc = zlib.crc32(self.name.encode())
        keys = np.random.SeedSequence([seed, name_crc]).generate_state(self.octaves, np.uint64)
        amplitudes = [0.5**o for o in range(self.octaves)]
        return [
            (
                self.spacing_m / _LACUNARITY**o,
                np.uint64(keys[o]),
                amplitudes[o] / sum(amplitudes),
                int(keys[o] % np.uint64(1000))
                / 1000.0,  # the octaves' lattices never all meet at 0
            )
            for o in range(self.octaves)
        ]


def _lerp(a: F32, b: F32, t: F32) -> F32:
    return a * (1 - t) + b * t


def _axis(s: F64) -> tuple[I64, F32, int, int]:
    """For coordinates `s` in lattice cells: each one's cell relative to the first cell, its
    smoothed position in the cell, the first cell, and how many lattice points the cells span."""
    i = np.floor(s)
    t = smootherstep(s - i)
    idx = i.astype(np.int64)
    lo = int(idx.min())
    return idx - lo, t, lo, int(idx.max()) - lo + 2
