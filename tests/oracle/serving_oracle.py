"""A second, plain SimPy model of the companion's scheduled instances (levers-serving §1–§4),
written from the spec in a different shape from kvcargo's engine, to check it.

Scope: colocated or disaggregated mode (any number of prefill and decode instances, the shared
FCFS link), one seeded Poisson stream, every batching policy (prefill-priority, decode-priority,
chunked) and KV policy (oracle, pow2, max, paged with recompute or swap preemption); no prefix
cache, no sessions. Requests are dicts, an instance is a dict of lists,
the step cost is written out from §2.5 with the model's shape; only the roofline (RS §3) is
kvcargo's (tested against the reference on its own).
"""

from __future__ import annotations

import math
from typing import Any

import simpy

from kvcargo.catalog import Link, Model
from kvcargo.cost import Pool, kv_capacity, roofline, shape
from kvcargo.workload import Workload

MAX_ROWS = 256


def run_serving_oracle(wl: Workload, *, model: Model, pool: Pool, instances: int, policy: str, kv_policy: str,
                       budget: int = 8192, block: int = 16, max_seq_len: int = 2048, swap: bool = False,
                       host: Link | None = None, prefill_pool: Pool | None = None, n_prefill: int = 0,
                       channels: int = 1, xfer_time: Any = None) -> dict[str, Any]:
    """Per-request stamps (``reqs``: list of dicts) and totals (``preemptions``, ``swap_s``, ...).

    ``instances`` of ``pool`` are the colocated instances, or with ``n_prefill`` > 0 the decode
    pool behind ``n_prefill`` instances of ``prefill_pool`` and a link of ``channels`` (hand-off
    durations ``xfer_time[rid]``).
    """
    env = simpy.Environment()
    sh = shape(model)
    L, d = model.layers, model.d_model
    disagg = n_prefill > 0
    unit = block if kv_policy == "paged" else 1
    cap = kv_capacity(model, pool) // unit
    wm = math.floor(0.01 * cap) if kv_policy == "paged" else 0
    reqs = [dict(rid=i, arr=float(a), p=int(p), o=int(o), t=0, done=0, out=0, base=0, alloc=0, last=math.nan,
                 ps=math.nan, ft=math.nan, ks=math.nan, kr=math.nan, ds=math.nan, fin=math.nan, itl=[], swapped=0,
                 held=0, src=-1)
            for i, (a, p, o) in enumerate(zip(wl.arrival, wl.prompt, wl.output))]
    totals = dict(preemptions=0, recompute=0, computed=0, swap_s=[0.0] * (n_prefill + instances), settled=0)
    finished = env.event()

    def blocks(x: int) -> int:
        return -(-x // unit)

    def whole(r: dict) -> int:
        p, o = r["p"], r["o"]
        return {"oracle": p + o, "pow2": p + (1 << (o - 1).bit_length()), "max": max(max_seq_len, p + o),
                "paged": blocks(p + o) + wm}[kv_policy]

    def first_need(r: dict) -> int:
        p, o = r["p"], r["o"]
        return {"oracle": p + o, "pow2": p + (1 << (o - 1).bit_length()), "max": max(max_seq_len, p + o),
                "paged": blocks(r["t"])}[kv_policy]

    def instance(i: int, role: str, of: Pool) -> dict:
        c = kv_capacity(model, of) // unit
        return dict(i=i, role=role, hf=of.coefficients(), cap=c, wm=math.floor(0.01 * c) if kv_policy == "paged"
                    and role != "prefill" else 0, q=[], run=[], sw=[], used=0, debt=0.0, sleeping=None, inbox=[],
                    landed=[], flying=0)

    pre = [instance(i, "prefill", prefill_pool) for i in range(n_prefill)]
    insts = [instance(n_prefill + i, "decode" if disagg else "colocated", pool) for i in range(instances)]

    def by_arrival(rows: list) -> None:
        rows.sort(key=lambda r: (r["arr"], r["rid"]))

    def settle(r: dict) -> None:
        r["fin"] = env.now
        totals["settled"] += 1
        if totals["settled"] == len(reqs):
            finished.succeed()

    def kick(inst: dict) -> None:
        ev = inst["sleeping"]
        if ev is not None and not ev.triggered:
            ev.succeed()

    def admit(inst: dict) -> dict | None:
        r = inst["q"][0]
        if r["t"] == 0:
            r["t"] = r["p"]
        need = blocks(r["t"]) if inst["role"] == "prefill" else first_need(r)
        if inst["used"] + need + inst["wm"] > inst["cap"]:
            return None
        inst["q"].pop(0)
        inst["used"] += need
        r.update(alloc=need, done=0, base=r["out"])
        if math.isnan(r["ps"]):
            r["ps"] = env.now
        inst["run"].append(r)
        by_arrival(inst["run"])
        return r

    def host_time(inst: dict, n: int) -> None:
        t = n * host.latency + n * block * sh.kv_per_token / host.bandwidth
        inst["debt"] += t
        totals["swap_s"][inst["i"]] += t

    def kick_out(inst: dict, v: dict) -> None:
        inst["run"].remove(v)
        totals["preemptions"] += 1
        inst["used"] -= v["alloc"]
        if swap and v["done"] >= v["t"]:
            host_time(inst, v["alloc"])
            v["swapped"], v["alloc"] = v["alloc"], 0
            inst["sw"].append(v)
            by_arrival(inst["sw"])
        else:
            v.update(alloc=0, t=v["p"] + v["out"], done=0)
            inst["q"].insert(0, v)

    def grow(inst: dict) -> None:
        if kv_policy != "paged":
            return
        i = 0
        while i < len(inst["run"]):
            r = inst["run"][i]
            want = blocks(r["p"] + r["out"])
            if r["done"] < r["t"] or want <= r["alloc"]:
                i += 1
                continue
            while True:
                if inst["used"] + want - r["alloc"] <= inst["cap"]:
                    inst["used"] += want - r["alloc"]
                    r["alloc"] = want
                    i += 1
                    break
                victim = inst["run"][-1]
                kick_out(inst, victim)
                if victim is r:
                    break

    def token(inst: dict, r: dict) -> None:
        now = env.now
        if r["out"] == 0:
            r["ft"] = now
            r["out"] = 1
        else:
            r["itl"].append(now - r["last"])
            r["out"] += 1
        r["last"] = now
        if math.isnan(r["ds"]) and r["o"] > 1:
            r["ds"] = now
        if r["out"] >= r["o"]:
            inst["run"].remove(r)
            inst["used"] -= r["alloc"]
            settle(r)

    def step(inst: dict, dec: list, chunks: list) -> Any:
        b = len(dec)
        ctx = sum(r["p"] + r["out"] for r in dec)
        flops = 2 * sh.p_mm * b + 4 * L * d * (ctx + b)
        kv_pos = ctx + b
        n_tok = b
        for r, c in chunks:
            flops += 2 * sh.p_mm * c + 2 * L * d * c * (2 * r["done"] + c + 1)
            kv_pos += r["done"] + c
            n_tok += c
            totals["computed"] += c
            if r["out"] > 0:
                totals["recompute"] += c
        nbytes = sh.w_str + n_tok * sh.row_bytes + kv_pos * sh.kv_per_token
        dt, _, _ = roofline(inst["hf"], flops, nbytes)
        dt += inst["debt"]
        inst["debt"] = 0.0
        return env.timeout(dt)

    def load(x: dict) -> int:
        decoding = sum(1 for q in x["run"] if q["done"] >= q["t"])
        return len(x["inbox"]) + x["flying"] + len(x["landed"]) + len(x["q"]) + len(x["sw"]) + decoding

    def pull(dec: dict) -> None:
        while dec["inbox"] and not dec["sw"]:
            r = dec["inbox"][0]
            need = first_need(r)
            if dec["used"] + need + dec["wm"] > dec["cap"]:
                return
            dec["inbox"].pop(0)
            dec["used"] += need
            r["alloc"] = need
            dec["flying"] += 1
            env.process(move(r, dec))

    def move(r: dict, dec: dict):
        with channel.request() as req:
            yield req
            r["ks"] = env.now
            yield env.timeout(float(xfer_time[r["rid"]]))
        r["kr"] = env.now
        src = pre[r["src"]]
        src["used"] -= r["held"]
        kick(src)
        dec["flying"] -= 1
        dec["landed"].append(r)
        kick(dec)

    def prefilled(inst: dict, r: dict) -> None:
        """Prefill pool: first token out, then the hand-off to the least loaded decode instance."""
        r["ft"] = r["last"] = env.now
        r["out"] = 1
        inst["run"].remove(r)
        if r["o"] <= 1:
            inst["used"] -= r["alloc"]
            settle(r)
            return
        r["held"], r["alloc"] = r["alloc"], 0
        dec = min(insts, key=load)
        dec["inbox"].append(r)
        pull(dec)

    def prefill_loop(inst: dict):
        while True:
            chunks = []
            if policy == "chunked":
                n = 0
                for r in list(inst["run"]):
                    if n < budget:
                        c = min(r["t"] - r["done"], budget - n)
                        n += c
                        chunks.append((r, c))
                while inst["q"] and n < budget:
                    r = admit(inst)
                    if r is None:
                        break
                    c = min(r["t"] - r["done"], budget - n)
                    n += c
                    chunks.append((r, c))
            else:
                tokens = 0
                while inst["q"]:
                    head = inst["q"][0]
                    if chunks and tokens + head["p"] > budget:
                        break
                    if admit(inst) is None:
                        break
                    chunks.append((head, head["t"]))
                    tokens += head["t"]
            if not chunks:
                inst["sleeping"] = env.event()
                yield inst["sleeping"]
                continue
            yield step(inst, [], chunks)
            for r, c in chunks:
                r["done"] += c
                if r["done"] == r["t"]:
                    prefilled(inst, r)

    def loop(inst: dict):
        while True:
            if inst["role"] == "decode":
                pull(inst)
                while inst["landed"] and len(inst["run"]) < MAX_ROWS:
                    r = inst["landed"].pop(0)
                    r.update(ds=env.now, done=r["p"], base=r["out"])
                    inst["run"].append(r)
                    by_arrival(inst["run"])
            while inst["sw"] and len(inst["run"]) < MAX_ROWS:  # swap back in, earliest first
                r = inst["sw"][0]
                if inst["used"] + r["swapped"] > inst["cap"]:
                    break
                inst["sw"].pop(0)
                host_time(inst, r["swapped"])
                inst["used"] += r["swapped"]
                r["alloc"] = r["swapped"]
                inst["run"].append(r)
                by_arrival(inst["run"])
            if policy == "chunked":
                grow(inst)
                dec = [r for r in inst["run"] if r["done"] >= r["t"]]
                n = len(dec)
                chunks = []
                for r in list(inst["run"]):
                    if r["done"] < r["t"] and n < budget:
                        c = min(r["t"] - r["done"], budget - n)
                        n += c
                        chunks.append((r, c))
                while inst["q"] and n < budget and len(inst["run"]) < MAX_ROWS and not inst["sw"]:
                    r = admit(inst)
                    if r is None:
                        break
                    c = min(r["t"] - r["done"], budget - n)
                    n += c
                    chunks.append((r, c))
                if not dec and not chunks:
                    inst["sleeping"] = env.event()
                    yield inst["sleeping"]
                    continue
                yield step(inst, dec, chunks)
                for r in dec:
                    token(inst, r)
                for r, c in chunks:
                    r["done"] += c
                    if r["done"] == r["t"]:
                        token(inst, r)
                continue
            if policy == "decode-priority" and inst["run"]:
                batch = []
            else:
                batch, tokens = [], 0
                while inst["q"] and len(inst["run"]) < MAX_ROWS and not inst["sw"]:
                    head = inst["q"][0]
                    if batch and tokens + (head["t"] or head["p"]) > budget:
                        break
                    if admit(inst) is None:
                        break
                    batch.append(head)
                    tokens += head["t"]
            if batch:
                yield step(inst, [], [(r, r["t"]) for r in batch])
                for r in batch:
                    r["done"] = r["t"]
                    token(inst, r)
            elif inst["run"]:
                grow(inst)
                if inst["run"]:
                    rows = list(inst["run"])
                    yield step(inst, rows, [])
                    for r in rows:
                        token(inst, r)
            else:
                inst["sleeping"] = env.event()
                yield inst["sleeping"]

    def arrivals():
        for r in reqs:
            yield env.timeout(max(0, r["arr"] - env.now))
            if whole(r) > cap or (disagg and blocks(r["p"]) > pre[0]["cap"]):
                totals["settled"] += 1
                r["rejected"] = True
                if totals["settled"] == len(reqs):
                    finished.succeed()
                continue
            if disagg:
                inst = min(pre, key=lambda x: sum(q["p"] for q in x["q"]))
                r["src"] = inst["i"]
            else:
                inst = min(insts, key=load)
            inst["q"].append(r)
            kick(inst)

    for inst in pre:
        env.process(prefill_loop(inst))
    for inst in insts:
        env.process(loop(inst))
    channel = simpy.Resource(env, capacity=channels) if disagg else None
    env.process(arrivals())
    env.run(until=finished)
    swap_s = 0.0
    for s in totals["swap_s"]:
        swap_s += s
    return dict(reqs=reqs, preemptions=totals["preemptions"], recompute=totals["recompute"],
                computed=totals["computed"], swap_s=swap_s, horizon=env.now)
