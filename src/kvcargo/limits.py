"""The valid range of every numeric input, and why.

Each bound comes from what the model can represent: FLOP counts are exact 64-bit integers
(:func:`max_step_tokens`), the clock is float64 seconds (:data:`MAX_CLOCK_S`), generated lengths
are clipped to the reference generator's 32,768 tokens (reference-semantics §6.1). The others keep
a typo from exhausting the machine. A bound is checked once, where the value enters
(:class:`~kvcargo.config.SimConfig`, the calculator), and ``--help`` shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcargo.errors import KvcargoError

if TYPE_CHECKING:
    import numpy as np

    from kvcargo.workload.stream import Workload

INT64_MAX = 2**63 - 1
REFERENCE_MAX_LENGTH = 32_768
"""The reference generator clips prompt and output lengths to [1, 32,768] tokens (§6.1)."""
MAX_CLOCK_S = 1e9
"""Latest arrival a run may have (about 32 years): the clock is float64 seconds, which there
still resolves 0.1 µs; far later, step times of microseconds vanish in rounding."""


def number(x: float) -> str:
    """A bound as people read it: ``10,000``, ``50,000,000``, ``1e-06``."""
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e10 else f"{x:g}"


@dataclass(frozen=True)
class Bound:
    """Closed range ``[lo, hi]`` of one input (either end may be open-ended: ``None``)."""

    lo: float | None
    hi: float | None
    reason: str

    def text(self) -> str:
        """The range as ``--help`` shows it."""
        num = number
        if self.lo is not None and self.hi is not None:
            return f"{num(self.lo)} to {num(self.hi)}"
        return f"at most {num(self.hi)}" if self.hi is not None else f"at least {num(self.lo)}"

    def check(self, flag: str, value: float) -> None:
        """Raise KvcargoError naming ``flag``, the range and its reason when ``value`` is outside."""
        inside = (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)
        if not inside:  # (NaN is never inside)
            raise KvcargoError(f"{flag} {value:g} is out of range: {self.text()} ({self.reason})")


_MACHINE = "a typo must not exhaust the machine"
_SCALE_UP = "beyond any scale-up domain (NVL72, NVL576)"
_LONGEST = "more tokens than the longest length --max-length allows"
RANGES: Mapping[str, Bound] = {
    "devices_per_instance": Bound(1, 1024, _SCALE_UP),
    "prefill_devices_per_instance": Bound(1, 1024, _SCALE_UP),
    "decode_devices_per_instance": Bound(1, 1024, _SCALE_UP),
    "prefill": Bound(1, 10_000, _MACHINE),
    "decode": Bound(1, 10_000, _MACHINE),
    "instances": Bound(1, 20_000, _MACHINE),
    "link_channels": Bound(1, 10_000, _MACHINE),
    "rate": Bound(1e-6, 1e6, "slower, the clock loses resolution; faster, arrivals under a microsecond "
                  "apart are one burst and per-second rates measure nothing"),
    "time_scale": Bound(1e-6, 1e6, "as for --rate: the replayed clock must keep its resolution"),
    "prompt_cv": Bound(0, 100, "beyond it almost every length is clipped to the bounds"),
    "output_cv": Bound(0, 100, "beyond it almost every length is clipped to the bounds"),
    "ttft_slo": Bound(None, 1e9, "the clock's range"),
    "tpot_slo": Bound(None, 1e9, "the clock's range"),
    "power_cap": Bound(None, 1e5, "far above any device's TDP"),
    "prefill_power_cap": Bound(None, 1e5, "far above any device's TDP"),
    "decode_power_cap": Bound(None, 1e5, "far above any device's TDP"),
    "kv_keep": Bound(1e-3, 1, "keeping under 1 in 1,000 coefficients is ten times beyond any published "
                     "KV reduction"),
    "kv_ratio": Bound(1, 1000, "ten times beyond any published KV reduction"),
    "token_budget": Bound(1, 2**24, "one prefill step's FLOPs must fit a 64-bit integer (see also the model's "
                          "own limit)"),
    "max_num_batched_tokens": Bound(1, 2**24, "one step's FLOPs must fit a 64-bit integer (see also the model's "
                                    "own limit)"),
    "max_batch": Bound(1, 1_000_000, _MACHINE),
    "layer_groups": Bound(1, 4096, "more slices than any model has layers"),
    "nics_per_instance": Bound(1, 64, _MACHINE),
    "domain_size": Bound(1, 100_000, _MACHINE),
    "max_length": Bound(1, 2**24, "one prompt's prefill FLOPs must fit a 64-bit integer"),
    "kv_block_size": Bound(1, 2**24, _LONGEST),
    "max_seq_len": Bound(1, 2**24, _LONGEST),
    "system_len": Bound(0, 2**24, _LONGEST),
    "ced_replay": Bound(1, 2**24, _LONGEST),
    "think": Bound(0, 1e9, "the clock's range"),
    "transit_ops_per_byte": Bound(1e-6, 1e6, "a millionth of the default budget or a million times it"),
    "transit_pj_per_bit": Bound(None, 1e6, "a microjoule per bit, far above any codec"),
    "fft_efficiency": Bound(1e-6, None, "below a millionth of the matmul rate a step outlasts the clock"),
    "ft_static_w": Bound(None, 1e5, "far above any device's TDP"),
    "ft_mask_rate": Bound(1e-6, None, "slower, one rewrite outlasts the clock"),
    "ft_samples_per_s": Bound(1, None, "slower, one step outlasts the clock"),
    "ft_enob": Bound(-64, 64, "converter energy 2^ENOB and passes 4^(11 − ENOB) leave any physical meaning"),
}
"""Ranges on top of each field's type (positive, whole, ...), keyed by configuration field."""


