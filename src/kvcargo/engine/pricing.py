"""What one step of an instance costs, as the engine asks for it: the target's forward pass (the
step-cost seam of :mod:`.kernels` on one big device, or a parallel layout's slots), plus the
speculative draft's passes.

The figures come from the cost model's kernels over the packed coefficients the engine was given;
this module only adds the parts in the companion's order and books a layout's communication and
a draft's time in the instance's totals.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.calibrated import calibrated_mixed_step
from kvcargo.cost import mixed_parts
from kvcargo.engine.kernels import (
    decode_cost,
    decode_parts,
    elementwise_pass,
    parallel_step,
    prefill_cost,
    prefill_parts,
    roofline,
    verify_parts,
)
from kvcargo.engine.state import P_GAMMA, P_SPEC, S_COMM, S_DRAFT_T, S_SCALE_UP_J
from kvcargo.parallel import LF_ON


@kernel(inline=True)
def _layout_pass(st, pr, pool, row, flops, w, o, tokens):
    """One target pass with pool ``pool``'s parallel layout, its communication booked to stats row
    ``row``: (time with overhead, bytes counted, compute J, memory J)."""
    dt, e_c, e_m, nbytes, comm_t, scale_up_j = parallel_step(pr.hs[pool], pr.lf[pool], flops, w, o, tokens)
    st.stats[row, S_COMM] += comm_t
    st.stats[row, S_SCALE_UP_J] += scale_up_j
    return dt, nbytes, e_c, e_m


@kernel(inline=True)
def scheduled_pass(hf, hs, lf, flops, w, o, tokens):
    """A scheduled instance's forward pass of ``flops`` FLOPs, weight traffic ``w``, KV bytes
    ``o`` and ``tokens`` tokens on its pool (roofline ``hf``; with a layout ``lf``, its slots on
    the stage device ``hs``, levers-parallel §2.2): (time with overhead, bytes counted, compute J,
    memory J, communication s, scale-up J)."""
    if lf[LF_ON] == 0.0:
        nbytes = w + o
        dt, e_c, e_m = roofline(hf, flops, nbytes)
        return dt, nbytes, e_c, e_m, 0.0, 0.0
    dt, e_c, e_m, nbytes, comm_t, scale_up_j = parallel_step(hs, lf, flops, w, o, tokens)
    return dt, nbytes, e_c, e_m, comm_t, scale_up_j


@kernel(inline=True)
def scheduled_step(hf, hs, lf, ct, cs, calibrated, mi, mf, rows, context, chunk_tokens, chunk_attn, chunk_kv,
                   chunks, last, ep_ops, ep_bytes):
    """A scheduled instance's step over ``rows`` decode rows and ``chunks`` prompt chunks (the
    arguments of :func:`kvcargo.cost.mixed_parts`) on its pool — the calibrated model's
    (``calibrated``: tables ``ct``, ``cs``), or the roofline's with the pool's layout
    (:func:`scheduled_pass`) — plus the endpoint-compression pass (RS §5) of the prompts it
    completes: (time, FLOPs, bytes, compute J, memory J, communication s, scale-up J). Both
    scheduled engines price through it."""
    flops, w, o, tokens = mixed_parts(mi, mf, rows, context, chunk_tokens, chunk_attn, chunk_kv, last)
    if calibrated:
        nbytes = w + o
        dt, e_c, e_m = calibrated_mixed_step(ct, cs, hf, float(rows), float(context), float(chunk_tokens),
                                             float(chunk_attn), float(chunks), float(last), float(flops), nbytes)
        comm_t = 0.0
        scale_up_j = 0.0
    else:
        dt, nbytes, e_c, e_m, comm_t, scale_up_j = scheduled_pass(hf, hs, lf, flops, w, o, tokens)
    fl = flops + 0.0
    if ep_ops or ep_bytes:
        x_t, x_c, x_m = elementwise_pass(hf, ep_ops, ep_bytes)
        dt, fl, nbytes, e_c, e_m = dt + x_t, flops + ep_ops, nbytes + ep_bytes, e_c + x_c, e_m + x_m
    return dt, fl, nbytes, e_c, e_m, comm_t, scale_up_j


@kernel(inline=True)
def _with_draft_pass(pr, pool, step, f_d, w_d, o_d):
    """A step with one more draft pass (FLOPs ``f_d``, bytes ``w_d + o_d``) added left to right;
    returns it and the pass's time."""
    dt, flops, nbytes, e_c, e_m = step
    t_d, c_d, m_d = roofline(pr.hd[pool], f_d, w_d + o_d)
    return (dt + t_d, flops + f_d, nbytes + (w_d + o_d), e_c + c_d, e_m + m_d), t_d


