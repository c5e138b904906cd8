"""``kvcargo catalog``: what models, devices, links and codecs exist, with key numbers."""

from __future__ import annotations

import json

import click

from kvcargo import catalog as catalog_mod
from kvcargo.cli.options import field_options
from kvcargo.cost import shape
from kvcargo.report.text import rate_bps, seconds, table

KINDS = (*catalog_mod.KINDS, "traces")
"""The catalog's kinds, then the built-in traces."""


@click.command("catalog")
@click.argument("kind", required=False, type=click.Choice(KINDS))
@field_options("catalog")
@click.option("--json", "as_json", is_flag=True, help="print every field as JSON")
def command(kind: str | None, catalog: tuple[str, ...], as_json: bool) -> None:
    """List the catalog (all kinds, or one)."""
    cat = catalog_mod.load(catalog)
    kinds = [kind] if kind else list(KINDS)
    if as_json:
        data = {k: _traces_json() if k == "traces" else
                {key: e.model_dump(exclude={"key"}) for key, e in getattr(cat, k).items()} for k in kinds}
        click.echo(json.dumps(data if kind is None else data[kind], indent=2))
        return
    blocks = []
    for k in kinds:
        blocks.append(f"{k}\n" + RENDER[k](cat))
    click.echo("\n\n".join(blocks))


def _models(cat: catalog_mod.Catalog) -> str:
    rows = []
    for key, m in cat.models.items():
        s = shape(m)
        kv = (f"latent {m.kv_lora_rank}+{m.qk_rope_dim}" if m.kv_layout == "mla"
              else f"{m.kv_layout} {m.kv_heads}×{m.head_dim}")
        rows.append([key, m.name, m.layers, kv, f"{s.p_total / 1e9:.2f} B", f"{s.kv_per_token:,} B"])
    return table(["key", "name", "layers", "KV cache", "params", "KV per token"], rows, "llrrrr")


def _devices(cat: catalog_mod.Catalog) -> str:
    rows = [[key, d.name, f"{d.peak_flops / 1e12:,.0f} T", f"{d.hbm_bw / 1e12:.3g} TB/s", f"{d.capacity / 1e9:.0f} GB",
             f"{d.tdp_w:.0f} W"] for key, d in cat.devices.items()]
    return table(["key", "name", "BF16 FLOP/s", "HBM", "memory", "TDP"], rows, "llrrrr")


def _links(cat: catalog_mod.Catalog) -> str:
    rows = [[key, ln.name, rate_bps(ln.bandwidth), seconds(ln.latency), f"{ln.pj_per_bit:g} pJ/bit"]
            for key, ln in cat.links.items()]
    return table(["key", "name", "bandwidth", "latency", "energy"], rows, "llrrr")


def _traces_json() -> dict[str, dict[str, str]]:
    from kvcargo.workload.builtin import TRACES, trace_dir

    return {t.key: {"file": str(trace_dir() / t.file), "source": t.source, "licence": t.licence}
            for t in TRACES.values()}


def _traces(cat: catalog_mod.Catalog) -> str:
    """The built-in traces (give the key to --workload-file or trace-stats)."""
    from kvcargo.workload.builtin import TRACES

    rows = [[t.key, t.source, t.licence] for t in TRACES.values()]
    return table(["key", "source", "licence"], rows, "lll")


def _codecs(cat: catalog_mod.Catalog) -> str:
    rows = [[key, c.name, f"{c.ratio:.3f}", f"{c.ops_per_value:g}", "yes" if c.fft else "no"]
            for key, c in cat.codecs.items()]
    return table(["key", "name", "ratio", "ops/value", "FFT"], rows, "llrrl")


RENDER = {"models": _models, "devices": _devices, "links": _links, "codecs": _codecs, "traces": _traces}
