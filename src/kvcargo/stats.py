"""Exact sample statistics, fast on millions of values.

* :func:`exact_sum` — the correctly rounded sum (``math.fsum``'s result: it is unique, so an
  exact integer accumulation, correctly rounded once, gives the same float); means are ``exact_sum / n`` as
  ``statistics.fmean`` (:func:`exact_weighted_mean` also for a sample given as multiplicities).
* :func:`percentiles` — the reference's linear interpolation between order statistics
  (reference-semantics §7), from order statistics found by partial sorting (O(n), not a sort).
* :func:`weighted_order_stat` — order statistics of a sample given as (value, multiplicity).
* :class:`ExactSum` and :class:`Sample` — the same figures for a sample received in chunks (a
  windowed run), with the chunks kept in a temporary file past a memory limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from kvcargo._jit import fast, kernel

PERCENTILES = (50, 90, 99)
"""The percentiles a run's summary reports."""
LIMBS = 67
"""32-bit limbs of :func:`_limb_sum`'s accumulator: every finite double is ``m·2^(s − 1074)``
with a 53-bit ``m`` and ``0 ≤ s ≤ 2045``, so its bits fall in limbs 0 … 65 (one more for carries)."""


CARRY_EVERY = 1 << 23
"""Values added to the limbs between carries: each adds less than 2^34 to a limb, so no limb
overflows 63 bits in between."""


@kernel(inline=True)
def _limb_add(limbs, b):
    """Add the finite double whose bits are ``b`` to the limbs (see :func:`_limb_sum`)."""
    e = (b >> 52) & 0x7FF
    m = b & 0xFFFFFFFFFFFFF
    if e > 0:
        m |= 0x10000000000000
    else:  # subnormal: the same scale as the smallest normal exponent
        e = 1
    i = (e - 1) >> 5
    o = (e - 1) & 31
    lo = (m & 0xFFFFFFFF) << o  # < 2^63
    hi = (m >> 32) << o  # < 2^52
    if b < 0:
        limbs[i] -= lo & 0xFFFFFFFF
        limbs[i + 1] -= (lo >> 32) + (hi & 0xFFFFFFFF)
        limbs[i + 2] -= hi >> 32
    else:
        limbs[i] += lo & 0xFFFFFFFF
        limbs[i + 1] += (lo >> 32) + (hi & 0xFFFFFFFF)
        limbs[i + 2] += hi >> 32


@kernel(inline=True)
def _carry(limbs):
    """Move each limb's bits above 32 into the next (the value is unchanged)."""
    for j in range(LIMBS - 1):
        limbs[j + 1] += limbs[j] >> 32
        limbs[j] &= 0xFFFFFFFF


@kernel
def _limb_sum(x):
    """The exact sum of ``x`` as an integer in 32-bit limbs: ``Σ x = Σ limbs[i]·2^(32i − 1074)``
    (a signed top limb). ``limbs[LIMBS]`` is 1 if a value is not finite (the sum is then not
    formed). Integer additions only: exact in any order, a few operations per value."""
    bits = x.view(np.int64)
    limbs = np.zeros(LIMBS + 1, dtype=np.int64)
    for k in range(bits.shape[0]):
        if ((bits[k] >> 52) & 0x7FF) == 0x7FF:
            limbs[LIMBS] = 1
            return limbs
        _limb_add(limbs, bits[k])
        if (k + 1) % CARRY_EVERY == 0:
            _carry(limbs)
    return limbs


@kernel(inline=True)
def _split(a):
    """Veltkamp's split: ``a = hi + lo`` exactly, each half with at most 26 significant bits."""
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


