"""The cost model's kernels as the engine calls them (compiled when numba is available).

The engine never sees a hardware number: it hands these functions the packed coefficient
arrays it was given and gets back times and energies. :func:`prefill_cost` and
:func:`decode_cost` are the step-cost seam: the reference roofline, or the calibrated model's
tables (``--cost-model``), behind one call.
"""

from kvcargo import calibrated, cost, parallel, speculative
from kvcargo._jit import kernel
from kvcargo.engine.state import P_CALIBRATED

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
def prefill_cost(pr, pool, tokens, quad, n):
    """FLOPs, bytes, time, compute and memory energy of a prefill step over ``n`` prompts of
    ``tokens`` in all (Σ s(s+1) = ``quad``) on pool row ``pool``."""
    flops, nbytes = prefill_work(pr.mi, pr.mf, tokens, quad, n)
    if pr.ints[P_CALIBRATED]:
        dt, e_c, e_m = calibrated_step(pr.ct[pool], pr.cs[pool], pr.hf[pool], True, float(tokens), float(n),
                                       float(quad), 0.0, float(flops), nbytes)
    else:
        dt, e_c, e_m = roofline(pr.hf[pool], flops, nbytes)
    return flops, nbytes, dt, e_c, e_m


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
