"""Memory-aware hand-off (``--kv-reserve at-transfer``, the pull model of vLLM's NIXL connector
and SGLang): a hand-off moves only once its decode instance has reserved the whole KV.

Requests wait FIFO per decode instance for memory; layer-wise slices that become ready in the
meantime are held back and released together. Without reservation (the reference) a ready
hand-off goes straight to the network.
"""

from __future__ import annotations

import math

from kvcargo._jit import kernel
from kvcargo.engine.link import release_units
from kvcargo.engine.lists import fifo_cut, fifo_push
from kvcargo.engine.routing import choose_decode
from kvcargo.engine.state import (
    D_KV_USED,
    D_RQ_HEAD,
    D_RQ_TAIL,
    DEST,
    F_NOW,
    HELD,
    P_EARLY,
    P_KVCAP,
    P_RESERVE,
    RESERVED,
    UNITS,
    WANT_MEMORY,
)


@kernel(refcounts=False)
def handoff_ready(st, pr, r, k):
    """``k`` more parts of request ``r``'s hand-off are ready to move."""
    if pr.ints[P_EARLY] and st.r[r, DEST] < 0:
        choose_decode(st, pr, r)
    if pr.ints[P_RESERVE] and math.isnan(st.tx[r, RESERVED]):
        st.r[r, HELD] += k
        if math.isnan(st.tx[r, WANT_MEMORY]):
            st.tx[r, WANT_MEMORY] = st.f[F_NOW]
            d = st.r[r, DEST]
            fifo_push(st.qnext, st.d, d, D_RQ_HEAD, D_RQ_TAIL, r)
            try_reserve(st, pr, d)
        return
    release_units(st, pr, r, k)


@kernel(refcounts=False)
def try_reserve(st, pr, d):
    """Reserve decode memory for the requests waiting at instance ``d``, in order, while it
    fits; each reserved request's held parts leave at once."""
    cap = pr.ints[P_KVCAP]
    r = st.d[d, D_RQ_HEAD]
    while r >= 0:
        need = pr.ri[r, UNITS]
        if st.d[d, D_KV_USED] + need > cap:
            break
        st.d[d, D_KV_USED] += need
        st.tx[r, RESERVED] = st.f[F_NOW]
        nxt = st.qnext[r]
        fifo_cut(st.d, d, D_RQ_HEAD, D_RQ_TAIL, nxt)
        held = st.r[r, HELD]
        st.r[r, HELD] = 0
        release_units(st, pr, r, held)
        r = nxt
