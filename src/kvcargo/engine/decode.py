"""Decode instances: FIFO KV-capacity admission at step boundaries and continuous batching.

At every step boundary an instance admits from its queue head while the batch is below the
maximum and the request's whole KV (prompt + output) fits what is left of its capacity — strict
FIFO, so a request that does not fit blocks those behind it. A step advances every running
sequence by one token; its cost depends only on the batch size and the sum of contexts, kept
as running sums. A heap of finish-step ordinals finds the requests that end at each step, so a
step costs O(1) plus O(log n) per finishing request — never a loop over the batch.
"""

from __future__ import annotations

import heapq

from kvcargo.engine._jit import kernel
from kvcargo.engine.events import finish_request, log_step, schedule
from kvcargo.engine.kernels import decode_work, roofline
from kvcargo.engine.state import (
    BUSY,
    DECODE_WAKE,
    F_NOW,
    IDLE,
    P_KVCAP,
    P_MAXBATCH,
    P_NPREFILL,
    S_BUSY,
    S_BYTES,
    S_EC,
    S_EM,
    S_FLOPS,
    S_STEPS,
    WAKING,
)


@kernel
def route_decode(st):
    """The instance with the fewest queued + running requests (ties: lowest index)."""
    best = 0
    best_load = st.d_queued[0] + st.d_running[0]
    for d in range(1, st.d_queued.shape[0]):
        load = st.d_queued[d] + st.d_running[d]
        if load < best_load:
            best = d
            best_load = load
    return best


@kernel
def decode_submit(heap, st, pr, d, r):
    """Queue a request at instance ``d``, waking it if it sleeps."""
    st.qnext[r] = -1
    if st.d_tail[d] < 0:
        st.d_head[d] = r
    else:
        st.qnext[st.d_tail[d]] = r
    st.d_tail[d] = r
    st.d_queued[d] += 1
    st.decode_inst[r] = d
    if st.d_state[d] == IDLE:
        st.d_state[d] = WAKING
        schedule(heap, st, st.f[F_NOW], DECODE_WAKE, d)


@kernel
def join_batch(st, pr, d, fin, r):
    """A request starts decoding on instance ``d`` with its first token already out."""
    st.d_running[d] += 1
    st.d_context[d] += pr.prompt[r] + 1
    st.decode_start[r] = st.f[F_NOW]
    st.first_step[r] = st.d_steps[d]
    heapq.heappush(fin[d], (st.d_steps[d] + pr.output[r] - 2, r))


@kernel
def decode_admit(st, pr, d, fin):
    """Admit from the queue head while the batch has room and the KV fits (strict FIFO)."""
    r = st.d_head[d]
    cap = pr.ints[P_KVCAP]
    max_batch = pr.ints[P_MAXBATCH]
    while r >= 0 and st.d_running[d] < max_batch:
        need = pr.prompt[r] + pr.output[r]
        if st.d_kv_used[d] + need > cap:
            break
        st.d_kv_used[d] += need
        st.d_queued[d] -= 1
        join_batch(st, pr, d, fin, r)
        r = st.qnext[r]
    st.d_head[d] = r
    if r < 0:
        st.d_tail[d] = -1


@kernel
def decode_step_begin(st, pr, d):
    """Start one decode step over the running batch; returns its end time."""
    now = st.f[F_NOW]
    batch = st.d_running[d]
    flops, nbytes = decode_work(pr.mi, pr.mf, batch, st.d_context[d])
    dt, e_c, e_m = roofline(pr.hf_decode, flops, nbytes)
    row = st.stats[pr.ints[P_NPREFILL] + d]
    row[S_BUSY] += dt
    row[S_FLOPS] += flops
    row[S_BYTES] += nbytes
    row[S_EC] += e_c
    row[S_EM] += e_m
    row[S_STEPS] += 1
    st.d_state[d] = BUSY
    st.d_step_start[d] = now
    return now + dt


@kernel
def decode_step_end(st, pr, d, fin, logf, logi):
    """Every running sequence got a token; finish those that reached their output length."""
    k = st.d_steps[d]
    batch = st.d_running[d]
    log_step(st, logf, logi, d, st.d_step_start[d], st.f[F_NOW], batch)
    st.d_steps[d] = k + 1
    st.d_context[d] += batch
    h = fin[d]
    while len(h) > 0 and h[0][0] == k:
        r = heapq.heappop(h)[1]
        need = pr.prompt[r] + pr.output[r]
        st.d_running[d] -= 1
        st.d_context[d] -= need
        st.d_kv_used[d] -= need
        finish_request(st, pr, r)


@kernel
def decode_begin(st, pr, d, fin):
    """At a step boundary: admit, then start a step (returns its end) or sleep (returns -1)."""
    decode_admit(st, pr, d, fin)
    if st.d_running[d] == 0:
        st.d_state[d] = IDLE
        return -1.0
    return decode_step_begin(st, pr, d)
