"""What exists: models, devices, links and KV codecs, loaded from TOML data.

The built-in entries live in the TOML files next to this module (one file per kind, one table
per entry). Users extend or override them with their own TOML files whose top-level tables are
the kinds (``[models.my-model]``, ``[devices.my-gpu]``, ``[links.my-link]``,
``[codecs.my-codec]``). Every entry is validated; a malformed one is rejected with a message that
names the file, the entry and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.version import VERSION as PYDANTIC_VERSION

from kvcargo import cachefiles
from kvcargo.errors import KvcargoError, unknown

HERE = Path(__file__).parent

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class _Entry(BaseModel):
    # defer_build: a process that takes the built-in entries from the cache never validates one,
    # so it never pays for building the validators (about 30 ms)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    key: str
    name: str


class Model(_Entry):
    """A transformer's shape (§1.1). Derived counts live in :mod:`kvcargo.cost`."""

    layers: PositiveInt
    d_model: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    d_ff: PositiveInt
    vocab: PositiveInt
    head_dim: PositiveInt | None = None
    weight_bytes: PositiveFloat = 2.0
    kv_bytes: PositiveFloat = 2.0
    experts: NonNegInt = 0
    top_k: NonNegInt = 0
    shared_experts: NonNegInt = 0
    notes: str = ""
    # KV layouts beyond the reference (every field optional; the defaults are the reference's
    # full-attention MHA/GQA model, so the presets of §1.1 keep their numbers exactly).
    kv_layout: Literal["mha", "gqa", "mla"] | None = None
    """``mha``: one K and one V head per query head; ``gqa``: ``kv_heads`` shared K/V heads;
    ``mla``: multi-head latent attention (DeepSeek), one latent of ``kv_lora_rank + qk_rope_dim``
    values per layer and token, not split by tensor parallelism. Default: ``mha`` when
    ``kv_heads == heads``, else ``gqa``."""
    kv_lora_rank: PositiveInt | None = None
    """MLA: width of the compressed KV latent (DeepSeek-V3: 512)."""
    qk_rope_dim: PositiveInt | None = None
    """MLA: width of the decoupled RoPE key, cached beside the latent (DeepSeek-V3: 64)."""
    qk_nope_dim: PositiveInt | None = None
    """MLA: per-head query/key width without RoPE (parameter count only)."""
    v_head_dim: PositiveInt | None = None
    """MLA: per-head value width (parameter count only)."""
    q_lora_rank: PositiveInt | None = None
    """MLA: rank of the low-rank query projection (none: a full d × heads·(nope+rope) one)."""
    sliding_window: PositiveInt | None = None
    """Tokens a sliding-window attention layer keeps: the hand-off of those layers is capped at
    this many tokens. Unset: full attention everywhere (the reference, Mistral-7B included)."""
    window_layers: NonNegInt | None = None
    """How many of the layers use the sliding window (default: all of them when
    ``sliding_window`` is set; Gemma-2 alternates, so half)."""
    dense_layers: NonNegInt = 0
    """Mixture of experts: leading layers with a dense MLP instead of experts (DeepSeek-V3: 3)."""
    d_ff_dense: PositiveInt | None = None
    """MLP width of those dense layers (default ``(top_k + shared_experts) · d_ff``)."""
    # Sequence mixers beyond attention and causal encoder-decoders (levers-mixers §1, §4). The
    # defaults are a plain attention model, so every preset above keeps its numbers.
    mixer: Literal["attention", "hyena", "hybrid"] = "attention"
    """``hyena``: every layer is a Hyena-2 long-convolution operator (Poli et al. 2023,
    arXiv:2302.10866); ``hybrid``: layer i is attention iff i mod 4 = 0, the others Hyena."""
    hyena_decode: Literal["direct", "distilled"] = "direct"
    """``direct``: decode evaluates the long convolution over a per-token cache of its inputs;
    ``distilled``: a constant recurrent state per sequence (Massaroli et al. 2023,
    arXiv:2310.18780). Hyena models only."""
    circulant_block: NonNegInt = 0
    """Block size k of block-circulant weight matrices (CirCNN, Ding et al. 2017,
    arXiv:1708.08917); 0: dense weights. Hyena models only; a power of two dividing d and d_ff."""
    ced_encoder_layers: NonNegInt = 0
    """Causal encoder-decoder: the bottom E layers are an encoder run only at prefill (0: off)."""
    ced_replay: PositiveInt = 128
    """CED: the last W prompt tokens are replayed through the decoder layers."""
    ced_replay_on: Literal["prefill", "decode"] = "prefill"
    """CED: which pool runs the replay (decode: the first token comes from the decode side)."""

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if self.kv_heads > self.heads:
            raise ValueError("kv_heads must not exceed heads")
        if self.heads % self.kv_heads and self.kv_layout != "mla":
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads}): each K/V head "
                             "serves a whole group of query heads")
        if self.experts and not 0 < self.top_k <= self.experts:
            raise ValueError("a mixture of experts needs 0 < top_k <= experts")
        self._check_layout()
        return self

    def _check_layout(self) -> None:
        mla_fields = ("kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "v_head_dim")
        if self.kv_layout is None:
            object.__setattr__(self, "kv_layout", "mha" if self.kv_heads == self.heads else "gqa")
        if self.kv_layout == "mha" and self.kv_heads != self.heads:
            raise ValueError("kv_layout 'mha' needs kv_heads == heads (use 'gqa')")
        if self.kv_layout == "mla":
            missing = [f for f in mla_fields if getattr(self, f) is None]
            if missing:
                raise ValueError("kv_layout 'mla' needs " + ", ".join(missing))
        elif any(getattr(self, f) is not None for f in (*mla_fields, "q_lora_rank")):
            raise ValueError("kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim and q_lora_rank "
                             "apply only to kv_layout 'mla'")
        if self.window_layers is not None:
            if self.sliding_window is None:
                raise ValueError("window_layers needs sliding_window")
            if self.window_layers > self.layers:
                raise ValueError("window_layers must not exceed layers")
        if self.dense_layers and not self.experts:
            raise ValueError("dense_layers applies only to a mixture of experts")
        if self.dense_layers > self.layers:
            raise ValueError("dense_layers must not exceed layers")
        if self.d_ff_dense is not None and not self.dense_layers:
            raise ValueError("d_ff_dense needs dense_layers")
        self._check_mixer()

    def _check_mixer(self) -> None:
        if self.mixer != "attention" and (self.experts or self.kv_layout == "mla" or self.sliding_window):
            raise ValueError("a hyena or hybrid mixer needs a dense full-attention shape (no experts, MLA or window)")
        if self.mixer != "hyena" and (self.hyena_decode != "direct" or self.circulant_block):
            raise ValueError("hyena_decode and circulant_block apply only to mixer 'hyena'")
        k = self.circulant_block
        if k and (k & (k - 1) or k < 2 or self.d_model % k or self.d_ff % k):
            raise ValueError("circulant_block must be a power of two (>= 2) dividing d_model and d_ff")
        if self.ced_encoder_layers:
            if self.mixer != "attention" or self.experts:
                raise ValueError("a causal encoder-decoder needs a dense attention model (no hyena mixer, no experts)")
            if self.ced_encoder_layers >= self.layers:
                raise ValueError("ced_encoder_layers must leave at least one decoder layer")


class TransformEngine(BaseModel):
    """An optical Fourier-transform engine beside a digital part (levers-mixers §3): converters,
    a reprogrammable spectral mask, a laser. Figures are the companion's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    samples_per_s: PositiveFloat = 1e12
    """Converter samples per second, each direction."""
    enob: int = 8
    """Effective number of bits of the converters."""
    dac_fj_per_step: NonNegFloat = 10.0
    adc_fj_per_step: NonNegFloat = 20.0
    """Walden figures of merit, fJ per conversion step."""
    laser_w: NonNegFloat = 10.0
    tuning_w: NonNegFloat = 10.0
    """Static power per device: laser and thermal tuning."""
    mask_values: PositiveInt = 2_000_000
    """Complex values the mask holds at once."""
    mask_rate_hz: PositiveFloat = 1031.0
    """Mask rewrites per second (an 8-bit DMD)."""
    detection: Literal["coherent", "intensity"] = "coherent"
    """``intensity`` detection needs twice the passes."""
    overlap: bool = False
    """Optical and digital time overlap (max) instead of adding."""
    channel_samples_per_s: PositiveFloat = 50e9
    """Samples per second of one converter channel (area: one DAC and one ADC per channel)."""
    dac_mm2: NonNegFloat = 0.05
    adc_mm2: NonNegFloat = 0.10
    photonic_mm2: PositiveFloat = 100.0
    """Area of the separate photonic die."""


class Device(_Entry):
    """An accelerator (§2): peaks, derating efficiencies, memory, power coefficients."""

    peak_flops: PositiveFloat
    hbm_bw: PositiveFloat
    capacity: PositiveFloat
    flop_eff: Annotated[float, Field(gt=0, le=1)] = 0.55
    bw_eff: Annotated[float, Field(gt=0, le=1)] = 0.80
    tdp_w: PositiveFloat = 700.0
    idle_w: NonNegFloat = 100.0
    pj_per_flop: NonNegFloat = 1.0
    pj_per_byte: NonNegFloat = 60.0
    lowp_speedup: dict[str, PositiveFloat] = {}
    scale_up: str = "nvlink4"
    die_mm2: PositiveFloat | None = None
    price_usd: PositiveFloat | None = None
    bw_unit: PositiveFloat = 1.0
    """Unit in which the memory time is evaluated: ``(bytes/unit) / (bw/unit · eff · n)``.
    Mathematically irrelevant; it fixes the last bit of the result (the reference computes the
    A100's memory time in TB and TB/s, and kvcargo reproduces that bit for bit)."""
    ft_engine: TransformEngine | None = None
    """An optical Fourier-transform engine (FFT-mixing prefill runs on it; see kvcargo.optical)."""
    kernel_tables: str | None = None
    """Measured kernel tables (``.npz`` from ``scripts/convert_aiconfigurator.py``) for
    ``--cost-model calibrated``; unset: the built-in set of the same key, if any."""
    framework: dict[str, dict[str, float]] = {}
    """Fitted framework constants of ``--cost-model calibrated`` by TP degree
    (``{tp8 = {prefill_scale = …, prefill_host_s_per_layer = …, comm_scale = …, decode_scale = …,
    decode_overhead_s = …, large_step = …}}``, written by ``kvcargo calibrate``; a field left out
    takes its neutral value: scales 1, seconds and ``large_step`` 0); empty: the built-in ones."""

    @model_validator(mode="after")
    def _check(self) -> Device:
        if self.idle_w >= self.tdp_w:
            raise ValueError("idle_w must be below tdp_w")
        return self


class Link(_Entry):
    """A KV link (§4): per-channel bandwidth per direction, per-transfer latency, energy."""

    bandwidth: PositiveFloat
    latency: NonNegFloat = 10e-6
    pj_per_bit: NonNegFloat = 10.0
    channels: PositiveInt = 1
    # ``--link-model measured`` (kvcargo.linkmodel); unset: line rate, the catalog latency.
    message_overhead_s: NonNegFloat | None = None
    """Fixed cost of one message (replaces ``latency`` under the measured model)."""
    efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of ``bandwidth`` a channel sustains on large messages."""
    min_message_s: NonNegFloat | None = None
    """Floor on the time of any message."""
    channel_cap: PositiveFloat | None = None
    """Host-side ceiling of one channel, bytes/s (a NIC's PCIe attachment)."""
    layer_overhead_s: NonNegFloat | None = None
    """Per-layer cost of layer-wise sending that does not overlap the prefill (default: a
    multiple of ``message_overhead_s``, see kvcargo.linkmodel)."""


class Codec(_Entry):
    """A KV hand-off codec (§5): wire ratio, encode and decode work per BF16 value.

    ``kind``: ``fixed`` (a constant ratio), ``ratio`` (the user gives it with ``--kv-ratio``;
    ``ratio`` is the default) or ``kivi`` (``bits`` per value plus an FP16 scale and zero point
    per ``group`` values; the last ``residual`` tokens stay in BF16: the ratio depends on the
    prompt). Accuracy is not modelled.
    """

    kind: Literal["fixed", "ratio", "kivi"] = "fixed"
    ratio: Annotated[float, Field(ge=1)] = 1.0
    ops_per_value: NonNegFloat = 0.0
    decode_ops_per_value: NonNegFloat = 0.0
    """Decompression work, charged to the decode instance's first step of the request."""
    fft: bool = False
    keep_adjustable: bool = False
    bits: PositiveInt | None = None
    group: PositiveInt | None = None
    residual: NonNegInt | None = None

    @model_validator(mode="after")
    def _check(self) -> Codec:
        kivi = (self.bits, self.group, self.residual)
        if self.kind == "kivi" and None in kivi:
            raise ValueError("a kivi codec needs bits, group and residual")
        if self.kind != "kivi" and any(v is not None for v in kivi):
            raise ValueError("bits, group and residual apply only to kind 'kivi'")
        return self


KINDS: dict[str, type[_Entry]] = {"models": Model, "devices": Device, "links": Link, "codecs": Codec}
E = TypeVar("E", bound=_Entry)


@dataclass(frozen=True)
class Catalog:
    """Every known entry by kind and key; look-ups fail with the list of valid keys."""

    models: Mapping[str, Model] = field(default_factory=dict)
    devices: Mapping[str, Device] = field(default_factory=dict)
    links: Mapping[str, Link] = field(default_factory=dict)
    codecs: Mapping[str, Codec] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def model(self, key: str) -> Model:
        return _lookup(self.models, "model", key)

    def device(self, key: str) -> Device:
        return _lookup(self.devices, "device", key)

    def link(self, key: str) -> Link:
        return _lookup(self.links, "link", key)

    def codec(self, key: str) -> Codec:
        return _lookup(self.codecs, "codec", key)

    def extended(self, path: str | Path) -> Catalog:
        """This catalog plus (and overridden by) the entries of a user TOML file."""
        import tomllib

        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise KvcargoError(f"catalog file {path}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise KvcargoError(f"catalog file {path}: not UTF-8 text (a TOML file is expected)") from None
        except tomllib.TOMLDecodeError as exc:
            raise KvcargoError(f"catalog file {path}: not valid TOML ({exc})") from None
        except RecursionError:
            raise KvcargoError(f"catalog file {path}: not valid TOML (nested too deeply)") from None
        tables = {kind: dict(getattr(self, kind)) for kind in KINDS}
        for kind, entries in data.items():
            if kind not in KINDS:
                raise KvcargoError(
                    f"catalog file {path}: unknown section {kind!r}; valid sections: "
                    + ", ".join(KINDS)
                )
            if not isinstance(entries, dict):
                raise KvcargoError(f"catalog file {path}: [{kind}] must be a table of entries")
            tables[kind].update(_parse_entries(KINDS[kind], entries, f"{path}", kind))
        return Catalog(**tables, sources=self.sources + (str(path),))


def _lookup(table: Mapping[str, E], kind: str, key: str) -> E:
    try:
        return table[key]
    except KeyError:
        raise unknown(kind, key, table) from None


def _parse_entries(cls: type[E], entries: dict, source: str, kind: str) -> dict[str, E]:
    parsed: dict[str, E] = {}
    for key, body in entries.items():
        where = f"catalog file {source}: entry {kind}.{key}"
        if not isinstance(body, dict):
            raise KvcargoError(f"{where}: must be a table of fields")
        try:
            parsed[key] = cls(key=key, **{"name": key, **body})
        except ValidationError as exc:
            err = exc.errors()[0]
            fld = ".".join(str(p) for p in err["loc"]) or "(entry)"
            raise KvcargoError(f"{where}: field {fld!r}: {err['msg']}") from None
        except TypeError as exc:  # e.g. a field named "key" given twice
            raise KvcargoError(f"{where}: {exc}") from None
    return parsed


@lru_cache(maxsize=1)
def builtin() -> Catalog:
    """The catalog shipped with kvcargo: parsed and validated once, then kept in kvcargo's cache
    directory for later processes while its files and this module are unchanged."""
    files = [HERE / f"{kind}.toml" for kind in KINDS] + [Path(__file__)]
    return cachefiles.cached("catalog", (cachefiles.stamp(files), PYDANTIC_VERSION), _parse_builtin)


def _parse_builtin() -> Catalog:
    import tomllib

    tables = {}
    for kind, cls in KINDS.items():
        text = (HERE / f"{kind}.toml").read_text(encoding="utf-8")
        tables[kind] = _parse_entries(cls, tomllib.loads(text), f"{kind}.toml (built-in)", kind)
    return Catalog(**tables, sources=("built-in",))


def load(extra_files: Iterable[str | Path] = ()) -> Catalog:
    """The built-in catalog extended by user files, in order (later files win). Parsed once per
    set of files as they stand (a plan resolves the same files for every candidate); an edited
    file is read again."""
    files = tuple(str(p) for p in extra_files)
    return _load(cachefiles.stamp(files)) if files else builtin()


@lru_cache(maxsize=32)
def _load(files: tuple[tuple[str, int, int], ...]) -> Catalog:
    """The catalog of ``files`` as :func:`kvcargo.cachefiles.stamp` gives them (a missing file's
    stamp is -1: reading it fails with the file's name)."""
    cat = builtin()
    for path, _, _ in files:
        cat = cat.extended(path)
    return cat
