"""A deliberately simple SimPy oracle of the reference simulator (reference-semantics §6).

Written straight from the spec, independently of kvcargo's engine: one SimPy process per prefill
instance, per decode (or colocated) instance, per request transfer and one for the arrivals; a
SimPy ``Resource`` with ``channels`` slots is the single cluster-wide KV link; every queue is a
FIFO list and an idle instance sleeps on an event that the next submit triggers. Step costs,
hand-offs and the summary are restated from the spec too (:mod:`oracle.costs`,
:mod:`oracle.handoff`, :mod:`oracle.summary`): nothing of kvcargo's is used but the catalog
entries and the configuration objects' fields (pool device, devices, cap, DVFS; codec, placement,
keep). It is slow and plain on purpose: its value is being obviously right.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from . import costs, handoff
from . import levers as lever_costs

NAN = float("nan")


@dataclass
class OracleResult:
    """Per-request stamps (NaN where a stage does not apply or the request was rejected) and
    per-instance / link totals of one run."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prefill_start: np.ndarray
    first_token: np.ndarray
    kv_start: np.ndarray
    kv_ready: np.ndarray
    decode_start: np.ndarray
    finish: np.ndarray
    rejected: np.ndarray
    itls: list[list[float]]
    horizon: float
    busy_s: list[float]
    """Per instance (prefill instances then decode, or the colocated ones), summed in step order."""
    flops: list[float]
    """FLOPs per instance (exact ints unless endpoint-compression ops were added)."""
    bytes: list[float]
    compute_j: list[float]
    memory_j: list[float]
    link_busy_s: float = 0.0
    link_j: float = 0.0
    transit_j: float = 0.0
    n_transfers: int = 0
    requests: list[_Req] = field(default_factory=list)
    instances: list[_Instance] = field(default_factory=list)
    wire_bytes: list[float] = field(default_factory=list)
    transit_bound: list[bool] = field(default_factory=list)
    channels: int = 1
    colocated: bool = False


@dataclass(frozen=True)
class PoolSpec:
    """The hardware of one instance, as the oracle reads it (kvcargo's ``Pool`` has these fields)."""

    device: Any
    """A catalog device entry."""
    n: int = 1
    power_cap_w: float | None = None
    dvfs: bool = False
    precision: str = "bf16"


@dataclass(frozen=True)
class CompressionSpec:
    """A hand-off codec and its placement (kvcargo's ``Compression`` has these fields)."""

    codec: Any
    """A catalog codec entry."""
    at: str = "transit"
    keep: float | None = None


@dataclass(slots=True, eq=False)
class _Req:
    """One request's mutable state and stamps (NaN until stamped)."""

    i: int
    arrival: float
    prompt: int
    output: int
    prefill_start: float = NAN
    first_token: float = NAN
    kv_start: float = NAN
    kv_ready: float = NAN
    decode_start: float = NAN
    finish: float = NAN
    last_token: float = NAN
    tokens_out: int = 0
    rejected: bool = False
    itls: list[float] = field(default_factory=list)


@dataclass
class _Instance:
    """One instance: a FIFO queue, the running decode batch, its KV reservation and totals."""

    env: simpy.Environment
    name: str
    device: str
    n: int
    die_mm2: float | None
    cost: costs.Instance
    kv_cap: int
    queue: list[_Req] = field(default_factory=list)
    running: list[_Req] = field(default_factory=list)
    kv_used: int = 0
    wake: simpy.Event | None = None
    busy: float = 0.0
    flops: float = 0  # a Python int unless an endpoint pass adds float ops
    nbytes: float = 0.0
    compute_j: float = 0.0
    memory_j: float = 0.0
    steps: int = 0
    served: int = 0
    """Requests prefilled."""
    batches: list[int] = field(default_factory=list)
    """Batch size of every decode step."""
    layout: lever_costs.Layout | None = None
    """With the companion's levers: the instance's parallel layout and the draft's device."""
    draft_cost: costs.Instance | None = None

    def submit(self, req: _Req) -> None:
        """Append to the queue and wake the instance if it sleeps."""
        self.queue.append(req)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def sleep(self) -> Generator[simpy.Event, Any, None]:
        """Wait until the next submit."""
        self.wake = self.env.event()
        yield self.wake
        self.wake = None

    def charge(self, t: float, flops: float, nbytes: float, e_c: float, e_m: float) -> None:
        self.busy += t
        self.flops += flops
        self.nbytes += nbytes
        self.compute_j += e_c
        self.memory_j += e_m
        self.steps += 1