def check_ranges(values: Mapping[str, object]) -> None:
    """Check every given field of ``values`` that has a range (KvcargoError on the first outside)."""
    for name, bound in RANGES.items():
        value = values.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            bound.check("--" + name.replace("_", "-"), value)


def max_step_tokens(mi: np.ndarray) -> int:
    """Most tokens one prefill step may hold while its FLOP count stays an exact 64-bit integer.

    ``mi`` is a model's integer coefficients (:func:`kvcargo.cost.model_coefficients`). A step of
    T tokens in whole prompts costs at most ``2·P_mm·T + 2·L·d·T·(T + 1)`` FLOPs (every prompt's
    causal term is below the one of a single T-token prompt).
    """
    from kvcargo.cost import MI_TWO_LD, MI_TWO_PMM

    a, b = int(mi[MI_TWO_LD]), int(mi[MI_TWO_PMM])

    def flops(t: int) -> int:
        return b * t + a * t * (t + 1)

    t = int((-(a + b) + math.isqrt((a + b) ** 2 + 4 * a * INT64_MAX)) // (2 * a))
    while flops(t) > INT64_MAX:
        t -= 1
    while flops(t + 1) <= INT64_MAX:
        t += 1
    return t


def step_token_error(model_key: str, what: str, tokens: int, limit: int) -> KvcargoError:
    """The error for a prompt (or budget) whose prefill FLOPs would overflow."""
    return KvcargoError(f"{what} of {tokens:,} tokens is above {limit:,}, the most one prefill step of "
                        f"{model_key} can hold: its FLOP count would overflow a 64-bit integer")


def check_workload(model_key: str, mi: np.ndarray, workload: Workload, budgets: Mapping[str, int | None]) -> None:
    """Refuse a run the cost model or the clock cannot represent: a prompt or a step's token budget
    (``budgets``: flag → value, None when not given) whose prefill FLOPs overflow, or arrivals
    beyond :data:`MAX_CLOCK_S`."""
    limit = max_step_tokens(mi)
    for flag, budget in budgets.items():
        if budget is not None and budget > limit:
            raise step_token_error(model_key, flag, budget, limit)
    longest = int(workload.prompt.argmax())
    if workload.prompt[longest] > limit:
        raise step_token_error(model_key, f"request {longest}'s prompt", int(workload.prompt[longest]), limit)
    longest = int(workload.output.argmax())
    most = int(RANGES["max_length"].hi)  # type: ignore[arg-type]
    if workload.output[longest] > most:
        raise KvcargoError(f"request {longest}'s output of {int(workload.output[longest]):,} tokens is above "
                           f"{most:,}, the most kvcargo simulates (a trace's, or --max-length's): every decode step "
                           "is simulated, and the step log would not fit in memory")
    last = float(workload.arrival[-1])
    if last > MAX_CLOCK_S:
        raise KvcargoError(f"the last request arrives at {last:.3g} s, beyond {MAX_CLOCK_S:g} s (about 32 years), "
                           "where float64 seconds no longer resolve step times: raise --rate (or lower "
                           "--time-scale), or run fewer requests")


def check_step(model_key: str, mi: np.ndarray, phase: str, batch: int, length: int) -> None:
    """Refuse one step (``kvcargo step``) whose FLOP count would overflow a 64-bit integer:
    ``batch`` prompts of ``length`` tokens, or ``batch`` sequences of ``length`` tokens of context."""
    from kvcargo.cost import MI_FOUR_LD, MI_TWO_PMM

    if phase == "prefill":
        limit = max_step_tokens(mi)
        if batch * length > limit:
            raise step_token_error(model_key, f"--batch × --prompt ({batch:,} × {length:,})", batch * length, limit)
    elif int(mi[MI_TWO_PMM]) * batch + int(mi[MI_FOUR_LD]) * (batch * length + batch) > INT64_MAX:
        raise KvcargoError(f"a decode step of --batch {batch:,} × --context {length:,} tokens is beyond what "
                           f"{model_key} can count: its FLOP count would overflow a 64-bit integer")
