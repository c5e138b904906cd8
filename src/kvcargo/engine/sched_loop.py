"""The scheduled engine's event loop over plain arrays (levers-serving §1–§4, §6.3).

It replays the SimPy model's event order exactly: pending events are ordered by (time,
priority, sequence) as SimPy orders (time, priority, event id); a process start is urgent,
everything else normal. The processes are state machines: the arrival process, one loop per
instance (asleep, woken, or waiting for its step to end), one hand-off per request (start,
link grant, transfer end; the link channel's release is an event of its own, as in SimPy's
resource), and the think-time timeouts that release later turns. Each instance's step is the
same sequence of admissions, growth, preemptions and pricing as :mod:`.scheduled`'s, on arrays.

A request's token gaps are not stored per token: a token on the logged step right after the
step of its previous token on the same instance (the common case) extends the request's current
*run*; any other token starts a new run holding its gap. The gaps follow from the runs and the
step log (:mod:`.sched_gaps`).
"""

from __future__ import annotations

import math

from kvcargo._jit import kernel
from kvcargo.engine.heap import A as HEAP_A
from kvcargo.engine.heap import B as HEAP_B
from kvcargo.engine.heap import heap_pop, heap_push
from kvcargo.engine.lists import fifo_pop, fifo_push
from kvcargo.engine.pricing import scheduled_step
from kvcargo.engine.sched_memory import (
    became_decoding,
    grow,
    need,
    pop,
    push,
    queue_push,
    release,
    room,
    run_insert,
    run_remove,
    swap_in,
    try_admit,
    units,
    whole_need,
)
from kvcargo.engine.sched_state import (
    ACTIVE,
    ALLOC,
    ALLOC_INT,
    ALLOCATED,
    ARR,
    ARRIVE,
    BASE,
    BUSY,
    C_BUDGET,
    C_CALIBRATED,
    C_CHANNELS,
    C_COLOCATED,
    C_ENDPOINT,
    C_KVP,
    C_NDEC,
    C_NPRE,
    C_POLICY,
    CAP,
    CHUNKED,
    CHUNKED_STEP,
    COMM,
    COMPUTED,
    CONTEXT,
    CUR_LOG,
    DEBT,
    DECODE,
    DECODE_PRIORITY,
    DECODE_STEP,
    DINST,
    DONE_TOK,
    DS,
    E_C,
    E_M,
    EP_BYTES,
    EP_OPS,
    EVENTS_FULL,
    F_LINK_BUSY,
    F_LINK_J,
    F_NOW,
    F_TRANSIT_J,
    FIN,
    FINISHED,
    FIRST,
    FLOPS,
    G_DONE,
    G_INBOX,
    G_LINK_USERS,
    G_NEV,
    G_NEXT_ROOT,
    G_NRUNS,
    G_NSPANS,
    G_NSTEPS,
    G_REJ,
    G_SEQ,
    G_STOP,
    G_XFERS,
    GROW_GEN,
    HELD,
    IB_HEAD,
    IB_LEN,
    IB_TAIL,
    IN_FLIGHT,
    INDEX,
    KR,
    KS,
    L_HEAD,
    L_LEN,
    L_TAIL,
    LAST,
    LAST_STEP,
    LINK_RELEASE,
    LIVELOCK,
    LOG_END,
    LOG_FULL,
    LOG_INST,
    LOG_ROWS,
    LOG_START,
    LQ_HEAD,
    LQ_TAIL,
    MAX_ROWS,
    N_CHUNK,
    N_DEC,
    N_GROW,
    N_LOGGED,
    N_PREFILLING,
    N_RUN,
    NBYTES,
    NORMAL,
    PAGED,
    PINST,
    POOL,
    PREFILL,
    PREV_LOG,
    PROMPT_STEP,
    Q_HEAD,
    Q_LEN,
    Q_TOKENS,
    RECOMPUTED,
    ROLE,
    RUN,
    RUN_GEN,
    RUN_INST,
    RUN_INT,
    RUN_LEN,
    RUN_M,
    RUN_ORD,
    RUN_R,
    RUNS_FULL,
    SCALE_UP_J,
    SLEEPING,
    SPANS_FULL,
    STALLED,
    STATE,
    STATUS,
    STEP_END,
    STEP_KIND,
    STEPS,
    SUCC,
    SW_HEAD,
    SW_LEN,
    THINK,
    TOK,
    TOK_INT,
    TOKENS,
    TRANSIT_J,
    TURN,
    UNIT,
    URGENT,
    USED,
    WAKE,
    WAKING,
    WMARK,
    XFER_DONE,
    XFER_GRANT,
    XFER_INIT,
    XFER_J,
    XFER_T,
    O,
    P,
    T,
)

