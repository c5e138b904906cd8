"""One validated run configuration, and its resolution against the catalog.

:class:`SimConfig` holds plain values whose names are the CLI flags with dashes turned into
underscores (the web API uses the same names); its defaults are the chapter's base scenario.
:func:`resolve` turns it into catalog objects, pools, the link, the compression stage and the
request stream, failing with one clear line on anything impossible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvcargo import catalog as catalog_mod
from kvcargo.catalog import Catalog, Link, Model
from kvcargo.cost import LmHead, Pool, model_coefficients, require_fit
from kvcargo.errors import KvcargoError
from kvcargo.formats import calibrated_error, compute_error, require_units
from kvcargo.levers import Levers, lever_model, resolve_levers
from kvcargo.limits import INT64_MAX, REFERENCE_MAX_LENGTH, check_ranges, check_workload, number
from kvcargo.params import (
    CostModel,
    Count,
    LinkModel,
    NonNeg,
    NumberFormat,
    Positive,
    attribute_docstrings,
    build,
    layer_groups_error,
    transit_option_error,
)
from kvcargo.transfer import Compression
from kvcargo.workload import LengthDist, Workload, generate

DEFAULT_RATE = 8.0
"""Arrival rate of generated workloads when none is given (req/s)."""
MAX_REQUESTS = 50_000_000
"""Hard ceiling on generated requests (a typo should not exhaust the machine)."""
MAX_GAMMA = 1024
"""Most drafted tokens per verify pass (each costs a draft pass per step)."""
HANDOFF_FEATURES: dict[str, Any] = {"send": "whole", "topology": "shared", "link_sharing": "fcfs",
                                    "kv_reserve": "at-decode", "decode_prefix_cache": False}
"""The opt-in models of the hand-off, each with its reference value. Any other value needs a
hand-off (``--mode disagg``) and the engine's extra per-request columns; the topologies and the
decode prefix cache also choose the decode instance when the hand-off starts."""
EARLY_DECODE_CHOICE = ("topology", "decode_prefix_cache")
"""Of :data:`HANDOFF_FEATURES`: those that need the destination before the transfer."""


@attribute_docstrings
class SimConfig(BaseModel):
    """A simulation run. Field names are the CLI flags (``--prefill-device`` → ``prefill_device``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    model: str = "llama3-8b"
    """Model key (kvcargo catalog models)."""
    device: str = "h100"
    """Accelerator of every instance (kvcargo catalog devices)."""
    devices_per_instance: Count = 1
    """Devices per instance (tensor parallelism as one big device)."""
    prefill_device: str | None = None
    """Accelerator of the prefill pool (default: --device)."""
    decode_device: str | None = None
    """Accelerator of the decode pool (default: --device)."""
    prefill_devices_per_instance: Count | None = None
    """Devices per prefill instance (default: --devices-per-instance)."""
    decode_devices_per_instance: Count | None = None
    """Devices per decode instance (default: --devices-per-instance)."""
    mode: Literal["disagg", "colocated"] = "disagg"
    """Disaggregated prefill/decode pools, or the colocated baseline on the same GPUs."""
    prefill: Count = 1
    """Prefill instances."""
    decode: Count = 1
    """Decode instances."""
    instances: Count | None = None
    """Colocated instance count (default: prefill + decode, the same GPUs)."""
    link: str = "ib-ndr"
    """KV link between the pools (kvcargo catalog links)."""
    link_channels: Count | None = None
    """Parallel channels of the KV link (default: the catalog's)."""
    rate: Positive | None = None
    """Poisson rate of the generated workload (default 8 req/s); with a trace file, rescale the
    trace to this mean rate (unset: replay it as recorded)."""
    requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] = 800
    """Number of requests."""
    prompt: Positive = 2048.0
    """Mean prompt length, tokens (at most --max-length)."""
    prompt_cv: NonNeg = 0.5
    """Coefficient of variation of prompt lengths (0: fixed)."""
    output: Positive = 256.0
    """Mean output length, tokens (at most --max-length)."""
    output_cv: NonNeg = 0.5
    """Coefficient of variation of output lengths (0: fixed)."""
    seed: int = 1
    """Random seed of the workload."""
    ttft_slo: Positive = 1.0
    """Time-to-first-token SLO, seconds."""
    tpot_slo: Positive = 0.025
    """Time-per-output-token SLO, seconds."""
    kv_compress: str | None = None
    """Compress the hand-off with a codec (kvcargo catalog codecs)."""
    kv_compress_at: Literal["transit", "endpoint"] = "transit"
    """Where the codec runs: in the link (transit) or on the prefill GPU (endpoint)."""
    kv_keep: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of coefficients kept by freq-keep-k."""
    power_cap: Positive | None = None
    """Per-device power cap, W (both pools)."""
    prefill_power_cap: Positive | None = None
    """Per-device power cap of the prefill pool, W."""
    decode_power_cap: Positive | None = None
    """Per-device power cap of the decode pool, W."""
    dvfs: bool = False
    """Lower the compute clock on memory-bound steps."""
    workload_file: str | None = None
    """Replay a trace (CSV, JSON rows, Mooncake JSONL, Azure 2023 CSV), or a built-in one by name
    (kvcargo catalog traces: mooncake-conversation, azure-code-2023, ...)."""
    # Trace replay (with workload_file); see kvcargo.workload.traces.
    time_scale: Positive | None = None
    """Multiply the trace's arrival times by this (0.5 replays twice as fast)."""
    limit: Count | None = None
    """Replay only the first N requests of the trace (after ``window``)."""
    window: str | None = None
    """Replay only the requests arriving in ``START:END`` seconds of the trace (``600:``, ``:300``)."""
    arrival_col: str | None = None
    """Trace column (CSV header or JSON key) holding arrival times, for files in other layouts."""
    prompt_col: str | None = None
    """Trace column holding prompt lengths (tokens)."""
    output_col: str | None = None
    """Trace column holding output lengths (tokens)."""
    time_unit: Literal["s", "ms", "us", "ns"] | None = None
    """Unit of numeric arrival times in the trace (default: the format's; Mooncake: ms)."""

    @model_validator(mode="after")
    def _check_trace(self) -> SimConfig:
        trace_only = ("time_scale", "limit", "window", "arrival_col", "prompt_col", "output_col", "time_unit")
        given = [f for f in trace_only if getattr(self, f) is not None]
        if given and self.workload_file is None:
            raise ValueError(f"--{given[0].replace('_', '-')} applies only to a trace (--workload-file)")
        if self.time_scale is not None and self.rate is not None:
            raise ValueError("--time-scale and --rate both set the replay speed: give one")
        if self.window is not None:
            from kvcargo.workload.traces import parse_window

            parse_window(self.window)
        return self

    lm_head: LmHead = "all"
    """LM head over every prompt token (reference) or the last one only."""
    token_budget: Count = 8192
    """Prefill batch token budget."""
    max_batch: Count = 256
    """Maximum decode batch."""
    # Beyond the reference (opt-in; the defaults are the reference's behaviour). See docs/modelling.md.
    kv_ratio: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    """Wire ratio of the ``ratio`` codec (an entropy coder such as CacheGen's)."""
    send: Literal["whole", "layerwise"] = "whole"
    """Send each KV cache after its prefill step (reference) or stream it layer by layer."""
    layer_groups: Count | None = None
    """Layer-wise streaming in this many slices per prefill step (default: one per layer)."""
    topology: Literal["shared", "nic", "nvlink-domain"] = "shared"
    """One cluster-wide link (reference), a NIC per instance, or NVLink domains plus the link."""
    link_sharing: Literal["fcfs", "fair"] = "fcfs"
    """Whole transfers in turn on each channel (reference) or max-min fair bandwidth sharing."""
    nics_per_instance: Count = 1
    """With ``--topology nic``: NICs (rails) per instance, each of the link's bandwidth."""
    domain_size: Count = 8
    """With ``--topology nvlink-domain``: GPUs per NVLink domain."""
    kv_reserve: Literal["at-decode", "at-transfer"] = "at-decode"
    """Reserve decode KV at admission (reference) or before the transfer (pull model)."""
    decode_prefix_cache: bool = False
    """Keep received prompt blocks in an LRU cache per decode instance; send only missing blocks
    (needs a trace with block ids, e.g. Mooncake's ``hash_ids``)."""
    catalog: tuple[str, ...] = ()
    """Extra catalog TOML files, in order."""
    # Parallelism, number formats and speculative decoding (levers of the companion simulator;
    # see kvcargo.parallel, kvcargo.formats, kvcargo.speculative and docs/modelling.md).
    tp: Count | None = None
    """Tensor-parallel GPUs per pipeline stage (a layout for both pools; tp·pp = devices per instance)."""
    pp: Count | None = None
    """Pipeline stages (GPipe micro-batching, no overlap between steps)."""
    ep: Count | None = None
    """Expert parallelism: 1 (experts split by TP) or tp (whole experts per GPU); MoE models only."""
    microbatches: Count | None = None
    """Pipeline micro-batches per step (default: pp); each re-reads its stage's weights."""
    expert_imbalance: Annotated[float, Field(ge=1, allow_inf_nan=False)] | None = None
    """Busiest GPU's routed-expert work over the mean (MoE with --ep > 1; default 1.0)."""
    scale_up_link: str | None = None
    """Link carrying TP/PP/EP traffic inside an instance (default: the device's scale-up link)."""
    prefill_tp: Count | None = None
    """Tensor parallelism of the prefill pool only (unset --prefill-pp is 1, not --pp)."""
    prefill_pp: Count | None = None
    """Pipeline stages of the prefill pool only (unset --prefill-tp is 1, not --tp)."""
    decode_tp: Count | None = None
    """Tensor parallelism of the decode pool only (unset --decode-pp is 1, not --pp)."""
    decode_pp: Count | None = None
    """Pipeline stages of the decode pool only (unset --decode-tp is 1, not --tp)."""
    weight_format: NumberFormat = "bf16"
    """Weight storage format (int4: 128-weight groups with a 16-bit scale; fp4: MX blocks of 32)."""
    kv_format: NumberFormat = "bf16"
    """KV-cache storage format (the hand-off crosses the link in it)."""
    compute_format: NumberFormat = "bf16"
    """Matmul input format: bf16 (weight-only quantisation) or the weight format (needs native units)."""
    speculative: str | None = None
    """Speculative decoding with this draft: 'mtp' (one extra layer) or a model key."""
    gamma: Annotated[int, Field(ge=1, le=MAX_GAMMA)] | None = None
    """Drafted tokens per verify pass (default 3; needs --speculative)."""
    alpha: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    """Acceptance probability of each drafted token (default 0.7; needs --speculative)."""
    spec_seed: Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)] | None = None
    """Seed of the acceptance draws (default 0; needs --speculative)."""
    transit_ops_per_byte: Positive | None = None
    """In-transit codec compute budget per line byte (default 1.6; needs --kv-compress in transit)."""
    transit_pj_per_bit: NonNeg | None = None
    """In-transit codec energy per input bit, pJ (default 1.0; needs --kv-compress in transit)."""
    ppa: bool = False
    """Add the silicon area and cost report (changes no simulated number)."""
    fast: bool = False
    """The companion's accelerated decode path: kvcargo's engine is always exact and fast, so this
    changes nothing (kept for the companion's command lines; refused where the companion refuses it)."""

    @model_validator(mode="after")
    def _check_levers(self) -> SimConfig:
        spec_only = [f for f in ("gamma", "alpha", "spec_seed") if getattr(self, f) is not None]
        if spec_only and self.speculative is None:
            raise ValueError(f"--{spec_only[0].replace('_', '-')} applies only to --speculative")
        if error := transit_option_error(self):
            raise ValueError(error)
        layout = [f for f in ("tp", "pp", "ep", "microbatches") if getattr(self, f) is not None]
        pool_layout = [f for f in ("prefill_tp", "prefill_pp", "decode_tp", "decode_pp") if getattr(self, f) is not None]
        if pool_layout and self.mode == "colocated":
            raise ValueError(f"--{pool_layout[0].replace('_', '-')} is a pool layout: it needs --mode disagg "
                             "(colocated instances use --tp/--pp)")
        if not layout and not pool_layout:
            alone = [f for f in ("expert_imbalance", "scale_up_link") if getattr(self, f) is not None]
            if alone:
                raise ValueError(f"--{alone[0].replace('_', '-')} needs a parallel layout (--tp, --pp, --ep, "
                                 "--microbatches or a pool's --prefill-/--decode-tp/-pp)")
        if error := compute_error(self.weight_format, self.compute_format):
            raise ValueError(error)
        if self.cost_model == "calibrated" and (layout or pool_layout or self.speculative is not None):
            raise ValueError("parallel layouts and speculative decoding follow the companion's roofline: "
                             "they need --cost-model roofline (the calibrated model runs each instance "
                             "tensor-parallel over its --devices-per-instance)")
        if self.kv_format != "bf16" and self.kv_compress is not None:
            raise ValueError("KV hand-off compression assumes a BF16 KV cache: drop --kv-format or --kv-compress")
        return self

    cost_model: CostModel = "roofline"
    """Step costs from the reference roofline, or from measured kernels plus fitted framework
    constants (tensor parallel over each instance's devices; see docs/accuracy.md)."""
    link_model: LinkModel = "line-rate"
    """Links at line rate plus a latency (reference), or the measured per-message overhead,
    efficiency, per-channel ceiling and per-layer cost of each catalog link."""

    @model_validator(mode="after")
    def _check_calibrated(self) -> SimConfig:
        if self.cost_model == "calibrated" and self.dvfs:
            raise ValueError("--dvfs is a roofline clock model: it needs --cost-model roofline")
        if self.cost_model == "calibrated" and (error := calibrated_error(self.weight_format, self.kv_format,
                                                                          self.compute_format)):
            raise ValueError(error)
        if self.link_model != "line-rate" and self.mode == "colocated":
            raise ValueError("--link-model shapes the hand-off: it needs --mode disagg")
        return self
    # The companion's serving levers (levers-serving spec); defaults leave a run as the reference.
    batch_policy: Literal["prefill-priority", "decode-priority", "chunked"] = "prefill-priority"
    """Step scheduling: prefill first (reference), decode first, or chunked prefill mixed with
    decode (Sarathi-Serve)."""
    max_num_batched_tokens: Count | None = None
    """Token budget of one scheduled step (default: --token-budget); giving it switches to the
    scheduled engine."""
    kv_policy: Literal["oracle", "pow2", "max", "paged"] = "oracle"
    """Decode KV reservation: prompt + true output (reference), output rounded up to a power of two,
    --max-seq-len, or paged blocks grown on demand with preemption (vLLM)."""
    kv_block_size: Count | None = None
    """With --kv-policy paged: tokens per KV block [default: 16]."""
    max_seq_len: Count | None = None
    """With --kv-policy max: tokens reserved per request at least [default: 2048]."""
    preemption: Literal["recompute", "swap"] | None = None
    """With --kv-policy paged: what a preempted request loses, its KV (recompute) or its place
    (KV swapped to host memory) [default: recompute]."""
    host_link: str | None = None
    """With --preemption swap: the host link KV blocks are swapped over [default: pcie5]."""
    prefix_caching: bool = False
    """Keep prompt prefixes (system prompts, earlier turns) in an LRU cache; compute only the rest."""
    workload: Literal["chat", "coding-agent", "offline-batch", "long-rag", "voice"] | None = None
    """A named workload: lengths, SLOs and session shape (--rate is the session start rate)."""
    turns: Count = 1
    """Requests per session; later turns are released when the previous one finishes."""
    think: NonNeg = 0.0
    """Mean think time between turns (exponential), seconds."""
    system_prompts: Annotated[int, Field(ge=0)] = 0
    """Distinct shared system prompts (a session draws one)."""
    system_len: Annotated[int, Field(ge=0)] = 0
    """Tokens of each system prompt."""
    prefix_share: Annotated[float, Field(ge=0, le=1)] | None = None
    """Share of sessions that use a system prompt [default: 1.0]."""

    @model_validator(mode="after")
    def _check_serving(self) -> SimConfig:
        from kvcargo.serving import check_serving

        check_serving(self)
        return self

    @property
    def scheduled(self) -> bool:
        """Whether a serving lever switches on the scheduled engine."""
        return (self.batch_policy != "prefill-priority" or self.max_num_batched_tokens is not None
                or self.kv_policy != "oracle" or self.prefix_caching)

    max_length: int = REFERENCE_MAX_LENGTH
    """Generated prompt and output lengths are clipped to [1, N] tokens (the reference generator's
    32,768); a larger N is an opt-in beyond the reference."""

    @model_validator(mode="after")
    def _check_ranges(self) -> SimConfig:
        check_ranges(self.__dict__)
        if self.workload_file is not None:
            generated = ("requests", "prompt", "prompt_cv", "output", "output_cv", "seed", "max_length")
            ignored = [f for f in generated if getattr(self, f) != SimConfig.model_fields[f].default]
            if ignored:
                raise ValueError(f"--{ignored[0].replace('_', '-')} applies only to generated workloads, not to a "
                                 "trace (--workload-file; --limit, --window and --time-scale select and pace one)")
        if self.kv_ratio is not None and self.kv_compress is None:
            raise ValueError("--kv-ratio needs the ratio codec: add --kv-compress ratio")
        for flag, value, default, needs in (("--nics-per-instance", self.nics_per_instance, 1, "nic"),
                                            ("--domain-size", self.domain_size, 8, "nvlink-domain")):
            if value != default and self.topology != needs:
                raise ValueError(f"{flag} applies only to --topology {needs}")
        return self

    # Model families beyond attention (levers-mixers; see kvcargo.mixers, kvcargo.ced, kvcargo.optical).
    ced_encoder_layers: Annotated[int, Field(ge=0)] | None = None
    """Causal encoder-decoder: the bottom E layers run only at prefill (default: the model's; 0: off)."""
    ced_replay: Count | None = None
    """CED: prompt tokens replayed through the decoder layers (default: the model's, 128)."""
    ced_replay_on: Literal["prefill", "decode"] | None = None
    """CED: the pool that runs the replay; decode stamps the first token there (default: the model's)."""
    fft_efficiency: Positive | None = None
    """FFT-mixing models: fraction of the matmul rate a digital device reaches on FFT work (default 1)."""
    ft_enob: int | None = None
    """Optical transform engine: converter ENOB (default: the device's, 8)."""
    ft_static_w: NonNeg | None = None
    """Optical transform engine: laser + tuning power per device, W (default: the device's, 20)."""
    ft_mask_rate: Positive | None = None
    """Optical transform engine: mask rewrites per second (default: the device's, 1031)."""
    ft_samples_per_s: Positive | None = None
    """Optical transform engine: converter samples per second (default: the device's, 1e12)."""
    ft_detection: Literal["coherent", "intensity"] | None = None
    """Optical transform engine: detection (intensity doubles the passes; default coherent)."""
    ft_overlap: bool = False
    """Optical transform engine: overlap optical and digital time instead of adding them."""

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.mode == "colocated" and self.kv_compress is not None:
            raise ValueError("KV compression needs a hand-off: use --mode disagg or drop --kv-compress")
        if self.kv_keep is not None and self.kv_compress != "freq-keep-k":
            raise ValueError("--kv-keep applies only to --kv-compress freq-keep-k")
        if self.mode == "colocated" and self.handoff_features:
            *most, last = (f"--{f.replace('_', '-')}" for f in HANDOFF_FEATURES)
            raise ValueError(f"{', '.join(most)} and {last} shape the hand-off: they need --mode disagg")
        if error := layer_groups_error(self):
            raise ValueError(error)
        return self

    @classmethod
    def build(cls, **values: Any) -> SimConfig:
        """Validate ``values``; bad input raises :class:`KvcargoError` with one line naming it."""
        return build(cls, values)

    def replace(self, **changes: Any) -> SimConfig:
        """A copy with some values changed (validated again)."""
        return SimConfig.build(**{**self.model_dump(), **changes})

    def values(self) -> dict[str, Any]:
        """Every field's value by name, in order: what :meth:`model_dump` gives (every field holds a
        plain value), without building pydantic's serializer, which a process whose configuration
        came validated from kvcargo's cache never needs otherwise (see ``kvcargo.cli.options``)."""
        return {name: getattr(self, name) for name in SimConfig.model_fields}

    @property
    def handoff_features(self) -> tuple[str, ...]:
        """The opt-in hand-off models this run uses (:data:`HANDOFF_FEATURES` off their reference)."""
        return tuple(f for f, ref in HANDOFF_FEATURES.items() if getattr(self, f) != ref)

    @property
    def early_decode_choice(self) -> bool:
        """Whether the decode instance is chosen when the hand-off starts (not when it lands)."""
        return any(f in EARLY_DECODE_CHOICE for f in self.handoff_features)

    @property
    def arrival_rate(self) -> float:
        """The generator's rate: ``rate`` or the default 8 req/s."""
        return DEFAULT_RATE if self.rate is None else self.rate

    @property
    def colocated_instances(self) -> int:
        return self.instances if self.instances is not None else self.prefill + self.decode


