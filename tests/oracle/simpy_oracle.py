"""A deliberately simple SimPy oracle of the reference simulator (reference-semantics §6).

Written straight from the spec, independently of kvcargo's engine: one SimPy process per prefill
instance, per decode (or colocated) instance, per request transfer and one for the arrivals; a
SimPy ``Resource`` with ``channels`` slots is the single cluster-wide KV link; every queue is a
FIFO list and an idle instance sleeps on an event that the next submit triggers. Only the step
costs come from kvcargo (:mod:`kvcargo.cost`, :mod:`kvcargo.handoff`), which are tested elsewhere.
It is slow and plain on purpose: its value is being obviously right.

With ``levers`` it also follows the companion's parallel layouts and speculative decoding
(levers-parallel §2, §6): a layout's slot pricing comes from :mod:`kvcargo.parallel`, while the
verify pass's FLOPs, the draft passes' order and the mulberry32 acceptance draws are written out
here again from the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from kvcargo.catalog import Link, Model
from kvcargo.cost import (
    HF_OVERHEAD,
    Pool,
    decode_parts,
    elementwise_pass,
    kv_capacity,
    model_coefficients,
    prefill_parts,
    roofline,
    shape,
)
from kvcargo.handoff import Compression, endpoint_work, transfers
from kvcargo.levers import Levers
from kvcargo.parallel import layout_coefficients, parallel_step, stage_coefficients
from kvcargo.workload import Workload

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
    hf: np.ndarray
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
    lf: np.ndarray | None = None
    """With a parallel layout: its coefficients and the stage device's (``hs``)."""
    hs: np.ndarray | None = None
    hd: np.ndarray | None = None
    """With a speculative draft: its roofline coefficients (the pool's devices, no overhead)."""

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


