"""The serving levers of the companion simulator: which flags need which, and their workloads.

Batching policy, token budget, KV reservation policy (with paged blocks and preemption), prefix
caching, multi-turn sessions and the named workload presets. A run that uses none of them is the
reference's, bit for bit; see docs/modelling.md ("Serving levers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcargo.errors import KvcargoError
from kvcargo.workload import LengthDist, Workload, generate
from kvcargo.workload.sessions import PRESETS, SessionShape, generate_sessions

if TYPE_CHECKING:
    from kvcargo.config import Resolved, SimConfig

DEFAULT_BLOCK = 16
DEFAULT_MAX_SEQ_LEN = 2048
DEFAULT_PREEMPTION = "recompute"
DEFAULT_HOST_LINK = "pcie5"
DEFAULT_PREFIX_SHARE = 1.0
PRESET_FIELDS = ("prompt", "prompt_cv", "output", "output_cv", "turns", "think", "system_prompts", "system_len",
                 "prefix_share")
"""Fields a ``--workload`` preset sets (giving them too changes nothing: a note says so)."""
SCHEDULED_REFUSED_LEVERS = ("speculative",)
"""The levers of levers-parallel the scheduled engine does not run: a speculative draft. Its
instances take every other one: layouts (expert parallelism included), scale-up links and number
formats (levers-parallel §1)."""


def _changed(c: SimConfig, name: str) -> bool:
    """Whether a field differs from its default (how a preset tells that a flag was given)."""
    return getattr(c, name) != type(c).model_fields[name].default


def session_shape(c: SimConfig) -> SessionShape:
    """The session shape of a configuration (its preset's, if it names one)."""
    if c.workload is not None:
        return PRESETS[c.workload].shape
    share = DEFAULT_PREFIX_SHARE if c.prefix_share is None else c.prefix_share
    return SessionShape(c.turns, c.think, c.system_prompts, c.system_len, share)


def check_serving(c: SimConfig) -> None:
    """Refuse, with one line, a serving flag the configuration cannot combine (flags it merely
    ignores are :func:`ignored_settings`)."""
    if c.prefix_caching and c.kv_policy == "paged" and c.preemption == "swap":
        raise ValueError("--prefix-caching with --preemption swap is not modelled: use --preemption recompute")
    if c.workload is not None and c.workload_file is not None:
        raise ValueError("--workload and --workload-file both give the requests: choose one")
    shape = session_shape(c)
    if c.workload is None and c.workload_file is not None and (shape.turns > 1 or shape.has_system_prompts):
        raise ValueError("sessions are generated: --turns/--system-prompts cannot be combined with --workload-file")
    closed_loop = shape.turns > 1
    if c.fast and closed_loop:
        raise ValueError("--fast with closed-loop sessions (--turns > 1): a later turn needs its predecessor's "
                         "exact finish time, which the companion's fast path does not keep; drop --fast")
    if c.fast and c.scheduled and c.mode == "disagg":
        raise ValueError("--fast is the plain decode instance's fast path: not with the serving levers in "
                         "disaggregated mode (colocated mode ignores it); drop --fast")
    if (c.scheduled or closed_loop) and c.handoff_features:
        raise ValueError("the serving levers and multi-turn sessions use the reference hand-off: drop --send, "
                         "--topology, --link-sharing, --kv-reserve and --decode-prefix-cache")
    unmodelled = [f for f in SCHEDULED_REFUSED_LEVERS if _changed(c, f)]
    if (c.scheduled or closed_loop) and unmodelled:
        raise ValueError(f"the serving levers and multi-turn sessions are modelled without a speculative draft: "
                         f"drop --{unmodelled[0].replace('_', '-')}")
    if c.prefix_caching and c.decode_prefix_cache:
        raise ValueError("--prefix-caching and --decode-prefix-cache are two prefix caches: choose one")


def ignored_settings(c: SimConfig) -> list[str]:
    """What the serving flags given change nothing about, one line each: the companion accepts and
    ignores them, the run is the one without them, bit for bit (levers-serving §0.1 "inert
    settings", §6.1, §7), and the command line says so on stderr."""
    notes = []
    paged = c.kv_policy == "paged"
    for flag, given, needs in (("--kv-block-size", c.kv_block_size is not None and not paged, "--kv-policy paged"),
                               ("--preemption", c.preemption is not None and not paged, "--kv-policy paged"),
                               ("--host-link", c.host_link is not None and not (paged and c.preemption == "swap"),
                                "--kv-policy paged --preemption swap"),
                               ("--max-seq-len", c.max_seq_len is not None and c.kv_policy != "max",
                                "--kv-policy max")):
        if given:
            notes.append(f"{flag} has no effect without {needs}")
    if c.workload is not None:
        notes += [f"--{f.replace('_', '-')} has no effect: --workload {c.workload} sets it"
                  for f in PRESET_FIELDS if _changed(c, f)]
        if _changed(c, "max_length"):
            notes.append(f"--max-length has no effect: --workload {c.workload} clips lengths to its own limits")
        return notes
    if c.think > 0 and c.turns < 2:
        notes.append("--think has no effect with one turn per session (--turns 1)")
    if (c.system_prompts > 0) != (c.system_len > 0):
        given, missing = ("--system-prompts", "--system-len") if c.system_prompts > 0 else ("--system-len",
                                                                                           "--system-prompts")
        notes.append(f"{given} has no effect without {missing}: no system prompt is drawn")
    if c.prefix_share is not None and not session_shape(c).has_system_prompts:
        notes.append("--prefix-share has no effect without --system-prompts and --system-len")
    return notes


def with_preset_slos(c: SimConfig) -> SimConfig:
    """A preset's SLOs, unless ``--ttft-slo``/``--tpot-slo`` were given (differ from the default)."""
    if c.workload is None:
        return c
    p = PRESETS[c.workload]
    changes = {}
    if not _changed(c, "ttft_slo"):
        changes["ttft_slo"] = p.ttft_slo
    if not _changed(c, "tpot_slo"):
        changes["tpot_slo"] = p.tpot_slo
    return c.model_copy(update=changes)


def serving_workload(c: SimConfig) -> Workload | None:
    """The generated requests of a preset or a session workload (None: the plain generator's)."""
    shape = session_shape(c)
    if c.workload is not None:
        prompt, output = PRESETS[c.workload].prompt, PRESETS[c.workload].output
    elif shape.is_session:
        prompt = LengthDist(c.prompt, c.prompt_cv, hi=c.max_length)
        output = LengthDist(c.output, c.output_cv, hi=c.max_length)
    else:
        return None
    if shape.is_session:
        return generate_sessions(c.requests, c.arrival_rate, prompt, output, shape, c.seed)
    return generate(c.requests, c.arrival_rate, prompt, output, c.seed)


def uses_scheduled_engine(res: Resolved) -> bool:
    """A serving lever is on, or sessions release turns in a closed loop."""
    s = res.workload.sessions
    return res.config.scheduled or (s is not None and s.closed_loop)


def check_model(res: Resolved) -> None:
    """Refuse a model the scheduled engine does not model, when the run would use it (before it starts)."""
    m = res.model
    if uses_scheduled_engine(res) and (m.sliding_window is not None or m.kv_layout == "mla"):
        raise KvcargoError(f"the serving levers and sessions are modelled for full-attention models (no sliding "
                           f"window, no MLA); {m.key} is not one", field="model")