@dataclass(frozen=True)
class Resolved:
    """A configuration turned into what the engine needs: catalog objects, pools, workload."""

    config: SimConfig
    catalog: Catalog
    model: Model
    prefill_pool: Pool
    decode_pool: Pool
    link: Link
    channels: int
    compression: Compression | None
    workload: Workload
    kv_capacity: int
    """KV tokens of a decode (or colocated) instance: the admission and rejection limit."""
    levers: Levers
    """Parallel layouts, scale-up links, per-pool KV capacities and the speculative draft."""

    @property
    def colocated(self) -> bool:
        return self.config.mode == "colocated"

    @property
    def n_prefill(self) -> int:
        return 0 if self.colocated else self.config.prefill

    @property
    def n_decode(self) -> int:
        return self.config.colocated_instances if self.colocated else self.config.decode


def resolve(config: SimConfig, workload: Workload | None = None) -> Resolved:
    """Look everything up in the catalog, build the pools and the request stream."""
    from kvcargo.families import effective_device, effective_model, prefill_resident_bytes
    from kvcargo.serving import with_preset_slos

    config = with_preset_slos(config)
    cat = catalog_mod.load(config.catalog)
    c = config
    model = effective_model(lever_model(c, cat.model(c.model)), c)
    cat.device(config.device)
    if c.mode == "colocated":
        require_units(cat.device(c.device), c.compute_format, "colocated", c.cost_model)
        pool = colocated_pool(c, cat)
        prefill_pool = decode_pool = pool
        levers = resolve_levers(c, cat, model, {"colocated": pool})
    else:
        for role, key in (("prefill", c.prefill_device), ("decode", c.decode_device)):
            require_units(cat.device(key or c.device), c.compute_format, role, c.cost_model)
        prefill_pool = Pool(
            effective_device(cat.device(c.prefill_device or c.device), c),
            c.prefill_devices_per_instance or c.devices_per_instance,
            _cap(c.power_cap, c.prefill_power_cap), c.dvfs, c.compute_format,
        )
        decode_pool = Pool(
            effective_device(cat.device(c.decode_device or c.device), c),
            c.decode_devices_per_instance or c.devices_per_instance,
            _cap(c.power_cap, c.decode_power_cap), c.dvfs, c.compute_format,
        )
        levers = resolve_levers(c, cat, model, {"prefill": prefill_pool, "decode": decode_pool})
        require_fit(model, prefill_pool, "prefill", prefill_resident_bytes(model))
    kvcap = levers.decode.kv_capacity
    link = cat.link(c.link)
    compression = None
    if c.kv_compress is not None:
        stage = {k: v for k, v in (("ops_per_byte", c.transit_ops_per_byte), ("pj_per_bit", c.transit_pj_per_bit))
                 if v is not None}
        compression = Compression(cat.codec(c.kv_compress), c.kv_compress_at, c.kv_keep, c.kv_ratio, **stage)
        if compression.at == "endpoint" and compression.is_identity:
            compression = None  # nothing to do on the GPU, and no in-transit stage either
    if workload is None:
        workload = load_workload(c)
    check_workload(model.key, model_coefficients(model)[0], workload,
                   {"--token-budget": c.token_budget, "--max-num-batched-tokens": c.max_num_batched_tokens})
    if c.decode_prefix_cache and workload.block_ids is None:
        raise KvcargoError("--decode-prefix-cache needs prompt block ids: replay a trace that has them "
                           "(Mooncake's hash_ids) with --workload-file")
    res = Resolved(c, cat, model, prefill_pool, decode_pool, link, c.link_channels or link.channels,
                   compression, workload, kvcap, levers)
    from kvcargo.families import check_levers

    check_levers(res)
    return res


