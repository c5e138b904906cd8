"""``kvcargo step``: the time and energy of one prefill or decode step (see kvcargo/steps.py)."""

from __future__ import annotations

import json

import click

from kvcargo.cli.options import field_options
from kvcargo.report.text import seconds, table


@click.command("step")
@click.option("--model", default="llama3-8b", show_default=True, help="model key (kvcargo catalog models)")
@click.option("--device", default="h100", show_default=True, help="device key (kvcargo catalog devices)")
@click.option("--devices-per-instance", type=int, default=1, show_default=True,
              help="devices of the instance (tensor parallel over all of them under --cost-model calibrated) "
                   "[range: 1 to 1,024]")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), required=True, help="which step")
@click.option("--batch", type=int, default=1, show_default=True, help="prompts (prefill) or sequences (decode) [range: ≥ 1]")
@click.option("--prompt", type=int, default=None, help="prefill: tokens of each prompt [range: ≥ 1; batch × prompt at most the model's limit, "
                   "where the step's FLOP count still fits a 64-bit integer]")
@click.option("--context", type=int, default=None, help="decode: tokens of context of each sequence [range: ≥ 1, the step's FLOP count a 64-bit "
                   "integer]")
@field_options("cost_model", "lm_head", "weight_format", "kv_format", "compute_format", "catalog")
@click.option("--json", "as_json", is_flag=True, help="print JSON (seconds, joules, FLOPs, bytes, watts)")
def command(model: str, device: str, devices_per_instance: int, phase: str, batch: int, prompt: int | None,
            context: int | None, cost_model: str | None, lm_head: str | None, weight_format: str | None,
            kv_format: str | None, compute_format: str | None, catalog: tuple[str, ...], as_json: bool) -> None:
    """Time, energy and average power of one step: B prompts of P tokens (--phase prefill
    --prompt P) or B sequences of C tokens of context (--phase decode --context C)."""
    from kvcargo.errors import KvcargoError
    from kvcargo.steps import step

    wanted, other = ("prompt", "context") if phase == "prefill" else ("context", "prompt")
    length = prompt if phase == "prefill" else context
    if (prompt if other == "prompt" else context) is not None:
        raise KvcargoError(f"--{other} applies to --phase {'prefill' if other == 'prompt' else 'decode'}; "
                           f"--phase {phase} takes --{wanted}")
    if length is None:
        raise KvcargoError(f"--phase {phase} needs --{wanted}")
    r = step(model, device, devices_per_instance, phase, batch, length, cost_model or "roofline",
             lm_head or "all", catalog, weight_format or "bf16", kv_format or "bf16", compute_format or "bf16")
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    rows = [["time", seconds(r["time_s"])], ["energy", f"{r['energy_j']:.4g} J"],
            ["average power", f"{r['power_w']:.0f} W"], ["FLOPs", f"{r['flops']:.4g}"],
            ["bytes", f"{r['bytes']:.4g}"]]
    for k, v in r.get("parts_s", {}).items():
        rows.append([k.replace("_", " "), f"{v:.4g}" if k.endswith("scale") else seconds(v)])
    formats = "".join(f", {k.removesuffix('_format')} {r[k]}" for k in ("weight_format", "kv_format", "compute_format")
                      if k in r)
    head = (f"{r['model']} on {devices_per_instance}× {r['device']}, {phase}: batch {batch}, "
            f"{wanted} {length:,} ({r['cost_model']}{formats})")
    click.echo(head + "\n" + table(["", ""], rows, "lr").split("\n", 2)[2])
