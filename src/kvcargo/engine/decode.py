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
from kvcargo.engine.batching import UNLIMITED, take_batch
from kvcargo.engine.events import book_step, finish_request, log_step, wake, with_pass
from kvcargo.engine.heap import A, heap_pop, heap_push
from kvcargo.engine.kernels import family_step_cost
from kvcargo.engine.lists import fifo_cut, fifo_push
from kvcargo.engine.pricing import decode_step_cost
from kvcargo.engine.speculation import spec_join, spec_step_end
from kvcargo.engine.state import (
    BNEXT,
    BUSY,
    D_CONTEXT,
    D_FIN_N,
    D_HEAD,
    D_KV_USED,
    D_QUEUED,
    D_REPLAY_A,
    D_REPLAY_HEAD,
    D_REPLAY_N,
    D_REPLAY_S,
    D_REPLAY_T,
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
    FIRST_TOKEN,
    IDLE,
    OUTPUT,
    P_DECCOST,
    P_KVCAP,
    P_MAXBATCH,
    P_MIXED,
    P_NPREFILL,
    P_REPLAY_DECODE,
    P_RESERVE,
    P_SPEC,
    PROMPT,
    RQ_FLOPS,
    RQ_TOKENS,
    S_PEND_BYTES,
    S_PEND_OPS,
    S_STEP_START,
    UNITS,
)


@kernel(refcounts=False)
def decode_submit(st, d, r):
    """Queue a request at instance ``d``, waking it if it sleeps."""
    fifo_push(st.qnext, st.d, d, D_HEAD, D_TAIL, r)
    st.d[d, D_QUEUED] += 1
    st.r[r, DECODE_INST] = d
    wake(st, st.d, d, D_STATE, DECODE_WAKE)


@kernel(inline=True)
def _stats_row(pr, d):
    """Instance ``d``'s row of ``State.stats`` (prefill instances come first)."""
    return pr.ints[P_NPREFILL] + d


@kernel(inline=True)
def _finishes_at(st, d, k, r):
    """Request ``r`` gets its last token in step ``k`` of instance ``d``."""
    n = st.d[d, D_FIN_N]
    st.d[d, D_FIN_N] = n + 1
    heap_push(st.fink, st.fini, d, n, float(k), r, r, 0)


@kernel(inline=True)
def _pop_finished(st, d):
    """Remove and return the request of instance ``d`` that finishes first."""
    n = st.d[d, D_FIN_N]
    st.d[d, D_FIN_N] = n - 1
    r = st.fini[d, 0, A]
    heap_pop(st.fink, st.fini, d, n)
    return r


@kernel(inline=True)
def join_batch(st, pr, d, r):
    """A request starts decoding on instance ``d`` with its first token already out (its
    decompression, if the codec has a cost, joins the instance's next step). When the decode
    side replays the prompt's end, the request is a replay row of the next step, which emits
    its first token; its decode steps follow."""
    if pr.ints[P_DECCOST]:
        row = _stats_row(pr, d)
        st.stats[row, S_PEND_OPS] += pr.rx[r, DEC_OPS]
        st.stats[row, S_PEND_BYTES] += pr.rx[r, DEC_BYTES]
    if pr.ints[P_SPEC]:
        spec_join(st, pr, d, r)
    st.d[d, D_RUNNING] += 1
    st.t[r, DECODE_START] = st.f[F_NOW]
    k = st.d[d, D_STEPS]
    if pr.ints[P_REPLAY_DECODE]:
        st.d[d, D_REPLAY_N] += 1
        st.d[d, D_REPLAY_T] += pr.rq[r, RQ_TOKENS]
        st.d[d, D_REPLAY_A] += pr.rq[r, RQ_FLOPS]
        st.d[d, D_REPLAY_S] += pr.ri[r, PROMPT]
        st.r[r, BNEXT] = st.d[d, D_REPLAY_HEAD]
        st.d[d, D_REPLAY_HEAD] = r
        st.r[r, FIRST_STEP] = k + 1
        _finishes_at(st, d, k + pr.ri[r, OUTPUT] - 1, r)
        return
    st.d[d, D_CONTEXT] += pr.ri[r, PROMPT] + 1
    st.r[r, FIRST_STEP] = k
    if not pr.ints[P_SPEC]:
        _finishes_at(st, d, k + pr.ri[r, OUTPUT] - 2, r)


