"""The scheduled engine's request lists and KV memory rules over its arrays (levers-serving §1–§3).

Small helpers the event loop inlines: intrusive FIFO lists, the running list kept sorted by
(arrival, id), units and reservation needs, admission, growth, preemption and swap.
"""

from __future__ import annotations

import math

from kvcargo._jit import kernel
from kvcargo.engine.lists import fifo_pop, fifo_push, fifo_push_front
from kvcargo.engine.sched_state import (
    ALLOC,
    ALLOCATED,
    ARR,
    BASE,
    C_BLOCK,
    C_KV_TOK,
    C_KVP,
    C_MAX_SEQ,
    C_SWAP,
    CAP,
    CONTEXT,
    DEBT,
    DONE_TOK,
    F_NOW,
    G_NSPANS,
    GROW_GEN,
    H_BW,
    H_LATENCY,
    H_PJ,
    INDEX,
    MAX_ROWS,
    MAXLEN,
    N_GROW,
    N_PREFILLING,
    N_RUN,
    PAGED,
    POW2,
    PREEMPTED_AT,
    PREEMPTIONS,
    PREFILL,
    PS,
    Q_HEAD,
    Q_LEN,
    Q_TAIL,
    Q_TOKENS,
    ROLE,
    RUN_GEN,
    SPAN_FROM,
    SPAN_INST,
    SPAN_KIND,
    SPAN_R,
    SPAN_RECOMPUTE,
    SPAN_ROLE,
    SPAN_SWAP,
    SPAN_TO,
    SW_HEAD,
    SW_LEN,
    SWAP_IN,
    SWAP_J,
    SWAP_OUT,
    SWAP_S,
    SWAPPED_UNITS,
    TOK,
    TOKENS,
    UNIT,
    USED,
    WMARK,
    O,
    P,
    T,
)


@kernel(inline=True)
def push(st, d, head, tail, length, r):
    """Append request ``r`` to instance ``d``'s list whose ends are columns ``head``, ``tail``."""
    fifo_push(st.nxt, st.ii, d, head, tail, r)
    st.ii[d, length] += 1


@kernel(inline=True)
def pop(st, d, head, tail, length):
    """Remove and return the head of instance ``d``'s list."""
    st.ii[d, length] -= 1
    return fifo_pop(st.nxt, st.ii, d, head, tail)


@kernel(inline=True)
def queue_push(st, d, r):
    push(st, d, Q_HEAD, Q_TAIL, Q_LEN, r)
    st.ii[d, Q_TOKENS] += st.ri[r, P]


@kernel(inline=True)
def queue_pop(st, d):
    r = pop(st, d, Q_HEAD, Q_TAIL, Q_LEN)
    st.ii[d, Q_TOKENS] -= st.ri[r, P]
    return r


@kernel(inline=True)
def queue_push_front(st, d, r):
    """A recompute victim goes to the front of the queue."""
    fifo_push_front(st.nxt, st.ii, d, Q_HEAD, Q_TAIL, r)
    st.ii[d, Q_LEN] += 1
    st.ii[d, Q_TOKENS] += st.ri[r, P]


@kernel(inline=True)
def before(st, a, b):
    """Whether request ``a`` sorts before ``b`` by (arrival, id)."""
    return st.rf[a, ARR] < st.rf[b, ARR] or (st.rf[a, ARR] == st.rf[b, ARR] and a < b)


@kernel(inline=True)
def _count(st, d, r, sign):
    """Add (sign 1) or take out (-1) row ``r``'s share of the running list's sums."""
    st.ii[d, ALLOCATED] += sign * st.ri[r, ALLOC]
    st.ii[d, TOKENS] += sign * (st.ri[r, DONE_TOK] + st.ri[r, TOK] - st.ri[r, BASE])
    if st.ri[r, DONE_TOK] < st.ri[r, T]:
        st.ii[d, N_PREFILLING] += sign
    else:
        st.ii[d, CONTEXT] += sign * (st.ri[r, P] + st.ri[r, TOK])


@kernel(inline=True)
def became_decoding(st, d, r):
    """Running row ``r``'s prompt is now all in KV."""
    st.ii[d, RUN_GEN] += 1
    st.ii[d, N_PREFILLING] -= 1
    st.ii[d, CONTEXT] += st.ri[r, P] + st.ri[r, TOK]


@kernel(inline=True)
def run_insert(st, d, r):
    """Insert ``r`` into the running list, after every row that sorts before it."""
    n = st.ii[d, N_RUN]
    if n >= st.run.shape[1]:
        raise IndexError("running rows beyond the instance's capacity")
    k = n
    while k > 0 and before(st, r, st.run[d, k - 1]):
        st.run[d, k] = st.run[d, k - 1]
        k -= 1
    st.run[d, k] = r
    st.ii[d, N_RUN] = n + 1
    st.ii[d, RUN_GEN] += 1
    _count(st, d, r, 1)