# ------------------------------------------------------------------ the event heap


SEQ_SPAN = 1 << 40
"""Events order by (time, priority, sequence); the shared heap breaks ties by one integer,
priority · SEQ_SPAN + sequence, the same order while a run schedules fewer than 2⁴⁰ events."""


@kernel(inline=True)
def schedule(st, t, prio, kind, idx):
    """Put an event on the heap (SimPy's ``env.schedule``)."""
    seq = st.g[G_SEQ]
    st.g[G_SEQ] = seq + 1
    n = st.g[G_NEV]
    heap_push(st.evt, st.evi, 0, n, t, prio * SEQ_SPAN + seq, kind, idx)
    st.g[G_NEV] = n + 1


@kernel(inline=True)
def pop_event(st):
    """Remove the earliest event: (time, kind, index)."""
    t, kind, idx = st.evt[0, 0], st.evi[0, 0, HEAP_A], st.evi[0, 0, HEAP_B]
    n = st.g[G_NEV]
    heap_pop(st.evt, st.evi, 0, n)
    st.g[G_NEV] = n - 1
    return t, kind, idx


@kernel(inline=True)
def poke(st, d):
    """Wake instance ``d`` if it sleeps (its wake event succeeds now)."""
    if st.ii[d, STATE] == SLEEPING:
        st.ii[d, STATE] = WAKING
        schedule(st, st.gf[F_NOW], NORMAL, WAKE, d)


# ------------------------------------------------------------------ tokens and settling


@kernel(inline=True)
def last_token(st, r):
    """When request ``r`` got its last token: the end of its logged step (the same float as the
    step's end event), else the time kept for it."""
    j = st.ri[r, LAST_STEP]
    return st.logf[j, LOG_END] if j >= 0 else st.rf[r, LAST]


@kernel(inline=True)
def end_run(st, r):
    """Request ``r``'s current run of token gaps (if any) ends: its length goes to its row."""
    if st.ri[r, RUN] >= 0:
        st.runi[st.ri[r, RUN], RUN_M] = st.ri[r, RUN_LEN]


@kernel(inline=True)
def token(st, d, r, first):
    """Request ``r`` got a token at the end of ``d``'s step in flight (``first``: its first)."""
    now = st.gf[F_NOW]
    j = st.ii[d, CUR_LOG]
    if not first and j >= 0 and st.ri[r, LAST_STEP] == st.ii[d, PREV_LOG]:
        st.ri[r, RUN_LEN] += 1
    elif first and j < 0:
        st.ri[r, RUN] = -1  # no gap now, and the next token's gap starts a run
    else:
        end_run(st, r)
        k = st.g[G_NRUNS]
        st.runi[k, RUN_R] = r
        st.runi[k, RUN_INST] = st.ii[d, INDEX]
        st.runi[k, RUN_ORD] = st.ii[d, N_LOGGED] - 1 if j >= 0 else -1  # the step in flight is d's latest
        st.runf[k] = math.nan if first else now - last_token(st, r)
        st.g[G_NRUNS] = k + 1
        st.ri[r, RUN] = k
        st.ri[r, RUN_LEN] = 1
    st.ri[r, LAST_STEP] = j if j >= 0 else -2
    if j < 0:
        st.rf[r, LAST] = now
    if first:
        st.rf[r, FIRST] = now
    st.ri[r, TOK] += 1
    st.ii[d, CONTEXT] += 1  # a running, decoding row
    st.ii[d, TOKENS] += 1


@kernel(inline=True)
def _settled(st):
    if st.g[G_DONE] + st.g[G_REJ] == st.ri.shape[0]:
        st.g[G_STOP] = 1


