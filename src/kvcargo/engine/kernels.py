"""The cost model's kernels as the engine calls them (compiled when numba is available).

The engine never sees a hardware number: it hands these functions the packed coefficient
arrays it was given and gets back times and energies.
"""

from kvcargo import cost
from kvcargo._jit import kernel
from kvcargo.stepcost import decode_cost, prefill_cost  # noqa: F401  (compiled where defined)

prefill_work = kernel(cost.prefill_work, inline=True)
decode_work = kernel(cost.decode_work, inline=True)
roofline = kernel(cost.roofline, inline=True)
elementwise_pass = kernel(cost.elementwise_pass, inline=True)