@kernel(refcounts=False)
def prefill_step_cost(st, pr, pool, row, tokens, quad, n, xflops, xtok, xmask):
    """A prefill step over whole prompts on pool ``pool`` (0 prefill/colocated, 1 decode) of stats
    row ``row`` (another model family's per-request terms ``xflops``, ``xtok``, ``xmask``), then the
    draft's prefill of the same prompts: (time, FLOPs, bytes, compute J, memory J, and an optical
    transform engine's conversion J, FLOPs and whether it bound the step)."""
    e_o, opt, bound = 0.0, 0.0, False
    if pr.lf[pool, LF_ON] == 0.0:
        flops, nbytes, dt, e_c, e_m, e_o, opt, bound = prefill_cost(pr, pool, tokens, quad, n, xflops, xtok, xmask)
    else:
        flops, w, o = prefill_parts(pr.mi, pr.mf, tokens, quad, n)
        dt, nbytes, e_c, e_m = _layout_pass(st, pr, pool, row, flops, w, o, tokens)
    step = (dt, flops, nbytes, e_c, e_m)
    if pr.ints[P_SPEC]:
        f_d, w_d, o_d = prefill_parts(pr.mid, pr.mfd, tokens, quad, n)
        step, t_d = _with_draft_pass(pr, pool, step, f_d, w_d, o_d)
        st.stats[row, S_DRAFT_T] += 0.0 + t_d
    dt, flops, nbytes, e_c, e_m = step
    return dt, flops, nbytes, e_c, e_m, e_o, opt, bound


@kernel(refcounts=False)
def decode_step_cost(st, pr, pool, row, batch, context):
    """A decode step over ``batch`` rows whose contexts sum to ``context``; with a draft, a verify
    pass of γ + 1 tokens per row after γ draft passes: (time, FLOPs, bytes, compute J, memory J)."""
    if not pr.ints[P_SPEC]:
        if pr.lf[pool, LF_ON] == 0.0:
            flops, nbytes, dt, e_c, e_m = decode_cost(pr, pool, batch, context)
        else:
            flops, w, o = decode_parts(pr.mi, pr.mf, batch, context)
            dt, nbytes, e_c, e_m = _layout_pass(st, pr, pool, row, flops, w, o, batch)
        return dt, flops, nbytes, e_c, e_m
    gamma = pr.ints[P_GAMMA]
    flops, w, o, tokens = verify_parts(pr.mi, pr.mf, batch, context, gamma)
    if pr.lf[pool, LF_ON] == 0.0:
        dt, e_c, e_m = roofline(pr.hf[pool], flops, w + o)
        nbytes = w + o
    else:
        dt, nbytes, e_c, e_m = _layout_pass(st, pr, pool, row, flops, w, o, tokens)
    step = (dt, flops, nbytes, e_c, e_m)
    draft_t = 0.0
    for j in range(gamma):
        f_d, w_d, o_d = decode_parts(pr.mid, pr.mfd, batch, context + j * batch)
        step, t_d = _with_draft_pass(pr, pool, step, f_d, w_d, o_d)
        draft_t = draft_t + t_d
    st.stats[row, S_DRAFT_T] += draft_t
    return step
