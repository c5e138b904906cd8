"""The text report of one simulation run (the companion simulator's layout, plus the hand-off)."""

from __future__ import annotations

from typing import Any

from kvcargo.config import DEFAULT_RATE
from kvcargo.metrics import STAGES
from kvcargo.report.levers import lever_config, lever_lines
from kvcargo.report.serving import scheduler_lines
from kvcargo.report.text import bytes_, count, fixed, ms, pct, seconds, table


def describe_config(c: dict[str, Any], with_rate: bool = True) -> str:
    """One line naming what was simulated (``with_rate=False``: all but the arrival rate)."""
    if c["mode"] == "colocated":
        n = c["instances"] or c["prefill"] + c["decode"]
        pools = f"colocated ×{n} ({c['devices_per_instance']}× {c['device']} each)"
    else:
        pre = f"{c['prefill_devices_per_instance'] or c['devices_per_instance']}× {c['prefill_device'] or c['device']}"
        dec = f"{c['decode_devices_per_instance'] or c['devices_per_instance']}× {c['decode_device'] or c['device']}"
        pools = f"{c['prefill']} prefill ({pre}) + {c['decode']} decode ({dec}), link {c['link']}"
        if c["kv_compress"]:
            pools += f", {c['kv_compress']} at {c['kv_compress_at']}"
    load = f"trace {c['workload_file']}" if c["workload_file"] else (
        (f"{DEFAULT_RATE if c['rate'] is None else c['rate']:g} req/s, " if with_rate else "")
        + f"{c['requests']} requests, prompt {c['prompt']:g}±cv{c['prompt_cv']:g}, "
        f"output {c['output']:g}±cv{c['output_cv']:g}, seed {c['seed']}")
    levers = lever_config(c)
    return f"{c['model']}: {pools}; {load}" + (f"; {levers}" if levers else "")


def render(config: dict[str, Any], s: dict[str, Any]) -> str:
    """The full report."""
    out = [describe_config(config), ""]
    out.append(f"completed {s['completed']:,} of {s['requests']:,} requests"
               + (f" ({s['rejected']:,} rejected: KV never fits)" if s["rejected"] else "")
               + f" in {seconds(s['horizon_s'])} simulated; latency over {s['steady_requests']:,} "
               "steady requests (first 10% are warm-up)")
    if s.get("clipped_prompts") or s.get("clipped_outputs"):
        out.append(f"the generator clipped {count(s['clipped_prompts'], 'prompt length')} and "
                   f"{count(s['clipped_outputs'], 'output length')} to "
                   + (f"the --workload {config['workload']} bounds" if config.get("workload")
                      else f"[1, {config['max_length']:,}] tokens"))
    out += ["", "Latency (ms)"]
    rows = []
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"), ("handoff", "hand-off")):
        rows.append([name] + [ms(s[f"{key}_{p}"]) for p in ("mean", "p50", "p90", "p99", "max")])
    out.append(table(["", "mean", "p50", "p90", "p99", "max"], rows))
    out += ["", "Throughput and SLOs",
            (f"  output {fixed(s['output_tok_per_s'], ',.1f')} tok/s, {fixed(s['req_per_s'], '.2f')} req/s; "
            f"SLO met {pct(s['slo_attainment'])} (TTFT ≤ {config['ttft_slo']:g} s, TPOT ≤ "
            f"{config['tpot_slo'] * 1e3:g} ms); goodput {fixed(s['goodput_rps'], '.2f')} req/s"),
            "  (goodput: steady requests inside both SLOs per second of their arrival window; the req/s "
            "above spread every request over the whole run, drain included, so goodput can be higher)"]
    out += ["", "Utilisation"]
    rows = [[r["name"], f"{r['devices']}× {r['device']}", pct(r["busy"], 0), pct(r["mfu"], 0), pct(r["mbu"], 0),
             fixed(r['mean_batch'], '.1f'), f"{fixed(r['avg_power_w'], ',.0f')} W"] for r in s["instances"]]
    if s["transfers"]:
        rows.append(["kv-link", config["link"], pct(s["link_busy"], 1), "", "", "", ""])
    out.append(table(["instance", "hardware", "busy", "MFU", "MBU", "batch", "power"], rows))
    if s["transfers"]:
        out += ["", "KV hand-off",
                (f"  {s['transfers']:,} transfers, {bytes_(s['link_bytes'])} on the wire "
                f"({fixed(s['link_gbytes_per_s'], '.2f')} GB/s), mean wait for the link {seconds(s['link_mean_wait_s'])}"),
                f"  hand-off p99 {seconds(s['handoff_p99'])}; link energy {fixed(s['link_j_per_request'], '.4f')} J per request"
                + (f"; transit-bound {pct(s['transit_bound_share'])}" if config["kv_compress"] else "")]
    out += ["", "Efficiency",
            (f"  {fixed(s['j_per_token'], '.3f')} J per output token ({fixed(s['tokens_per_j'], '.2f')} tok/J), "
            f"average power {fixed(s['avg_power_w'], ',.0f')} W"),
            f"  energy: static {pct(s['share_static'], 0)}, compute {pct(s['share_compute'], 0)}, "
            f"memory {pct(s['share_memory'], 0)}, link {pct(s['share_link'], 1)}"
            + (f", in-transit {pct(s['share_transit'], 1)}" if s["energy_transit_j"] else "")
            + (f", scale-up {pct(s['share_scale_up'], 2)}" if s["energy_scale_up_j"] else "")]
    if s["silicon_usd"] == s["silicon_usd"]:
        out.append(f"  silicon (illustrative) ${s['silicon_usd']:,.0f}: "
                   f"{fixed(s['tok_per_s_per_kusd'], ',.0f')} tok/s per $1000")
    out += scheduler_lines(s)
    out += lever_lines(s)
    out += ["", "Where time goes (mean over steady requests)"]
    out.append("  " + ", ".join(f"{k.replace('_', ' ')} {pct(s[f'share_{k}'], 0)}" for k in STAGES))
    out.append(f"  KV wait + transfer: {pct(s['kv_share_of_e2e'])} of end-to-end")
    out += ["", f"Hot-spot: {s['hotspot_stage'].replace('_', ' ')} → {s['hotspot']}"]
    return "\n".join(out)
