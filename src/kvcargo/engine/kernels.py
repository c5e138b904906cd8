"""The cost model's kernels as the engine calls them (compiled when numba is available).

The engine never sees a hardware number: it hands these functions the packed coefficient
arrays it was given and gets back times and energies.
"""

from kvcargo import cost, parallel, speculative
from kvcargo._jit import kernel

roofline = kernel(cost.roofline, inline=True)
elementwise_pass = kernel(cost.elementwise_pass, inline=True)
prefill_parts = cost.prefill_parts
decode_parts = cost.decode_parts
parallel_step = kernel(parallel.parallel_step, inline=True)
verify_parts = speculative.verify_parts
