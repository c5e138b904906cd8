"""The calculator: one prompt's hand-off, timed exactly as the simulator times it.

:func:`calculate` gives the chapter's panel — hand-off bytes S, wire bytes, the transfer, the
prefill, the time left exposed after prefill (whole or layer-wise) and the rate at which
hand-offs alone fill the link. It owns no physics: the transfer comes from
:func:`kvcargo.linkmodel.link_transfers` and the prefill from :func:`prefill_time`, the very
functions the engine's parameters and the planner's ceilings come from, so a one-request
simulation on an idle link hands off in the calculator's time and its TTFT is the calculator's
prefill (tests/test_calculator_equals_simulator.py). It figures one hand-off in plain numbers:
``kvcargo handoff`` never imports numpy (parallel layouts, speculative drafts and endpoint codecs
load it when asked for).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from kvcargo import catalog as catalog_mod
from kvcargo.catalog import Catalog, Link, Model
from kvcargo.ced import encoder_resident_bytes, replay_on_decode
from kvcargo.cost import LmHead, Pool, coefficient_values, elementwise_pass, prefill_step, require_fit, shape
from kvcargo.errors import KvcargoError
from kvcargo.formats import calibrated_error, compute_error, is_default, require_units, with_formats
from kvcargo.limits import check_ranges, max_step_tokens, step_token_error
from kvcargo.linkmodel import link_transfers
from kvcargo.params import HandoffConfig, layer_groups_error, transit_option_error
from kvcargo.stepcost import ATTENTION, step_class
from kvcargo.stepcost import prefill_step as class_prefill_step
from kvcargo.transfer import Compression, SendMode, Transfers, endpoint_work, parts_per_handoff

if TYPE_CHECKING:  # the calculator's path does not import the simulator's configuration
    from kvcargo.levers import PoolLevers


def prefill_time(model: Model, pool: Pool, n: int, tokens: int, *, cost_model: str = "roofline",
                 lm_head: LmHead = "all", fft_efficiency: float | None = None, encoder_only: bool = False,
                 lever: PoolLevers | None = None, draft: Model | None = None,
                 compression: Compression | None = None, handoff_bytes: float = 0.0) -> tuple[float, float]:
    """(seconds, of which encoding) of one prefill step over ``n`` prompts of ``tokens`` each, as the
    engine charges it: the step under the cost model (with a parallel layout's communication), a
    speculative draft's prefill, then an endpoint codec's encode pass over ``handoff_bytes`` per
    prompt. The calculator (n = 1) and the planner's prefill ceiling both time a prefill here."""
    prompts = [tokens] * n
    if lever is not None and lever.layout is not None:  # with its communication
        from kvcargo import parallel

        t = parallel.prefill_time(model, pool, lever.layout, lever.scale_up, prompts, lm_head)
    elif step_class(model) == ATTENTION and cost_model == "roofline":
        t = prefill_step(model, pool, prompts, lm_head).time  # steps.step_cost's roofline branch
    elif step_class(model) == ATTENTION:
        from kvcargo.steps import step_cost  # the calibrated tables: loaded only when asked for

        t = step_cost(model, pool, "prefill", n, tokens, cost_model, lm_head)["time_s"]
    else:  # FFT-mixing or CED (an encoder-only prefill pool when the decode side replays)
        t = class_prefill_step(model, pool, prompts, lm_head, fft_efficiency, encoder_only).time
    if draft is not None:  # the draft prefills the same prompts
        from kvcargo.speculative import draft_prefill_time

        t += draft_prefill_time(draft, pool, prompts)
    encode = 0.0
    if compression is not None and compression.at == "endpoint":
        import numpy as np

        ops, moved = endpoint_work(compression, np.full(n, float(handoff_bytes)), np.full(n, tokens), model.kv_bytes)
        encode = elementwise_pass(pool.coefficient_values(), float(ops.sum()), float(moved.sum()))[0]
        t += encode
    return t, encode


def landed_after(x: Transfers, prefill_s: float, groups: int, channels: int) -> float:
    """Seconds from the prefill's start until a lone layer-wise hand-off (``groups`` > 1 slices)
    has landed on an idle link, by the engine's own arithmetic: slice g is ready at g/groups of
    the step, takes the earliest free of ``channels`` channels for ``slice_time``, and the last
    adds ``last_extra``. (One slice is a whole hand-off: it moves at the step's end for
    ``duration``.) ``x``: the hand-off's figures as numbers."""
    free = [0.0] * min(channels, groups)  # when each channel is next free (a heap)
    done = 0.0
    for g in range(1, groups + 1):
        ready = prefill_s if g == groups else prefill_s * g / groups
        busy = float(x.slice_time) + (float(x.last_extra) if g == groups else 0.0)
        done = max(ready, heapq.heappop(free)) + busy
        heapq.heappush(free, done)
    return done


@dataclass(frozen=True)
class HandoffResult:
    """The chapter's panel for one prompt (SI units: bytes, seconds, requests per second)."""

    model: str
    prompt_tokens: int
    link: str
    codec: str
    send: str
    device: str
    devices_per_instance: int
    kv_bytes_per_token: int
    kv_bytes: int
    """What crosses: the prompt's KV in its storage format (and a speculative draft's)."""
    state_bytes: int
    """A constant per-sequence state handed off instead of a per-token cache (0: none)."""
    handoff_kind: str
    """What is handed off: ``kv`` (attention K/V), ``kv+conv`` (hybrid: K/V and the Hyena
    layers' convolution inputs), ``conv`` (Hyena's convolution inputs) or ``state``."""
    wire_bytes: float
    ratio: float
    bandwidth: float
    latency_s: float
    transfer_s: float
    """Seconds the whole hand-off holds a link channel (the in-transit stage included)."""
    prefill_s: float
    """The prefill step, an endpoint codec's encode pass included: the TTFT of a lone request."""
    exposed_s: float
    """Seconds the hand-off still needs once the prefill has ended."""
    link_full_rps: float
    draft_kv_bytes_per_token: int = 0
    """A speculative draft's KV per token: its prompt KV crosses with the target's."""
    compress_at: str = "transit"
    encode_s: float = 0.0
    """Of ``prefill_s``: the endpoint codec's encode pass on the prefill GPU."""
    transit_bound: bool = False
    """The in-transit stage's compute, not the wire, sets the transfer time."""
    cost_model: str = "roofline"
    link_model: str = "line-rate"

    def as_dict(self) -> dict:
        return asdict(self)


def exposed_after_prefill(latency: float, wire_s: float, prefill_s: float, layers: int, send: SendMode) -> float:
    """The chapter's closed form of the transfer time still left when the prefill ends (one channel,
    line rate). Whole: the whole transfer. Layer-wise (each of L layers takes T_p/L and its slice
    T'x/L): ``ℓ + max(T'x/L, T'x − (L−1)/L·T_p)``. :func:`calculate` replays the engine's schedule
    instead (:func:`landed_after`), which this equals on one channel up to rounding."""
    if send == "whole":
        return latency + wire_s
    if send != "layerwise":
        raise KvcargoError(f"unknown send mode {send!r}; valid choices: layerwise, whole")
    return latency + max(wire_s / layers, wire_s - (prefill_s * (layers - 1)) / layers)


def handoff_kind(model: Model) -> str:
    """What a model hands from prefill to decode (see :attr:`HandoffResult.handoff_kind`)."""
    if model.mixer == "attention":
        return "kv"
    if shape(model).state_bytes:
        return "state"
    return "kv+conv" if model.mixer == "hybrid" else "conv"


def calculate(model: Model, prompt: int, link: Link, pool: Pool, compression: Compression | None = None,
              send: SendMode = "whole", draft: Model | None = None, *, groups: int | None = None,
              channels: int | None = None, cost_model: str = "roofline", link_model: str = "line-rate",
              lm_head: LmHead = "all") -> HandoffResult:
    """Hand-off size, wire bytes, transfer, prefill, exposed time and link saturation rate.

    With a speculative ``draft``, its prompt KV crosses too and its prefill follows the target's.
    Layer-wise, the cache moves in ``groups`` slices (default: one per layer) over ``channels``
    (default: the link's)."""
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt <= 0:
        raise KvcargoError(f"prompt must be a positive whole number of tokens, got {prompt!r}")
    if send not in ("whole", "layerwise"):
        raise KvcargoError(f"unknown send mode {send!r}; valid choices: layerwise, whole")
    limit = max_step_tokens(coefficient_values(model)[0])
    if prompt > limit:
        raise step_token_error(model.key, "--prompt", prompt, limit)
    replay = replay_on_decode(model)
    require_fit(model, pool, "prefill", encoder_resident_bytes(model) if replay else None)
    s = shape(model)
    draft_kv = shape(draft).kv_per_token if draft is not None else 0
    kv = s.handoff_bytes(prompt) + prompt * draft_kv
    slices = parts_per_handoff(send, groups, model.layers)
    x = link_transfers(link_model, link, compression, float(kv), model.kv_bytes, prompt, slices)
    wire = float(x.wire_bytes)
    prefill_s, encode_s = prefill_time(model, pool, 1, prompt, cost_model=cost_model, lm_head=lm_head,
                                       encoder_only=replay, draft=draft, compression=compression,
                                       handoff_bytes=kv)
    transfer_s = float(x.duration)
    exposed = transfer_s if slices == 1 else landed_after(x, prefill_s, slices, channels or link.channels) - prefill_s
    ratio = 1.0 if compression is None else kv / wire if compression.codec.kind == "kivi" else compression.ratio
    return HandoffResult(
        model=model.key,
        prompt_tokens=prompt,
        link=link.key,
        codec=compression.codec.key if compression else "none",
        send=send,
        device=pool.device.key,
        devices_per_instance=pool.n,
        kv_bytes_per_token=s.kv_per_token,
        kv_bytes=kv,
        state_bytes=s.state_bytes,
        handoff_kind=handoff_kind(model),
        wire_bytes=wire,
        ratio=ratio,
        bandwidth=link.bandwidth,
        latency_s=link.latency,
        transfer_s=transfer_s,
        prefill_s=prefill_s,
        exposed_s=exposed,
        link_full_rps=link.bandwidth * ratio / kv if kv else math.inf,
        draft_kv_bytes_per_token=draft_kv,
        compress_at=compression.at if compression else "transit",
        encode_s=encode_s,
        transit_bound=bool(x.transit_bound),
        cost_model=cost_model,
        link_model=link_model,
    )


def calculate_config(config: HandoffConfig, cat: Catalog | None = None) -> tuple[HandoffResult, Model, Link, Pool]:
    """The calculator from a :class:`~kvcargo.params.HandoffConfig` (what the CLI, the web API and
    ``kvcargo reproduce`` take): the result and the model (in its storage formats), link and
    prefill pool it was computed for. ``cat`` defaults to the built-in catalog and the config's
    files."""
    c = config
    if c.kv_compress is None and (c.kv_keep is not None or c.kv_ratio is not None):
        raise KvcargoError(f"--kv-{'keep' if c.kv_keep is not None else 'ratio'} needs a codec: add --kv-compress "
                           f"{'freq-keep-k' if c.kv_keep is not None else 'ratio'}")
    for error in (transit_option_error(c), layer_groups_error(c)):
        if error:
            raise KvcargoError(error)
    check_ranges({"kv_keep": c.kv_keep, "kv_ratio": c.kv_ratio, "devices_per_instance": c.devices_per_instance,
                  "layer_groups": c.layer_groups, "link_channels": c.link_channels,
                  "transit_ops_per_byte": c.transit_ops_per_byte})
    weight_format, kv_format, compute_format = (f or "bf16" for f in (c.weight_format, c.kv_format, c.compute_format))
    if error := compute_error(weight_format, compute_format):
        raise KvcargoError(error)
    if kv_format != "bf16" and c.kv_compress:
        raise KvcargoError("KV hand-off compression assumes a BF16 KV cache: drop --kv-format or --kv-compress")
    if c.cost_model == "calibrated" and c.speculative is not None:
        raise KvcargoError("speculative decoding follows the companion's roofline: it needs --cost-model roofline")
    if c.cost_model == "calibrated" and (error := calibrated_error(weight_format, kv_format, compute_format)):
        raise KvcargoError(error)
    cat = catalog_mod.load(c.catalog) if cat is None else cat
    m, ln = cat.model(c.model), cat.link(c.link)
    if not is_default(weight_format, kv_format, compute_format):
        m = with_formats(m, weight_format, kv_format)
    dev = cat.device(c.device)
    require_units(dev, compute_format, "prefill", c.cost_model)
    pool = Pool(dev, c.devices_per_instance, precision=compute_format)
    codec = None
    if c.kv_compress:
        stage = {"ops_per_byte": c.transit_ops_per_byte} if c.transit_ops_per_byte is not None else {}
        codec = Compression(cat.codec(c.kv_compress), c.kv_compress_at, c.kv_keep, c.kv_ratio, **stage)
        if codec.at == "endpoint" and codec.is_identity:
            codec = None  # as the simulator: nothing to do on the GPU, and no in-transit stage either
    draft = None
    if c.speculative:
        from kvcargo.speculative import make_draft

        draft = make_draft(m, c.speculative, cat, None, None, None).model
    result = calculate(m, c.prompt, ln, pool, codec, c.send, draft, groups=c.layer_groups, channels=c.link_channels,
                       cost_model=c.cost_model, link_model=c.link_model, lm_head=c.lm_head)
    return result, m, ln, pool
