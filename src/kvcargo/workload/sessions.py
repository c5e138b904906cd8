"""Multi-turn sessions and the named workload presets of the companion simulator.

A session is a conversation: an optional shared system prompt, then ``turns`` requests whose
prompts carry the whole history (system prompt, earlier inputs and replies) plus a new input.
Later turns are released only when the previous turn has finished, after a think gap (a closed
loop), so their arrival times are known only during the run.

Each request also carries its *prefix chain*: the named segments its prompt starts with
(``sys{i}``, then ``s{sid}t{k}`` per earlier turn), which a prefix cache can share, and the
name of the segment it adds itself (its input and reply, offered to the cache when it ends).

The draws follow the companion exactly (one ``random.Random(seed)``, in this order per session:
the start gap, the system-prompt choice, then per turn the input length, the reply length and
the think gap), so the request lists are the same.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from kvcargo.errors import KvcargoError
from kvcargo.workload.generator import LengthDist
from kvcargo.workload.stream import Workload

Segment = tuple[str, int]


@dataclass(frozen=True)
class Sessions:
    """Per request (parallel lists): prefix chain, emitted segment, predecessor and successor
    turn (-1: none) and the think gap before it is released."""

    chain: list[tuple[Segment, ...]]
    emit: list[str | None]
    predecessor: np.ndarray
    successor: np.ndarray
    think: np.ndarray

    @property
    def closed_loop(self) -> bool:
        """Whether some request is released by its predecessor's finish."""
        return bool(np.any(self.predecessor >= 0))


@dataclass(frozen=True)
class SessionShape:
    """How sessions are built: turns, think time (s), system prompts (count × tokens), the
    share of sessions that use one."""

    turns: int = 1
    think: float = 0.0
    system_prompts: int = 0
    system_len: int = 0
    prefix_share: float = 1.0

    @property
    def is_session(self) -> bool:
        """The session generator is used (else the Poisson one gives the same requests)."""
        return self.turns > 1 or self.system_prompts != 0

    @property
    def has_system_prompts(self) -> bool:
        """Sessions may start with a system prompt: both how many and how long are given
        (levers-serving §6.2 step 2; either alone draws none)."""
        return self.system_prompts > 0 and self.system_len > 0


@dataclass(frozen=True)
class Preset:
    """A named workload: lengths, SLOs and session shape."""

    prompt: LengthDist
    output: LengthDist
    ttft_slo: float
    tpot_slo: float
    shape: SessionShape


PRESETS: dict[str, Preset] = {
    "chat": Preset(LengthDist(161.31, 1.0, 1, 1024), LengthDist(337.99, 1.0, 1, 1024), 1.0, 0.05,
                   SessionShape(3, 10.0, 8, 512, 1.0)),
    "coding-agent": Preset(LengthDist(512, 0.8, 1, 4096), LengthDist(160, 0.6, 1, 1024), 1.5, 0.04,
                           SessionShape(8, 2.0, 2, 6144, 1.0)),
    "offline-batch": Preset(LengthDist(2048, 0.5, 1, 8192), LengthDist(256, 0.5, 1, 2048), 60.0, 0.5,
                            SessionShape()),
    "long-rag": Preset(LengthDist(7904, 0.50, 1, 15360), LengthDist(230, 0.48, 1, 1024), 5.0, 0.05,
                       SessionShape(1, 0.0, 4, 1024, 1.0)),
    "voice": Preset(LengthDist(64, 0.5, 1, 512), LengthDist(48, 0.5, 1, 256), 0.3, 0.025,
                    SessionShape(6, 3.0, 4, 1024, 1.0)),
}
"""The companion's ``--workload`` presets (lengths: lognormal, lo 1, hi as given)."""


def _length(rng: random.Random, dist: LengthDist) -> tuple[int, bool]:
    """One length as the reference draws it (no draw when cv <= 0), and whether the bounds
    clipped it (as the Poisson generator counts it)."""
    if dist.cv <= 0:
        x = dist.mean
    else:
        sigma2 = math.log(1 + dist.cv * dist.cv)
        x = rng.lognormvariate(math.log(dist.mean) - sigma2 / 2, math.sqrt(sigma2))
    r = round(x)
    return int(min(dist.hi, max(dist.lo, r))), not dist.lo <= r <= dist.hi


def generate_sessions(n: int, rate: float, prompt: LengthDist, output: LengthDist, shape: SessionShape,
                      seed: int = 1) -> Workload:
    """``n`` requests in sessions starting as a Poisson process at ``rate`` sessions/s.

    ``prompt`` is each turn's new input, ``output`` its reply. The arrival of a later turn is a
    placeholder 0.0 (it is set when its predecessor finishes).
    """
    if n < 1:
        raise KvcargoError(f"number of requests must be >= 1, got {n}")
    rng = random.Random(seed)
    arrival, plen, olen, chain, emit, pred, think = [], [], [], [], [], [], []
    t = 0.0
    sid = clipped_prompts = clipped_outputs = 0
    while len(arrival) < n:
        t += rng.expovariate(rate)
        segments: list[Segment] = []
        history = 0
        if shape.has_system_prompts:
            use = shape.prefix_share >= 1 or rng.random() < shape.prefix_share
            if use:
                segments.append((f"sys{rng.randrange(shape.system_prompts)}", shape.system_len))
                history = shape.system_len
        prev = -1
        for k in range(shape.turns):
            if len(arrival) == n:
                break
            new, clipped = _length(rng, prompt)
            clipped_prompts += clipped
            out, clipped = _length(rng, output)
            clipped_outputs += clipped
            gap = shape.think * rng.expovariate(1.0) if k > 0 and shape.think > 0 else 0.0
            key = f"s{sid}t{k}"
            arrival.append(t if k == 0 else 0.0)
            plen.append(history + new)
            olen.append(out)
            chain.append(tuple(segments))
            emit.append(key if shape.turns > 1 else None)
            pred.append(prev)
            think.append(gap)
            prev = len(arrival) - 1
            segments.append((key, new + out))
            history += new + out
        sid += 1
    predecessor = np.array(pred, dtype=np.int64)
    successor = np.full(n, -1, dtype=np.int64)
    has = predecessor >= 0
    successor[predecessor[has]] = np.nonzero(has)[0]
    sessions = Sessions(chain, emit, predecessor, successor, np.array(think, dtype=np.float64))
    return Workload(np.array(arrival, dtype=np.float64), np.array(plen, dtype=np.int64),
                    np.array(olen, dtype=np.int64), source=f"sessions rate={rate:g} seed={seed}",
                    sessions=sessions, clipped_prompts=clipped_prompts, clipped_outputs=clipped_outputs)