@kernel(inline=True)
def finish(st, r):
    """Request ``r`` is done; its next turn is released after its think time."""
    now = st.gf[F_NOW]
    end_run(st, r)
    st.rf[r, FIN] = now
    st.ri[r, STATUS] = 1
    st.g[G_DONE] += 1
    nxt = st.ri[r, SUCC]
    if nxt >= 0:
        schedule(st, now + st.rf[nxt, THINK], NORMAL, TURN, nxt)
    _settled(st)


@kernel(inline=True)
def end(st, d, r):
    """Free a finished request's units and settle it."""
    release(st, d, r)
    finish(st, r)


# ------------------------------------------------------------------ arrivals and routing


@kernel(inline=True)
def load(st, d):
    """Routing load: waiting, swapped, in flight or landed, and decoding requests."""
    return (st.ii[d, IB_LEN] + st.ii[d, IN_FLIGHT] + st.ii[d, L_LEN] + st.ii[d, Q_LEN] + st.ii[d, SW_LEN]
            + st.ii[d, N_RUN] - st.ii[d, N_PREFILLING])


@kernel(inline=True)
def least_loaded(st, lo, hi):
    best = lo
    for d in range(lo + 1, hi):
        if load(st, d) < load(st, best):
            best = d
    return best


@kernel(inline=True)
def rejects(st, r):
    """Whether a request can never fit (§1.2)."""
    d0 = st.cfg[C_NPRE]
    if whole_need(st, d0, r) > st.ii[d0, CAP]:
        return True
    return st.cfg[C_NPRE] > 0 and units(st, 0, st.ri[r, P]) > st.ii[0, CAP]


@kernel(inline=True)
def submit(st, d, r):
    queue_push(st, d, r)
    poke(st, d)


@kernel(inline=True)
def arrive(st, r):
    """Request ``r`` arrives: rejected with its later turns, or routed to an instance."""
    npre = st.cfg[C_NPRE]
    if rejects(st, r):
        while True:
            st.ri[r, STATUS] = 2
            st.g[G_REJ] += 1
            if st.ri[r, SUCC] < 0:
                break
            r = st.ri[r, SUCC]
        _settled(st)
    elif st.cfg[C_COLOCATED]:
        d = least_loaded(st, 0, st.cfg[C_NDEC])
        st.ri[r, DINST] = d
        submit(st, d, r)
    else:
        best = 0
        for d in range(1, npre):
            if st.ii[d, Q_TOKENS] < st.ii[best, Q_TOKENS]:
                best = d
        st.ri[r, PINST] = best
        submit(st, best, r)


@kernel(inline=True)
def next_arrival(st):
    """The arrival process waits for its next root request: ``max(0, arrival - now)``."""
    k = st.g[G_NEXT_ROOT]
    if k < st.roots.shape[0]:
        now = st.gf[F_NOW]
        schedule(st, now + max(0.0, st.rf[st.roots[k], ARR] - now), NORMAL, ARRIVE, k)


# ------------------------------------------------------------------ disaggregated hand-off


@kernel(inline=True)
def pull(st, d):
    """Reserve KV for waiting hand-offs (strict FIFO) and start their transfers (§4.2)."""
    while st.ii[d, IB_LEN] > 0 and st.ii[d, SW_LEN] == 0:
        r = st.ii[d, IB_HEAD]
        n = need(st, d, r)
        if not room(st, d, n + st.ii[d, WMARK]):
            return
        pop(st, d, IB_HEAD, IB_TAIL, IB_LEN)
        st.g[G_INBOX] -= 1
        st.ri[r, ALLOC] = n
        st.ii[d, USED] += n
        st.ii[d, IN_FLIGHT] += 1
        schedule(st, st.gf[F_NOW], URGENT, XFER_INIT, r)


@kernel(inline=True)
def hand_off(st, r):
    """A prefilled request picks its decode instance now and waits there for KV memory."""
    npre = st.cfg[C_NPRE]
    d = least_loaded(st, npre, npre + st.cfg[C_NDEC])
    st.ri[r, DINST] = d - npre
    push(st, d, IB_HEAD, IB_TAIL, IB_LEN, r)
    st.g[G_INBOX] += 1
    pull(st, d)


