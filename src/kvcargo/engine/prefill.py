"""Prefill instances: a FIFO of whole prompts, token-budget batching, the least-queued router.

An instance sleeps while its queue is empty; a submit wakes it (one zero-delay event). It then
takes prompts from the head while the batch's tokens stay within the budget (the first prompt
is always taken), runs one step, and hands every request of the batch on. Streaming layer by
layer, the step releases one slice of every request's KV at each of its G fractions. With
``--kv-reserve at-transfer`` the instance holds each request's KV until it has landed and stops
taking prompts when that buffer is full.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.events import charge_step, fifo_cut, fifo_push, finish_request, schedule, wake
from kvcargo.engine.kernels import elementwise_pass
from kvcargo.engine.pricing import prefill_step_cost
from kvcargo.engine.reserve import handoff_ready
from kvcargo.engine.routing import prefill_kv_change
from kvcargo.engine.state import (
    BNEXT,
    BUSY,
    EP_BYTES,
    EP_OPS,
    F_NOW,
    FIRST_TOKEN,
    IDLE,
    OUTPUT,
    P_BATCH,
    P_BATCH_N,
    P_BUDGET,
    P_ENDPOINT,
    P_GROUPS,
    P_HEAD,
    P_KV_HELD,
    P_PREFILL_KVCAP,
    P_RESERVE,
    P_SLICE,
    P_STATE,
    P_TAIL,
    P_TOKENS,
    PREFILL_DONE,
    PREFILL_INST,
    PREFILL_START,
    PREFILL_WAKE,
    PROMPT,
    QNEXT,
    QUAD,
    S_STEP_END,
    S_STEP_START,
    SLICE_READY,
)


@kernel(inline=True)
def route_prefill(st):
    """The instance with the fewest queued prompt tokens (the batch in flight does not count)."""
    best = 0
    for p in range(1, st.p.shape[0]):
        if st.p[p, P_TOKENS] < st.p[best, P_TOKENS]:
            best = p
    return best


@kernel
def prefill_submit(st, pr, p, r):
    """Queue a prompt at instance ``p``, waking it if it sleeps."""
    fifo_push(st, st.p, p, P_HEAD, P_TAIL, r)
    st.p[p, P_TOKENS] += pr.ri[r, PROMPT]
    st.r[r, PREFILL_INST] = p
    wake(st, st.p, p, P_STATE, PREFILL_WAKE)


@kernel
def prefill_begin(st, pr, p):
    """Form a batch from the queue head and start its step (or go to sleep)."""
    r = st.p[p, P_HEAD]
    budget = pr.ints[P_BUDGET]
    room = pr.ints[P_PREFILL_KVCAP] - st.p[p, P_KV_HELD] if pr.ints[P_RESERVE] else 1 << 62
    if r < 0 or pr.ri[r, PROMPT] > room:
        st.p[p, P_STATE] = IDLE
        return
    now = st.f[F_NOW]
    tokens = 0
    quad = 0
    n = 0
    ops = 0.0
    nbytes = 0.0
    st.p[p, P_BATCH] = r
    last = r
    while r >= 0 and (n == 0 or tokens + pr.ri[r, PROMPT] <= budget) and tokens + pr.ri[r, PROMPT] <= room:
        tokens += pr.ri[r, PROMPT]
        quad += pr.ri[r, QUAD]
        n += 1
        st.t[r, PREFILL_START] = now
        if pr.ri[r, OUTPUT] > 1:
            ops += pr.rf[r, EP_OPS]
            nbytes += pr.rf[r, EP_BYTES]
        st.r[last, BNEXT] = r
        last = r
        r = st.r[r, QNEXT]
    st.r[last, BNEXT] = -1
    fifo_cut(st.p, p, P_HEAD, P_TAIL, r)
    st.p[p, P_TOKENS] -= tokens
    st.p[p, P_BATCH_N] = n
    if pr.ints[P_RESERVE]:
        prefill_kv_change(st, p, tokens)
    hf = pr.hf[0]
    dt, flops, by, e_c, e_m = prefill_step_cost(st, pr, 0, p, tokens, quad, n)
    if pr.ints[P_ENDPOINT]:
        x_t, x_c, x_m = elementwise_pass(hf, ops, nbytes)
        dt = dt + x_t
        e_c = e_c + x_c
        e_m = e_m + x_m
        flops = flops + ops
        by = by + nbytes
    charge_step(st, p, dt, flops, by, e_c, e_m)
    st.stats[p, S_STEP_START] = now
    st.stats[p, S_STEP_END] = now + dt
    st.p[p, P_STATE] = BUSY
    schedule(st, now + dt, PREFILL_DONE, p)
    groups = pr.ints[P_GROUPS]
    if groups > 1:
        st.p[p, P_SLICE] = 1
        schedule(st, now + dt / groups, SLICE_READY, p)


@kernel
def _release_batch(st, pr, r, n):
    """One more part of every multi-token request of a batch (``n`` requests from ``r``) is
    ready to move."""
    for _ in range(n):
        nxt = st.r[r, BNEXT]
        if pr.ri[r, OUTPUT] > 1:
            handoff_ready(st, pr, r, 1)
        r = nxt


@kernel
def prefill_slice(st, pr, p):
    """Layer-wise streaming: slice ``g`` of the batch's KV is final at g/G of the step."""
    g = st.p[p, P_SLICE]
    _release_batch(st, pr, st.p[p, P_BATCH], st.p[p, P_BATCH_N])
    groups = pr.ints[P_GROUPS]
    st.p[p, P_SLICE] = g + 1
    if g + 1 < groups:
        start = st.stats[p, S_STEP_START]
        schedule(st, start + (st.stats[p, S_STEP_END] - start) * (g + 1) / groups, SLICE_READY, p)


@kernel
def prefill_done(st, pr, p):
    """The step ended: first tokens out, single-token requests finish, the instance takes its
    next batch, and then (as new SimPy processes would) every hand-off asks for the link."""
    now = st.f[F_NOW]
    head = st.p[p, P_BATCH]
    n = st.p[p, P_BATCH_N]
    r = head
    for _ in range(n):
        st.t[r, FIRST_TOKEN] = now
        if pr.ri[r, OUTPUT] <= 1:
            if pr.ints[P_RESERVE]:
                prefill_kv_change(st, p, -pr.ri[r, PROMPT])
            finish_request(st, r)
        r = st.r[r, BNEXT]
    prefill_begin(st, pr, p)
    _release_batch(st, pr, head, n)
