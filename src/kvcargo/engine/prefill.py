"""Prefill instances: a FIFO of whole prompts, token-budget batching, the least-queued router.

An instance sleeps while its queue is empty; a submit wakes it (one zero-delay event). It then
takes prompts from the head while the batch's tokens stay within the budget (the first prompt
is always taken), runs one step, and hands every request of the batch on.
"""

from __future__ import annotations

from kvcargo.engine._jit import kernel
from kvcargo.engine.events import finish_request, schedule
from kvcargo.engine.kernels import elementwise_pass, prefill_work, roofline
from kvcargo.engine.link import link_request
from kvcargo.engine.state import (
    BUSY,
    F_NOW,
    IDLE,
    P_BUDGET,
    P_ENDPOINT,
    PREFILL_DONE,
    PREFILL_WAKE,
    S_BUSY,
    S_BYTES,
    S_EC,
    S_EM,
    S_FLOPS,
    S_STEPS,
    WAKING,
)


@kernel
def route_prefill(st):
    """The instance with the fewest queued prompt tokens (the batch in flight does not count)."""
    best = 0
    for p in range(1, st.p_tokens.shape[0]):
        if st.p_tokens[p] < st.p_tokens[best]:
            best = p
    return best


@kernel
def prefill_submit(heap, st, pr, p, r):
    """Queue a prompt at instance ``p``, waking it if it sleeps."""
    st.qnext[r] = -1
    if st.p_tail[p] < 0:
        st.p_head[p] = r
    else:
        st.qnext[st.p_tail[p]] = r
    st.p_tail[p] = r
    st.p_tokens[p] += pr.prompt[r]
    st.prefill_inst[r] = p
    if st.p_state[p] == IDLE:
        st.p_state[p] = WAKING
        schedule(heap, st, st.f[F_NOW], PREFILL_WAKE, p)


@kernel
def prefill_begin(heap, st, pr, p):
    """Form a batch from the queue head and start its step (or go to sleep)."""
    r = st.p_head[p]
    if r < 0:
        st.p_state[p] = IDLE
        return
    now = st.f[F_NOW]
    budget = pr.ints[P_BUDGET]
    tokens = 0
    quad = 0
    n = 0
    ops = 0.0
    nbytes = 0.0
    st.p_batch[p] = r
    while r >= 0 and (n == 0 or tokens + pr.prompt[r] <= budget):
        tokens += pr.prompt[r]
        quad += pr.quad[r]
        n += 1
        st.prefill_start[r] = now
        if pr.output[r] > 1:
            ops += pr.ep_ops[r]
            nbytes += pr.ep_bytes[r]
        r = st.qnext[r]
    st.p_head[p] = r
    if r < 0:
        st.p_tail[p] = -1
    st.p_tokens[p] -= tokens
    st.p_batch_n[p] = n
    flops, by = prefill_work(pr.mi, pr.mf, tokens, quad, n)
    dt, e_c, e_m = roofline(pr.hf_prefill, flops, by)
    if pr.ints[P_ENDPOINT]:
        x_t, x_c, x_m = elementwise_pass(pr.hf_prefill, ops, nbytes)
        dt = dt + x_t
        e_c = e_c + x_c
        e_m = e_m + x_m
        flops = flops + ops
        by = by + nbytes
    row = st.stats[p]
    row[S_BUSY] += dt
    row[S_FLOPS] += flops
    row[S_BYTES] += by
    row[S_EC] += e_c
    row[S_EM] += e_m
    row[S_STEPS] += 1
    st.p_state[p] = BUSY
    schedule(heap, st, now + dt, PREFILL_DONE, p)


@kernel
def prefill_done(heap, st, pr, p):
    """The step ended: first tokens out, single-token requests finish, the instance takes its
    next batch, and then (as new SimPy processes would) every hand-off asks for the link."""
    now = st.f[F_NOW]
    head = st.p_batch[p]
    n = st.p_batch_n[p]
    r = head
    for _ in range(n):
        st.first_token[r] = now
        if pr.output[r] <= 1:
            finish_request(st, pr, r)
        r = st.qnext[r]
    # The batch is detached from the queue, so its links stay valid while the next one forms.
    prefill_begin(heap, st, pr, p)
    r = head
    for _ in range(n):
        nxt = st.qnext[r]
        if pr.output[r] > 1:
            link_request(heap, st, pr, r)
        r = nxt
