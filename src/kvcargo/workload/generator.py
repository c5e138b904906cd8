"""The seeded request generator of reference-semantics §6.1, bit-identical to the reference.

One ``random.Random(seed)``; for each request in order: an exponential inter-arrival gap, then
the prompt length, then the output length (lognormal with a given mean and coefficient of
variation, rounded half-to-even and clipped). The same seed gives the same lengths at every
rate; arrival times scale as 1/rate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvcargo.errors import KvcargoError
from kvcargo.workload.stream import Workload


@dataclass(frozen=True)
class LengthDist:
    """Lognormal lengths with mean ``mean`` and coefficient of variation ``cv``, clipped to
    [lo, hi]; ``cv <= 0`` means every length is ``mean`` (and draws no random number)."""

    mean: float
    cv: float = 0.5
    lo: int = 1
    hi: int = 32768

    def __post_init__(self) -> None:
        if not self.mean > 0:
            raise KvcargoError(f"mean length must be > 0, got {self.mean:g}")
        if not 1 <= self.lo <= self.hi:
            raise KvcargoError(f"length bounds must satisfy 1 <= lo <= hi, got {self.lo}..{self.hi}")

    def params(self) -> np.ndarray:
        """(mean, cv, μ, σ, lo, hi) for the draw kernel: σ² = ln(1 + cv²), μ = ln(mean) − σ²/2."""
        sigma2 = math.log(1 + self.cv * self.cv) if self.cv > 0 else 0.0
        mu = math.log(self.mean) - sigma2 / 2
        return np.array([self.mean, self.cv, mu, math.sqrt(sigma2), self.lo, self.hi], dtype=np.float64)


DRAW_PLAIN_S = 16e-6
"""Seconds per request of drawing the workload as plain Python (this project's 2-core machine)."""
CHUNK = 1 << 20
"""Uniforms drawn per batch (bounded memory for millions of requests)."""


def generate(n: int, rate: float, prompt: LengthDist, output: LengthDist, seed: int = 1) -> Workload:
    """``n`` Poisson arrivals at ``rate`` req/s with lognormal prompt and output lengths."""
    return next(generate_chunks(n, rate, prompt, output, seed, n))


def generate_chunks(n: int, rate: float, prompt: LengthDist, output: LengthDist, seed: int = 1,
                    size: int = CHUNK) -> Iterator[Workload]:
    """:func:`generate`'s requests, ``size`` at a time (the last chunk may be shorter): the same
    random stream, so the chunks put together are :func:`generate`'s workload bit for bit, and
    a long run never holds more than a chunk of it. Each chunk's ``clipped_*`` counts its own."""
    if n < 1:
        raise KvcargoError(f"number of requests must be >= 1, got {n}")
    if not (rate > 0 and math.isfinite(rate)):
        raise KvcargoError(f"rate must be a positive number of requests per second, got {rate:g}")
    from kvcargo.engine import aot

    # before the import below, which then finds the compiled kernel
    aot.prepare(n, accumulate=False, unit_plain_s=DRAW_PLAIN_S)
    from kvcargo.workload.draws import draw_requests, uniforms

    # ~6.5 uniforms per request, drawn a bounded batch at a time
    u, state = first_uniforms(seed, min(7 * n + 64, CHUNK))
    rng = random.Random()
    rng.setstate(state)
    pos, t, first = 0, 0.0, 0
    p_par, o_par = prompt.params(), output.params()
    while first < n:
        k = min(size, n - first)
        arrival = np.empty(k, dtype=np.float64)
        plen = np.empty(k, dtype=np.int64)
        olen = np.empty(k, dtype=np.int64)
        clipped = np.zeros(2, dtype=np.int64)
        done = 0
        while True:
            done, pos, t = draw_requests(u, pos, done, t, float(rate), p_par, o_par, arrival, plen, olen,
                                         clipped)
            if done == k:
                break
            u = np.concatenate([u[pos:], uniforms(rng, min(7 * (n - first - done) + 64, CHUNK))])
            pos = 0
        first += k
        yield Workload(arrival, plen, olen, source=f"poisson rate={rate:g} seed={seed}",
                       clipped_prompts=int(clipped[0]), clipped_outputs=int(clipped[1]))


@lru_cache(maxsize=4)
def first_uniforms(seed: int, k: int) -> tuple[np.ndarray, tuple]:
    """The first ``k`` uniforms of ``random.Random(seed)`` (read-only) and the generator's state
    after them. Cached: a capacity search or a plan draws the same stream at every rate (only the
    arrival times scale), and drawing it is most of a small run's workload cost."""
    from kvcargo.workload.draws import uniforms

    rng = random.Random(seed)
    u = uniforms(rng, k)
    u.flags.writeable = False
    return u, rng.getstate()
