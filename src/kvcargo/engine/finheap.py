"""Per-instance min-heaps of (finish-step ordinal, request) pairs, stored in one array.

A decode instance runs at most ``max_batch`` requests, so each heap lives in one row of a
preallocated ``(instances, max_batch, 2)`` array; the heap's length is the instance's
``D_FIN_N`` column.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.state import D_FIN_N


@kernel(inline=True)
def _less(ak, ar, bk, br):
    return ak < bk or (ak == bk and ar < br)


@kernel(inline=True)
def heap_push(h, rows, d, key, rid):
    """Insert (key, rid) into the heap of instance ``d``."""
    i = rows[d, D_FIN_N]
    rows[d, D_FIN_N] = i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(key, rid, h[d, parent, 0], h[d, parent, 1]):
            break
        h[d, i, 0] = h[d, parent, 0]
        h[d, i, 1] = h[d, parent, 1]
        i = parent
    h[d, i, 0] = key
    h[d, i, 1] = rid


@kernel(inline=True)
def heap_pop(h, rows, d):
    """Remove the smallest (key, rid) of instance ``d``'s heap and return its request."""
    top = h[d, 0, 1]
    n = rows[d, D_FIN_N] - 1
    rows[d, D_FIN_N] = n
    key, rid = h[d, n, 0], h[d, n, 1]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _less(h[d, child + 1, 0], h[d, child + 1, 1], h[d, child, 0], h[d, child, 1]):
            child += 1
        if not _less(h[d, child, 0], h[d, child, 1], key, rid):
            break
        h[d, i, 0] = h[d, child, 0]
        h[d, i, 1] = h[d, child, 1]
        i = child
    h[d, i, 0] = key
    h[d, i, 1] = rid
    return top
