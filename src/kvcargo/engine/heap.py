"""Binary min-heaps in plain arrays: the pending events, and each decode instance's finishing
requests.

A set of heaps shares two arrays: heap ``h`` holds its entries in ``keys[h, :n]`` (a float, the
first sort key) and ``items[h, :n]`` (the tie-breaker, then two payload integers); entries
order by (key, tie-breaker). The caller keeps each heap's length ``n`` where it belongs (the
event count, an instance's column) and stores the new length after a push or a pop.

The comparisons and moves are written out rather than called: compiled, a call per comparison
inside the sift loop costs more than the comparison.
"""

from __future__ import annotations

import numpy as np

from kvcargo._jit import kernel
from kvcargo.engine.layout import Table

ITEMS = Table(np.int64, TIE=0, A=0, B=0)
"""Columns of ``items``: the tie-breaker and the two payload integers."""
TIE, A, B = ITEMS.numbers


@kernel(inline=True)
def heap_push(keys, items, h, n, key, tie, a, b):
    """Insert (key, tie; a, b) into heap ``h`` of ``n`` entries (it then has ``n + 1``)."""
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if keys[h, parent] < key or (keys[h, parent] == key and items[h, parent, TIE] < tie):
            break
        keys[h, i] = keys[h, parent]
        items[h, i, TIE] = items[h, parent, TIE]
        items[h, i, A] = items[h, parent, A]
        items[h, i, B] = items[h, parent, B]
        i = parent
    keys[h, i] = key
    items[h, i, TIE] = tie
    items[h, i, A] = a
    items[h, i, B] = b


@kernel(inline=True)
def heap_pop(keys, items, h, n):
    """Remove the first entry of heap ``h`` of ``n`` entries (it then has ``n - 1``); read it
    first at ``keys[h, 0]``, ``items[h, 0]``."""
    n -= 1
    key, tie, a, b = keys[h, n], items[h, n, TIE], items[h, n, A], items[h, n, B]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        right = child + 1
        if right < n and (keys[h, right] < keys[h, child]
                          or (keys[h, right] == keys[h, child] and items[h, right, TIE] < items[h, child, TIE])):
            child = right
        if not (keys[h, child] < key or (keys[h, child] == key and items[h, child, TIE] < tie)):
            break
        keys[h, i] = keys[h, child]
        items[h, i, TIE] = items[h, child, TIE]
        items[h, i, A] = items[h, child, A]
        items[h, i, B] = items[h, child, B]
        i = child
    keys[h, i] = key
    items[h, i, TIE] = tie
    items[h, i, A] = a
    items[h, i, B] = b
