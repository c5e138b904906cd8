"""``kvcargo handoff``: the chapter's calculator for one prompt (or every link)."""

from __future__ import annotations

import json

import click
from click.core import ParameterSource

from kvcargo import catalog as catalog_mod
from kvcargo.catalog import Link, Model
from kvcargo.cli.options import field_options, range_help
from kvcargo.cost import Pool
from kvcargo.handoff import HandoffResult, calculate_keys
from kvcargo.report.text import bytes_, rate_bps, seconds, table


@click.command("handoff")
@click.option("--model", default="llama3-8b", show_default=True, help="model key (kvcargo catalog models)")
@click.option("--prompt", type=int, default=2048, show_default=True,
              help="prompt tokens [range: 1 to the model's limit, where one prefill step's FLOP count still "
                   "fits a 64-bit integer: 5,903,082 for llama3-8b]")
@click.option("--link", default="eth-25g", show_default=True, help="link key (kvcargo catalog links)")
@click.option("--kv-compress", default=None, help="codec applied to the hand-off (kvcargo catalog codecs)")
@click.option("--kv-keep", type=float, default=None, help="fraction kept by freq-keep-k (needs --kv-compress freq-keep-k)" + range_help("kv_keep"))
@click.option("--kv-ratio", type=float, default=None, help="wire ratio of the ratio codec (needs --kv-compress ratio)" + range_help("kv_ratio"))
@click.option("--send", type=click.Choice(["whole", "layerwise"]), default="whole", show_default=True,
              help="send the cache after the prefill, or stream it layer by layer")
@click.option("--device", default="h100", show_default=True, help="prefill device (sets the prefill time)")
@click.option("--devices-per-instance", type=int, default=1, show_default=True,
              help="devices per prefill instance" + range_help("devices_per_instance"))
@click.option("--links", "all_links", is_flag=True, help="the link table: this hand-off over every link")
@field_options("weight_format", "kv_format", "compute_format", "speculative", "catalog")
@click.option("--json", "as_json", is_flag=True, help="print JSON (seconds, bytes, req/s)")
def command(model: str, prompt: int, link: str, kv_compress: str | None, kv_keep: float | None,
            kv_ratio: float | None, send: str,
            device: str, devices_per_instance: int, all_links: bool, weight_format: str | None,
            kv_format: str | None, compute_format: str | None, speculative: str | None, catalog: tuple[str, ...],
            as_json: bool) -> None:
    """Hand-off size, transfer time, time exposed after prefill and link saturation rate."""
    if all_links and click.get_current_context().get_parameter_source("link") is not ParameterSource.DEFAULT:
        raise click.UsageError("--links shows every link: drop --link (or drop --links for one link)")
    cat = catalog_mod.load(catalog)
    keys = list(cat.links) if all_links else [link]
    formats = {"weight_format": weight_format, "kv_format": kv_format, "compute_format": compute_format,
               "speculative": speculative}
    runs = [calculate_keys(cat, model, prompt, key, kv_compress, kv_keep, kv_ratio, send, device,
                           devices_per_instance, **formats) for key in keys]
    results = [r for r, *_ in runs]
    if as_json:
        data = [r.as_dict() for r in results]
        click.echo(json.dumps(data if all_links else data[0], indent=2))
    elif all_links:
        click.echo(link_table(runs))
    else:
        r, m, ln, pool = runs[0]
        click.echo(panel(r, ln.name, m.name, pool))


def panel_rows(r: HandoffResult, link_name: str, model_name: str, pool: Pool) -> tuple[str, list[list[str]]]:
    """The chapter's result panel as a title and (label, value, note) rows."""
    codec = "uncompressed" if r.codec == "none" else f"{r.codec} (÷{r.ratio:.3g})"
    per_token = f"{r.kv_bytes_per_token:,} B" if not r.draft_kv_bytes_per_token else (
        f"({r.kv_bytes_per_token:,} + {r.draft_kv_bytes_per_token:,} draft) B")
    rows = [
        ["KV to hand off", bytes_(r.kv_bytes), f"{r.prompt_tokens:,} tokens × {per_token}"
         if r.kv_bytes == r.prompt_tokens * (r.kv_bytes_per_token + r.draft_kv_bytes_per_token) else
         f"{r.prompt_tokens:,} tokens, sliding-window layers capped"],
        ["On the wire", bytes_(r.wire_bytes), codec],
        ["Transfer", seconds(r.transfer_s), f"{link_name}, {rate_bps(r.bandwidth)}"],
        ["Prefill", seconds(r.prefill_s), f"{pool.n}× {pool.device.name}"],
        ["Exposed after prefill", seconds(r.exposed_s),
         "added before decode can start" + (" (layer-wise streaming)" if r.send == "layerwise" else "")],
        ["Link full at", f"{r.link_full_rps:.1f} req/s", "hand-offs alone"],
    ]
    return f"{model_name}, {r.prompt_tokens:,}-token prompt over {link_name}", rows


def panel(r: HandoffResult, link_name: str, model_name: str, pool: Pool) -> str:
    """The chapter's result panel."""
    head, rows = panel_rows(r, link_name, model_name, pool)
    return head + "\n" + table(["", "", ""], rows, "lrl").split("\n", 2)[2]


def link_table(runs: list[tuple[HandoffResult, Model, Link, Pool]]) -> str:
    """Link, bandwidth per direction, time for this hand-off (fastest first)."""
    first = runs[0][0]
    rows = [(ln.name, rate_bps(r.bandwidth), seconds(r.transfer_s))
            for r, _, ln, _ in sorted(runs, key=lambda run: run[0].transfer_s)]
    size = bytes_(first.wire_bytes)
    return table(["Link", "Bandwidth", f"{size} takes"], rows, "lrr")
