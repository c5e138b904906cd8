"""The event loop: pop the earliest event, dispatch it, repeat until every request settled.

Between events that change a batch, an instance's steps are advanced in a tight loop: when the
next step of a decode (or colocated) instance would end before any pending event, nothing can
happen in between, so it is processed at once instead of going through the heap. This is exact
(the same float additions ``now + dt``, the same tie order), and it is where most of a run's
steps are spent.

Events are dispatched by an ``if``/``elif`` chain on their kind, not a table of handlers: numba
has no cheap table of functions (a first-class function value is called through a pointer and
never inlined), while the chain compiles to compare-and-branch code with the small handlers
inlined into the loop.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.colocated import colocated_begin, colocated_end
from kvcargo.engine.decode import decode_begin, decode_step_end, decode_submit
from kvcargo.engine.events import log_full, pop_event, reject_request, schedule
from kvcargo.engine.link import fair_done, port_trigger, unit_done, unit_granted, unit_landed
from kvcargo.engine.prefill import prefill_begin, prefill_done, prefill_slice, prefill_submit, route_prefill
from kvcargo.engine.reserve import try_reserve
from kvcargo.engine.routing import route_decode
from kvcargo.engine.state import (
    ARRIVAL,
    ARRIVAL_T,
    ARRIVALS_DUE,
    DECODE_DONE,
    DECODE_WAKE,
    EVENTS_FULL,
    F_NOW,
    FINISHED,
    FLOW_DONE,
    GRANT,
    I_DUE,
    I_LOADED,
    I_NEV,
    I_SEQ,
    I_STOP,
    LOG_FULL,
    P_COLOCATED,
    P_KVCAP,
    P_PREFILL_KVCAP,
    P_RESERVE,
    PREFILL_DONE,
    PREFILL_WAKE,
    PROMPT,
    RELEASE,
    SLICE_READY,
    UNITS,
    XFER_DONE,
)


@kernel(inline=True)
def _schedule_arrival(st, pr, r):
    """The arrival process waits for request ``r``: ``max(0, arrival - now)``, as the reference."""
    now = st.f[F_NOW]
    schedule(st, now + max(0.0, pr.rf[r, ARRIVAL_T] - now), ARRIVAL, r)


@kernel(refcounts=False)
def arrive(st, pr, r):
    """Request ``r`` arrives: reject it if its KV can never fit (a decode instance; with
    reservation also a prefill instance's buffer), else queue it; then the arrival process
    waits for the next request."""
    if pr.ri[r, UNITS] > pr.ints[P_KVCAP] or (
            pr.ints[P_RESERVE] and pr.ri[r, PROMPT] > pr.ints[P_PREFILL_KVCAP]):
        reject_request(st, r)
    elif pr.ints[P_COLOCATED]:
        decode_submit(st, route_decode(st), r)
    else:
        prefill_submit(st, pr, route_prefill(st), r)
    if r + 1 >= pr.rf.shape[0]:
        return
    if r + 1 < st.i[I_LOADED]:
        _schedule_arrival(st, pr, r + 1)
    else:  # a windowed run loads it first: run_events pauses and schedules it on resuming
        st.i[I_DUE] = r + 1


@kernel(refcounts=False)
def run_instance(st, pr, d, ending):
    """Carry decode (or colocated) instance ``d`` through every step that ends before the next
    pending event — first ending the step in flight, if ``ending`` — and schedule the first step
    that does not (or leave the instance asleep).

    The dispatch is written out here rather than in small helpers: compiled, each would be a call
    on every step."""
    colocated = pr.ints[P_COLOCATED]
    while True:
        if ending:
            if colocated:
                colocated_end(st, pr, d)
            else:
                decode_step_end(st, pr, d)
                if pr.ints[P_RESERVE]:
                    try_reserve(st, pr, d)
            if st.i[I_STOP]:
                return
        t_end = colocated_begin(st, pr, d) if colocated else decode_begin(st, pr, d)
        if t_end < 0.0:  # asleep
            return
        if log_full(st) or (st.i[I_NEV] > 0 and t_end >= st.evt[0, 0]):
            schedule(st, t_end, DECODE_DONE, d)
            return
        st.f[F_NOW] = t_end
        ending = True


@kernel(refcounts=False)
def run_events(st, pr):
    """Simulate until every request has finished or been rejected (returns FINISHED), or until
    the step log or the event heap is full (LOG_FULL, EVENTS_FULL: grow it and call again to
    resume exactly where it paused), or until the next arrival's parameters are not loaded
    (ARRIVALS_DUE: load them and call again; the clock has not moved, so scheduling it on
    resuming gives it the sequence number it would have had)."""
    if st.i[I_SEQ] == 0:  # a fresh run (the clock is at 0)
        _schedule_arrival(st, pr, 0)
    if st.i[I_DUE] >= 0:
        _schedule_arrival(st, pr, st.i[I_DUE])
        st.i[I_DUE] = -1
    while st.i[I_NEV] > 0 and st.i[I_STOP] == 0:
        if log_full(st):
            return LOG_FULL
        if 2 * st.i[I_NEV] + 64 > st.evt.shape[1]:
            return EVENTS_FULL
        t, kind, idx = pop_event(st)
        st.f[F_NOW] = t
        if kind == ARRIVAL:
            arrive(st, pr, idx)
            if st.i[I_DUE] >= 0:
                return ARRIVALS_DUE
        elif kind == PREFILL_WAKE:
            prefill_begin(st, pr, idx)
        elif kind == PREFILL_DONE:
            prefill_done(st, pr, idx)
        elif kind == GRANT:
            unit_granted(st, pr, idx)
        elif kind == XFER_DONE:
            unit_done(st, pr, idx)
        elif kind == RELEASE:
            port_trigger(st, pr, idx)
        elif kind == DECODE_WAKE:
            run_instance(st, pr, idx, False)
        elif kind == DECODE_DONE:
            run_instance(st, pr, idx, True)
        elif kind == SLICE_READY:
            prefill_slice(st, pr, idx)
        elif kind == FLOW_DONE:
            fair_done(st, pr, idx)
        else:  # LANDED
            unit_landed(st, pr, idx)
    return FINISHED
