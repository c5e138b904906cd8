"""What every handler does: schedule events, settle requests, log and charge steps.

Pending events are heap 0 of ``State.evt``/``State.evi`` (:mod:`.heap`), ordered by (time,
sequence). Ties at the same time are broken by the order events were scheduled, exactly as SimPy
does for the reference simulator, so zero-delay chains (a submit waking an idle instance, a
released link channel granted to the next transfer) resolve in the same order.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.heap import A, B, heap_pop, heap_push
from kvcargo.engine.kernels import elementwise_pass
from kvcargo.engine.state import (
    DONE,
    F_NOW,
    FINISH,
    I_DONE,
    I_NEV,
    I_NSTEPS,
    I_REJ,
    I_SEQ,
    I_STOP,
    IDLE,
    LOG_BATCH,
    LOG_END,
    LOG_INST,
    LOG_START,
    REJECTED,
    S_BUSY,
    S_BYTES,
    S_EC,
    S_EM,
    S_EO,
    S_FLOPS,
    S_OPT_BUSY,
    S_OPT_FLOPS,
    S_STEP_START,
    S_STEPS,
    STATUS,
    WAKING,
)


@kernel(inline=True)
def schedule(st, t, kind, idx):
    """Put an event on the heap; later-scheduled events at the same time run later."""
    seq = st.i[I_SEQ]
    st.i[I_SEQ] = seq + 1
    n = st.i[I_NEV]
    st.i[I_NEV] = n + 1
    heap_push(st.evt, st.evi, 0, n, t, seq, kind, idx)


@kernel(inline=True)
def pop_event(st):
    """Remove the earliest event; returns its (time, kind, index)."""
    t, kind, idx = st.evt[0, 0], st.evi[0, 0, A], st.evi[0, 0, B]
    n = st.i[I_NEV]
    st.i[I_NEV] = n - 1
    heap_pop(st.evt, st.evi, 0, n)
    return t, kind, idx


@kernel(inline=True)
def wake(st, table, row, col, kind):
    """Wake instance ``row`` (state ``table[row, col]``) if it sleeps: a zero-delay ``kind``
    event."""
    if table[row, col] == IDLE:
        table[row, col] = WAKING
        schedule(st, st.f[F_NOW], kind, row)


@kernel(inline=True)
def log_full(st):
    """Whether the step log has no room for another step (the engine then pauses)."""
    return st.i[I_NSTEPS] >= st.logf.shape[0]


@kernel(inline=True)
def _settled(st):
    """The run ends when every request is settled (finished or rejected)."""
    if st.i[I_DONE] + st.i[I_REJ] == st.r.shape[0]:
        st.i[I_STOP] = 1


@kernel(inline=True)
def finish_request(st, r):
    """A request has produced its last token; the run ends when every request is settled."""
    st.t[r, FINISH] = st.f[F_NOW]
    st.r[r, STATUS] = DONE
    st.i[I_DONE] += 1
    _settled(st)


@kernel(inline=True)
def reject_request(st, r):
    """A request whose KV can never fit a decode instance is turned away on arrival."""
    st.r[r, STATUS] = REJECTED
    st.i[I_REJ] += 1
    _settled(st)


@kernel(inline=True)
def log_step(st, inst, start, end, batch):
    """Append a decode step to the step log (the caller made sure there is room)."""
    k = st.i[I_NSTEPS]
    st.logf[k, LOG_START] = start
    st.logf[k, LOG_END] = end
    st.logi[k, LOG_INST] = inst
    st.logi[k, LOG_BATCH] = batch
    st.i[I_NSTEPS] = k + 1


@kernel(inline=True)
def with_pass(pr, pool, dt, flops, nbytes, e_c, e_m, ops, xbytes):
    """A step (time, FLOPs, bytes, compute J, memory J) with an elementwise pass over ``ops``
    operations and ``xbytes`` bytes on pool ``pool`` added: the endpoint codec's compression on a
    prefill step, the decompression waiting on a decode step."""
    x_t, x_c, x_m = elementwise_pass(pr.hf[pool], ops, xbytes)
    return dt + x_t, flops + ops, nbytes + xbytes, e_c + x_c, e_m + x_m


@kernel(inline=True)
def book_step(st, row, now, dt, flops, nbytes, e_c, e_m):
    """A step of stats row ``row`` starts ``now``: add it to the instance's totals (in step order:
    the sums are the reference's)."""
    st.stats[row, S_BUSY] += dt
    st.stats[row, S_FLOPS] += flops
    st.stats[row, S_BYTES] += nbytes
    st.stats[row, S_EC] += e_c
    st.stats[row, S_EM] += e_m
    st.stats[row, S_STEPS] += 1
    st.stats[row, S_STEP_START] = now


@kernel(inline=True)
def charge_engine(st, row, dt, e_o, optical_flops, engine_bound):
    """Add an optical transform engine's share of a step to instance ``row``'s totals."""
    st.stats[row, S_EO] += e_o
    st.stats[row, S_OPT_FLOPS] += optical_flops
    if engine_bound:
        st.stats[row, S_OPT_BUSY] += dt