@kernel(inline=True)
def decode_admit(st, pr, d):
    """Admit from the queue head while the batch has room and the KV fits (strict FIFO; with
    ``--kv-reserve at-transfer`` the KV was reserved before the transfer)."""
    head = st.d[d, D_HEAD]
    reserved = pr.ints[P_RESERVE]
    n, _, units, rest = take_batch(st, pr, head, pr.ints[P_MAXBATCH] - st.d[d, D_RUNNING], UNLIMITED, UNLIMITED,
                                   st.d[d, D_KV_USED], pr.ints[P_KVCAP], not reserved)
    if not reserved:
        st.d[d, D_KV_USED] += units
    st.d[d, D_QUEUED] -= n
    r = head
    for _ in range(n):
        nxt = st.qnext[r]
        join_batch(st, pr, d, r)
        r = nxt
    fifo_cut(st.d, d, D_HEAD, D_TAIL, rest)


@kernel(inline=True)
def decode_step_begin(st, pr, d):
    """Start one decode step over the running batch; returns its end time."""
    now = st.f[F_NOW]
    batch = st.d[d, D_RUNNING]
    row = _stats_row(pr, d)
    if pr.ints[P_MIXED]:  # another model family (replay rows: a causal encoder-decoder's)
        rn = st.d[d, D_REPLAY_N]
        flops, nbytes, dt, e_c, e_m = family_step_cost(pr, 1, batch - rn, st.d[d, D_CONTEXT], rn, st.d[d, D_REPLAY_T],
                                                       st.d[d, D_REPLAY_A], st.d[d, D_REPLAY_S])
    else:
        dt, flops, nbytes, e_c, e_m = decode_step_cost(st, pr, 1, row, batch, st.d[d, D_CONTEXT])
    if pr.ints[P_DECCOST] and st.stats[row, S_PEND_OPS] + st.stats[row, S_PEND_BYTES] > 0.0:
        dt, flops, nbytes, e_c, e_m = with_pass(pr, 1, dt, flops, nbytes, e_c, e_m, st.stats[row, S_PEND_OPS],
                                                st.stats[row, S_PEND_BYTES])
        st.stats[row, S_PEND_OPS] = 0.0
        st.stats[row, S_PEND_BYTES] = 0.0
    book_step(st, row, now, dt, flops, nbytes, e_c, e_m)
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
    if pr.ints[P_REPLAY_DECODE] and st.d[d, D_REPLAY_N]:
        _replayed(st, d, batch)
    else:
        st.d[d, D_CONTEXT] += batch
    while st.d[d, D_FIN_N] > 0 and st.fink[d, 0] == k:
        r = _pop_finished(st, d)
        st.d[d, D_RUNNING] -= 1
        st.d[d, D_CONTEXT] -= pr.ri[r, PROMPT] + pr.ri[r, OUTPUT]
        st.d[d, D_KV_USED] -= pr.ri[r, UNITS]
        finish_request(st, r)


@kernel(inline=True)
def _replayed(st, d, batch):
    """After a step with replay rows: each got its first token (context s + 1); the decode rows
    one more token each."""
    now = st.f[F_NOW]
    rn = st.d[d, D_REPLAY_N]
    st.d[d, D_CONTEXT] += batch - rn + st.d[d, D_REPLAY_S] + rn
    r = st.d[d, D_REPLAY_HEAD]
    while r >= 0:
        st.t[r, FIRST_TOKEN] = now
        r = st.r[r, BNEXT]
    st.d[d, D_REPLAY_N] = 0
    st.d[d, D_REPLAY_T] = 0
    st.d[d, D_REPLAY_A] = 0
    st.d[d, D_REPLAY_S] = 0
    st.d[d, D_REPLAY_HEAD] = -1


@kernel(inline=True)
def decode_begin(st, pr, d):
    """At a step boundary: admit, then start a step (returns its end) or sleep (returns -1)."""
    if st.d[d, D_HEAD] >= 0:  # most step boundaries find nobody waiting: no call (see run_instance)
        decode_admit(st, pr, d)
    if st.d[d, D_RUNNING] == 0:
        st.d[d, D_STATE] = IDLE
        return -1.0
    return decode_step_begin(st, pr, d)
