"""The live simulator's presets: every scenario the chapter discusses, as data.

Each preset is a set of ``POST /api/simulate`` parameters (CLI flag names with underscores; what
is not given keeps the CLI default) and, under ``chapter``, the figures the chapter quotes for
it: ``(summary key, unit, text)``. The page shows them next to the run's own numbers, and the
tests check that every one is reproduced to the digits the chapter prints.
"""

from __future__ import annotations

from typing import Any

UNIT_SCALE = {"ms": 1e3, "s": 1.0, "%": 100.0, "J": 1.0}
"""Summary values are SI; the chapter's text = summary value × scale, to its printed digits."""

FIVE_LINKS = "The five links at 8 req/s"

PRESETS: list[dict[str, Any]] = [
    {
        "key": "links-nvlink4", "group": FIVE_LINKS, "title": "NVLink 4",
        "params": {"link": "nvlink4", "rate": 8},
        "note": "Prefill and decode in the same NVLink domain: the transfer is 0.6 ms.",
        "chapter": [("ttft_p99", "ms", "353.6")],
    },
    {
        "key": "links-cpo", "group": FIVE_LINKS, "title": "Co-packaged optics (illustrative)",
        "params": {"link": "cpo-optical", "rate": 8},
        "note": "Photonic links: 200 GB/s, 5 µs, 3 pJ/bit. The effect is energy, not latency: "
                "0.006 J of link energy per request against 0.032 J on InfiniBand, same TPOT p99.",
        "chapter": [("ttft_p99", "ms", "353.6"), ("tpot_p99", "ms", "8.8"), ("link_j_per_request", "J", "0.006")],
    },
    {
        "key": "links-ib-ndr", "group": FIVE_LINKS, "title": "InfiniBand NDR 400G (the base scenario)",
        "params": {"link": "ib-ndr", "rate": 8},
        "note": "The chapter's base scenario: the hand-off is a few percent of the prefill.",
        "chapter": [("ttft_p99", "ms", "353.6"), ("tpot_p99", "ms", "8.8"), ("link_j_per_request", "J", "0.032")],
    },
    {
        "key": "links-eth-100g", "group": FIVE_LINKS, "title": "100 GbE",
        "params": {"link": "eth-100g", "rate": 8},
        "note": "A 268 MB hand-off takes 21.5 ms; TTFT is unchanged, TPOT barely.",
        "chapter": [("ttft_p99", "ms", "353.6")],
    },
    {
        "key": "links-eth-25g", "group": FIVE_LINKS, "title": "25 GbE",
        "params": {"link": "eth-25g", "rate": 8},
        "note": "The transfer (85.9 ms) is longer than the prefill (59.0 ms); the link is busy 64.4% "
                "of the time and TPOT p99 rises to 11.6 ms. TTFT does not move: the first token "
                "comes from the prefill pool.",
        "chapter": [("ttft_p99", "ms", "353.6"), ("tpot_p99", "ms", "11.6"), ("link_busy", "%", "64.4")],
    },
    {
        "key": "eth-25g-14", "group": "Compression where the link is the bottleneck",
        "title": "25 GbE at 14 req/s, uncompressed",
        "params": {"link": "eth-25g", "rate": 14},
        "note": "Near saturation (the link is full at 11.6 req/s of 2,048-token prompts): "
                "queueing, not transfer, dominates.",
        "chapter": [("link_busy", "%", "94.0"), ("handoff_p99", "ms", "9,657.8"), ("tpot_p99", "ms", "77.2"),
                    ("slo_attainment", "%", "41.0")],
    },
    {
        "key": "eth-25g-14-fp8", "group": "Compression where the link is the bottleneck",
        "title": "25 GbE at 14 req/s, FP8 hand-off",
        "params": {"link": "eth-25g", "rate": 14, "kv_compress": "fp8"},
        "note": "FP8 halves the bytes on the wire and the link recovers.",
        "chapter": [("link_busy", "%", "53.7"), ("handoff_p99", "ms", "166.6"), ("tpot_p99", "ms", "11.5"),
                    ("slo_attainment", "%", "100.0")],
    },
    {
        "key": "ib-ndr-fp8", "group": "Compression where the link is the bottleneck",
        "title": "InfiniBand at 8 req/s, FP8 hand-off",
        "params": {"link": "ib-ndr", "rate": 8, "kv_compress": "fp8"},
        "note": "On a link with headroom the same compression changes TPOT p99 not at all.",
        "chapter": [("tpot_p99", "ms", "8.8")],
    },
    {
        "key": "decode-a100", "group": "Heterogeneous pools", "title": "Decode on A100",
        "params": {"rate": 8, "decode_device": "a100"},
        "note": "Decode wants memory bandwidth and capacity per dollar: TPOT p99 rises but stays "
                "inside the 25 ms SLO, and energy per token falls (0.326 → 0.299 J).",
        "chapter": [("ttft_p99", "ms", "353.6"), ("tpot_p99", "ms", "16.8"), ("slo_attainment", "%", "100.0"),
                    ("j_per_token", "J", "0.299")],
    },
    {
        "key": "prefill-a100", "group": "Heterogeneous pools", "title": "Prefill on A100, one instance",
        "params": {"rate": 8, "prefill_device": "a100"},
        "note": "The reverse placement fails: one A100 prefill instance cannot keep up with 8 req/s.",
        "chapter": [("ttft_p99", "s", "47.1")],
    },
    {
        "key": "prefill-a100-x2", "group": "Heterogeneous pools", "title": "Prefill on A100, two instances",
        "params": {"rate": 8, "prefill_device": "a100", "prefill": 2},
        "note": "Two A100 prefill instances bring TTFT back under the 1 s SLO for most requests.",
        "chapter": [("ttft_p99", "ms", "1,093.5"), ("slo_attainment", "%", "96.9")],
    },
]


def chapter_text(value: float, unit: str, like: str) -> str:
    """``value`` (SI) printed as the chapter prints ``like``: same unit, decimals, separators."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{value * UNIT_SCALE[unit]:,.{decimals}f}"


def presets() -> list[dict[str, Any]]:
    """The presets as plain JSON-able data (``chapter`` rows as objects)."""
    return [{**p, "chapter": [{"key": k, "unit": u, "text": t} for k, u, t in p["chapter"]]} for p in PRESETS]