@kernel(inline=True)
def link_trigger(st):
    """A link request or release: grant the head waiter if a channel is free (SimPy's
    ``Resource._trigger_put``, which looks at the head only)."""
    if st.lq[0, LQ_HEAD] >= 0 and st.g[G_LINK_USERS] < st.cfg[C_CHANNELS]:
        r = fifo_pop(st.nxt, st.lq, 0, LQ_HEAD, LQ_TAIL)
        st.g[G_LINK_USERS] += 1
        schedule(st, st.gf[F_NOW], NORMAL, XFER_GRANT, r)


@kernel(inline=True)
def transfer_event(st, kind, r):
    """The hand-off process of request ``r``: start (request a channel), granted, done."""
    now = st.gf[F_NOW]
    if kind == XFER_INIT:
        fifo_push(st.nxt, st.lq, 0, LQ_HEAD, LQ_TAIL, r)
        link_trigger(st)
    elif kind == XFER_GRANT:
        st.rf[r, KS] = now
        st.g[G_XFERS] += 1
        st.gf[F_LINK_BUSY] += st.rf[r, XFER_T]
        st.gf[F_LINK_J] += st.rf[r, XFER_J]
        st.gf[F_TRANSIT_J] += st.rf[r, TRANSIT_J]
        schedule(st, now + st.rf[r, XFER_T], NORMAL, XFER_DONE, r)
    else:
        st.g[G_LINK_USERS] -= 1
        schedule(st, now, NORMAL, LINK_RELEASE, 0)
        st.rf[r, KR] = now
        p = st.ri[r, PINST]
        st.ii[p, USED] -= st.ri[r, HELD]
        st.ri[r, HELD] = 0
        poke(st, p)
        d = st.cfg[C_NPRE] + st.ri[r, DINST]
        st.ii[d, IN_FLIGHT] -= 1
        push(st, d, L_HEAD, L_TAIL, L_LEN, r)
        poke(st, d)


# ------------------------------------------------------------------ steps


@kernel(inline=True)
def snap_row(st, d, r, c):
    k = st.ii[d, N_DEC] + st.ii[d, N_CHUNK]
    st.snap[d, k] = r
    st.snapc[d, k] = c
    st.ii[d, N_CHUNK] += 1


@kernel(inline=True)
def start_step(st, d, kind):
    """Price the step over the snapshot (decode rows, then chunks), add any host-link time owed,
    accumulate the occupancy integrals from the state before it, log it and wait it out."""
    ndec, nch = st.ii[d, N_DEC], st.ii[d, N_CHUNK]
    role = st.ii[d, ROLE]
    c_sum = 0
    attn = 0
    kv = 0
    last = 0
    ep_ops = 0.0
    ep_bytes = 0.0
    ri, rf, snap, snapc = st.ri, st.rf, st.snap, st.snapc
    endpoint = role == PREFILL and st.cfg[C_ENDPOINT]
    recomputed = 0
    for k in range(ndec, ndec + nch):
        r, c = snap[d, k], snapc[d, k]
        done = ri[r, DONE_TOK]
        c_sum += c
        attn += c * (2 * done + c + 1)
        kv += done + c
        if ri[r, TOK] > 0:
            recomputed += c
        if done + c == ri[r, T]:
            last += 1
            if endpoint and ri[r, O] > 1:
                ep_ops += rf[r, EP_OPS]
                ep_bytes += rf[r, EP_BYTES]
    st.ii[d, COMPUTED] += c_sum
    st.ii[d, RECOMPUTED] += recomputed
    context = st.ii[d, CONTEXT] if ndec else 0  # the decode rows are every decoding row
    pool = st.ii[d, POOL]
    dt, fl, nbytes, e_c, e_m, comm_t, scale_up_j = scheduled_step(
        st.hf[pool], st.hs[pool], st.lf[pool], st.ct[pool], st.cs[pool], st.cfg[C_CALIBRATED], st.mi, st.mf, ndec,
        context, c_sum, attn, kv, nch, last, ep_ops, ep_bytes)
    st.fi[d, COMM] += comm_t
    st.fi[d, SCALE_UP_J] += scale_up_j
    dt = dt + st.fi[d, DEBT]
    st.fi[d, DEBT] = 0.0
    if role != PREFILL:
        st.fi[d, RUN_INT] += st.ii[d, N_RUN] * dt
        st.fi[d, TOK_INT] += st.ii[d, TOKENS] * dt
        st.fi[d, ALLOC_INT] += st.ii[d, ALLOCATED] * st.ii[d, UNIT] * dt
    st.fi[d, BUSY] += dt
    st.fi[d, FLOPS] += fl
    st.fi[d, NBYTES] += nbytes
    st.fi[d, E_C] += e_c
    st.fi[d, E_M] += e_m
    st.ii[d, STEPS] += 1
    now = st.gf[F_NOW]
    st.ii[d, CUR_LOG] = -1
    if ndec:
        j = st.g[G_NSTEPS]
        st.logf[j, LOG_START] = now
        st.logf[j, LOG_END] = now + dt
        st.logi[j, LOG_INST] = st.ii[d, INDEX]
        st.logi[j, LOG_ROWS] = ndec
        st.ii[d, N_LOGGED] += 1
        st.g[G_NSTEPS] = j + 1
        st.ii[d, CUR_LOG] = j
    st.ii[d, STEP_KIND] = kind
    st.ii[d, STATE] = ACTIVE
    schedule(st, now + dt, NORMAL, STEP_END, d)