class _Sim:
    """The whole cluster: builds the processes in the reference's creation order and runs."""

    def __init__(self, wl: Any, model: Any, prefill_pool: Any, decode_pool: Any, n_prefill: int,
                 n_decode: int, link: Any, channels: int, compression: Any, mode: str,
                 n_colocated: int | None, lm_head: str, token_budget: int, max_batch: int,
                 levers: Any = None) -> None:
        self.env = env = simpy.Environment()
        self.shape = shape = costs.shape(model)
        self.model, self.levers = model, levers
        self.draft = levers.draft if levers is not None else None
        self.rng: dict[int, int] = {}  # per request: its acceptance stream's state (§6.4)
        handoff_tok = shape.kv_tok + (lever_costs.kv_tok(self.draft.model) if self.draft else 0)
        self.lm_head, self.channels = lm_head, channels
        self.budget, self.max_batch, self.mode = token_budget, max_batch, mode
        self.reqs = [_Req(i, float(a), int(p), int(o))
                     for i, (a, p, o) in enumerate(zip(wl.arrival, wl.prompt, wl.output))]
        codec = None if compression is None else handoff.codec(compression.codec, compression.at, compression.keep)
        if codec is not None and codec.at == "endpoint" and codec.is_identity:
            codec = None  # "none" at the endpoint does nothing (§5)
        self.codec = codec
        self.xfer = [handoff.transfer(link, codec, r.prompt * handoff_tok, model.kv_bytes) for r in self.reqs]
        if codec is not None and codec.at == "endpoint":
            self.ep_work = [handoff.endpoint_work(codec, r.prompt * shape.kv_tok, r.prompt, model.kv_bytes)
                            for r in self.reqs]
        self.completed = self.rejected = 0
        self.done = env.event()
        self.link_busy = self.link_j = self.transit_j = 0.0
        self.n_transfers = 0

        if compression is not None and compression.codec.kind != "fixed":
            raise ValueError("the oracle knows the reference's fixed-ratio codecs only")

        def inst(name: str, pool: Any) -> _Instance:
            if levers is not None:
                return self.lever_instance(name, pool)
            if pool.precision != "bf16":
                raise ValueError("the oracle knows the reference's BF16 compute only")
            d = pool.device
            c = costs.instance(d, pool.n, pool.power_cap_w, pool.dvfs)
            return _Instance(env, name, d.key, pool.n, d.die_mm2, c, costs.kv_capacity(shape, c))

        if mode == "disagg":
            self.prefill = [inst(f"prefill-{i}", prefill_pool) for i in range(n_prefill)]
            self.decode = [inst(f"decode-{i}", decode_pool) for i in range(n_decode)]
            for p in self.prefill:
                env.process(self.prefill_loop(p))
            for d in self.decode:
                env.process(self.decode_loop(d))
            self.instances = self.prefill + self.decode
            self.admit_cap = self.decode[0].kv_cap
            self.link = simpy.Resource(env, capacity=channels)
        elif mode == "colocated":
            n = n_colocated if n_colocated is not None else n_prefill + n_decode
            self.instances = [inst(f"colocated-{i}", prefill_pool) for i in range(n)]
            for c in self.instances:
                env.process(self.colocated_loop(c))
            self.admit_cap = self.instances[0].kv_cap
        else:
            raise ValueError(f"unknown mode {mode!r}")
        env.process(self.arrivals())

    def lever_instance(self, name: str, pool: Any) -> _Instance:
        """An instance under the companion's levers: compute at the format's native rate, the
        pool's layout (a stage of tp GPUs, the scale-up link), the draft's device; the capacity
        is the resolved one (its check values are pinned in the lever tests)."""
        d = pool.device
        speedup = 1.0 if pool.precision == "bf16" else d.lowp_speedup[pool.precision]
        pl = self.levers.prefill if name.startswith("prefill") else self.levers.decode
        c = costs.instance(d, pool.n, pool.power_cap_w, pool.dvfs, speedup)
        i = _Instance(self.env, name, d.key, pool.n, d.die_mm2, c, pl.kv_capacity)
        lay = pl.layout
        if lay is not None:
            i.layout = lever_costs.Layout(lay.tp, lay.pp, lay.ep, lay.microbatches, lay.imbalance,
                                          costs.instance(d, lay.tp, pool.power_cap_w, pool.dvfs, speedup),
                                          pl.scale_up.bandwidth, pl.scale_up.latency, pl.scale_up.pj_per_bit)
        if self.draft is not None:
            i.draft_cost = c
        return i

    def lever_step(self, inst: _Instance, prompts: list[int] | None) -> tuple[float, float, float, float, float]:
        """A step under the levers (levers-parallel §2.2, §6.3): prefill of ``prompts`` or a decode
        (verify) step over the running rows, then the draft's passes, added left to right."""
        m, draft = self.model, self.draft
        if prompts is not None:
            flops, w, o, tokens = lever_costs.prefill_parts(m, prompts, self.lm_head)
        else:
            b = len(inst.running)
            ctx = sum(r.prompt + r.tokens_out for r in inst.running)
            parts = lever_costs.decode_parts(m, b, ctx) if draft is None else lever_costs.verify_parts(
                m, b, ctx, draft.gamma)
            flops, w, o, tokens = parts
        t, nbytes, e_c, e_m = lever_costs.forward(m, inst.cost, inst.layout, flops, w, o, tokens)
        if draft is not None:
            if prompts is not None:
                passes = [lever_costs.prefill_parts(draft.model, prompts, self.lm_head)]
            else:
                passes = [lever_costs.decode_parts(draft.model, b, ctx + j * b) for j in range(draft.gamma)]
            for f_d, w_d, o_d, _ in passes:
                t_d, c_d, m_d = costs.step(inst.draft_cost, f_d, w_d + o_d, overhead=0.0)
                t, flops, nbytes, e_c, e_m = t + t_d, flops + f_d, nbytes + (w_d + o_d), e_c + c_d, e_m + m_d
        return t, flops, nbytes, e_c, e_m

    def gained(self, r: _Req) -> int:
        """Tokens a row gains in a verify pass: draws until a rejection or γ acceptances, plus the
        target's own token, capped at what is left (§6.4)."""
        d = self.draft
        if d is None:
            return 1
        state = self.rng.setdefault(r.i, (d.seed + r.i * 2654435761) % 2**32)
        k = 0
        while k < d.gamma:
            state, u = lever_costs.mulberry32(state)
            if u >= d.alpha:
                break
            k += 1
        self.rng[r.i] = state
        return min(k + 1, r.output - r.tokens_out)

    # ------------------------------------------------------------------------------ events
    def arrivals(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        for r in self.reqs:
            yield env.timeout(max(0, r.arrival - env.now))
            if r.prompt + r.output > self.admit_cap:
                r.rejected = True
                self.rejected += 1
                self.check_done()
            elif self.mode == "disagg":
                _least(self.prefill, lambda p: sum(q.prompt for q in p.queue)).submit(r)
            else:
                _least(self.instances, lambda c: len(c.queue) + len(c.running)).submit(r)

    def check_done(self) -> None:
        if self.completed + self.rejected == len(self.reqs) and not self.done.triggered:
            self.done.succeed()

    def finish(self, r: _Req) -> None:
        r.finish = self.env.now
        self.completed += 1
        self.check_done()

    def prefill_step(self, inst: _Instance, batch: list[_Req]) -> float:
        """Charge one prefill step and return its duration (§6.2.2).

        With endpoint compression the extra elementwise pass over the KV of every batch member
        that will be sent (output > 1) is appended to the step: one timeout of ``t + extra``, and
        the pass's FLOPs/bytes/energies are folded into the step's before accumulating (the
        reference's J/token for the fp8-endpoint run is reproduced only in this order).
        """
        if self.levers is not None:
            t, flops, nbytes, e_c, e_m = self.lever_step(inst, [r.prompt for r in batch])
        else:
            flops, nbytes = costs.prefill_work(self.shape, [r.prompt for r in batch], self.lm_head)
            t, e_c, e_m = costs.step(inst.cost, flops, nbytes)
        c = self.codec
        senders = [r for r in batch if r.output > 1]
        if self.mode == "disagg" and c is not None and c.at == "endpoint" and senders:
            ops = eb = 0.0
            for r in senders:
                ops += self.ep_work[r.i][0]
                eb += self.ep_work[r.i][1]
            extra, x_c, x_m = costs.elementwise_pass(inst.cost, ops, eb)
            t, flops, nbytes, e_c, e_m = t + extra, flops + ops, nbytes + eb, e_c + x_c, e_m + x_m
        inst.charge(t, flops, nbytes, e_c, e_m)
        inst.served += len(batch)
        return t

    def decode_step(self, inst: _Instance) -> Generator[simpy.Event, Any, None]:
        """One continuous-batching decode step over every running sequence (§6.2.4)."""
        env = self.env
        if self.levers is not None:
            t, flops, nbytes, e_c, e_m = self.lever_step(inst, None)
        else:
            ctx = sum(r.prompt + r.tokens_out for r in inst.running)
            flops, nbytes = costs.decode_work(self.shape, len(inst.running), ctx)
            t, e_c, e_m = costs.step(inst.cost, flops, nbytes)
        inst.charge(t, flops, nbytes, e_c, e_m)
        inst.batches.append(len(inst.running))
        yield env.timeout(t)
        still = []
        for r in inst.running:
            n = self.gained(r)  # tokens of one verify pass arrive together: one gap, then zeros
            r.itls += [env.now - r.last_token] + [0.0] * (n - 1)
            r.tokens_out += n
            r.last_token = env.now
            if r.tokens_out >= r.output:
                inst.kv_used -= r.prompt + r.output
                self.finish(r)
            else:
                still.append(r)
        inst.running = still

    def prefill_loop(self, inst: _Instance) -> Generator[simpy.Event, Any, None]:
        while True:
            if not inst.queue:
                yield from inst.sleep()
                continue
            batch: list[_Req] = []
            tokens = 0
            while inst.queue and (not batch or tokens + inst.queue[0].prompt <= self.budget):
                r = inst.queue.pop(0)
                batch.append(r)
                tokens += r.prompt
            yield from self.run_prefill(inst, batch, self.hand_off)

    def run_prefill(self, inst: _Instance, batch: list[_Req],
                    then: Callable[[_Req], None]) -> Generator[simpy.Event, Any, None]:
        """One prefill batch: every request gets its first token at the end of the step."""
        env = self.env
        for r in batch:
            r.prefill_start = env.now
        yield env.timeout(self.prefill_step(inst, batch))
        for r in batch:
            r.first_token = r.last_token = env.now
            r.tokens_out = 1
            then(r)

    def hand_off(self, r: _Req) -> None:
        """Disaggregated: a finished request leaves, every other one starts its KV transfer."""
        if r.output <= 1:
            self.finish(r)
        else:
            self.env.process(self.transfer(r))

    def transfer(self, r: _Req) -> Generator[simpy.Event, Any, None]:
        env = self.env
        x = self.xfer[r.i]
        duration = x.duration
        with self.link.request() as req:  # FCFS over the channels
            yield req
            r.kv_start = env.now
            self.n_transfers += 1
            yield env.timeout(duration)
        r.kv_ready = env.now
        # link totals accumulate as transfers complete (with several channels that is not the
        # order they started in; the companion's random run r24 tells the two apart)
        self.link_busy += duration
        self.link_j += x.link_j
        self.transit_j += x.transit_j
        _least(self.decode, lambda d: len(d.queue) + len(d.running)).submit(r)

    def decode_loop(self, inst: _Instance) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            while (inst.queue and len(inst.running) < self.max_batch
                   and inst.kv_used + inst.queue[0].prompt + inst.queue[0].output <= inst.kv_cap):
                r = inst.queue.pop(0)
                inst.kv_used += r.prompt + r.output
                r.decode_start = env.now
                inst.running.append(r)
            if not inst.running:
                yield from inst.sleep()
                continue
            yield from self.decode_step(inst)

    def colocated_loop(self, inst: _Instance) -> Generator[simpy.Event, Any, None]:
        """Prefill priority (vLLM v0): a prefill batch whenever one can be admitted, else decode."""
        while True:
            batch: list[_Req] = []
            tokens = 0
            while inst.queue:
                r = inst.queue[0]
                if len(inst.running) + len(batch) >= self.max_batch \
                        or (batch and tokens + r.prompt > self.budget) \
                        or inst.kv_used + r.prompt + r.output > inst.kv_cap:
                    break
                inst.queue.pop(0)
                inst.kv_used += r.prompt + r.output
                batch.append(r)
                tokens += r.prompt
            if batch:
                yield from self.run_prefill(inst, batch, lambda r, inst=inst: self.keep_decoding(inst, r))
            elif inst.running:
                yield from self.decode_step(inst)
            else:
                yield from inst.sleep()

    def keep_decoding(self, inst: _Instance, r: _Req) -> None:
        """Colocated: a prefilled request stays on its instance and joins the decode batch."""
        if r.output <= 1:
            inst.kv_used -= r.prompt + r.output
            self.finish(r)
        else:
            r.decode_start = self.env.now
            inst.running.append(r)

    # ------------------------------------------------------------------------------ result
    def run(self) -> OracleResult:
        self.env.run(until=self.done)
        col = lambda name: np.array([getattr(r, name) for r in self.reqs], dtype=np.float64)
        finish = col("finish")
        done = finish[~np.isnan(finish)]
        return OracleResult(
            arrival=col("arrival"), prompt=col("prompt"), output=col("output"),
            prefill_start=col("prefill_start"), first_token=col("first_token"), kv_start=col("kv_start"),
            kv_ready=col("kv_ready"), decode_start=col("decode_start"), finish=finish,
            rejected=np.array([r.rejected for r in self.reqs], dtype=bool),
            itls=[r.itls for r in self.reqs],
            horizon=float(done.max()) if len(done) else 0.0,
            busy_s=[i.busy for i in self.instances], flops=[i.flops for i in self.instances],
            bytes=[i.nbytes for i in self.instances], compute_j=[i.compute_j for i in self.instances],
            memory_j=[i.memory_j for i in self.instances],
            link_busy_s=self.link_busy, link_j=self.link_j, transit_j=self.transit_j,
            n_transfers=self.n_transfers, requests=self.reqs, instances=self.instances,
            wire_bytes=[x.wire_bytes for x in self.xfer], transit_bound=[x.transit_bound for x in self.xfer],
            channels=self.channels, colocated=self.mode == "colocated",
        )


def _least(instances: list[_Instance], load: Any) -> _Instance:
    """The instance with the smallest load; ties go to the lowest index."""
    return min(instances, key=load)  # min() keeps the first of equal keys


def run_oracle(workload: Any, *, model: Any, prefill_pool: Any, decode_pool: Any, n_prefill: int = 1,
               n_decode: int = 1, link: Any, channels: int = 1, compression: Any = None,
               mode: str = "disagg", n_colocated: int | None = None, lm_head: str = "all",
               token_budget: int = 8192, max_batch: int = 256, levers: Any = None) -> OracleResult:
    """Simulate ``workload`` on the cluster with the reference's event semantics (§6).

    ``mode="colocated"`` runs ``n_colocated`` (default ``n_prefill + n_decode``) instances of
    ``prefill_pool`` that do both phases; the link and ``compression`` are then unused.

    ``workload`` needs ``arrival``, ``prompt``, ``output``; a pool ``device`` (catalog entry),
    ``n``, ``power_cap_w``, ``dvfs``; ``compression`` a catalog ``codec``, ``at`` and ``keep``.
    """
    if mode == "colocated":
        compression = None
    return _Sim(workload, model, prefill_pool, decode_pool, n_prefill, n_decode, link, channels, compression,
                mode, n_colocated, lm_head, token_budget, max_batch, levers).run()


def run_resolved(res: Any) -> OracleResult:
    """The oracle on a resolved kvcargo configuration (``kvcargo.config.Resolved``): only its
    fields are read — workload, model, pools, link, channels, codec and the counts."""
    c = res.config
    return run_oracle(res.workload, model=res.model, prefill_pool=res.prefill_pool, decode_pool=res.decode_pool,
                      n_prefill=c.prefill, n_decode=c.decode, link=res.link, channels=res.channels,
                      compression=res.compression, mode=c.mode, n_colocated=c.colocated_instances,
                      lm_head=c.lm_head, token_budget=c.token_budget, max_batch=c.max_batch)