SECTIONS: dict[str, tuple[str, ...]] = {
    "hardware": ("model", "device", "devices_per_instance", "prefill_device", "decode_device",
                 "prefill_devices_per_instance", "decode_devices_per_instance", "mode", "prefill", "decode",
                 "instances", "power_cap", "prefill_power_cap", "decode_power_cap", "dvfs", "catalog"),
    "workload": ("rate", "requests", "prompt", "prompt_cv", "output", "output_cv", "seed", "max_length",
                 "workload_file", "time_scale", "limit", "window", "arrival_col", "prompt_col", "output_col",
                 "time_unit"),
    "slo": ("ttft_slo", "tpot_slo"),
    "scheduling": ("lm_head", "token_budget", "max_batch"),
    "handoff": ("link", "link_channels", "kv_compress", "kv_compress_at", "kv_keep", "kv_ratio",
                "transit_ops_per_byte", "transit_pj_per_bit", *HANDOFF_FEATURES, "layer_groups",
                "nics_per_instance", "domain_size"),
    "parallel": ("tp", "pp", "ep", "microbatches", "expert_imbalance", "scale_up_link", "prefill_tp", "prefill_pp",
                 "decode_tp", "decode_pp", "weight_format", "kv_format", "compute_format", "speculative", "gamma",
                 "alpha", "spec_seed", "ppa", "fast"),
    "cost_models": ("cost_model", "link_model"),
    "serving": ("batch_policy", "max_num_batched_tokens", "kv_policy", "kv_block_size", "max_seq_len", "preemption",
                "host_link", "prefix_caching", "workload", "turns", "think", "system_prompts", "system_len",
                "prefix_share"),
    "families": ("ced_encoder_layers", "ced_replay", "ced_replay_on", "fft_efficiency", "ft_enob", "ft_static_w",
                 "ft_mask_rate", "ft_samples_per_s", "ft_detection", "ft_overlap"),
}
"""SimConfig's fields by what they describe, each field in one section. The fields themselves
keep their historical order (it is the order of JSON keys, CSV columns and ``--help``)."""