@kernel(inline=True)
def prompt_batch(st, d):
    """Whole prompts from the queue head within the token budget (§2.2); the rows admitted."""
    tokens = 0
    n = 0
    while st.ii[d, Q_LEN] > 0 and st.ii[d, N_RUN] < st.ii[d, MAX_ROWS] and st.ii[d, SW_LEN] == 0:
        head = st.ii[d, Q_HEAD]
        x = st.ri[head, T] if st.ri[head, T] != 0 else st.ri[head, P]
        if n > 0 and tokens + x > st.cfg[C_BUDGET]:
            break
        if try_admit(st, d) < 0:
            break
        snap_row(st, d, head, st.ri[head, T] - st.ri[head, DONE_TOK])
        n += 1
        tokens += st.ri[head, T] - st.ri[head, DONE_TOK]
    return n


@kernel(inline=True)
def decode_rows(st, d):
    """Grow, then snapshot every running row as a decode row; whether any is left."""
    grow(st, d)
    n = st.ii[d, N_RUN]
    for k in range(n):
        st.snap[d, k] = st.run[d, k]
    st.ii[d, N_DEC] = n
    return n > 0


@kernel(inline=True)
def chunked_rows(st, d):
    """One Sarathi-Serve step's rows: every decode row plus prompt chunks up to the budget
    (§2.4); whether the step runs."""
    grow(st, d)
    budget = st.cfg[C_BUDGET]
    ri, run, snap, snapc = st.ri, st.run, st.snap, st.snapc
    n = st.ii[d, N_RUN] - st.ii[d, N_PREFILLING]
    st.ii[d, N_DEC] = n
    k_chunk = n
    if st.ii[d, N_PREFILLING] == 0:  # every running row decodes, in running order
        for k in range(n):
            snap[d, k] = run[d, k]
    else:
        k_dec = 0
        for k in range(st.ii[d, N_RUN]):
            r = run[d, k]
            if ri[r, DONE_TOK] >= ri[r, T]:
                snap[d, k_dec] = r
                k_dec += 1
            elif n < budget:
                c = min(ri[r, T] - ri[r, DONE_TOK], budget - n)
                n += c
                snap[d, k_chunk] = r
                snapc[d, k_chunk] = c
                k_chunk += 1
    st.ii[d, N_CHUNK] = k_chunk - st.ii[d, N_DEC]
    while st.ii[d, Q_LEN] > 0 and n < budget and st.ii[d, N_RUN] < st.ii[d, MAX_ROWS] and st.ii[d, SW_LEN] == 0:
        r = try_admit(st, d)
        if r < 0:
            break
        c = min(st.ri[r, T] - st.ri[r, DONE_TOK], budget - n)
        n += c
        snap_row(st, d, r, c)
    return st.ii[d, N_DEC] + st.ii[d, N_CHUNK] > 0


