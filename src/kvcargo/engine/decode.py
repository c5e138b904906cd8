"""Decode instances: FIFO KV-capacity admission at step boundaries and continuous batching.

At every step boundary an instance admits from its queue head while the batch is below the
maximum and the request's whole KV (prompt + output) fits what is left of its capacity — strict
FIFO, so a request that does not fit blocks those behind it. A step advances every running
sequence by one token; its cost depends only on the batch size and the sum of contexts, kept
as running sums. A heap of finish-step ordinals finds the requests that end at each step, so a
step costs O(1) plus O(log n) per finishing request — never a loop over the batch.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.events import charge_step, fifo_cut, fifo_push, finish_request, log_step, wake
from kvcargo.engine.finheap import heap_pop, heap_push
from kvcargo.engine.kernels import elementwise_pass
from kvcargo.engine.pricing import decode_step_cost
from kvcargo.engine.speculation import spec_join, spec_step_end
from kvcargo.engine.state import (
    BUSY,
    D_CONTEXT,
    D_FIN_N,
    D_HEAD,
    D_KV_USED,
    D_QUEUED,
    D_RUNNING,
    D_STATE,
    D_STEPS,
    D_TAIL,
    DEC_BYTES,
    DEC_OPS,
    DECODE_INST,
    DECODE_START,
    DECODE_WAKE,
    F_NOW,
    FIRST_STEP,
    IDLE,
    OUTPUT,
    P_DECCOST,
    P_KVCAP,
    P_MAXBATCH,
    P_NPREFILL,
    P_RESERVE,
    P_SPEC,
    PROMPT,
    QNEXT,
    S_PEND_BYTES,
    S_PEND_OPS,
    S_STEP_START,
)


@kernel
def decode_submit(st, d, r):
    """Queue a request at instance ``d``, waking it if it sleeps."""
    fifo_push(st, st.d, d, D_HEAD, D_TAIL, r)
    st.d[d, D_QUEUED] += 1
    st.r[r, DECODE_INST] = d
    wake(st, st.d, d, D_STATE, DECODE_WAKE)


@kernel(inline=True)
def _stats_row(pr, d):
    """Instance ``d``'s row of ``State.stats`` (prefill instances come first)."""
    return pr.ints[P_NPREFILL] + d


@kernel(inline=True)
def join_batch(st, pr, d, r):
    """A request starts decoding on instance ``d`` with its first token already out (its
    decompression, if the codec has a cost, joins the instance's next step)."""
    if pr.ints[P_DECCOST]:
        row = _stats_row(pr, d)
        st.stats[row, S_PEND_OPS] += pr.rx[r, DEC_OPS]
        st.stats[row, S_PEND_BYTES] += pr.rx[r, DEC_BYTES]
    if pr.ints[P_SPEC]:
        spec_join(st, pr, d, r)
    else:
        heap_push(st.fin, st.d, d, st.d[d, D_STEPS] + pr.ri[r, OUTPUT] - 2, r)
    st.d[d, D_RUNNING] += 1
    st.d[d, D_CONTEXT] += pr.ri[r, PROMPT] + 1
    st.t[r, DECODE_START] = st.f[F_NOW]
    st.r[r, FIRST_STEP] = st.d[d, D_STEPS]


@kernel(inline=True)
def decode_admit(st, pr, d):
    """Admit from the queue head while the batch has room and the KV fits (strict FIFO; with
    ``--kv-reserve at-transfer`` the KV was reserved before the transfer)."""
    r = st.d[d, D_HEAD]
    cap = pr.ints[P_KVCAP]
    max_batch = pr.ints[P_MAXBATCH]
    reserved = pr.ints[P_RESERVE]
    while r >= 0 and st.d[d, D_RUNNING] < max_batch:
        need = pr.ri[r, PROMPT] + pr.ri[r, OUTPUT]
        if not reserved:
            if st.d[d, D_KV_USED] + need > cap:
                break
            st.d[d, D_KV_USED] += need
        st.d[d, D_QUEUED] -= 1
        join_batch(st, pr, d, r)
        r = st.r[r, QNEXT]
    fifo_cut(st.d, d, D_HEAD, D_TAIL, r)


@kernel(inline=True)
def decode_step_begin(st, pr, d):
    """Start one decode step over the running batch; returns its end time."""
    now = st.f[F_NOW]
    batch = st.d[d, D_RUNNING]
    row = _stats_row(pr, d)
    dt, flops, nbytes, e_c, e_m = decode_step_cost(st, pr, 1, row, batch, st.d[d, D_CONTEXT])
    if pr.ints[P_DECCOST] and st.stats[row, S_PEND_OPS] + st.stats[row, S_PEND_BYTES] > 0.0:
        x_t, x_c, x_m = elementwise_pass(pr.hf[1], st.stats[row, S_PEND_OPS], st.stats[row, S_PEND_BYTES])
        dt, e_c, e_m = dt + x_t, e_c + x_c, e_m + x_m
        flops += st.stats[row, S_PEND_OPS]
        nbytes += st.stats[row, S_PEND_BYTES]
        st.stats[row, S_PEND_OPS] = 0.0
        st.stats[row, S_PEND_BYTES] = 0.0
    charge_step(st, row, dt, flops, nbytes, e_c, e_m)
    st.stats[row, S_STEP_START] = now
    st.d[d, D_STATE] = BUSY
    return now + dt


@kernel(inline=True)
def decode_step_end(st, pr, d):
    """Every running sequence got a token; finish those that reached their output length."""
    k = st.d[d, D_STEPS]
    batch = st.d[d, D_RUNNING]
    log_step(st, d, st.stats[_stats_row(pr, d), S_STEP_START], st.f[F_NOW], batch)
    if pr.ints[P_SPEC]:
        spec_step_end(st, pr, d)
        return
    st.d[d, D_STEPS] = k + 1
    st.d[d, D_CONTEXT] += batch
    while st.d[d, D_FIN_N] > 0 and st.fin[d, 0, 0] == k:
        r = heap_pop(st.fin, st.d, d)
        need = pr.ri[r, PROMPT] + pr.ri[r, OUTPUT]
        st.d[d, D_RUNNING] -= 1
        st.d[d, D_CONTEXT] -= need
        st.d[d, D_KV_USED] -= need
        finish_request(st, r)


@kernel(inline=True)
def decode_begin(st, pr, d):
    """At a step boundary: admit, then start a step (returns its end) or sleep (returns -1)."""
    decode_admit(st, pr, d)
    if st.d[d, D_RUNNING] == 0:
        st.d[d, D_STATE] = IDLE
        return -1.0
    return decode_step_begin(st, pr, d)