class _Sim:
    """The whole cluster: builds the processes in the reference's creation order and runs."""

    def __init__(self, wl: Workload, model: Model, prefill_pool: Pool, decode_pool: Pool, n_prefill: int,
                 n_decode: int, link: Link, channels: int, compression: Compression | None, mode: str,
                 n_colocated: int | None, lm_head: str, token_budget: int, max_batch: int,
                 levers: Levers | None = None) -> None:
        self.env = env = simpy.Environment()
        self.model = model
        self.mi, self.mf = model_coefficients(model, lm_head)
        self.draft = levers.draft if levers is not None else None
        self.rng: dict[int, int] = {}  # per request: its acceptance stream's state
        if self.draft is not None:
            self.mid, self.mfd = model_coefficients(self.draft.model, lm_head)
        self.budget, self.max_batch, self.mode = token_budget, max_batch, mode
        self.reqs = [_Req(i, float(a), int(p), int(o))
                     for i, (a, p, o) in enumerate(zip(wl.arrival, wl.prompt, wl.output))]
        kv_tok = shape(model).kv_per_token
        kv_tok += self.draft.kv_per_token if self.draft is not None else 0  # the draft's prompt KV too
        handoff = np.array([r.prompt * kv_tok for r in self.reqs], dtype=np.float64)
        if compression is not None and compression.at == "endpoint" and compression.ratio == 1.0 \
                and compression.codec.ops_per_value == 0 and not compression.codec.fft:
            compression = None  # "none" at the endpoint does nothing (§5)
        self.compression = compression
        self.xfer = transfers(link, compression, handoff, model.kv_bytes)
        if compression is not None and compression.at == "endpoint":
            self.ep_ops, self.ep_bytes = endpoint_work(compression, handoff, wl.prompt, model.kv_bytes)
        self.completed = self.rejected = 0
        self.done = env.event()
        self.link_busy = self.link_j = self.transit_j = 0.0
        self.n_transfers = 0

        def inst(pool: Pool, role: str = "decode") -> _Instance:
            if levers is None:
                return _Instance(env, pool.coefficients(), kv_capacity(model, pool))
            pl = levers.prefill if role == "prefill" else levers.decode
            i = _Instance(env, pool.coefficients(), pl.kv_capacity)
            if pl.layout is not None:
                i.lf = layout_coefficients(pl.layout, model, pl.scale_up)
                i.hs = stage_coefficients(pool, pl.layout.tp)
            if self.draft is not None:
                i.hd = pool.coefficients().copy()
                i.hd[HF_OVERHEAD] = 0.0
            return i

        if mode == "disagg":
            self.prefill = [inst(prefill_pool, "prefill") for _ in range(n_prefill)]
            self.decode = [inst(decode_pool) for _ in range(n_decode)]
            for p in self.prefill:
                env.process(self.prefill_loop(p))
            for d in self.decode:
                env.process(self.decode_loop(d))
            self.instances = self.prefill + self.decode
            self.admit_cap = self.decode[0].kv_cap
            self.link = simpy.Resource(env, capacity=channels)
        elif mode == "colocated":
            n = n_colocated if n_colocated is not None else n_prefill + n_decode
            self.instances = [inst(prefill_pool) for _ in range(n)]
            for c in self.instances:
                env.process(self.colocated_loop(c))
            self.admit_cap = self.instances[0].kv_cap
        else:
            raise ValueError(f"unknown mode {mode!r}")
        env.process(self.arrivals())

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
        tokens = sum(r.prompt for r in batch)
        quad = sum(r.prompt * (r.prompt + 1) for r in batch)
        flops, w, o = prefill_parts(self.mi, self.mf, tokens, quad, len(batch))
        t, flops, nbytes, e_c, e_m = self.forward(inst, int(flops), w, o, tokens)
        if self.draft is not None:  # the draft prefills the same prompts after the target
            f_d, w_d, o_d = prefill_parts(self.mid, self.mfd, tokens, quad, len(batch))
            t_d, c_d, m_d = roofline(inst.hd, f_d, w_d + o_d)
            t, flops, nbytes, e_c, e_m = t + t_d, flops + int(f_d), nbytes + (w_d + o_d), e_c + c_d, e_m + m_d
        comp = self.compression
        senders = [r for r in batch if r.output > 1]
        if self.mode == "disagg" and comp is not None and comp.at == "endpoint" and senders:
            ops = sum(float(self.ep_ops[r.i]) for r in senders)
            eb = sum(float(self.ep_bytes[r.i]) for r in senders)
            extra, x_c, x_m = elementwise_pass(inst.hf, ops, eb)
            t, flops, nbytes, e_c, e_m = t + extra, flops + ops, nbytes + eb, e_c + x_c, e_m + x_m
        inst.charge(t, flops, nbytes, e_c, e_m)
        return t

    def decode_step(self, inst: _Instance) -> Generator[simpy.Event, Any, None]:
        """One continuous-batching decode step over every running sequence (§6.2.4)."""
        env = self.env
        ctx = sum(r.prompt + r.tokens_out for r in inst.running)
        b = len(inst.running)
        if self.draft is None:
            flops, w, o = decode_parts(self.mi, self.mf, b, ctx)
            t, flops, nbytes, e_c, e_m = self.forward(inst, int(flops), w, o, b)
        else:
            t, flops, nbytes, e_c, e_m = self.speculative_step(inst, b, ctx)
        inst.charge(t, flops, nbytes, e_c, e_m)
        yield env.timeout(t)
        still = []
        for r in inst.running:
            gained = 1 if self.draft is None else self.accepted_plus_one(r)
            r.itls += [env.now - r.last_token] + [0.0] * (gained - 1)
            r.tokens_out += gained
            r.last_token = env.now
            if r.tokens_out >= r.output:
                inst.kv_used -= r.prompt + r.output
                self.finish(r)
            else:
                still.append(r)
        inst.running = still

    def forward(self, inst: _Instance, flops: int, w: float, o: float, tokens: int) -> tuple:
        """(time, FLOPs, bytes, compute J, memory J) of one target pass: the roofline on the
        instance, or with a layout the GPipe slots and their communication (levers-parallel §2.2)."""
        if inst.lf is None:
            t, e_c, e_m = roofline(inst.hf, flops, w + o)
            return t, flops, w + o, e_c, e_m
        t, e_c, e_m, nbytes, _, _ = parallel_step(inst.hs, inst.lf, flops, w, o, tokens)
        return t, flops, nbytes, e_c, e_m

    def speculative_step(self, inst: _Instance, b: int, ctx: int) -> tuple:
        """A verify pass of γ + 1 tokens per row (the causal FLOPs written out here), then γ
        draft decode passes over growing contexts (levers-parallel §6.3)."""
        m, g = self.model, self.draft.gamma
        c = g + 1
        p_mm = model_coefficients(m)[0][0] // 2
        flops = 2 * p_mm * b * c + 2 * m.layers * m.d_model * c * (2 * ctx + b * (c + 1))
        _, w, _ = decode_parts(self.mi, self.mf, b * c, 0)
        o = (ctx + b * c) * float(shape(m).kv_per_token)
        t, flops, nbytes, e_c, e_m = self.forward(inst, flops, w, o, b * c)
        for j in range(g):
            f_d, w_d, o_d = decode_parts(self.mid, self.mfd, b, ctx + j * b)
            t_d, c_d, m_d = roofline(inst.hd, f_d, w_d + o_d)
            t, flops, nbytes, e_c, e_m = t + t_d, flops + int(f_d), nbytes + (w_d + o_d), e_c + c_d, e_m + m_d
        return t, flops, nbytes, e_c, e_m

    def accepted_plus_one(self, r: _Req) -> int:
        """Tokens a row gains: its own mulberry32 stream (seeded at its first verify pass) draws
        until a rejection or γ acceptances; plus the target's token, capped at what is left."""
        d = self.draft
        if r.i not in self.rng:
            self.rng[r.i] = (d.seed + r.i * 2654435761) % 2**32
        k = 0
        while k < d.gamma:
            a = (self.rng[r.i] + 0x6D2B79F5) % 2**32
            self.rng[r.i] = a
            t = ((a ^ (a >> 15)) * (a | 1)) % 2**32
            t = ((t + ((t ^ (t >> 7)) * (t | 61)) % 2**32) % 2**32) ^ t
            if ((t ^ (t >> 14)) % 2**32) / 2**32 >= d.alpha:
                break
            k += 1
        return min(k + 1, r.output - r.tokens_out)

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
        duration = float(self.xfer.duration[r.i])
        with self.link.request() as req:  # FCFS over the channels
            yield req
            r.kv_start = env.now
            self.n_transfers += 1  # link totals accumulate in service order
            self.link_busy += duration
            self.link_j += float(self.xfer.link_j[r.i])
            self.transit_j += float(self.xfer.transit_j[r.i])
            yield env.timeout(duration)
        r.kv_ready = env.now
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
            n_transfers=self.n_transfers,
        )


def _least(instances: list[_Instance], load: Any) -> _Instance:
    """The instance with the smallest load; ties go to the lowest index."""
    return min(instances, key=load)  # min() keeps the first of equal keys


def run_oracle(workload: Workload, *, model: Model, prefill_pool: Pool, decode_pool: Pool, n_prefill: int = 1,
               n_decode: int = 1, link: Link, channels: int = 1, compression: Compression | None = None,
               mode: str = "disagg", n_colocated: int | None = None, lm_head: str = "all",
               token_budget: int = 8192, max_batch: int = 256, levers: Levers | None = None) -> OracleResult:
    """Simulate ``workload`` on the cluster with the reference's event semantics (§6).

    ``mode="colocated"`` runs ``n_colocated`` (default ``n_prefill + n_decode``) instances of
    ``prefill_pool`` that do both phases; the link and ``compression`` are then unused.
    """
    if mode == "colocated":
        compression = None
    return _Sim(workload, model, prefill_pool, decode_pool, n_prefill, n_decode, link, channels, compression,
                mode, n_colocated, lm_head, token_budget, max_batch, levers).run()
