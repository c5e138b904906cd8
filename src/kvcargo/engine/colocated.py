"""The colocated baseline: every instance does both phases, prefill first (vLLM v0 style).

At each step boundary an instance first tries to admit a prefill batch from its queue head
(batch + running below the maximum, the token budget, the request's whole KV reserved at
admission); if it admitted any, it runs a prefill step and the batch joins the running decode
batch. Otherwise it runs a decode step if anything is running, else it sleeps. There is no KV
transfer. Queues, routing and decode steps are the decode instances' (:mod:`.decode`).
"""

from __future__ import annotations

from kvcargo.engine._jit import kernel
from kvcargo.engine.decode import decode_step_begin, decode_step_end, join_batch
from kvcargo.engine.events import finish_request
from kvcargo.engine.kernels import prefill_work, roofline
from kvcargo.engine.state import (
    BUSY,
    F_NOW,
    IDLE,
    P_BUDGET,
    P_KVCAP,
    P_MAXBATCH,
    S_BUSY,
    S_BYTES,
    S_EC,
    S_EM,
    S_FLOPS,
    S_STEPS,
)


@kernel
def colocated_begin(st, pr, c, fin):
    """At a step boundary: a prefill step if any prompt is admitted, else a decode step, else
    sleep. Returns the step's end time, or -1 when the instance sleeps."""
    now = st.f[F_NOW]
    r = st.d_head[c]
    cap = pr.ints[P_KVCAP]
    budget = pr.ints[P_BUDGET]
    max_batch = pr.ints[P_MAXBATCH]
    tokens = 0
    quad = 0
    n = 0
    st.p_batch[c] = r
    while r >= 0 and st.d_running[c] + n < max_batch and (n == 0 or tokens + pr.prompt[r] <= budget):
        need = pr.prompt[r] + pr.output[r]
        if st.d_kv_used[c] + need > cap:
            break
        st.d_kv_used[c] += need
        tokens += pr.prompt[r]
        quad += pr.quad[r]
        n += 1
        st.prefill_start[r] = now
        r = st.qnext[r]
    if n > 0:
        st.d_head[c] = r
        if r < 0:
            st.d_tail[c] = -1
        st.d_queued[c] -= n
        st.p_batch_n[c] = n
        flops, nbytes = prefill_work(pr.mi, pr.mf, tokens, quad, n)
        dt, e_c, e_m = roofline(pr.hf_prefill, flops, nbytes)
        row = st.stats[c]
        row[S_BUSY] += dt
        row[S_FLOPS] += flops
        row[S_BYTES] += nbytes
        row[S_EC] += e_c
        row[S_EM] += e_m
        row[S_STEPS] += 1
        st.d_state[c] = BUSY
        st.d_is_prefill[c] = 1
        return now + dt
    st.d_is_prefill[c] = 0
    if st.d_running[c] == 0:
        st.d_state[c] = IDLE
        return -1.0
    return decode_step_begin(st, pr, c)


@kernel
def colocated_end(st, pr, c, fin, logf, logi):
    """End of a step: after a prefill the batch gets its first token and starts decoding."""
    if st.d_is_prefill[c] == 0:
        decode_step_end(st, pr, c, fin, logf, logi)
        return
    now = st.f[F_NOW]
    r = st.p_batch[c]
    for _ in range(st.p_batch_n[c]):
        nxt = st.qnext[r]
        st.first_token[r] = now
        if pr.output[r] <= 1:
            st.d_kv_used[c] -= pr.prompt[r] + pr.output[r]
            finish_request(st, pr, r)
        else:
            join_batch(st, pr, c, fin, r)
        r = nxt
