"""A decode-side prefix cache (``--decode-prefix-cache``): only the prompt blocks the receiving
instance lacks cross the link.

Traces such as Mooncake's give every request the ids of its 512-token prompt blocks (equal ids:
a shared prefix). Each decode instance keeps the blocks it has received in an LRU list, within
its spare KV memory (capacity minus what running requests reserved), trimmed whenever blocks
arrive. The receiver is chosen before the transfer, so the hand-off's size is known then.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.lists import lru_listed, lru_touch, lru_unlink
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


@kernel(refcounts=False)
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
        if not lru_listed(st.lru, d, pr.blocks[k]):
            missing += tokens
    st.tx[r, SEND_FRAC] = min(1.0, missing / prompt)


@kernel(refcounts=False)
def cache_blocks(st, pr, r, d):
    """Request ``r``'s blocks have arrived at ``d``: make them the most recent, then evict the
    least recent while the cache exceeds the instance's spare KV memory."""
    for k in range(pr.block_offsets[r], pr.block_offsets[r + 1]):
        lru_touch(st.lru, st.d, d, D_LRU_HEAD, D_LRU_TAIL, D_LRU_N, pr.blocks[k])
    spare = max(0, pr.ints[P_KVCAP] - st.d[d, D_KV_USED])
    while st.d[d, D_LRU_N] * pr.ints[P_BLOCK_TOKENS] > spare and st.d[d, D_LRU_TAIL] >= 0:
        lru_unlink(st.lru, st.d, d, D_LRU_HEAD, D_LRU_TAIL, D_LRU_N, st.d[d, D_LRU_TAIL])