@kernel(inline=True)
def boundary(st, d):
    """Decode pool: reserve for waiting hand-offs, then landed requests join the batch."""
    pull(st, d)
    while st.ii[d, L_LEN] > 0 and st.ii[d, N_RUN] < st.ii[d, MAX_ROWS]:
        r = pop(st, d, L_HEAD, L_TAIL, L_LEN)
        st.rf[r, DS] = st.gf[F_NOW]
        st.ri[r, DONE_TOK] = st.ri[r, P]
        st.ri[r, BASE] = st.ri[r, TOK]
        run_insert(st, d, r)


@kernel(inline=True)
def begin(st, d):
    """One pass of the instance's loop (§2.2): start a step, or sleep (or stop the run: -2)."""
    kind = _next_step(st, d)
    if kind == -2:
        st.g[G_STOP] = 2
    elif kind < 0:
        st.ii[d, STATE] = SLEEPING
    else:
        start_step(st, d, kind)


@kernel(inline=True)
def _next_step(st, d):
    """Loop until a step is chosen (its kind, its rows in the snapshot), the instance has
    nothing to do (-1) or it would loop for ever (-2).

    A pass without a step preempted every running row. With swap, the next pass at this same
    instant swaps them back in; if the first of them still finds no block for its next token,
    the pass ends as the last one did. Its memory, swapped and waiting rows as after the last
    pass (nothing joined, nothing grew) mean every later pass repeats it: the companion's loop
    spins at this instant for ever (a decode instance whose other memory is held by hand-offs in
    flight, which land only later)."""
    policy = st.cfg[C_POLICY]
    role = st.ii[d, ROLE]
    seen = (-1, -1, -1, -1, -1)
    while True:
        st.ii[d, N_DEC] = 0
        st.ii[d, N_CHUNK] = 0
        if role == DECODE:
            boundary(st, d)
        if st.ii[d, SW_LEN] > 0:
            swap_in(st, d)
        if policy == CHUNKED:
            return CHUNKED_STEP if chunked_rows(st, d) else -1
        if policy != DECODE_PRIORITY or role == PREFILL or st.ii[d, N_RUN] == 0:
            if prompt_batch(st, d) > 0:
                return PROMPT_STEP
            if st.ii[d, N_RUN] == 0:
                return -1
        if decode_rows(st, d):  # decode-priority with rows running, or no prompt admitted
            return DECODE_STEP
        state = (st.ii[d, USED], st.ii[d, SW_HEAD], st.ii[d, SW_LEN], st.ii[d, Q_LEN], st.ii[d, L_LEN])
        if state == seen:
            return -2
        seen = state


@kernel(inline=True)
def prefill_done(st, d, r):
    """A (re)prefill completed at the end of the step (§2.6, §4.1)."""
    if st.ii[d, ROLE] == PREFILL:
        token(st, d, r, True)
        run_remove(st, d, r)
        if st.ri[r, O] <= 1:
            release(st, d, r)
            finish(st, r)
        else:
            st.ri[r, HELD] = st.ri[r, ALLOC]
            st.ri[r, ALLOC] = 0
            hand_off(st, r)
        return
    token(st, d, r, st.ri[r, TOK] == 0)
    if math.isnan(st.rf[r, DS]) and st.ri[r, O] > 1:
        st.rf[r, DS] = st.gf[F_NOW]
    if st.ri[r, TOK] >= st.ri[r, O]:
        run_remove(st, d, r)
        end(st, d, r)


