"""Prefill instances: a FIFO of whole prompts, token-budget batching, the least-queued router.

An instance sleeps while its queue is empty; a submit wakes it (one zero-delay event). It then
takes prompts from the head while the batch's tokens stay within the budget (the first prompt
is always taken; :mod:`.batching`), runs one step, and hands every request of the batch on. Streaming layer by
layer, the step releases one slice of every request's KV at each of its G fractions. With
``--kv-reserve at-transfer`` the instance holds each request's KV until it has landed and stops
taking prompts when that buffer is full.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.batching import UNLIMITED, prefill_terms, take_batch
from kvcargo.engine.events import book_step, charge_engine, finish_request, schedule, wake, with_pass
from kvcargo.engine.lists import fifo_cut, fifo_push
from kvcargo.engine.pricing import prefill_step_cost
from kvcargo.engine.reserve import handoff_ready
from kvcargo.engine.routing import prefill_kv_change
from kvcargo.engine.state import (
    BNEXT,
    BUSY,
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
    P_MIXED,
    P_PREFILL_KVCAP,
    P_REPLAY_DECODE,
    P_RESERVE,
    P_SLICE,
    P_STATE,
    P_TAIL,
    P_TOKENS,
    PREFILL_DONE,
    PREFILL_END,
    PREFILL_INST,
    PREFILL_WAKE,
    PROMPT,
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


@kernel(refcounts=False)
def prefill_submit(st, pr, p, r):
    """Queue a prompt at instance ``p``, waking it if it sleeps."""
    fifo_push(st.qnext, st.p, p, P_HEAD, P_TAIL, r)
    st.p[p, P_TOKENS] += pr.ri[r, PROMPT]
    st.r[r, PREFILL_INST] = p
    wake(st, st.p, p, P_STATE, PREFILL_WAKE)


@kernel(refcounts=False)
def prefill_begin(st, pr, p):
    """Form a batch from the queue head and start its step (or go to sleep)."""
    head = st.p[p, P_HEAD]
    room = pr.ints[P_PREFILL_KVCAP] - st.p[p, P_KV_HELD] if pr.ints[P_RESERVE] else UNLIMITED
    n, tokens, _, rest = take_batch(st, pr, head, UNLIMITED, pr.ints[P_BUDGET], room, 0, 0, False)
    if n == 0:
        st.p[p, P_STATE] = IDLE
        return
    now = st.f[F_NOW]
    quad, xflops, xtok, xmask, ops, nbytes = prefill_terms(st, pr, head, n, now, True)
    fifo_cut(st.p, p, P_HEAD, P_TAIL, rest)
    st.p[p, P_BATCH] = head
    st.p[p, P_TOKENS] -= tokens
    st.p[p, P_BATCH_N] = n
    if pr.ints[P_RESERVE]:
        prefill_kv_change(st, p, tokens)
    dt, flops, by, e_c, e_m, e_o, opt, engine_bound = prefill_step_cost(st, pr, 0, p, tokens, quad, n, xflops, xtok,
                                                                         xmask)
    if pr.ints[P_ENDPOINT]:
        dt, flops, by, e_c, e_m = with_pass(pr, 0, dt, flops, by, e_c, e_m, ops, nbytes)
    book_step(st, p, now, dt, flops, by, e_c, e_m)
    if pr.ints[P_MIXED]:
        charge_engine(st, p, dt, e_o, opt, engine_bound)
    st.stats[p, S_STEP_END] = now + dt
    st.p[p, P_STATE] = BUSY
    schedule(st, now + dt, PREFILL_DONE, p)
    groups = pr.ints[P_GROUPS]
    if groups > 1:
        st.p[p, P_SLICE] = 1
        schedule(st, now + dt / groups, SLICE_READY, p)


@kernel(refcounts=False)
def _release_batch(st, pr, r, n):
    """One more part of every multi-token request of a batch (``n`` requests from ``r``) is
    ready to move (of every request when the first token comes from the decode side)."""
    every = pr.ints[P_REPLAY_DECODE]
    for _ in range(n):
        nxt = st.r[r, BNEXT]
        if pr.ri[r, OUTPUT] > 1 or every:
            handoff_ready(st, pr, r, 1)
        r = nxt


@kernel(refcounts=False)
def prefill_slice(st, pr, p):
    """Layer-wise streaming: slice ``g`` of the batch's KV is final at g/G of the step."""
    g = st.p[p, P_SLICE]
    _release_batch(st, pr, st.p[p, P_BATCH], st.p[p, P_BATCH_N])
    groups = pr.ints[P_GROUPS]
    st.p[p, P_SLICE] = g + 1
    if g + 1 < groups:
        start = st.stats[p, S_STEP_START]
        schedule(st, start + (st.stats[p, S_STEP_END] - start) * (g + 1) / groups, SLICE_READY, p)


@kernel(refcounts=False)
def prefill_done(st, pr, p):
    """The step ended: first tokens out, single-token requests finish, the instance takes its
    next batch, and then (as new SimPy processes would) every hand-off asks for the link. When
    the decode side replays the prompt's end, no token comes out here: every request is handed
    off and only the end of its prefill is recorded."""
    now = st.f[F_NOW]
    head = st.p[p, P_BATCH]
    n = st.p[p, P_BATCH_N]
    r = head
    for _ in range(n):
        if pr.ints[P_REPLAY_DECODE]:
            st.tx[r, PREFILL_END] = now
            r = st.r[r, BNEXT]
            continue
        st.t[r, FIRST_TOKEN] = now
        if pr.ri[r, OUTPUT] <= 1:
            if pr.ints[P_RESERVE]:
                prefill_kv_change(st, p, -pr.ri[r, PROMPT])
            finish_request(st, r)
        r = st.r[r, BNEXT]
    prefill_begin(st, pr, p)
    _release_batch(st, pr, head, n)