def notes(config: SimConfig) -> list[str]:
    """What the run will leave out or bend of what was asked, one line each; the run goes on, as
    the companion's does: serving flags it ignores, and mean lengths above the generator's clip."""
    from kvcargo.serving import ignored_settings

    out = ignored_settings(config)
    if config.workload_file is None and config.workload is None:
        for flag, mean in (("--prompt", config.prompt), ("--output", config.output)):
            if mean > config.max_length:
                out.append(f"{flag} {number(mean)} is above {config.max_length:,} tokens, where the generator clips "
                           "every length (reference-semantics §6.1); raise the clip with --max-length")
    return out


def section(config: SimConfig, name: str) -> dict[str, Any]:
    """One section's values (``section(c, "handoff")``)."""
    return {f: getattr(config, f) for f in SECTIONS[name]}


def needs_extra_columns(c: SimConfig) -> bool:
    """Whether an opt-in model reads the engine's per-request columns the reference does not need."""
    return bool(c.handoff_features) or c.kv_compress is not None


def load_workload(config: SimConfig) -> Workload:
    """The request stream: a trace file when given, else the seeded generator."""
    if config.workload_file:
        from kvcargo.workload.traces import read_trace, transform

        c = config
        trace = read_trace(c.workload_file, arrival_col=c.arrival_col, prompt_col=c.prompt_col,
                           output_col=c.output_col, time_unit=c.time_unit)
        return transform(trace, time_scale=c.time_scale, rate=c.rate, limit=c.limit, window=c.window)
    from kvcargo.serving import serving_workload

    served = serving_workload(config)
    if served is not None:
        return served
    return generate(
        config.requests, config.arrival_rate,
        LengthDist(config.prompt, config.prompt_cv, hi=config.max_length),
        LengthDist(config.output, config.output_cv, hi=config.max_length),
        config.seed,
    )