@kernel(inline=True)
def _two_product(a, b):
    """``(p, e)`` with ``p = fl(a·b)`` and ``a·b = p + e`` exactly (Dekker)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@kernel
def _weighted_limbs(values, weights):
    """As :func:`_limb_sum` for ``Σ values[i]·weights[i]``: each product is added exactly, as
    the two floats of its Dekker two-product."""
    pair = np.empty(2)
    bits = pair.view(np.int64)
    limbs = np.zeros(LIMBS + 1, dtype=np.int64)
    added = 0
    for k in range(values.shape[0]):
        if weights[k] != 0:
            pair[0], pair[1] = _two_product(values[k], float(weights[k]))
            for h in range(2):
                if ((bits[h] >> 52) & 0x7FF) == 0x7FF:
                    limbs[LIMBS] = 1
                    return limbs
                _limb_add(limbs, bits[h])
            added += 2
            if added % CARRY_EVERY == 0:
                _carry(limbs)
    return limbs


def _rounded_limbs(limbs: np.ndarray) -> float | None:
    """The correctly rounded value of the limbs (Python's integer division rounds correctly);
    None where a value was not finite or the sum is beyond the largest float."""
    bits = limbs.tolist()
    if bits[LIMBS]:
        return None
    try:
        return sum(v << (32 * i) for i, v in enumerate(bits[:LIMBS])) / (1 << 1074)
    except OverflowError:
        return None


def exact_sum(x: np.ndarray) -> float:
    """``math.fsum(x)``: compiled, the exact sum as an integer (:func:`_limb_sum`) divided by
    ``2^1074`` — Python's integer division rounds correctly, so it is fsum's unique result."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if fast(_limb_sum) and len(x) > 256:
        total = _rounded_limbs(_limb_sum(x))
        if total is not None:
            return total
    return math.fsum(x.tolist())  # also what fsum says of infinities, NaN, overflow


def exact_mean(x: np.ndarray) -> float:
    """``statistics.fmean(x)`` (NaN when empty)."""
    return exact_sum(x) / len(x) if len(x) else math.nan


def exact_weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """``statistics.fmean`` of the sample where ``values[i]`` occurs ``weights[i]`` times, without
    expanding it: every product ``value·weight`` is the exact sum of two floats (Dekker's
    two-product), and the correctly rounded sum of those is the expanded sample's ``fsum``
    (compiled: their exact integer sum, rounded once)."""
    n = int(np.asarray(weights).sum())
    if n == 0:
        return math.nan
    v = np.ascontiguousarray(values, dtype=np.float64)
    w = np.ascontiguousarray(weights, dtype=np.int64)
    if fast(_weighted_limbs):
        total = _rounded_limbs(_weighted_limbs(v, w))
        if total is not None:
            return total / n
    return math.fsum(x for pair in map(_two_product, v.tolist(), w.tolist()) for x in pair) / n


def _lerp(a: float, b: float, t: float) -> float:
    """``a + (b − a)·t`` for every fraction t (numpy's percentile switches to
    ``b − (b − a)(1 − t)`` for t ≥ 0.5, which differs in the last bit)."""
    return a + (b - a) * t


def _ranks(n: int, p: float) -> tuple[int, int, float]:
    """Order statistics and fraction of the p-th percentile of n values:
    ``k = ((n − 1)·p)/100`` (product first, then one division), ``⌊k⌋``, ``⌈k⌉``, ``k − ⌊k⌋``."""
    k = ((n - 1) * p) / 100
    lo = math.floor(k)
    return lo, math.ceil(k), k - lo


def percentiles(x: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The p-th percentile of ``x`` for each p (NaN when empty), by partial sorting.

    Not ``numpy.percentile``: its linear method interpolates ``b − (b − a)(1 − t)`` for t ≥ 0.5,
    one ulp away from reference-semantics §7's ``a + (b − a)·t`` (see :func:`_lerp`)."""
    n = len(x)
    if n == 0:
        return [math.nan] * len(ps)
    ranks = [_ranks(n, p) for p in ps]
    part = np.partition(x, sorted({k for lo, hi, _ in ranks for k in (lo, hi)}))
    return [_lerp(float(part[lo]), float(part[hi]), t) for lo, hi, t in ranks]


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, ps: tuple[float, ...],
                         overwrite: bool = False) -> list[float]:
    """As :func:`percentiles` for a sample where ``values[i]`` occurs ``weights[i]`` times.
    ``overwrite``: the arrays may be reordered in place (pairs kept), saving their copies."""
    if overwrite and fast(_weighted_select):  # zero weights hold no rank: the selection skips them
        v, w = np.ascontiguousarray(values, dtype=np.float64), np.ascontiguousarray(weights, dtype=np.int64)
    else:
        keep = weights > 0
        v, w = np.array(values[keep], dtype=np.float64), np.array(weights[keep], dtype=np.int64)  # copies
    n = int(w.sum())
    if n == 0:
        return [math.nan] * len(ps)
    ranks = [_ranks(n, p) for p in ps]
    wanted = np.array(sorted({k for lo, hi, _ in ranks for k in (lo, hi)}), dtype=np.int64)
    if fast(_weighted_select):
        found = dict(zip(wanted.tolist(), _weighted_select(v, w, wanted).tolist()))
    else:
        order = np.argsort(v)  # ties need no order: equal values are interchangeable
        cum = np.cumsum(w[order])
        found = dict(zip(wanted.tolist(), v[order][np.searchsorted(cum, wanted, side="right")].tolist()))
    return [_lerp(found[lo], found[hi], t) for lo, hi, t in ranks]


@kernel
def _weighted_select(values, weights, ranks):
    """The values at the given 0-based ranks (ascending) of the sample where ``values[i]``
    occurs ``weights[i]`` times: one weighted multi-quickselect (three-way partitions, median
    of three), descending only into the parts that hold a wanted rank. It permutes ``values``
    and ``weights`` in place (its caller's own copies: no third copy of a large sample)."""
    v = values
    w = weights
    out = np.empty(ranks.shape[0])
    stack = [(0, v.shape[0], 0, 0, ranks.shape[0])]  # [lo, hi), weight before lo, ranks [r0, r1)
    while len(stack) > 0:
        lo, hi, base, r0, r1 = stack.pop()
        a, b, c = v[lo], v[(lo + hi) // 2], v[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))
        lt, i, gt = lo, lo, hi
        w_lt = 0
        w_eq = 0
        while i < gt:
            x = v[i]
            if x < pivot:
                v[i], v[lt] = v[lt], v[i]
                w[i], w[lt] = w[lt], w[i]
                w_lt += w[lt]
                lt += 1
                i += 1
            elif x > pivot:
                gt -= 1
                v[i], v[gt] = v[gt], v[i]
                w[i], w[gt] = w[gt], w[i]
            else:
                w_eq += w[i]
                i += 1
        left = r0
        while left < r1 and ranks[left] - base < w_lt:
            left += 1
        right = left
        while right < r1 and ranks[right] - base < w_lt + w_eq:
            out[right] = pivot
            right += 1
        if left > r0:
            stack.append((lo, lt, base, r0, left))
        if right < r1:
            stack.append((gt, hi, base + w_lt + w_eq, right, r1))
    return out


class ExactSum:
    """A correctly rounded sum (or weighted sum) accumulated chunk by chunk: :func:`exact_sum`
    (:func:`exact_weighted_mean`'s numerator) of all the chunks together, however they were cut.
    Compiled, each chunk's exact sum is a Python integer in units of ``2^-1074`` added to the
    total, rounded once at the end; as plain Python the terms are kept and ``math.fsum`` rounds
    them at the end, as :func:`exact_sum` does (plain runs are short)."""

    def __init__(self) -> None:
        self._total = 0
        self._limbs = False
        """Whether a compiled chunk was added to ``_total``."""
        self._terms: list[np.ndarray] = []

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add ``Σ values`` (``Σ values·weights`` with integer weights) exactly."""
        v = np.ascontiguousarray(values, dtype=np.float64)
        if weights is None:
            if fast(_limb_sum) and len(v) > 256 and self._add_limbs(_limb_sum(v)):
                return
            self._terms.append(v)
            return
        w = np.ascontiguousarray(weights, dtype=np.int64)
        if fast(_weighted_limbs) and self._add_limbs(_weighted_limbs(v, w)):
            return
        self._terms.append(np.array([x for a, b in zip(v.tolist(), w.tolist()) if b
                                     for x in _two_product(a, float(b))], dtype=np.float64))

    def _add_limbs(self, limbs: np.ndarray) -> bool:
        bits = limbs.tolist()
        if bits[LIMBS]:
            return False  # a value is not finite: kept as a term
        self._total += sum(v << (32 * i) for i, v in enumerate(bits[:LIMBS]))
        self._limbs = True
        return True

    def value(self) -> float:
        """The correctly rounded total (``math.fsum``'s result for the whole sample)."""
        terms = np.concatenate(self._terms).tolist() if self._terms else []
        if not self._limbs or not all(map(math.isfinite, terms)):
            # no compiled chunk, or a value that is not finite (the sum is then fsum's of them)
            return math.fsum(terms if not self._limbs else [x for x in terms if not math.isfinite(x)])
        total = self._total
        for x in terms:
            num, den = x.as_integer_ratio()
            total += num * ((1 << 1074) // den)
        return total / (1 << 1074)


KEY_BITS = 16
"""Bits of the order-preserving key each pass of :meth:`Sample.order_stats` resolves."""


def _keys(x: np.ndarray) -> np.ndarray:
    """Unsigned 64-bit keys in the order of the floats (for every non-NaN float but -0.0)."""
    b = x.view(np.int64)
    return (b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)).view(np.uint64) ^ np.uint64(1 << 63)


def _from_keys(keys: np.ndarray) -> np.ndarray:
    """The floats of :func:`_keys` (the bit transform is its own inverse)."""
    b = (keys ^ np.uint64(1 << 63)).view(np.int64)
    return (b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)).view(np.float64)


GATHER = 1 << 18
"""Values (per open rank) few enough for :meth:`Sample.order_stats` to gather and sort."""


class Sample:
    """A sample received in chunks and summarised as if it had been whole: the exact mean
    (:class:`ExactSum`), the maximum and :func:`percentiles` (:func:`weighted_percentiles` when
    values come with integer multiplicities), bit for bit.

    The values stay in memory up to ``limit`` bytes (None: all of them); beyond, they go to a
    temporary file, and
    the order statistics are found by passes over it that narrow each wanted rank to the values
    sharing ever longer prefixes of their order-preserving bit patterns (a radix selection), so
    a sample of billions of values holds a few megabytes. Values must not be NaN or -0.0.
    """

    def __init__(self, weighted: bool = False, limit: int | None = None) -> None:
        self.weighted = weighted
        self.n = 0
        self.top = -math.inf
        self.total = ExactSum()
        self._limit = limit
        self._held: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._held_bytes = 0
        self._file: Any = None
        self._spilled: list[int] = []
        """Values per chunk written to the file (their weights follow them)."""

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add values (with ``weights``: each value that many times; zero weights hold nothing)."""
        v = np.ascontiguousarray(values, dtype=np.float64)
        w = None
        if self.weighted:
            w = np.ascontiguousarray(weights, dtype=np.int64)
            keep = w > 0
            if not keep.all():
                v, w = v[keep], w[keep]
            self.n += int(w.sum())
        else:
            self.n += len(v)
        if not len(v):
            return
        self.total.add(v, w)
        self.top = max(self.top, float(v.max()))
        self._held.append((v, w))
        self._held_bytes += v.nbytes + (w.nbytes if w is not None else 0)
        if self._limit is not None and self._held_bytes > self._limit:
            self._spill()

    def _spill(self) -> None:
        import tempfile

        if self._file is None:
            self._file = tempfile.TemporaryFile()
        for v, w in self._held:
            self._file.write(v.tobytes())
            if w is not None:
                self._file.write(w.tobytes())
            self._spilled.append(len(v))
        self._held, self._held_bytes = [], 0

    def _chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """Every chunk, from the file, then from memory."""
        if self._file is not None:
            self._file.seek(0)
            for k in self._spilled:
                v = np.frombuffer(self._file.read(8 * k), dtype=np.float64)
                w = np.frombuffer(self._file.read(8 * k), dtype=np.int64) if self.weighted else None
                yield v, w
        yield from self._held

    def mean(self) -> float:
        return self.total.value() / self.n if self.n else math.nan

    def percentiles(self, ps: tuple[float, ...]) -> list[float]:
        """:func:`percentiles` (or :func:`weighted_percentiles`) of the whole sample."""
        if self._file is None:
            v = np.concatenate([c[0] for c in self._held]) if self._held else np.zeros(0)
            if not self.weighted:
                return percentiles(v, ps)
            w = np.concatenate([c[1] for c in self._held]) if self._held else np.zeros(0, dtype=np.int64)
            return weighted_percentiles(v, w, ps, overwrite=True)
        if self.n == 0:
            return [math.nan] * len(ps)
        ranks = [_ranks(self.n, p) for p in ps]
        found = self.order_stats(sorted({k for lo, hi, _ in ranks for k in (lo, hi)}))
        return [_lerp(found[lo], found[hi], t) for lo, hi, t in ranks]

    def order_stats(self, wanted: list[int]) -> dict[int, float]:
        """The values at the given 0-based ranks, by radix selection over the chunks. Each pass
        takes, per rank still open, the values whose keys share its prefix: it counts them by
        their next :data:`KEY_BITS` bits and keeps the bucket holding the rank, or, once they are
        few (:data:`GATHER`), gathers them and picks the rank among them sorted."""
        # per open rank: key prefix, its length in bits, rank among the values with that prefix, their count
        open_ = {k: (0, 0, k, self.n) for k in wanted}
        out: dict[int, float] = {}
        while open_:
            groups: dict[tuple[int, int], list[int]] = {}
            for k, (prefix, bits, _, _) in open_.items():
                groups.setdefault((prefix, bits), []).append(k)
            gather = {g for g, ks in groups.items() if open_[ks[0]][3] <= GATHER}
            counts = {g: np.zeros(1 << KEY_BITS, dtype=np.int64) for g in groups if g not in gather}
            taken: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray | None]]] = {g: [] for g in gather}
            for v, w in self._chunks():
                keys = _keys(v)
                for g in groups:
                    prefix, bits = g
                    sel = ((keys >> np.uint64(64 - bits)) == np.uint64(prefix) if bits
                           else np.ones(len(v), dtype=bool))
                    if g in gather:
                        taken[g].append((v[sel], None if w is None else w[sel]))
                        continue
                    shift = np.uint64(64 - bits - KEY_BITS)
                    digit = ((keys[sel] >> shift) & np.uint64((1 << KEY_BITS) - 1)).astype(np.int64)
                    weights = None if w is None else w[sel]
                    counts[g] += np.bincount(digit, weights, 1 << KEY_BITS).astype(np.int64)
            for g, ks in groups.items():
                if g in gather:
                    v = np.concatenate([t[0] for t in taken[g]])
                    order = np.argsort(v, kind="stable")
                    cum = (np.cumsum(np.concatenate([t[1] for t in taken[g]])[order]) if self.weighted
                           else None)
                    for k in ks:
                        within = open_.pop(k)[2]
                        j = within if cum is None else int(np.searchsorted(cum, within, side="right"))
                        out[k] = float(v[order[j]])
                    continue
                prefix, bits = g
                cum = np.cumsum(counts[g])
                for k in ks:
                    within = open_[k][2]
                    d = int(np.searchsorted(cum, within, side="right"))
                    before = int(cum[d - 1]) if d else 0
                    key, nbits = (prefix << KEY_BITS) | d, bits + KEY_BITS
                    if nbits == 64:  # a whole key: one value
                        del open_[k]
                        out[k] = float(_from_keys(np.array([key], dtype=np.uint64))[0])
                    else:
                        open_[k] = (key, nbits, within - before, int(counts[g][d]))
        return out

    def describe(self, prefix: str) -> dict[str, float]:
        """:func:`kvcargo.metrics.describe`'s figures (``describe_weighted``'s when weighted)."""
        return described(prefix, self.mean(), self.percentiles(PERCENTILES), self.top if self.n else math.nan)


def described(prefix: str, mean: float, pcts: list[float], top: float) -> dict[str, float]:
    """A sample's summary figures keyed ``{prefix}_mean``, ``{prefix}_p50`` ... (one per
    :data:`PERCENTILES`) and ``{prefix}_max``."""
    out = {f"{prefix}_mean": mean}
    for p, v in zip(PERCENTILES, pcts):
        out[f"{prefix}_p{p}"] = v
    out[f"{prefix}_max"] = top
    return out
