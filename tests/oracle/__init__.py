"""Independent test oracles for kvcargo.

:mod:`oracle.simpy_oracle` is a deliberately simple SimPy re-implementation of the reference
simulator's event semantics (reference-semantics §6), used to check the real engine.
"""

from .simpy_oracle import OracleResult, run_oracle

__all__ = ["OracleResult", "run_oracle"]