def colocated_pool(config: SimConfig, cat: Catalog) -> Pool:
    """The hardware of one colocated instance (``--device``, the global power cap)."""
    from kvcargo.families import effective_device

    return Pool(effective_device(cat.device(config.device), config), config.devices_per_instance,
                config.power_cap, config.dvfs, config.compute_format)


def _cap(global_cap: float | None, pool_cap: float | None) -> float | None:
    """The tighter of a global and a per-pool power cap."""
    caps = [c for c in (global_cap, pool_cap) if c is not None]
    return min(caps) if caps else None


# ------------------------------------------------------------------ the colocated twin

HANDOFF_ONLY = ("link_model", *(f for f in SECTIONS["handoff"] if f not in ("link", "link_channels")))
"""Options that only shape the KV hand-off between the pools (a colocated run has none): the hand-off
section and the link model. The link and its channels stay, as colocated runs accept them."""


def without_handoff(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every hand-off-only option back at its default."""
    return {**values, **{f: SimConfig.model_fields[f].default for f in HANDOFF_ONLY}}


def colocated_twin(config: SimConfig) -> SimConfig:
    """The colocated baseline of ``config`` on the same GPUs: everything kept but the hand-off."""
    return SimConfig.build(**{**without_handoff(config.model_dump()), "mode": "colocated"})
