"""A second, plain SimPy model of the companion's scheduled instances (levers-serving §1–§4),
written from the spec in a different shape from kvcargo's engine, to check it.

Scope: colocated or disaggregated mode (any number of prefill and decode instances, the shared
FCFS link), one seeded Poisson stream, every batching policy (prefill-priority, decode-priority,
chunked) and KV policy (oracle, pow2, max, paged with recompute or swap preemption), prefix
caching (§5; eviction by scanning the unpinned leaves for the least recently used) and closed-loop
sessions (§6.3). Requests are dicts, an instance is a dict of lists,
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
                       channels: int = 1, xfer_time: Any = None, prefix_caching: bool = False) -> dict[str, Any]:
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
                 held=0, src=-1, chain=(), emit=None, succ=-1, think=0.0, pins=[], cov=0, held_pins=[])
            for i, (a, p, o) in enumerate(zip(wl.arrival, wl.prompt, wl.output))]
    ss = wl.sessions
    if ss is not None:
        for r in reqs:
            i = r["rid"]
            r.update(chain=ss.chain[i], emit=ss.emit[i], succ=int(ss.successor[i]), think=float(ss.think[i]))
    totals = dict(preemptions=0, recompute=0, computed=0, swap_s=[0.0] * (n_prefill + instances), settled=0,
                  prompt=0, hits=0)
    finished = env.event()

    def blocks(x: int) -> int:
        return -(-x // unit)

    def whole(r: dict) -> int:
        p, o = r["p"], r["o"]
        return {"oracle": p + o, "pow2": p + (1 << (o - 1).bit_length()), "max": max(max_seq_len, p + o),
                "paged": blocks(p + o) + wm}[kv_policy]

    def first_need(r: dict, h: int = 0) -> int:
        p, o = r["p"], r["o"]
        return {"oracle": p - h + o, "pow2": p - h + (1 << (o - 1).bit_length()),
                "max": max(max_seq_len, p + o) - h, "paged": blocks(r["t"] - h)}[kv_policy]

    def instance(i: int, role: str, of: Pool) -> dict:
        c = kv_capacity(model, of) // unit
        return dict(i=i, role=role, hf=of.coefficients(), cap=c, wm=math.floor(0.01 * c) if kv_policy == "paged"
                    and role != "prefill" else 0, q=[], run=[], sw=[], used=0, debt=0.0, sleeping=None, inbox=[],
                    landed=[], flying=0, cache={} if prefix_caching and role != "decode" else None, seq=0,
                    evicted=0)

    # ---------------------------------------------------------------- prefix cache (§5)
    def evict(inst: dict, k: int) -> int:
        cache, freed = inst["cache"], 0
        while freed < k:
            leaves = [n for n in cache.values() if n["ref"] == 0 and n["kids"] == 0]
            if not leaves:
                break
            n = min(leaves, key=lambda x: (x["used"], x["seq"]))
            del cache[n["key"]]
            freed += n["units"]
            inst["evicted"] += n["tok"]
            if n["parent"] is not None:
                n["parent"]["kids"] -= 1
        return freed

    def room(inst: dict, n: int) -> bool:
        short = inst["used"] + n - inst["cap"]
        if short > 0 and inst["cache"] is not None:
            inst["used"] -= evict(inst, short)
        return inst["used"] + n <= inst["cap"]

    def hits(inst: dict, r: dict, t: int) -> tuple[int, list]:
        if inst["cache"] is None or not r["chain"]:
            return 0, []
        found, parent = [], None
        for key, _ in r["chain"]:
            n = inst["cache"].get(key)
            if n is None or n["parent"] is not parent:
                break
            found.append(n)
            parent = n
        h = sum(n["tok"] for n in found)
        while found and h > t - 1:
            h -= found.pop()["tok"]
        return h, found

    def pin(n: dict) -> None:
        n["ref"] += 1
        n["used"] = env.now

    def unpin(nodes: list) -> None:
        for n in nodes:
            n["ref"] -= 1
            n["used"] = env.now

    def new_node(inst: dict, key: str, tok: int, parent: dict | None) -> dict:
        n = dict(key=key, tok=tok, units=blocks(tok), parent=parent, kids=0, ref=1, used=env.now, seq=inst["seq"])
        inst["seq"] += 1
        inst["cache"][key] = n
        if parent is not None:
            parent["kids"] += 1
        inst["used"] += n["units"]
        return n

    def private(r: dict, x: int) -> int:
        if kv_policy == "paged":
            return blocks(max(0, r["done"] + r["out"] - r["base"] - x))
        return r["alloc"] - (x - r["cov"])

    def keep_chain(inst: dict, r: dict) -> None:
        """After a (re)prefill: share or create the request's chain segments."""
        if inst["cache"] is None:
            return
        for key, tok in r["chain"][len(r["pins"]):]:
            parent = r["pins"][-1] if r["pins"] else None
            n = inst["cache"].get(key)
            if n is not None and n["parent"] is parent:
                pin(n)
            elif n is not None:
                break
            elif room(inst, blocks(tok) + private(r, r["cov"] + tok) - r["alloc"]):
                n = new_node(inst, key, tok, parent)
            else:
                break
            mine = private(r, r["cov"] + tok)
            inst["used"] += mine - r["alloc"]
            r["alloc"] = mine
            r["pins"].append(n)
            r["cov"] += tok

    def free(inst: dict, r: dict) -> None:
        inst["used"] -= r["alloc"]
        r["alloc"] = 0
        unpin(r["pins"])
        r["pins"], r["cov"] = [], 0

    pre = [instance(i, "prefill", prefill_pool) for i in range(n_prefill)]
    insts = [instance(n_prefill + i, "decode" if disagg else "colocated", pool) for i in range(instances)]

    def by_arrival(rows: list) -> None:
        rows.sort(key=lambda r: (r["arr"], r["rid"]))

    def settle(r: dict) -> None:
        r["fin"] = env.now
        totals["settled"] += 1
        if r["succ"] >= 0:
            nxt = reqs[r["succ"]]
            env.timeout(nxt["think"]).callbacks.append(lambda _, nxt=nxt: release(nxt))
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
        h, nodes = hits(inst, r, r["t"])
        need = blocks(r["t"] - h) if inst["role"] == "prefill" else first_need(r, h)
        for n in nodes:
            pin(n)
        if not room(inst, need + inst["wm"]):
            unpin(nodes)
            return None
        inst["q"].pop(0)
        inst["used"] += need
        r.update(alloc=need, done=h, base=r["out"], pins=list(nodes), cov=h)
        if math.isnan(r["ps"]):
            r["ps"] = env.now
            totals["prompt"] += r["p"]
            totals["hits"] += h
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
        if swap and v["done"] >= v["t"]:
            inst["used"] -= v["alloc"]
            host_time(inst, v["alloc"])
            v["swapped"], v["alloc"] = v["alloc"], 0
            inst["sw"].append(v)
            by_arrival(inst["sw"])
        else:
            free(inst, v)
            v.update(t=v["p"] + v["out"], done=0)
            inst["q"].insert(0, v)

    def grow(inst: dict) -> None:
        if kv_policy != "paged":
            return
        i = 0
        while i < len(inst["run"]):
            r = inst["run"][i]
            want = blocks(r["p"] + r["out"] - r["cov"])
            if r["done"] < r["t"] or want <= r["alloc"]:
                i += 1
                continue
            while True:
                if room(inst, want - r["alloc"]):
                    inst["used"] += want - r["alloc"]
                    r["alloc"] = want
                    i += 1
                    break
                victim = inst["run"][-1]
                kick_out(inst, victim)
                if victim is r:
                    break

    def prompt_done(inst: dict, r: dict) -> None:
        keep_chain(inst, r)
        token(inst, r)

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
            cache = inst["cache"]
            if cache is not None and r["emit"] is not None and len(r["pins"]) == len(r["chain"]):
                n = r["p"] - r["cov"] + r["o"]
                if r["emit"] not in cache and room(inst, blocks(n) - r["alloc"]):
                    r["pins"].append(new_node(inst, r["emit"], n, r["pins"][-1] if r["pins"] else None))
            free(inst, r)
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
        unpin(r["held_pins"])
        r["held_pins"] = []
        kick(src)
        dec["flying"] -= 1
        dec["landed"].append(r)
        kick(dec)

    def prefilled(inst: dict, r: dict) -> None:
        """Prefill pool: first token out, then the hand-off to the least loaded decode instance."""
        keep_chain(inst, r)
        r["ft"] = r["last"] = env.now
        r["out"] = 1
        inst["run"].remove(r)
        if r["o"] <= 1:
            free(inst, r)
            settle(r)
            return
        r["held"], r["held_pins"] = r["alloc"], r["pins"]
        r["alloc"], r["pins"], r["cov"] = 0, [], 0
        dec = min(insts, key=load)
        dec["inbox"].append(r)
        pull(dec)

    def fill_chunks(inst: dict, n: int, max_rows: float) -> list:
        """Sarathi-Serve: prompt chunks of the rows still prefilling, then of new admissions,
        until the step holds ``budget`` tokens (``n`` already taken by decode rows)."""
        chunks = []
        for r in list(inst["run"]):
            if r["done"] < r["t"] and n < budget:
                c = min(r["t"] - r["done"], budget - n)
                n += c
                chunks.append((r, c))
        while inst["q"] and n < budget and len(inst["run"]) < max_rows and not inst["sw"]:
            r = admit(inst)
            if r is None:
                break
            c = min(r["t"] - r["done"], budget - n)
            n += c
            chunks.append((r, c))
        return chunks

    def whole_prompts(inst: dict, max_rows: float) -> list:
        """Prompts from the queue head while their uncached tokens fit the budget (the first
        always goes)."""
        batch, tokens = [], 0
        while inst["q"] and len(inst["run"]) < max_rows and not inst["sw"]:
            head = inst["q"][0]
            t = head["t"] or head["p"]
            if batch and tokens + t - hits(inst, head, t)[0] > budget:
                break
            if admit(inst) is None:
                break
            batch.append(head)
            tokens += head["t"] - head["done"]
        return batch

    def prefill_loop(inst: dict):
        while True:
            if policy == "chunked":
                chunks = fill_chunks(inst, 0, math.inf)
            else:
                chunks = [(r, r["t"] - r["done"]) for r in whole_prompts(inst, math.inf)]
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
                if not room(inst, r["swapped"]):
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
                chunks = fill_chunks(inst, len(dec), MAX_ROWS)
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
                        prompt_done(inst, r)
                continue
            batch = [] if policy == "decode-priority" and inst["run"] else whole_prompts(inst, MAX_ROWS)
            if batch:
                yield step(inst, [], [(r, r["t"] - r["done"]) for r in batch])
                for r in batch:
                    r["done"] = r["t"]
                    prompt_done(inst, r)
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

    def release(r: dict) -> None:
        """A later turn arrives when its think time after the previous turn's finish is over."""
        r["arr"] = env.now
        arrive(r)

    def arrive(r: dict) -> None:
        if whole(r) > cap or (disagg and blocks(r["p"]) > pre[0]["cap"]):
            while True:  # the session's later turns go with it
                totals["settled"] += 1
                r["rejected"] = True
                if r["succ"] < 0:
                    break
                r = reqs[r["succ"]]
            if totals["settled"] == len(reqs):
                finished.succeed()
            return
        if disagg:
            inst = min(pre, key=lambda x: sum(q["p"] for q in x["q"]))
            r["src"] = inst["i"]
        else:
            inst = min(insts, key=load)
        inst["q"].append(r)
        kick(inst)

    def arrivals():
        for r in reqs:
            if ss is not None and ss.predecessor[r["rid"]] >= 0:
                continue  # released by its predecessor's finish
            yield env.timeout(max(0, r["arr"] - env.now))
            arrive(r)

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
    caches = [i for i in (pre or insts) if i["cache"] is not None]
    return dict(reqs=reqs, preemptions=totals["preemptions"], recompute=totals["recompute"],
                computed=totals["computed"], swap_s=swap_s, horizon=env.now, prompt=totals["prompt"],
                hits=totals["hits"], evicted=sum(i["evicted"] for i in caches),
                cached=sum(n["tok"] for i in caches for n in i["cache"].values()))