@kernel(inline=True)
def advance(st, d):
    """Every decode row of the step got its next token; those at their length finish, in row
    order, once all have advanced."""
    ndec = st.ii[d, N_DEC]
    ri, snap, grow_rows = st.ri, st.snap, st.grow
    j, prev = st.ii[d, CUR_LOG], st.ii[d, PREV_LOG]
    paged = st.cfg[C_KVP] == PAGED
    unit = st.ii[d, UNIT]
    finished = 0
    steady = 0
    short = 0
    for k in range(ndec):
        r = snap[d, k]
        if ri[r, LAST_STEP] == prev:  # its run goes on (token's first case, inlined)
            ri[r, RUN_LEN] += 1
            ri[r, LAST_STEP] = j
            ri[r, TOK] += 1
            steady += 1
        else:
            token(st, d, r, False)
        if ri[r, TOK] >= ri[r, O]:
            finished += 1
        elif paged and ri[r, P] + ri[r, TOK] > ri[r, ALLOC] * unit and ri[r, DONE_TOK] >= ri[r, T]:
            grow_rows[d, short] = r  # its next token needs a block (grow's test)
            short += 1
    st.ii[d, CONTEXT] += steady
    st.ii[d, TOKENS] += steady
    if finished:
        for k in range(ndec):
            r = snap[d, k]
            if ri[r, TOK] >= ri[r, O]:
                run_remove(st, d, r)
        for k in range(ndec):
            r = snap[d, k]
            if ri[r, TOK] >= ri[r, O]:
                end(st, d, r)
    st.ii[d, N_GROW] = short
    st.ii[d, GROW_GEN] = st.ii[d, RUN_GEN]  # the list holds until the running rows change


@kernel(inline=True)
def step_end(st, d):
    """The step in flight on ``d`` ended: its rows advance, its prompts complete."""
    kind = st.ii[d, STEP_KIND]
    ndec, nch = st.ii[d, N_DEC], st.ii[d, N_CHUNK]
    if kind == PROMPT_STEP:
        for k in range(nch):
            r = st.snap[d, k]
            st.ii[d, TOKENS] += st.ri[r, T] - st.ri[r, DONE_TOK]
            st.ri[r, DONE_TOK] = st.ri[r, T]
            became_decoding(st, d, r)
            prefill_done(st, d, r)
    else:
        advance(st, d)
        for k in range(ndec, ndec + nch):
            r = st.snap[d, k]
            st.ri[r, DONE_TOK] += st.snapc[d, k]
            st.ii[d, TOKENS] += st.snapc[d, k]
            if st.ri[r, DONE_TOK] == st.ri[r, T]:
                became_decoding(st, d, r)
                prefill_done(st, d, r)
    if st.ii[d, CUR_LOG] >= 0:
        st.ii[d, PREV_LOG] = st.ii[d, CUR_LOG]


# ------------------------------------------------------------------ the loop


@kernel(refcounts=False)
def run_events(st):
    """Simulate until every request is settled (FINISHED), a table is full (grow it and call
    again: it resumes where it paused), no event is left (STALLED) or an instance would pass
    without a step for ever (LIVELOCK)."""
    if st.g[G_SEQ] == 0:  # a fresh run: every instance's loop starts (urgent), then the arrivals
        for d in range(st.ii.shape[0]):
            schedule(st, 0.0, URGENT, WAKE, d)
        next_arrival(st)
    room_needed = 2 * st.run.shape[1] + 16
    while st.g[G_STOP] == 0:
        if st.g[G_NEV] == 0:
            return STALLED
        if st.g[G_NEV] + room_needed + st.g[G_INBOX] > st.evt.shape[1]:
            return EVENTS_FULL
        if st.g[G_NSTEPS] + 2 > st.logf.shape[0]:
            return LOG_FULL
        if st.g[G_NRUNS] + room_needed > st.runi.shape[0]:
            return RUNS_FULL
        if st.g[G_NSPANS] + room_needed > st.spi.shape[0]:
            return SPANS_FULL
        t, kind, idx = pop_event(st)
        st.gf[F_NOW] = t
        if kind == STEP_END or kind == WAKE:
            if kind == STEP_END:
                step_end(st, idx)
            begin(st, idx)  # its only call: inlined
        elif kind == ARRIVE:
            arrive(st, st.roots[idx])
            st.g[G_NEXT_ROOT] = idx + 1
            next_arrival(st)
        elif kind == TURN:
            st.rf[idx, ARR] = t
            arrive(st, idx)
        elif kind == LINK_RELEASE:
            link_trigger(st)
        else:
            transfer_event(st, kind, idx)
    return FINISHED if st.g[G_STOP] == 1 else LIVELOCK
