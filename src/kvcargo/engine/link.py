"""The KV link: one cluster-wide resource with N channels, FCFS (reference-semantics §4).

A hand-off asks for a channel; when one is free the grant is a zero-delay event (SimPy's
``Request`` succeeding), the transfer holds the channel for its duration, and the release is
another zero-delay event that grants the channel to the head of the FIFO. When the KV has
landed, the request goes to the decode instance with the fewest queued + running requests.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.decode import decode_submit, route_decode
from kvcargo.engine.events import schedule
from kvcargo.engine.state import (
    F_LINK_BUSY,
    F_LINK_J,
    F_NOW,
    F_TRANSIT_J,
    GRANT,
    I_LINK_FREE,
    I_LQ_HEAD,
    I_LQ_TAIL,
    I_XFERS,
    KV_READY,
    KV_START,
    QNEXT,
    RELEASE,
    TRANSIT_J,
    XFER_DONE,
    XFER_J,
    XFER_TIME,
)


@kernel
def link_request(st, r):
    """Join the FIFO of transfers waiting for a channel."""
    st.r[r, QNEXT] = -1
    if st.i[I_LQ_TAIL] < 0:
        st.i[I_LQ_HEAD] = r
    else:
        st.r[st.i[I_LQ_TAIL], QNEXT] = r
    st.i[I_LQ_TAIL] = r
    link_trigger(st)


@kernel
def link_trigger(st):
    """Grant a free channel to the head of the FIFO (at most one grant per trigger, as SimPy)."""
    r = st.i[I_LQ_HEAD]
    if r >= 0 and st.i[I_LINK_FREE] > 0:
        st.i[I_LINK_FREE] -= 1
        st.i[I_LQ_HEAD] = st.r[r, QNEXT]
        if st.r[r, QNEXT] < 0:
            st.i[I_LQ_TAIL] = -1
        schedule(st, st.f[F_NOW], GRANT, r)


@kernel
def link_granted(st, pr, r):
    """The transfer starts now and holds its channel for its duration."""
    now = st.f[F_NOW]
    st.t[r, KV_START] = now
    st.i[I_XFERS] += 1
    schedule(st, now + pr.rf[r, XFER_TIME], XFER_DONE, r)


@kernel
def link_done(st, pr, r):
    """The KV has landed: free the channel, account the transfer, hand the request to decode."""
    st.i[I_LINK_FREE] += 1
    schedule(st, st.f[F_NOW], RELEASE, -1)
    st.f[F_LINK_BUSY] += pr.rf[r, XFER_TIME]
    st.f[F_LINK_J] += pr.rf[r, XFER_J]
    st.f[F_TRANSIT_J] += pr.rf[r, TRANSIT_J]
    st.t[r, KV_READY] = st.f[F_NOW]
    decode_submit(st, route_decode(st), r)
