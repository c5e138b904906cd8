"""Batch formation: which requests from the head of a queue join the next step.

One rule forms every batch of the default engine — a prefill instance's batch of prompts, a
decode instance's admission at a step boundary, a colocated instance's prefill batch: requests
join in FIFO order while they fit every limit, and the first that does not ends the batch (strict
FIFO: it blocks those behind it). The callers choose the limits.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.state import (
    BNEXT,
    EP_BYTES,
    EP_OPS,
    OUTPUT,
    P_MIXED,
    P_REPLAY_DECODE,
    PREFILL_START,
    PROMPT,
    QUAD,
    RQ_FLOPS,
    RQ_MASK,
    RQ_TOKENS,
    UNITS,
)

UNLIMITED = 1 << 62
"""A limit that never binds."""


@kernel(inline=True)
def take_batch(st, pr, head, max_n, budget, room, kv_used, kv_cap, count_kv):
    """The longest run of queued requests from ``head`` that fits: at most ``max_n`` of them,
    their prompt tokens within ``budget`` (the first is always within it) and within ``room``,
    and, if ``count_kv``, their KV units within ``kv_cap`` beside ``kv_used``. Returns (requests,
    prompt tokens, KV units, the first request left in the queue or -1)."""
    r = head
    n = 0
    tokens = 0
    units = 0
    while r >= 0 and n < max_n:
        prompt = pr.ri[r, PROMPT]
        if (n > 0 and tokens + prompt > budget) or tokens + prompt > room:
            break
        need = pr.ri[r, UNITS]
        if count_kv and kv_used + units + need > kv_cap:
            break
        tokens += prompt
        units += need
        n += 1
        r = st.qnext[r]
    return n, tokens, units, r


@kernel(inline=True)
def prefill_terms(st, pr, head, n, now, link):
    """A prefill batch of ``n`` requests from ``head`` starts at ``now``: stamp them, and (with
    ``link``) chain them through BNEXT, which outlives the queue. Returns the cost model's batch
    terms: Σ s(s + 1), another model family's per-request terms, and the endpoint codec's work
    over the requests that are handed off."""
    quad = 0
    xflops = 0
    xtok = 0
    xmask = 0
    ops = 0.0
    nbytes = 0.0
    mixed = pr.ints[P_MIXED]
    every = pr.ints[P_REPLAY_DECODE]
    r = head
    for j in range(n):
        quad += pr.ri[r, QUAD]
        st.t[r, PREFILL_START] = now
        if mixed:
            xflops += pr.rq[r, RQ_FLOPS]
            xtok += pr.rq[r, RQ_TOKENS]
            xmask |= pr.rq[r, RQ_MASK]
        if pr.ri[r, OUTPUT] > 1 or every:
            ops += pr.rf[r, EP_OPS]
            nbytes += pr.rf[r, EP_BYTES]
        nxt = st.qnext[r]
        if link:
            st.r[r, BNEXT] = nxt if j + 1 < n else -1
        r = nxt
    return quad, xflops, xtok, xmask, ops, nbytes
