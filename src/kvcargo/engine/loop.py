"""The event loop: pop the earliest event, dispatch it, repeat until every request settled.

Between events that change a batch, an instance's steps are advanced in a tight loop: when the
next step of a decode (or colocated) instance would end before any pending event, nothing can
happen in between, so it is processed at once instead of going through the heap. This is exact
(the same float additions ``now + dt``, the same tie order), and it is where most of a run's
steps are spent.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.colocated import colocated_begin, colocated_end
from kvcargo.engine.decode import decode_begin, decode_step_end, decode_submit, route_decode
from kvcargo.engine.events import log_full, next_event_time, pop_event, reject_request, schedule
from kvcargo.engine.link import link_done, link_granted, link_trigger
from kvcargo.engine.prefill import prefill_begin, prefill_done, prefill_submit, route_prefill
from kvcargo.engine.state import (
    ARRIVAL,
    ARRIVAL_T,
    DECODE_DONE,
    DECODE_WAKE,
    F_NOW,
    GRANT,
    I_NEV,
    I_SEQ,
    I_STOP,
    OUTPUT,
    P_COLOCATED,
    P_KVCAP,
    PREFILL_DONE,
    PREFILL_WAKE,
    PROMPT,
    RELEASE,
    XFER_DONE,
)


@kernel
def arrive(st, pr, r):
    """Request ``r`` arrives: reject it if its KV can never fit, else queue it; then the arrival
    process waits for the next request (``max(0, arrival - now)``, as the reference)."""
    if pr.ri[r, PROMPT] + pr.ri[r, OUTPUT] > pr.ints[P_KVCAP]:
        reject_request(st, r)
    elif pr.ints[P_COLOCATED]:
        decode_submit(st, route_decode(st), r)
    else:
        prefill_submit(st, pr, route_prefill(st), r)
    if r + 1 < pr.rf.shape[0]:
        now = st.f[F_NOW]
        schedule(st, now + max(0.0, pr.rf[r + 1, ARRIVAL_T] - now), ARRIVAL, r + 1)


@kernel(inline=True)
def begin_step(st, pr, d):
    """At a step boundary of instance ``d``: start a step (returns its end) or sleep (-1)."""
    if pr.ints[P_COLOCATED]:
        return colocated_begin(st, pr, d)
    return decode_begin(st, pr, d)


@kernel(inline=True)
def after_step(st, pr, d):
    """End the step in flight on instance ``d``, then begin the next one."""
    if pr.ints[P_COLOCATED]:
        colocated_end(st, pr, d)
    else:
        decode_step_end(st, pr, d)
    if st.i[I_STOP]:
        return -1.0
    return begin_step(st, pr, d)


@kernel
def run_instance(st, pr, d, t_end):
    """Carry instance ``d`` through every step that ends before the next pending event;
    schedule the first one that does not (or leave it asleep)."""
    while t_end >= 0.0:
        if t_end >= next_event_time(st) or log_full(st):
            schedule(st, t_end, DECODE_DONE, d)
            return
        st.f[F_NOW] = t_end
        t_end = after_step(st, pr, d)


@kernel
def run_events(st, pr):
    """Simulate until every request has finished or been rejected (returns 0), or until the
    step log is full (returns 1: grow it and call again to resume exactly where it paused)."""
    if st.i[I_SEQ] == 0:
        schedule(st, 0.0 + max(0.0, pr.rf[0, ARRIVAL_T] - 0.0), ARRIVAL, 0)
    while st.i[I_NEV] > 0 and st.i[I_STOP] == 0:
        if log_full(st):
            return 1
        t, kind, idx = pop_event(st)
        st.f[F_NOW] = t
        if kind == ARRIVAL:
            arrive(st, pr, idx)
        elif kind == PREFILL_WAKE:
            prefill_begin(st, pr, idx)
        elif kind == PREFILL_DONE:
            prefill_done(st, pr, idx)
        elif kind == GRANT:
            link_granted(st, pr, idx)
        elif kind == XFER_DONE:
            link_done(st, pr, idx)
        elif kind == RELEASE:
            link_trigger(st)
        elif kind == DECODE_WAKE:
            run_instance(st, pr, idx, begin_step(st, pr, idx))
        else:  # DECODE_DONE
            run_instance(st, pr, idx, after_step(st, pr, idx))
    return 0
