"""The event loop: pop the earliest event, dispatch it, repeat until every request settled.

Between events that change a batch, an instance's steps are advanced in a tight loop: when the
next step of a decode (or colocated) instance would end before any pending event, nothing can
happen in between, so it is processed at once instead of going through the heap. This is exact
(the same float additions ``now + dt``, the same tie order), and it is where most of a run's
steps are spent.
"""

from __future__ import annotations

import heapq

from kvcargo.engine._jit import kernel
from kvcargo.engine.colocated import colocated_begin, colocated_end
from kvcargo.engine.decode import decode_begin, decode_step_end, decode_submit, route_decode
from kvcargo.engine.events import next_event_time, reject_request, schedule
from kvcargo.engine.link import link_done, link_granted, link_trigger
from kvcargo.engine.prefill import prefill_begin, prefill_done, prefill_submit, route_prefill
from kvcargo.engine.state import (
    ARRIVAL,
    DECODE_DONE,
    DECODE_WAKE,
    F_NOW,
    GRANT,
    I_STOP,
    P_COLOCATED,
    P_KVCAP,
    P_NDECODE,
    PREFILL_DONE,
    PREFILL_WAKE,
    RELEASE,
    XFER_DONE,
)


@kernel
def arrive(heap, st, pr, r):
    """Request ``r`` arrives: reject it if its KV can never fit, else queue it; then the arrival
    process waits for the next request (``max(0, arrival - now)``, as the reference)."""
    if pr.prompt[r] + pr.output[r] > pr.ints[P_KVCAP]:
        reject_request(st, pr, r)
    elif pr.ints[P_COLOCATED]:
        decode_submit(heap, st, pr, route_decode(st), r)
    else:
        prefill_submit(heap, st, pr, route_prefill(st), r)
    if r + 1 < pr.arrival.shape[0]:
        now = st.f[F_NOW]
        schedule(heap, st, now + max(0.0, pr.arrival[r + 1] - now), ARRIVAL, r + 1)


@kernel
def begin_step(st, pr, d, fin):
    """At a step boundary of instance ``d``: start a step (returns its end) or sleep (-1)."""
    if pr.ints[P_COLOCATED]:
        return colocated_begin(st, pr, d, fin)
    return decode_begin(st, pr, d, fin)


@kernel
def after_step(st, pr, d, fin, logf, logi):
    """End the step in flight on instance ``d``, then begin the next one."""
    if pr.ints[P_COLOCATED]:
        colocated_end(st, pr, d, fin, logf, logi)
    else:
        decode_step_end(st, pr, d, fin, logf, logi)
    if st.i[I_STOP]:
        return -1.0
    return begin_step(st, pr, d, fin)


@kernel
def run_instance(heap, st, pr, d, fin, logf, logi, t_end):
    """Carry instance ``d`` through every step that ends before the next pending event;
    schedule the first one that does not (or leave it asleep)."""
    while t_end >= 0.0:
        if t_end >= next_event_time(heap):
            schedule(heap, st, t_end, DECODE_DONE, d)
            return
        st.f[F_NOW] = t_end
        t_end = after_step(st, pr, d, fin, logf, logi)


@kernel
def run_events(st, pr, logf, logi):
    """Simulate until every request has finished or been rejected."""
    heap = [(0.0, 0, 0, 0)]
    heap.pop()
    fin = [[(0, 0)] for _ in range(pr.ints[P_NDECODE])]
    for h in fin:
        h.pop()
    schedule(heap, st, 0.0 + max(0.0, pr.arrival[0] - 0.0), ARRIVAL, 0)
    while len(heap) > 0 and st.i[I_STOP] == 0:
        t, _seq, kind, idx = heapq.heappop(heap)
        st.f[F_NOW] = t
        if kind == ARRIVAL:
            arrive(heap, st, pr, idx)
        elif kind == PREFILL_WAKE:
            prefill_begin(heap, st, pr, idx)
        elif kind == PREFILL_DONE:
            prefill_done(heap, st, pr, idx)
        elif kind == GRANT:
            link_granted(heap, st, pr, idx)
        elif kind == XFER_DONE:
            link_done(heap, st, pr, idx)
        elif kind == RELEASE:
            link_trigger(heap, st)
        elif kind == DECODE_WAKE:
            run_instance(heap, st, pr, idx, fin, logf, logi, begin_step(st, pr, idx, fin))
        else:  # DECODE_DONE
            run_instance(heap, st, pr, idx, fin, logf, logi, after_step(st, pr, idx, fin, logf, logi))
