"""Independent test oracles for kvcargo.

:mod:`oracle.simpy_oracle` is a deliberately simple SimPy re-implementation of the reference
simulator's event semantics (reference-semantics §6), used to check the real engine;
:mod:`oracle.serving_oracle` models the companion's scheduled instances (batching policies, KV
policies, paging with recompute and swap, disaggregated reserve-then-transfer, prefix caching,
closed-loop sessions) the same plain way.
"""

from .simpy_oracle import OracleResult, run_oracle

__all__ = ["OracleResult", "run_oracle"]