@kernel(inline=True)
def run_remove(st, d, r):
    """Remove ``r`` from the running list (a prefilling row also leaves the prefilling count)."""
    n = st.ii[d, N_RUN]
    run = st.run
    k = 0
    while run[d, k] != r:
        k += 1
    while k < n - 1:
        run[d, k] = run[d, k + 1]
        k += 1
    st.ii[d, N_RUN] = n - 1
    st.ii[d, RUN_GEN] += 1
    _count(st, d, r, -1)


@kernel(inline=True)
def swapped_insert(st, d, r):
    """Insert ``r`` into the swapped list, sorted like the running list."""
    prev = -1
    cur = st.ii[d, SW_HEAD]
    while cur >= 0 and not before(st, r, cur):
        prev = cur
        cur = st.nxt[cur]
    st.nxt[r] = cur
    if prev < 0:
        st.ii[d, SW_HEAD] = r
    else:
        st.nxt[prev] = r
    st.ii[d, SW_LEN] += 1


@kernel(inline=True)
def units(st, d, tokens):
    """``ceil(tokens / unit)``."""
    return -(-tokens // st.ii[d, UNIT])


@kernel(inline=True)
def room(st, d, n):
    """Whether ``n`` more units fit."""
    return st.ii[d, USED] + n <= st.ii[d, CAP]


@kernel(inline=True)
def pow2_at_least(o):
    """The smallest power of two >= o (o >= 1)."""
    b = 0
    x = o - 1
    while x > 0:
        x >>= 1
        b += 1
    return 1 << b


@kernel(inline=True)
def reserved(st, p, o):
    """Units a whole-life KV policy (power of two, maximum length, exact) holds for a request of
    ``p`` prompt and ``o`` output tokens (§1.1)."""
    kvp = st.cfg[C_KVP]
    if kvp == POW2:
        return p + pow2_at_least(o)
    if kvp == MAXLEN:
        return max(st.cfg[C_MAX_SEQ], p + o)
    return p + o


@kernel(inline=True)
def need(st, d, r):
    """Units allocated at admission (§1.1; no prefix hit)."""
    if st.ii[d, ROLE] == PREFILL or st.cfg[C_KVP] == PAGED:
        return units(st, d, st.ri[r, T])
    return reserved(st, st.ri[r, P], st.ri[r, O])


@kernel(inline=True)
def whole_need(st, d, r):
    """Units a request needs on a colocated or decode instance over its life (rejection, §1.2)."""
    p, o = st.ri[r, P], st.ri[r, O]
    if st.cfg[C_KVP] == PAGED:
        return units(st, d, p + o) + st.ii[d, WMARK]
    return reserved(st, p, o)


@kernel(inline=True)
def release(st, d, r):
    """Free a request's units."""
    st.ii[d, USED] -= st.ri[r, ALLOC]
    st.ri[r, ALLOC] = 0


@kernel(inline=True)
def span(st, d, r, kind):
    """Record the span a preempted request spent out of the batch, if it was preempted."""
    if not math.isnan(st.rf[r, PREEMPTED_AT]):
        k = st.g[G_NSPANS]
        if k >= st.spi.shape[0]:
            raise IndexError("preemption spans beyond the table's capacity")
        st.spi[k, SPAN_KIND] = kind
        st.spi[k, SPAN_ROLE] = st.ii[d, ROLE]
        st.spi[k, SPAN_INST] = st.ii[d, INDEX]
        st.spi[k, SPAN_R] = r
        st.spf[k, SPAN_FROM] = st.rf[r, PREEMPTED_AT]
        st.spf[k, SPAN_TO] = st.gf[F_NOW]
        st.g[G_NSPANS] = k + 1
        st.rf[r, PREEMPTED_AT] = math.nan


@kernel(inline=True)
def try_admit(st, d):
    """Admit the head of the queue if its KV fits (§2.1); the request, or -1."""
    r = st.ii[d, Q_HEAD]
    if st.ri[r, T] == 0:
        st.ri[r, T] = st.ri[r, P]
    n = need(st, d, r)
    if not room(st, d, n + st.ii[d, WMARK]):
        return -1
    queue_pop(st, d)
    st.ri[r, ALLOC] = n
    st.ri[r, DONE_TOK] = 0
    st.ri[r, BASE] = st.ri[r, TOK]
    st.ii[d, USED] += n
    span(st, d, r, SPAN_RECOMPUTE)
    if math.isnan(st.rf[r, PS]):
        st.rf[r, PS] = st.gf[F_NOW]
    run_insert(st, d, r)
    return r


@kernel(inline=True)
def swap_cost(st, d, n):
    """Bytes of ``n`` blocks over the host link; their seconds join the instance's debt."""
    nbytes = n * st.cfg[C_BLOCK] * st.cfg[C_KV_TOK]
    t = n * st.cf[H_LATENCY] + nbytes / st.cf[H_BW]
    st.fi[d, DEBT] += t
    st.fi[d, SWAP_S] += t
    st.fi[d, SWAP_J] += nbytes * 8 * st.cf[H_PJ] * 1e-12
    return nbytes


@kernel(inline=True)
def preempt(st, d, v):
    """Preempt ``v``: swap a decoding row out (with swap), else free it for a recompute (§3.2)."""
    decoding = st.ri[v, DONE_TOK] >= st.ri[v, T]
    run_remove(st, d, v)
    st.ii[d, PREEMPTIONS] += 1
    st.rf[v, PREEMPTED_AT] = st.gf[F_NOW]
    if st.cfg[C_SWAP] and decoding:
        n = st.ri[v, ALLOC]
        st.ii[d, SWAP_OUT] += swap_cost(st, d, n)
        st.ii[d, USED] -= n
        st.ri[v, SWAPPED_UNITS] = n
        st.ri[v, ALLOC] = 0
        swapped_insert(st, d, v)
        return
    release(st, d, v)
    st.ri[v, T] = st.ri[v, P] + st.ri[v, TOK]
    st.ri[v, DONE_TOK] = 0
    queue_push_front(st, d, v)


@kernel(inline=True)
def grow_listed(st, d):
    """Give the rows the last step listed their blocks if all of them fit (no preemption: the
    same units as row by row, in any order); whether they did. The list is every decoding row
    that needs a block while the running rows are as that step left them."""
    if st.ii[d, GROW_GEN] != st.ii[d, RUN_GEN]:
        return False
    ri, rows = st.ri, st.grow
    unit = st.ii[d, UNIT]
    more = 0
    for k in range(st.ii[d, N_GROW]):
        r = rows[d, k]
        more += -(-(ri[r, P] + ri[r, TOK]) // unit) - ri[r, ALLOC]
    if not room(st, d, more):
        return False
    for k in range(st.ii[d, N_GROW]):
        r = rows[d, k]
        ri[r, ALLOC] = -(-(ri[r, P] + ri[r, TOK]) // unit)
    st.ii[d, USED] += more
    st.ii[d, ALLOCATED] += more
    return True


@kernel(inline=True)
def grow(st, d):
    """Give decoding rows the blocks their next token needs, preempting the latest (§3.2): the
    rows the last step listed when they all fit, else row by row over the running rows."""
    if st.cfg[C_KVP] != PAGED:
        return
    listed = grow_listed(st, d)
    st.ii[d, GROW_GEN] = -1
    if listed:
        return
    ri, run = st.ri, st.run  # locals: no reference counting per row
    unit = st.ii[d, UNIT]
    i = 0
    while i < st.ii[d, N_RUN]:
        r = run[d, i]
        if ri[r, DONE_TOK] < ri[r, T]:
            i += 1
            continue
        context = ri[r, P] + ri[r, TOK]
        if context <= ri[r, ALLOC] * unit:  # its blocks hold the next token (no division per row)
            i += 1
            continue
        n = -(-context // unit)
        while True:
            if room(st, d, n - st.ri[r, ALLOC]):
                st.ii[d, USED] += n - st.ri[r, ALLOC]
                st.ii[d, ALLOCATED] += n - st.ri[r, ALLOC]
                st.ri[r, ALLOC] = n
                i += 1
                break
            victim = st.run[d, st.ii[d, N_RUN] - 1]
            preempt(st, d, victim)
            if victim == r:
                break


@kernel(inline=True)
def swap_in(st, d):
    """Swap rows back in, earliest first, while they fit (§3.3)."""
    while st.ii[d, SW_LEN] > 0 and st.ii[d, N_RUN] < st.ii[d, MAX_ROWS]:
        r = st.ii[d, SW_HEAD]
        n = st.ri[r, SWAPPED_UNITS]
        if not room(st, d, n):
            return
        st.ii[d, SW_HEAD] = st.nxt[r]
        st.ii[d, SW_LEN] -= 1
        st.ii[d, SWAP_IN] += swap_cost(st, d, n)
        st.ii[d, USED] += n
        st.ri[r, ALLOC] = n
        span(st, d, r, SPAN_SWAP)
        run_insert(st, d, r)
