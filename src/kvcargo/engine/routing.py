"""Where a hand-off goes: the decode router, the ports it crosses, prefill-side KV held.

The reference routes when the KV has landed (fewest queued + running requests). With a
topology, or when decode memory is reserved before the transfer, the receiver must be known
first, so the router runs when the hand-off becomes ready and counts requests already on
their way.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.events import wake
from kvcargo.engine.prefix import missing_fraction
from kvcargo.engine.state import (
    D_INCOMING,
    D_QUEUED,
    D_RUNNING,
    DEST,
    DOMAIN,
    F_NOW,
    NIC,
    P_HEAD,
    P_KV_HELD,
    P_NPREFILL,
    P_PREFIX,
    P_STATE,
    P_TOPOLOGY,
    PORT_A,
    PORT_B,
    PORT_FREE,
    PREFILL_INST,
    PREFILL_WAKE,
    S_KV_INT,
    S_KV_LAST,
    S_KV_PEAK,
)


@kernel(inline=True)
def route_decode(st):
    """The instance with the fewest queued + running requests (ties: lowest index)."""
    best = 0
    best_load = st.d[0, D_QUEUED] + st.d[0, D_RUNNING]
    for d in range(1, st.d.shape[0]):
        load = st.d[d, D_QUEUED] + st.d[d, D_RUNNING]
        if load < best_load:
            best = d
            best_load = load
    return best


@kernel(inline=True)
def rx_port(pr, d):
    """The port of decode instance ``d`` (NIC, or NVLink port in a domain)."""
    return 1 + pr.ints[P_NPREFILL] + d


@kernel(refcounts=False)
def choose_decode(st, pr, r):
    """Route before the transfer: fewest queued + running + incoming requests; ties go to a
    receiver with a free NIC (``nic``) or in the sender's NVLink domain (``nvlink-domain``),
    then to the lowest index. Sets the request's destination and ports."""
    topology = pr.ints[P_TOPOLOGY]
    p = st.r[r, PREFILL_INST]
    n_pre = pr.ints[P_NPREFILL]
    best, best_load, best_pref = -1, 0, 0
    for d in range(st.d.shape[0]):
        load = st.d[d, D_QUEUED] + st.d[d, D_RUNNING] + st.d[d, D_INCOMING]
        pref = 0
        if topology == NIC and st.ports[rx_port(pr, d), PORT_FREE] == 0:
            pref = 1
        elif topology == DOMAIN and pr.domain[n_pre + d] != pr.domain[p]:
            pref = 1
        if best < 0 or load < best_load or (load == best_load and pref < best_pref):
            best, best_load, best_pref = d, load, pref
    st.r[r, DEST] = best
    st.d[best, D_INCOMING] += 1
    set_ports(st, pr, r, best)
    if pr.ints[P_PREFIX]:
        missing_fraction(st, pr, r, best)
    return best


@kernel(inline=True)
def set_ports(st, pr, r, d):
    """The ports request ``r``'s units cross: the cluster link (port 0), the sender's and the
    receiver's NICs, or their NVLink ports when both sit in one domain."""
    topology = pr.ints[P_TOPOLOGY]
    p = st.r[r, PREFILL_INST]
    if topology == NIC or (topology == DOMAIN and pr.domain[p] == pr.domain[pr.ints[P_NPREFILL] + d]):
        st.r[r, PORT_A] = 1 + p
        st.r[r, PORT_B] = rx_port(pr, d)
    else:
        st.r[r, PORT_A] = 0
        st.r[r, PORT_B] = -1


@kernel(refcounts=False)
def prefill_kv_change(st, p, delta):
    """Prefill-side KV held by instance ``p`` changes by ``delta`` tokens (time-weighted
    mean and peak are kept); freed memory wakes an instance that stopped for it."""
    now = st.f[F_NOW]
    held = st.p[p, P_KV_HELD]
    st.stats[p, S_KV_INT] += held * (now - st.stats[p, S_KV_LAST])
    st.stats[p, S_KV_LAST] = now
    held += delta
    st.p[p, P_KV_HELD] = held
    st.stats[p, S_KV_PEAK] = max(st.stats[p, S_KV_PEAK], held)
    if delta < 0 and st.p[p, P_HEAD] >= 0:
        wake(st, st.p, p, P_STATE, PREFILL_WAKE)
