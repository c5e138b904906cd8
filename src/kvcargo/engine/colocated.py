"""The colocated baseline: every instance does both phases, prefill first (vLLM v0 style).

At each step boundary an instance first tries to admit a prefill batch from its queue head
(batch + running below the maximum, the token budget, the request's whole KV reserved at
admission); if it admitted any, it runs a prefill step and the batch joins the running decode
batch. Otherwise it runs a decode step if anything is running, else it sleeps. There is no KV
transfer. Queues, routing and decode steps are the decode instances' (:mod:`.decode`).
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.batching import UNLIMITED, prefill_terms, take_batch
from kvcargo.engine.decode import decode_step_begin, decode_step_end, join_batch
from kvcargo.engine.events import book_step, charge_engine, finish_request
from kvcargo.engine.lists import fifo_cut
from kvcargo.engine.pricing import prefill_step_cost
from kvcargo.engine.state import (
    BUSY,
    D_HEAD,
    D_IS_PREFILL,
    D_KV_USED,
    D_QUEUED,
    D_RUNNING,
    D_STATE,
    D_TAIL,
    F_NOW,
    FIRST_TOKEN,
    IDLE,
    OUTPUT,
    P_BATCH,
    P_BATCH_N,
    P_BUDGET,
    P_KVCAP,
    P_MAXBATCH,
    P_MIXED,
    UNITS,
)


@kernel(refcounts=False)
def colocated_begin(st, pr, c):
    """At a step boundary: a prefill step if any prompt is admitted, else a decode step, else
    sleep. Returns the step's end time, or -1 when the instance sleeps."""
    head = st.d[c, D_HEAD]
    n, tokens, units, rest = take_batch(st, pr, head, pr.ints[P_MAXBATCH] - st.d[c, D_RUNNING], pr.ints[P_BUDGET],
                                        UNLIMITED, st.d[c, D_KV_USED], pr.ints[P_KVCAP], True)
    if n == 0:
        st.d[c, D_IS_PREFILL] = 0
        if st.d[c, D_RUNNING] == 0:
            st.d[c, D_STATE] = IDLE
            return -1.0
        return decode_step_begin(st, pr, c)
    now = st.f[F_NOW]
    quad, xflops, xtok, xmask, _, _ = prefill_terms(st, pr, head, n, now, False)
    st.d[c, D_KV_USED] += units
    st.p[c, P_BATCH] = head
    fifo_cut(st.d, c, D_HEAD, D_TAIL, rest)
    st.d[c, D_QUEUED] -= n
    st.p[c, P_BATCH_N] = n
    dt, flops, nbytes, e_c, e_m, e_o, opt, engine_bound = prefill_step_cost(st, pr, 0, c, tokens, quad, n, xflops,
                                                                             xtok, xmask)
    book_step(st, c, now, dt, flops, nbytes, e_c, e_m)
    if pr.ints[P_MIXED]:
        charge_engine(st, c, dt, e_o, opt, engine_bound)
    st.d[c, D_STATE] = BUSY
    st.d[c, D_IS_PREFILL] = 1
    return now + dt


@kernel(refcounts=False)
def colocated_end(st, pr, c):
    """End of a step: after a prefill the batch gets its first token and starts decoding."""
    if st.d[c, D_IS_PREFILL] == 0:
        decode_step_end(st, pr, c)
        return
    now = st.f[F_NOW]
    r = st.p[c, P_BATCH]
    for _ in range(st.p[c, P_BATCH_N]):
        nxt = st.qnext[r]
        st.t[r, FIRST_TOKEN] = now
        if pr.ri[r, OUTPUT] <= 1:
            st.d[c, D_KV_USED] -= pr.ri[r, UNITS]
            finish_request(st, r)
        else:
            join_batch(st, pr, c, r)
        r = nxt
