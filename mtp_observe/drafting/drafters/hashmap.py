"""An int64 -> int32 hash map in two numpy arrays, for the drafters' compiled (numba) code.

Open addressing with linear probing; capacity a power of two, kept at most half full (the caller
grows it with `grown` between compiled calls: numba code cannot reallocate an array its caller
holds). Deletion shifts later entries of the probe run back (Knuth's algorithm R), so the table
never holds tombstones and a lookup's cost depends only on what is in it. Keys are >= 0; EMPTY
marks a free slot.

    keys [C] int64, values [C] int32;  C = 2^b
    get(keys, values, key) -> value or -1;  put / set / erase
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = np.int64(-1)

# The drafters' compiled loops call small helpers millions of times with the state arrays as
# arguments; with numba's reference counting every such call increfs and decrefs each array
# (~20 ns apiece, 30x the work of the helper). Code that allocates nothing needs no reference
# counts: it is compiled without them (numba's `_nrt=False`), and its callers allocate.
compiled = njit(cache=True, _nrt=False)
compiled_inline = njit(cache=True, _nrt=False, inline="always")


@compiled_inline
def _home(key: np.int64, mask: np.int64) -> np.int64:
    # splitmix64's finaliser: every key bit reaches the low bits that pick the slot
    z = key + np.int64(-7046029254386353131)
    z = (z ^ (z >> np.int64(30))) * np.int64(-4658895280553007687)
    z = (z ^ (z >> np.int64(27))) * np.int64(-7723592293110705685)
    return (z ^ (z >> np.int64(31))) & mask


@compiled_inline
def slot(keys: np.ndarray, key: np.int64) -> np.int64:
    """The slot holding key, or the free slot where it would go."""
    mask = np.int64(keys.shape[0] - 1)
    i = _home(key, mask)
    while keys[i] != key and keys[i] != EMPTY:
        i = (i + 1) & mask
    return i


@compiled_inline
def get(keys: np.ndarray, values: np.ndarray, key: np.int64) -> np.int32:
    i = slot(keys, key)
    if keys[i] == EMPTY:
        return np.int32(-1)
    return values[i]


@compiled
def put(keys: np.ndarray, values: np.ndarray, key: np.int64, value) -> None:
    """Insert or overwrite."""
    i = slot(keys, key)
    keys[i] = key
    values[i] = value


@compiled
def erase(keys: np.ndarray, values: np.ndarray, key: np.int64) -> None:
    """Remove key (which must be present) and close the gap in its probe run."""
    mask = np.int64(keys.shape[0] - 1)
    i = slot(keys, key)
    assert keys[i] == key
    keys[i] = EMPTY
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == EMPTY:
            return
        h = _home(keys[j], mask)
        # the entry at j may stay only if its home lies cyclically in (i, j]
        if i <= j:
            stays = i < h <= j
        else:
            stays = h > i or h <= j
        if not stays:
            keys[i] = keys[j]
            values[i] = values[j]
            keys[j] = EMPTY
            i = j


@njit(cache=True)
def _rehash(keys: np.ndarray, values: np.ndarray, capacity: int):
    new_keys = np.full(capacity, EMPTY, dtype=np.int64)
    new_values = np.zeros(capacity, dtype=np.int32)
    for i in range(keys.shape[0]):
        if keys[i] != EMPTY:
            put(new_keys, new_values, keys[i], values[i])
    return new_keys, new_values


def empty(capacity: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    capacity = 1 << max(4, int(capacity - 1).bit_length())
    return np.full(capacity, EMPTY, dtype=np.int64), np.zeros(capacity, dtype=np.int32)


def grown(keys: np.ndarray, values: np.ndarray, count: int, more: int) -> tuple[np.ndarray, np.ndarray]:
    """The same map with room for `more` insertions beyond its `count` entries (at most half full)."""
    need = 2 * (count + more)
    if need <= keys.shape[0]:
        return keys, values
    capacity = keys.shape[0]
    while capacity < need:
        capacity *= 2
    return _rehash(keys, values, capacity)
