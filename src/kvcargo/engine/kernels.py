"""The cost model's kernels as the engine calls them (compiled when numba is available).

The engine never sees a hardware number: it hands these functions the packed coefficient
arrays it was given and gets back times and energies. :func:`prefill_cost` and
:func:`decode_cost` are the step-cost seam: the reference roofline, or the calibrated model's
tables (``--cost-model``), or the step classes of other model families (:mod:`kvcargo.stepcost`:
FFT mixers, causal encoder-decoders, optical transform engines), behind one call.
"""

from kvcargo import calibrated, cost, parallel, speculative
from kvcargo._jit import kernel
from kvcargo.engine.state import P_CALIBRATED, P_MIXED
from kvcargo.stepcost import decode_cost as family_decode_cost  # compiled where defined
from kvcargo.stepcost import prefill_cost as family_prefill_cost

prefill_work = kernel(cost.prefill_work, inline=True)
decode_work = kernel(cost.decode_work, inline=True)
roofline = kernel(cost.roofline, inline=True)
elementwise_pass = kernel(cost.elementwise_pass, inline=True)
prefill_parts = cost.prefill_parts
decode_parts = cost.decode_parts
parallel_step = kernel(parallel.parallel_step, inline=True)
verify_parts = speculative.verify_parts
calibrated_step = calibrated.calibrated_step  # compiled where it is defined (it calls table_at)


@kernel(inline=True)
def prefill_cost(pr, pool, tokens, quad, n, xflops, xtok, xmask):
    """FLOPs, bytes, time, compute, memory and conversion energy, engine FLOPs and whether the
    engine bound it, of a prefill step over ``n`` prompts of ``tokens`` in all (Σ s(s+1) =
    ``quad``; the batch's per-request family terms ``xflops``, ``xtok``, ``xmask``) on pool row
    ``pool``."""
    if pr.ints[P_MIXED]:
        dt, flops, nbytes, e_c, e_m, e_o, opt, bound = family_prefill_cost(
            pr.mi, pr.mf, pr.xi, pr.xf, pr.hf[pool], pr.ehf[pool], pr.eo[pool], tokens, quad, n, xflops, xtok, xmask)
        return flops, nbytes, dt, e_c, e_m, e_o, opt, bound
    flops, nbytes = prefill_work(pr.mi, pr.mf, tokens, quad, n)
    if pr.ints[P_CALIBRATED]:
        dt, e_c, e_m = calibrated_step(pr.ct[pool], pr.cs[pool], pr.hf[pool], True, float(tokens), float(n),
                                       float(quad), 0.0, float(flops), nbytes)
    else:
        dt, e_c, e_m = roofline(pr.hf[pool], flops, nbytes)
    return float(flops), nbytes, dt, e_c, e_m, 0.0, 0.0, False


@kernel(inline=True)
def decode_cost(pr, pool, batch, context):
    """FLOPs, bytes, time, compute and memory energy of a decode step: ``batch`` sequences
    whose contexts sum to ``context``."""
    flops, nbytes = decode_work(pr.mi, pr.mf, batch, context)
    if pr.ints[P_CALIBRATED]:
        dt, e_c, e_m = calibrated_step(pr.ct[pool], pr.cs[pool], pr.hf[pool], False, float(batch), float(batch),
                                       0.0, float(context), float(flops), nbytes)
    else:
        dt, e_c, e_m = roofline(pr.hf[pool], flops, nbytes)
    return flops, nbytes, dt, e_c, e_m


@kernel(inline=True)
def family_step_cost(pr, pool, batch, context, rn, rt, ra, rs):
    """:func:`decode_cost` of another model family, with ``rn`` replay rows (replay tokens
    ``rt``, their attention FLOPs ``ra``, prompt tokens ``rs``) of a causal encoder-decoder."""
    dt, flops, nbytes, e_c, e_m = family_decode_cost(pr.mi, pr.mf, pr.xi, pr.xf, pr.hf[pool], batch, context,
                                                     rn, rt, ra, rs)
    return flops, nbytes, dt, e_c, e_m
