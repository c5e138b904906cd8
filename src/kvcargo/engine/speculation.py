"""Decode rows under speculative decoding: every step is one verify pass, and each row gains the
draft tokens its own seeded acceptance stream accepts plus the target's token.

A row can gain several tokens per step, so the finish-step heap of plain decoding does not apply:
each instance keeps its running requests in a row array (``State.rows``) and a step walks it once.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.events import finish_request
from kvcargo.engine.state import (
    D_CONTEXT,
    D_KV_USED,
    D_RUNNING,
    D_STEPS,
    OUTPUT,
    P_GAMMA,
    P_NPREFILL,
    P_SPEC_SEED,
    PROMPT,
    RNG,
    S_GAINED,
    S_VERIFY_ROWS,
    TOKENS_OUT,
    VERIFY,
)
from kvcargo.speculative import accepted, seed_state


@kernel(inline=True)
def spec_join(st, pr, d, r):
    """Request ``r`` becomes a running row of instance ``d`` (its first token already out)."""
    st.rows[d, st.d[d, D_RUNNING]] = r
    st.spec[r, TOKENS_OUT] = 1
    st.spec[r, VERIFY] = 0
    st.spec[r, RNG] = seed_state(pr.ints[P_SPEC_SEED], r)


@kernel(refcounts=False)
def spec_step_end(st, pr, d):
    """After a verify pass: each row draws its acceptances and gains ``min(k + 1, left)`` tokens;
    rows that reach their output length free their KV and finish (row order kept)."""
    gamma = pr.ints[P_GAMMA]
    row = pr.ints[P_NPREFILL] + d
    n = st.d[d, D_RUNNING]
    st.stats[row, S_VERIFY_ROWS] += n
    kept = 0
    for i in range(n):
        r = st.rows[d, i]
        state, k = accepted(st.spec[r, RNG], gamma, pr.alpha[0])
        st.spec[r, RNG] = state
        gain = min(k + 1, pr.ri[r, OUTPUT] - st.spec[r, TOKENS_OUT])
        st.spec[r, TOKENS_OUT] += gain
        st.spec[r, VERIFY] += 1
        st.stats[row, S_GAINED] += gain
        st.d[d, D_CONTEXT] += gain
        if st.spec[r, TOKENS_OUT] >= pr.ri[r, OUTPUT]:
            need = pr.ri[r, PROMPT] + pr.ri[r, OUTPUT]
            st.d[d, D_CONTEXT] -= need
            st.d[d, D_KV_USED] -= need
            finish_request(st, r)
        else:
            st.rows[d, kept] = r
            kept += 1
    st.d[d, D_RUNNING] = kept
    st.d[d, D_STEPS] += 1
