"""A decode-side prefix cache (``--decode-prefix-cache``): only the prompt blocks the receiving
instance lacks cross the link.

Traces such as Mooncake's give every request the ids of its 512-token prompt blocks (equal ids:
a shared prefix). Each decode instance keeps the blocks it has received in an LRU list, within
its spare KV memory (capacity minus what running requests reserved), trimmed whenever blocks
arrive. The receiver is chosen before the transfer, so the hand-off's size is known then.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.state import (
    D_KV_USED,
    D_LRU_HEAD,
    D_LRU_N,
    D_LRU_TAIL,
    P_BLOCK_TOKENS,
    P_KVCAP,
    PROMPT,
    SEND_FRAC,
)

NOT_CACHED = -2


@kernel
def missing_fraction(st, pr, r, d):
    """Record the share of request ``r``'s prompt that instance ``d`` does not hold (blocks are
    full but the last, which holds the rest of the prompt)."""
    lo, hi = pr.block_offsets[r], pr.block_offsets[r + 1]
    prompt = pr.ri[r, PROMPT]
    size = pr.ints[P_BLOCK_TOKENS]
    if hi == lo:
        st.tx[r, SEND_FRAC] = 1.0
        return
    missing = 0
    for k in range(lo, hi):
        tokens = size if k < hi - 1 else max(0, prompt - size * (hi - lo - 1))
        if st.lru[d, pr.blocks[k], 0] == NOT_CACHED:
            missing += tokens
    st.tx[r, SEND_FRAC] = min(1.0, missing / prompt)


@kernel(inline=True)
def _unlink(st, d, b):
    prev, nxt = st.lru[d, b, 0], st.lru[d, b, 1]
    if prev >= 0:
        st.lru[d, prev, 1] = nxt
    else:
        st.d[d, D_LRU_HEAD] = nxt
    if nxt >= 0:
        st.lru[d, nxt, 0] = prev
    else:
        st.d[d, D_LRU_TAIL] = prev
    st.lru[d, b, 0] = NOT_CACHED
    st.lru[d, b, 1] = NOT_CACHED
    st.d[d, D_LRU_N] -= 1


@kernel
def cache_blocks(st, pr, r, d):
    """Request ``r``'s blocks have arrived at ``d``: make them the most recent, then evict the
    least recent while the cache exceeds the instance's spare KV memory."""
    for k in range(pr.block_offsets[r], pr.block_offsets[r + 1]):
        b = pr.blocks[k]
        if st.lru[d, b, 0] != NOT_CACHED:
            _unlink(st, d, b)
        head = st.d[d, D_LRU_HEAD]
        st.lru[d, b, 0] = -1
        st.lru[d, b, 1] = head
        if head >= 0:
            st.lru[d, head, 0] = b
        else:
            st.d[d, D_LRU_TAIL] = b
        st.d[d, D_LRU_HEAD] = b
        st.d[d, D_LRU_N] += 1
    spare = max(0, pr.ints[P_KVCAP] - st.d[d, D_KV_USED])
    while st.d[d, D_LRU_N] * pr.ints[P_BLOCK_TOKENS] > spare and st.d[d, D_LRU_TAIL] >= 0:
        _unlink(st, d, st.d[d, D_LRU_TAIL])
