"""The calculator's panel and link table as text and rows: what ``kvcargo handoff`` prints and
the web page shows, from one place."""

from __future__ import annotations

from kvcargo.catalog import Link, Model
from kvcargo.cost import Pool
from kvcargo.handoff import HandoffResult
from kvcargo.report.text import bytes_, rate_bps, seconds, table


def panel_rows(r: HandoffResult, link_name: str, model_name: str, pool: Pool) -> tuple[str, list[list[str]]]:
    """The chapter's result panel as a title and (label, value, note) rows."""
    codec = "uncompressed" if r.codec == "none" else f"{r.codec} (÷{r.ratio:.3g})"
    rows = [
        [HANDOFF_LABEL[r.handoff_kind], bytes_(r.kv_bytes), handoff_note(r)],
        ["On the wire", bytes_(r.wire_bytes), codec],
        ["Transfer", seconds(r.transfer_s), f"{link_name}, {rate_bps(r.bandwidth)}"
         + (" (the in-transit codec's compute sets the pace)" if r.transit_bound else "")],
        ["Prefill", seconds(r.prefill_s), f"{pool.n}× {pool.device.name}"
         + (f", with {seconds(r.encode_s)} encoding {r.codec}" if r.encode_s else "")],
        ["Exposed after prefill", seconds(r.exposed_s),
         "added before decode can start" + (" (layer-wise streaming)" if r.send == "layerwise" else "")],
        ["Link full at", f"{r.link_full_rps:.1f} req/s", "hand-offs alone"],
    ]
    return f"{model_name}, {r.prompt_tokens:,}-token prompt over {link_name}", rows


HANDOFF_LABEL = {"kv": "KV to hand off", "kv+conv": "KV + conv cache to hand off",
                 "conv": "Conv cache to hand off", "state": "State to hand off"}


def handoff_note(r: HandoffResult) -> str:
    """How the hand-off size comes about (what a mixer model hands off instead of K/V)."""
    if r.handoff_kind == "state":
        return "one distilled recurrent state per sequence, whatever the prompt"
    per_token = f"{r.kv_bytes_per_token:,} B" if not r.draft_kv_bytes_per_token else (
        f"({r.kv_bytes_per_token:,} + {r.draft_kv_bytes_per_token:,} draft) B")
    per = f"{r.prompt_tokens:,} tokens × {per_token}"
    if r.handoff_kind == "conv":
        return per + " (Hyena: its convolution inputs, 2 × d per layer)"
    if r.handoff_kind == "kv+conv":
        return per + " (attention K/V + Hyena convolution inputs)"
    if r.kv_bytes == r.prompt_tokens * (r.kv_bytes_per_token + r.draft_kv_bytes_per_token):
        return per
    return f"{r.prompt_tokens:,} tokens, sliding-window layers capped"


EXPLANATION = {
    "conv": "A Hyena layer hands decode the inputs of its two long convolutions for every prompt token "
            "(2 × d values per layer) instead of attention K/V: four times a GQA cache, so decode memory "
            "fills sooner.",
    "kv+conv": "The hybrid's attention layers (every fourth) hand off K/V; its Hyena layers hand off the "
               "inputs of their long convolutions (2 × d values per layer and token).",
    "state": "Distilled decode replaces the per-token cache with a constant recurrent state per sequence "
             "(16 complex values per channel and convolution): the hand-off and the decode memory of a "
             "request do not grow with the prompt.",
}
"""What the panel adds when a model hands off something other than attention K/V."""


def panel(r: HandoffResult, link_name: str, model_name: str, pool: Pool) -> str:
    """The chapter's result panel."""
    head, rows = panel_rows(r, link_name, model_name, pool)
    text = head + "\n" + table(["", "", ""], rows, "lrl").split("\n", 2)[2]
    return text + ("\n\n" + EXPLANATION[r.handoff_kind] if r.handoff_kind in EXPLANATION else "")


def link_table(runs: list[tuple[HandoffResult, Model, Link, Pool]]) -> str:
    """Link, bandwidth per direction, time for this hand-off (fastest first)."""
    first = runs[0][0]
    rows = [(ln.name, rate_bps(r.bandwidth), seconds(r.transfer_s))
            for r, _, ln, _ in sorted(runs, key=lambda run: run[0].transfer_s)]
    size = bytes_(first.wire_bytes)
    return table(["Link", "Bandwidth", f"{size} takes"], rows, "lrr")
