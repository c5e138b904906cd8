"""The network between the pools: ports, their channels, and the units that cross them.

Every hand-off is cut into units (one, or one per layer-wise slice). A unit crosses one port
(the cluster-wide link; an NVLink port inside a domain) or two (the sender's and the receiver's
NIC). Two ways to share a port:

* ``fcfs`` (the reference): a unit holds a channel at full bandwidth; units wait FCFS. A grant
  is a zero-delay event (SimPy's ``Request`` succeeding) and a release is another that grants the
  channel to the head of the queue — the reference's exact event order.
* ``fair``: every unit moves at once and the ports' bandwidth is shared max-min fairly,
  recomputed whenever a unit starts or finishes (each unit capped at one channel's bandwidth).

When a hand-off's last unit has landed, the request joins a decode queue. Unit ``r·G + g`` is
part ``g`` of request ``r``'s hand-off (G = 1: the whole hand-off; G > 1: layer-wise slices); a
port's waiting units form a FIFO threaded through ``State.unext`` (:mod:`.lists`).
"""

from __future__ import annotations

import math

from kvcargo._jit import kernel
from kvcargo.engine.decode import decode_submit
from kvcargo.engine.events import schedule
from kvcargo.engine.lists import fifo_pop, fifo_push
from kvcargo.engine.prefix import cache_blocks
from kvcargo.engine.routing import prefill_kv_change, route_decode
from kvcargo.engine.state import (
    D_INCOMING,
    DEST,
    DOMAIN,
    EFF_BYTES,
    F_FLOW_T,
    F_LINK_J,
    F_NOW,
    F_TRANSIT_J,
    FLOW_DONE,
    GRANT,
    I_FLOW_GEN,
    I_NACTIVE,
    I_XFERS,
    KV_READY,
    KV_START,
    LANDED,
    P_FAIR,
    P_GROUPS,
    P_PREFIX,
    P_RESERVE,
    P_TOPOLOGY,
    PF_BW,
    PF_LATENCY,
    PORT_A,
    PORT_B,
    PORT_FREE,
    PORT_HEAD,
    PORT_TAIL,
    PREFILL_INST,
    PROMPT,
    RELEASE,
    SEND_FRAC,
    SENT,
    SLICE_EXTRA,
    SLICE_TIME,
    SLICE_TIME_NV,
    TRANSIT_J,
    UF_LEFT,
    UF_RATE,
    UNITS_DONE,
    XFER_DONE,
    XFER_J,
    XFER_J_NV,
    XFER_TIME,
    XFER_TIME_NV,
)


@kernel(inline=True)
def _over_nvlink(st, pr, r):
    """Whether request ``r``'s units cross an NVLink port (a hand-off inside a domain)."""
    return pr.ints[P_TOPOLOGY] == DOMAIN and st.r[r, PORT_A] > 0


@kernel(refcounts=False)
def release_units(st, pr, r, k):
    """Send the next ``k`` parts of request ``r``'s hand-off into the network."""
    g = pr.ints[P_GROUPS]
    for _ in range(k):
        unit = r * g + st.r[r, SENT]
        st.r[r, SENT] += 1
        if pr.ints[P_FAIR]:
            fair_start(st, pr, unit)
        else:
            port = st.r[r, PORT_A]
            fifo_push(st.unext, st.ports, port, PORT_HEAD, PORT_TAIL, unit)
            port_trigger(st, pr, port)


