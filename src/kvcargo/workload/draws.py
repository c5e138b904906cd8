"""The reference generator's draws as a kernel over a stream of uniforms (compiled with numba).

Python's ``random.Random`` is consumed exactly as the reference consumes it: one uniform for each
exponential gap (``-log(1 - u)/rate``), then for each lognormal length the Kinderman–Monahan
ratio method of ``random.normalvariate`` (two uniforms per try) — so the results are the same
floats, only computed without a Python call per draw.
"""

from __future__ import annotations

import math

import numpy as np

from kvcargo._jit import kernel

NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)
PYTHON_UNIFORMS_MAX = 65_536
"""Up to this many uniforms are drawn by ``rng.random()`` itself: importing numpy's bit
generators costs a process more (~10 ms) than drawing them one call at a time (~70 ns each)."""


@kernel
def _length(u, pos, mean, cv, mu, sigma, lo, hi):
    """One clipped, rounded lognormal length; returns (length, next position, whether it was
    clipped) or (-1, pos, False) when the uniforms ran out."""
    if cv <= 0.0:
        x = mean
    else:
        while True:
            if pos + 2 > u.shape[0]:
                return -1, pos, False
            u1 = u[pos]
            u2 = 1.0 - u[pos + 1]
            pos += 2
            z = NV_MAGICCONST * (u1 - 0.5) / u2
            zz = z * z / 4.0
            if zz <= -math.log(u2):
                break
        x = math.exp(mu + z * sigma)
    r = np.rint(x)
    return int(min(hi, max(lo, r))), pos, bool(r > hi or r < lo)


@kernel
def draw_requests(u, start, n_done, t, rate, p_par, o_par, arrival, prompt, output, clipped):
    """Fill requests from index ``n_done`` on, consuming uniforms ``u[start:]``.

    ``p_par``/``o_par`` = (mean, cv, mu, sigma, lo, hi). Returns (requests done, position, clock);
    stops early (at a request boundary) when the uniforms run out. ``clipped`` counts the prompt
    (``[0]``) and output (``[1]``) lengths the bounds clipped.
    """
    pos = start
    i = n_done
    n = arrival.shape[0]
    while i < n:
        if pos >= u.shape[0]:
            break
        gap = -math.log(1.0 - u[pos]) / rate
        plen, p2, p_clip = _length(u, pos + 1, p_par[0], p_par[1], p_par[2], p_par[3], p_par[4], p_par[5])
        if plen < 0:
            break
        olen, p3, o_clip = _length(u, p2, o_par[0], o_par[1], o_par[2], o_par[3], o_par[4], o_par[5])
        if olen < 0:
            break
        if p_clip:
            clipped[0] += 1
        if o_clip:
            clipped[1] += 1
        t += gap
        arrival[i] = t
        prompt[i] = plen
        output[i] = olen
        pos = p3
        i += 1
    return i, pos, t


def uniforms(rng, k: int) -> np.ndarray:
    """The next ``k`` values ``rng.random()`` would return, in one call, leaving ``rng`` where
    ``k`` calls would. numpy's MT19937 is the same Mersenne Twister as Python's ``random``: it
    continues from ``rng``'s state, draws two 32-bit words a, b per value (exactly:
    ``((a >> 5)·2^26 + (b >> 6)) / 2^53``) and hands its state back; three times faster than
    ``getrandbits`` for a million values. At most :data:`PYTHON_UNIFORMS_MAX`: ``k`` calls."""
    if k <= PYTHON_UNIFORMS_MAX:
        return np.array([rng.random() for _ in range(k)], dtype=np.float64)
    version, internal, gauss = rng.getstate()
    mt = np.random.MT19937()
    mt.state = {"bit_generator": "MT19937",
                "state": {"key": np.array(internal[:-1], dtype=np.uint32), "pos": internal[-1]}}
    words = mt.random_raw(2 * k)
    state = mt.state["state"]
    rng.setstate((version, (*state["key"].tolist(), int(state["pos"])), gauss))
    u = (words[0::2] >> 5).astype(np.float64)  # in place from here: the same exact operations
    u *= 67108864.0
    u += words[1::2] >> 6
    u *= 1.0 / 9007199254740992.0
    return u