@kernel(refcounts=False)
def port_trigger(st, pr, port):
    """Give a free channel of ``port`` to the head of its queue (one grant per trigger, as
    SimPy's resource). A unit that needs a second port then queues there."""
    if st.ports[port, PORT_HEAD] >= 0 and st.ports[port, PORT_FREE] > 0:
        st.ports[port, PORT_FREE] -= 1
        unit = fifo_pop(st.unext, st.ports, port, PORT_HEAD, PORT_TAIL)
        second = st.r[unit // pr.ints[P_GROUPS], PORT_B]
        if second < 0 or second == port:
            schedule(st, st.f[F_NOW], GRANT, unit)
            return
        fifo_push(st.unext, st.ports, second, PORT_HEAD, PORT_TAIL, unit)
        if st.ports[second, PORT_HEAD] >= 0 and st.ports[second, PORT_FREE] > 0:
            st.ports[second, PORT_FREE] -= 1
            schedule(st, st.f[F_NOW], GRANT, fifo_pop(st.unext, st.ports, second, PORT_HEAD, PORT_TAIL))


@kernel(inline=True)
def _send_frac(st, pr, r):
    """Share of request ``r``'s hand-off that crosses: with a decode prefix cache only the blocks
    the receiver lacks, at the same pace; else all of it."""
    return st.tx[r, SEND_FRAC] if pr.ints[P_PREFIX] else 1.0


@kernel(inline=True)
def _landing_latency(st, pr, r, nv):
    """The latency the last unit of request ``r``'s hand-off pays on top of its bytes."""
    return pr.pf[st.r[r, PORT_A], PF_LATENCY] if nv else pr.rx[r, SLICE_EXTRA]


@kernel(inline=True)
def unit_duration(st, pr, unit):
    """Seconds unit ``unit`` holds its channels."""
    g = pr.ints[P_GROUPS]
    r = unit // g
    nv = _over_nvlink(st, pr, r)
    if g == 1 and not pr.ints[P_PREFIX]:  # a whole hand-off
        return pr.rx[r, XFER_TIME_NV] if nv else pr.rf[r, XFER_TIME]
    body = (pr.rx[r, SLICE_TIME_NV] if nv else pr.rx[r, SLICE_TIME]) * _send_frac(st, pr, r)
    if unit % g < g - 1:
        return body
    return body + _landing_latency(st, pr, r, nv)


@kernel(inline=True)
def _stamp_kv_start(st, r):
    """The hand-off's first unit to move stamps KV start and counts a transfer."""
    if math.isnan(st.t[r, KV_START]):
        st.t[r, KV_START] = st.f[F_NOW]
        st.i[I_XFERS] += 1


@kernel(refcounts=False)
def unit_granted(st, pr, unit):
    """A unit has its channels: it moves now."""
    _stamp_kv_start(st, unit // pr.ints[P_GROUPS])
    schedule(st, st.f[F_NOW] + unit_duration(st, pr, unit), XFER_DONE, unit)


@kernel(inline=True)
def _account(st, pr, r, busy):
    """Link time and energy of one unit (its share of the hand-off's)."""
    g = pr.ints[P_GROUPS]
    share = _send_frac(st, pr, r) / g  # 1.0 for a whole hand-off
    st.port_busy[st.r[r, PORT_A]] += busy
    if _over_nvlink(st, pr, r):
        st.f[F_LINK_J] += pr.rx[r, XFER_J_NV] * share
    else:
        st.f[F_LINK_J] += pr.rf[r, XFER_J] * share
        st.f[F_TRANSIT_J] += pr.rf[r, TRANSIT_J] * share


@kernel(refcounts=False)
def unit_done(st, pr, unit):
    """A unit has crossed: free its channels, account it, and land it."""
    r = unit // pr.ints[P_GROUPS]
    for port in (st.r[r, PORT_A], st.r[r, PORT_B]):
        if port >= 0:
            st.ports[port, PORT_FREE] += 1
            schedule(st, st.f[F_NOW], RELEASE, port)
    _account(st, pr, r, unit_duration(st, pr, unit))
    unit_landed(st, pr, unit)


@kernel(refcounts=False)
def unit_landed(st, pr, unit):
    """A unit's bytes are at the decode side; the hand-off is complete with its last unit."""
    r = unit // pr.ints[P_GROUPS]
    st.r[r, UNITS_DONE] += 1
    if st.r[r, UNITS_DONE] == pr.ints[P_GROUPS]:
        handoff_landed(st, pr, r)


@kernel(refcounts=False)
def handoff_landed(st, pr, r):
    """The whole KV cache is at the decode side: the prefill instance lets go of it and the
    request joins a decode queue (the one chosen before the transfer, or the least loaded)."""
    st.t[r, KV_READY] = st.f[F_NOW]
    if pr.ints[P_RESERVE]:
        prefill_kv_change(st, st.r[r, PREFILL_INST], -pr.ri[r, PROMPT])
    d = st.r[r, DEST]
    if d >= 0:
        st.d[d, D_INCOMING] -= 1
    else:
        d = route_decode(st)
    if pr.ints[P_PREFIX]:
        cache_blocks(st, pr, r, d)
    decode_submit(st, d, r)


# ------------------------------------------------------------------------------ fair sharing


@kernel(inline=True)
def _flow_cap(st, pr, r):
    """A unit moves at most at one channel's bandwidth of each port it crosses."""
    cap = pr.pf[st.r[r, PORT_A], PF_BW]
    b = st.r[r, PORT_B]
    if b >= 0:
        cap = min(cap, pr.pf[b, PF_BW])
    return cap


@kernel(refcounts=False)
def fair_advance(st):
    """Move every active unit forward to now at its current rate."""
    dt = st.f[F_NOW] - st.f[F_FLOW_T]
    if dt > 0.0:
        for i in range(st.i[I_NACTIVE]):
            u = st.active[i]
            st.uf[u, UF_LEFT] -= st.uf[u, UF_RATE] * dt
    st.f[F_FLOW_T] = st.f[F_NOW]


@kernel(refcounts=False)
def fair_rates(st, pr):
    """Max-min fair rates by progressive filling: raise every unfrozen unit's rate together
    until a port is full or a unit reaches its cap; freeze those; repeat."""
    n = st.i[I_NACTIVE]
    g = pr.ints[P_GROUPS]
    left, count, frozen = st.port_left, st.port_count, st.frozen
    for port in range(left.shape[0]):  # not a slice copy: that may allocate (no reference counting here)
        left[port] = pr.port_cap[port]
        count[port] = 0
    frozen[:n] = False
    for i in range(n):
        u = st.active[i]
        st.uf[u, UF_RATE] = 0.0
        r = u // g
        count[st.r[r, PORT_A]] += 1
        if st.r[r, PORT_B] >= 0:
            count[st.r[r, PORT_B]] += 1
    unfrozen = n
    while unfrozen > 0:
        inc = math.inf
        for port in range(left.shape[0]):
            if count[port] > 0:
                inc = min(inc, left[port] / count[port])
        for i in range(n):
            if not frozen[i]:
                u = st.active[i]
                inc = min(inc, _flow_cap(st, pr, u // g) - st.uf[u, UF_RATE])
        for i in range(n):
            if not frozen[i]:
                u = st.active[i]
                st.uf[u, UF_RATE] += inc
                left[st.r[u // g, PORT_A]] -= inc
                if st.r[u // g, PORT_B] >= 0:
                    left[st.r[u // g, PORT_B]] -= inc
        for i in range(n):
            if not frozen[i]:
                u = st.active[i]
                r = u // g
                a, b = st.r[r, PORT_A], st.r[r, PORT_B]
                full = left[a] <= 1e-9 * pr.pf[a, PF_BW] or (b >= 0 and left[b] <= 1e-9 * pr.pf[b, PF_BW])
                if full or st.uf[u, UF_RATE] >= _flow_cap(st, pr, r) * (1 - 1e-12):
                    frozen[i] = True
                    unfrozen -= 1
                    count[a] -= 1
                    if b >= 0:
                        count[b] -= 1


@kernel(refcounts=False)
def fair_schedule(st):
    """Schedule the next completion (earlier schedules become stale: their generation differs)."""
    soonest = math.inf
    for i in range(st.i[I_NACTIVE]):
        u = st.active[i]
        if st.uf[u, UF_RATE] > 0.0:
            soonest = min(soonest, st.uf[u, UF_LEFT] / st.uf[u, UF_RATE])
    st.i[I_FLOW_GEN] += 1
    if soonest < math.inf:
        schedule(st, st.f[F_NOW] + max(soonest, 0.0), FLOW_DONE, st.i[I_FLOW_GEN])


@kernel(refcounts=False)
def fair_start(st, pr, unit):
    """A unit starts moving now; everyone's share changes."""
    fair_advance(st)
    r = unit // pr.ints[P_GROUPS]
    st.uf[unit, UF_LEFT] = pr.rx[r, EFF_BYTES] / pr.ints[P_GROUPS] * _send_frac(st, pr, r)
    st.active[st.i[I_NACTIVE]] = unit
    st.i[I_NACTIVE] += 1
    _stamp_kv_start(st, r)
    fair_rates(st, pr)
    fair_schedule(st)


@kernel(refcounts=False)
def fair_done(st, pr, generation):
    """Units whose bytes are through finish (then land after the path's latency)."""
    if generation != st.i[I_FLOW_GEN]:
        return
    fair_advance(st)
    g = pr.ints[P_GROUPS]
    i = 0
    while i < st.i[I_NACTIVE]:
        u = st.active[i]
        if st.uf[u, UF_LEFT] > st.uf[u, UF_RATE] * 1e-9:
            i += 1
            continue
        st.i[I_NACTIVE] -= 1
        st.active[i] = st.active[st.i[I_NACTIVE]]
        r = u // g
        size = pr.rx[r, EFF_BYTES] * _send_frac(st, pr, r) / g
        _account(st, pr, r, size / _flow_cap(st, pr, r))
        if u % g < g - 1:
            unit_landed(st, pr, u)
        else:
            schedule(st, st.f[F_NOW] + _landing_latency(st, pr, r, _over_nvlink(st, pr, r)), LANDED, u)
    fair_rates(st, pr)
    fair_schedule(st)
