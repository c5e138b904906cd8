"""The scheduled engine: the companion's serving levers, as SimPy processes (levers-serving spec).

Runs with a serving lever and no prefix cache go through the array event loop of
:mod:`.sched_loop` (the same rules and event order, compiled like the default engine); this
SimPy model runs prefix caching and closed-loop sessions without a lever, and is the reference
the array loop is tested against.

Used when a serving lever is on (batching policy, token budget, KV policy, prefix caching) or
when multi-turn sessions release turns in a closed loop. Each instance is one process looping
over step boundaries: it swaps KV back in, admits from its FIFO queue under the KV policy, grows
paged allocations (preempting the latest arrival when memory runs out) and runs one step — a
prompt batch, a decode step or a chunked mixed step — priced by the pool's cost model
(:func:`kvcargo.cost.mixed_parts`; with a parallel layout, its slots and communication,
levers-parallel §2.2; under ``--cost-model calibrated``,
:func:`kvcargo.calibrated.calibrated_mixed_step`). In disaggregated mode a prefilled request first reserves KV on its decode
instance, then moves over the shared link.

The rules mirror vLLM's scheduler (PagedAttention, preemption by recompute or swap: Kwon et al.,
SOSP 2023, arXiv:2309.06180) and Sarathi-Serve's chunked prefill (Agrawal et al., OSDI 2024,
arXiv:2403.02310) as the companion simulator models them.

SimPy keeps the companion's event order (zero-delay wakes, FIFO link channels, same-time
callbacks), which decides ties and therefore the last bits. Events are per step and per request,
never per token.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from kvcargo.config import Resolved
from kvcargo.cost import model_coefficients, shape
from kvcargo.engine.cluster import step_tables
from kvcargo.engine.kvmemory import KvMemory, PrefixCache
from kvcargo.engine.pricing import scheduled_step
from kvcargo.errors import KvcargoError
from kvcargo.lever_metrics import COMM, SCALE_UP_J
from kvcargo.linkmodel import link_transfers
from kvcargo.serving import (
    DEFAULT_BLOCK,
    DEFAULT_HOST_LINK,
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_PREEMPTION,
    check_model,
)
from kvcargo.transfer import endpoint_work
from kvcargo.workload.stream import BLOCK_TOKENS

NAN = math.nan
WATERMARK = 0.01
"""Share of a paged colocated or decode instance's blocks kept free at admission."""


@dataclass(slots=True, eq=False)
class Req:
    """One request's scheduling state and stamps."""

    rid: int
    arrival: float
    p: int
    o: int
    chain: tuple = ()
    emit: str | None = None
    succ: int = -1
    think: float = 0.0
    prefill_start: float = NAN
    first_token: float = NAN
    kv_start: float = NAN
    kv_ready: float = NAN
    decode_start: float = NAN
    finish: float = NAN
    last_token: float = NAN
    tokens_out: int = 0
    itls: list = field(default_factory=list)
    t: int = 0
    """Tokens the current (re)prefill must put in KV (0: not looked at yet)."""
    done: int = 0
    base: int = 0
    alloc: int = 0
    covered: int = 0
    pins: list = field(default_factory=list)
    swapped_units: int = 0
    preempted_at: float = NAN
    held: tuple = (0, ())
    """Prefill pool: (units, pinned segments) kept until the hand-off has landed."""
    status: int = 0
    prefill_inst: int = -1
    decode_inst: int = -1

    @property
    def key(self) -> tuple[float, int]:
        return (self.arrival, self.rid)

    @property
    def decoding(self) -> bool:
        return self.done >= self.t


@dataclass(frozen=True)
class Rules:
    """The lever settings every instance reads."""

    policy: str
    kv_policy: str
    budget: int
    block: int
    max_seq_len: int
    swap: bool
    host_bw: float
    host_latency: float
    host_pj_bit: float
    kv_tok: int
    scheduled: bool


class StepWork(NamedTuple):
    """What one step computes (the arguments of :func:`kvcargo.cost.mixed_parts`, and the number of
    prompt chunks) and the endpoint-compression work of the prompts it completes."""

    rows: int
    context: int
    chunk_tokens: int
    chunk_attn: int
    chunk_kv: int
    chunks: int
    last: int
    ep_ops: float = 0.0
    ep_bytes: float = 0.0


def pool_arrays(res: Resolved) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pool row (0 prefill or colocated, 1 decode): roofline coefficients, stage-device
    coefficients and packed layout (levers-parallel §2.2; all zeros without a layout)."""
    first = res.decode_pool if res.colocated else res.prefill_pool
    hf = np.stack([first.coefficients(), res.decode_pool.coefficients()])
    lf, hs = res.levers.layout_arrays(res.model, res.prefill_pool, res.decode_pool)
    return hf, hs, lf


def transfers_of(res: Resolved):  # type: ignore[no-untyped-def]
    """The hand-offs' transfers: time on the link, energies, wire bytes (RS §4, §5); None colocated."""
    if res.colocated:
        return None
    w = res.workload
    return link_transfers(res.config.link_model, res.link, res.compression,
                          shape(res.model).handoff_bytes(np.asarray(w.prompt, dtype=np.int64)), res.model.kv_bytes,
                          np.asarray(w.prompt))


def next_token(r: Req, now: float) -> None:
    """A request produced its next token now (its gap joins the inter-token latencies)."""
    r.itls.append(now - r.last_token)
    r.tokens_out += 1
    r.last_token = now


class Totals:
    """What an instance accumulates, step by step, in step order."""

    sim: Sim
    index: int
    pool: int
    """Row of the pool arrays (:func:`pool_arrays`)."""

    def init_totals(self) -> None:
        self.busy = self.flops = self.nbytes = self.e_c = self.e_m = 0.0
        self.comm = self.scale_up_j = 0.0
        self.steps = 0

    def price(self, work: StepWork) -> tuple[float, Any, float, float, float]:
        """Time, FLOPs, bytes and energies of a step on this instance's pool — the calibrated
        model's, or the roofline's (a layout's slots, its communication booked) — plus the
        endpoint-compression pass (RS §5) when the step completes prompts that are sent
        compressed."""
        sim, k = self.sim, self.pool
        dt, flops, nbytes, e_c, e_m, comm_t, scale_up_j = scheduled_step(
            sim.hf[k], sim.hs[k], sim.lf[k], sim.ct[k], sim.cs[k], sim.calibrated, sim.mi, sim.mf, *work)
        self.comm += comm_t
        self.scale_up_j += scale_up_j
        return dt, flops, nbytes, e_c, e_m

    def spend(self, dt: float, flops: Any, nbytes: float, e_c: float, e_m: float, batch: int) -> Generator:
        """Charge a step of ``dt`` seconds (``batch`` decode rows: logged) and wait it out."""
        self.busy += dt
        self.flops += flops
        self.nbytes += nbytes
        self.e_c += e_c
        self.e_m += e_m
        self.steps += 1
        env = self.sim.env
        if batch:
            self.sim.step_log.append((env.now, env.now + dt, self.index, batch))
        yield env.timeout(dt)


class Instance(Totals):
    """A scheduled instance: colocated, prefill pool or decode pool (``role``)."""

    def __init__(self, sim: Sim, index: int, role: str, kvcap: int) -> None:
        self.sim, self.env, self.index, self.role = sim, sim.env, index, role
        self.pool = int(role == "decode")
        rules = sim.rules
        self.rules = rules
        unit = rules.block if rules.kv_policy == "paged" else 1
        cap = kvcap // unit
        paged = rules.kv_policy == "paged"
        watermark = math.floor(WATERMARK * cap) if paged and role != "prefill" else 0
        cache = PrefixCache() if sim.prefix_caching and role != "decode" else None
        self.mem = KvMemory(cap, unit, watermark, cache)
        self.max_rows = 256 if role != "prefill" else 1 << 62
        self.queue: deque[Req] = deque()
        self.running: list[Req] = []
        self.swapped: list[Req] = []
        self.inbox: deque[Req] = deque()
        self.landed: deque[Req] = deque()
        self.in_flight = 0
        self.wake: Any = None
        self.debt = 0.0
        self.init_totals()
        self.run_int = self.tok_int = self.alloc_int = 0.0
        self.swap_s = self.swap_j = 0.0
        self.swap_out = self.swap_in_bytes = 0
        self.computed = self.recomputed = self.preemptions = 0
        self.prompt_tokens = self.hit_tokens = 0

    # ------------------------------------------------------------------ queues and loads
    def load(self) -> int:
        """Routing load: waiting, swapped, in flight or landed, and decoding requests."""
        decoding = sum(1 for r in self.running if r.decoding)
        return (len(self.inbox) + self.in_flight + len(self.landed) + len(self.queue) + len(self.swapped)
                + decoding)

    def queued_tokens(self) -> int:
        return sum(r.p for r in self.queue)

    def submit(self, r: Req) -> None:
        self.queue.append(r)
        self.poke()

    def poke(self) -> None:
        """Wake the instance if it sleeps."""
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def sleep(self) -> Generator:
        self.wake = self.env.event()
        yield self.wake
        self.wake = None

    # ------------------------------------------------------------------ memory rules
    def need(self, r: Req, hit: int) -> int:
        """Units allocated at admission (§1.1)."""
        rules = self.rules
        if self.role == "prefill" or rules.kv_policy == "paged":
            return self.mem.units(r.t - hit)
        if rules.kv_policy == "pow2":
            return r.p - hit + (1 << (r.o - 1).bit_length())
        if rules.kv_policy == "max":
            return max(rules.max_seq_len, r.p + r.o) - hit
        return r.p - hit + r.o

    def private(self, r: Req, x: int) -> int:
        """Private units once ``x`` prompt tokens are covered by cached segments."""
        if self.rules.kv_policy == "paged":
            return self.mem.units(max(0, r.done + r.tokens_out - r.base - x))
        return r.alloc - (x - r.covered)

    def lookup(self, r: Req, t: int) -> tuple[int, list]:
        cache = self.mem.cache
        if cache is None or not r.chain:
            return 0, []
        return cache.lookup(r.chain, t - 1)

    def release(self, r: Req) -> None:
        """Free a request's private units and unpin its segments."""
        self.mem.used -= r.alloc
        r.alloc = 0
        self.unpin_all(r.pins)
        r.pins = []
        r.covered = 0

    def unpin_all(self, pins) -> None:
        cache = self.mem.cache
        for node in pins:
            cache.unpin(node, self.env.now)

    def try_admit(self) -> Req | None:
        """Admit the head of the queue if its KV fits (§2.1)."""
        r = self.queue[0]
        if r.t == 0:
            r.t = r.p
        hit, nodes = self.lookup(r, r.t)
        need = self.need(r, hit)
        now = self.env.now
        for node in nodes:
            PrefixCache.pin(node, now)
        if not self.mem.room(need + self.mem.watermark):
            self.unpin_all(nodes)
            return None
        self.queue.popleft()
        r.pins, r.covered, r.alloc, r.done, r.base = list(nodes), hit, need, hit, r.tokens_out
        self.mem.used += need
        self.resumed(r, "preempted: recompute")
        if math.isnan(r.prefill_start):
            r.prefill_start = now
            self.prompt_tokens += r.p
            self.hit_tokens += hit
        bisect.insort(self.running, r, key=Req.key.fget)
        return r

    def cache_chain(self, r: Req) -> None:
        """After a (re)prefill, cache or share the request's chain segments (§5.2)."""
        cache = self.mem.cache
        if cache is None:
            return
        mem, now = self.mem, self.env.now
        for key, n in r.chain[len(r.pins):]:
            parent = r.pins[-1] if r.pins else None
            node = cache.nodes.get(key)
            if node is not None and node.parent is parent:
                PrefixCache.pin(node, now)
            elif node is not None:
                break
            else:
                if not mem.room(mem.units(n) + self.private(r, r.covered + n) - r.alloc):
                    break
                node = cache.create(key, n, mem.units(n), parent, now)
                mem.used += node.units
            priv = self.private(r, r.covered + n)
            mem.used += priv - r.alloc
            r.alloc = priv
            r.pins.append(node)
            r.covered += n

    def emit(self, r: Req) -> None:
        """At finish, offer the request's own segment (input and reply) to the cache."""
        cache, mem = self.mem.cache, self.mem
        if cache is None or r.emit is None or len(r.pins) != len(r.chain):
            return
        n = r.p - r.covered + r.o
        if r.emit not in cache.nodes and mem.room(mem.units(n) - r.alloc):
            node = cache.create(r.emit, n, mem.units(n), r.pins[-1] if r.pins else None, self.env.now)
            mem.used += node.units
            r.pins.append(node)

    # ------------------------------------------------------------------ paging and swap
    def swap_cost(self, n: int) -> tuple[int, float]:
        rules = self.rules
        nbytes = n * rules.block * rules.kv_tok
        t = n * rules.host_latency + nbytes / rules.host_bw
        self.debt += t
        self.swap_s += t
        self.swap_j += nbytes * 8 * rules.host_pj_bit * 1e-12
        return nbytes, t

    def preempt(self, v: Req) -> None:
        self.running.remove(v)
        self.preemptions += 1
        v.preempted_at = self.env.now
        if self.rules.swap and v.decoding:
            n = v.alloc
            nbytes, _ = self.swap_cost(n)
            self.swap_out += nbytes
            self.mem.used -= n
            v.swapped_units, v.alloc = n, 0
            bisect.insort(self.swapped, v, key=Req.key.fget)
            return
        self.release(v)
        v.t, v.done = v.p + v.tokens_out, 0
        self.queue.appendleft(v)

    def grow(self) -> None:
        """Give decoding rows the blocks their next token needs, preempting the latest (§3.2)."""
        if self.rules.kv_policy != "paged":
            return
        running, mem = self.running, self.mem
        unit = mem.unit
        i = 0
        while i < len(running):
            r = running[i]
            if r.done < r.t:
                i += 1
                continue
            need = -(-(r.p + r.tokens_out - r.covered) // unit)
            if need <= r.alloc:
                i += 1
                continue
            while True:
                if mem.room(need - r.alloc):
                    mem.used += need - r.alloc
                    r.alloc = need
                    i += 1
                    break
                victim = running[-1]
                self.preempt(victim)
                if victim is r:
                    break

    def swap_in(self) -> None:
        while self.swapped and len(self.running) < self.max_rows:
            r = self.swapped[0]
            if not self.mem.room(r.swapped_units):
                return
            self.swapped.pop(0)
            n = r.swapped_units
            nbytes, _ = self.swap_cost(n)
            self.swap_in_bytes += nbytes
            self.mem.used += n
            r.alloc = n
            self.resumed(r, "swapped out")
            bisect.insort(self.running, r, key=Req.key.fget)

    def resumed(self, r: Req, what: str) -> None:
        """A preempted request is back: record the span it spent out of the batch."""
        if not math.isnan(r.preempted_at):
            self.sim.spans.append((what, self.role, self.index, r.rid, r.preempted_at, self.env.now))
            r.preempted_at = NAN

    # ------------------------------------------------------------------ steps
    def step(self, work: StepWork) -> Generator:
        """One step: its priced time plus any host-link time owed; occupancy integrals from the
        state before it."""
        dt, flops_f, nbytes, e_c, e_m = self.price(work)
        dt = dt + self.debt
        self.debt = 0.0
        if self.role != "prefill":
            unit = self.mem.unit
            self.run_int += len(self.running) * dt
            self.tok_int += sum(r.done - r.covered + r.tokens_out - r.base for r in self.running) * dt
            self.alloc_int += sum(r.alloc for r in self.running) * unit * dt
        yield from self.spend(dt, flops_f, nbytes, e_c, e_m, work.rows)

    def advance(self, rows: list[Req]) -> None:
        """Every decode row of the step got its next token; those at their length finish (in
        row order)."""
        now = self.env.now
        done = []
        for r in rows:
            r.itls.append(now - r.last_token)
            r.tokens_out += 1
            r.last_token = now
            if r.tokens_out >= r.o:
                done.append(r)
        if done:
            ended = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in ended]
            for r in done:
                self.end(r)

    def end(self, r: Req) -> None:
        self.emit(r)
        self.release(r)
        self.sim.finish(r)

    def prefill_done(self, r: Req) -> None:
        now = self.env.now
        self.cache_chain(r)
        if self.role == "prefill":
            r.first_token = r.last_token = now
            r.tokens_out = 1
            self.running.remove(r)
            if r.o <= 1:
                self.release(r)
                self.sim.finish(r)
            else:
                r.held = (r.alloc, tuple(r.pins))
                r.alloc, r.pins, r.covered = 0, [], 0
                self.sim.hand_off(r)
            return
        if r.tokens_out > 0:
            next_token(r, now)
        else:
            r.first_token = r.last_token = now
            r.tokens_out = 1
        if math.isnan(r.decode_start) and r.o > 1:
            r.decode_start = now
        if r.tokens_out >= r.o:
            self.running.remove(r)
            self.end(r)

    def chunk_work(self, rows: list[tuple[Req, int]], dec: list[Req]) -> StepWork:
        """The work of a step over decode rows ``dec`` and prompt chunks ``rows`` (and the endpoint
        compression of the prompts it completes)."""
        c_sum = attn = kv = last = 0
        ep_ops = ep_bytes = 0.0
        for r, c in rows:
            c_sum += c
            attn += c * (2 * r.done + c + 1)
            kv += r.done + c
            self.computed += c
            if r.tokens_out > 0:
                self.recomputed += c
            if r.done + c == r.t:
                last += 1
                if self.role == "prefill" and self.sim.endpoint and r.o > 1:
                    ep_ops += self.sim.ep_ops[r.rid]
                    ep_bytes += self.sim.ep_bytes[r.rid]
        context = sum(r.p + r.tokens_out for r in dec)
        return StepWork(len(dec), context, c_sum, attn, kv, len(rows), last, ep_ops, ep_bytes)

    def prompt_batch(self) -> list[Req]:
        """Whole prompts from the queue head within the token budget (§2.2)."""
        batch: list[Req] = []
        tokens = 0
        while self.queue and len(self.running) < self.max_rows and not self.swapped:
            head = self.queue[0]
            t = head.t or head.p
            x = t - self.lookup(head, t)[0]
            if batch and tokens + x > self.rules.budget:
                break
            if self.try_admit() is None:
                break
            batch.append(head)
            tokens += head.t - head.done
        return batch

    def prefill_step(self, batch: list[Req]) -> Generator:
        rows = [(r, r.t - r.done) for r in batch]
        yield from self.step(self.chunk_work(rows, []))
        for r in batch:
            r.done = r.t
            self.prefill_done(r)

    def decode_step(self) -> Generator:
        self.grow()
        if not self.running:
            return
        rows = list(self.running)
        yield from self.step(self.chunk_work([], rows))
        self.advance(rows)

    def chunked_step(self) -> Generator:
        """One Sarathi-Serve step: every decode row plus prompt chunks up to the budget (§2.4)."""
        self.grow()
        budget = self.rules.budget
        dec = [r for r in self.running if r.done >= r.t]
        n = len(dec)
        rows: list[tuple[Req, int]] = []
        for r in list(self.running):
            if r.done < r.t and n < budget:
                c = min(r.t - r.done, budget - n)
                n += c
                rows.append((r, c))
        while self.queue and n < budget and len(self.running) < self.max_rows and not self.swapped:
            r = self.try_admit()
            if r is None:
                break
            c = min(r.t - r.done, budget - n)
            n += c
            rows.append((r, c))
        if not dec and not rows:
            return False
        yield from self.step(self.chunk_work(rows, dec))
        self.advance(dec)
        for r, c in rows:
            r.done += c
            if r.done == r.t:
                self.prefill_done(r)
        return True

    # ------------------------------------------------------------------ decode pool
    def pull(self) -> None:
        """Reserve KV for waiting hand-offs (strict FIFO) and start their transfers."""
        while self.inbox and not self.swapped:
            r = self.inbox[0]
            need = self.need(r, 0)
            if not self.mem.room(need + self.mem.watermark):
                return
            self.inbox.popleft()
            r.alloc = need
            self.mem.used += need
            self.in_flight += 1
            self.env.process(self.sim.transfer(r, self))

    def boundary(self) -> None:
        self.pull()
        while self.landed and len(self.running) < self.max_rows:
            r = self.landed.popleft()
            r.decode_start = self.env.now
            r.done, r.base = r.p, r.tokens_out
            bisect.insort(self.running, r, key=Req.key.fget)

    def land_held(self, r: Req) -> None:
        """Prefill pool: the hand-off landed, its KV here is freed."""
        units, pins = r.held
        self.mem.used -= units
        self.unpin_all(pins)
        r.held = (0, ())
        self.poke()

    def loop(self) -> Generator:
        policy = self.rules.policy
        while True:
            if self.role == "decode":
                self.boundary()
            if self.swapped:
                self.swap_in()
            if policy == "chunked":
                ran = yield from self.chunked_step()
                if not ran:
                    yield from self.sleep()
                continue
            if policy == "decode-priority" and self.role != "prefill" and self.running:
                yield from self.decode_step()
                continue
            batch = self.prompt_batch()
            if batch:
                yield from self.prefill_step(batch)
            elif self.running:
                yield from self.decode_step()
            else:
                yield from self.sleep()


class PlainInstance(Totals):
    """The reference's prefill or decode instance (RS §6.2), for closed-loop sessions that use
    no scheduling lever in disaggregated mode."""

    def __init__(self, sim: Sim, index: int, role: str, kvcap: int) -> None:
        self.sim, self.env, self.index, self.role, self.kvcap = sim, sim.env, index, role, kvcap
        self.pool = int(role == "decode")
        self.queue: deque[Req] = deque()
        self.running: list[Req] = []
        self.kv_used = 0
        self.wake: Any = None
        self.init_totals()

    submit, poke, sleep = Instance.submit, Instance.poke, Instance.sleep

    def queued_tokens(self) -> int:
        return sum(r.p for r in self.queue)

    def load(self) -> int:
        return len(self.queue) + len(self.running)

    def charge(self, work: StepWork) -> Generator:
        yield from self.spend(*self.price(work), work.rows)

    def loop(self) -> Generator:
        sim, env = self.sim, self.env
        while True:
            if self.role == "decode":
                while (self.queue and len(self.running) < 256
                       and self.kv_used + self.queue[0].p + self.queue[0].o <= self.kvcap):
                    r = self.queue.popleft()
                    self.kv_used += r.p + r.o
                    r.decode_start = env.now
                    self.running.append(r)
            if self.role == "decode" and self.running:
                ctx = sum(r.p + r.tokens_out for r in self.running)
                yield from self.charge(StepWork(len(self.running), ctx, 0, 0, 0, 0, 0))
                still = []
                for r in self.running:
                    next_token(r, env.now)
                    if r.tokens_out >= r.o:
                        self.kv_used -= r.p + r.o
                        sim.finish(r)
                    else:
                        still.append(r)
                self.running = still
            elif self.role == "prefill" and self.queue:
                batch, tokens = [], 0
                while self.queue and (not batch or tokens + self.queue[0].p <= sim.rules.budget):
                    r = self.queue.popleft()
                    r.prefill_start = env.now
                    batch.append(r)
                    tokens += r.p
                attn = sum(r.p * (r.p + 1) for r in batch)
                ep = [r.rid for r in batch if r.o > 1] if sim.endpoint else []
                ep_ops, ep_bytes = sum(sim.ep_ops[i] for i in ep), sum(sim.ep_bytes[i] for i in ep)
                yield from self.charge(StepWork(0, 0, tokens, attn, tokens, len(batch), len(batch), ep_ops, ep_bytes))
                for r in batch:
                    r.first_token = r.last_token = env.now
                    r.tokens_out = 1
                    if r.o <= 1:
                        sim.finish(r)
                    else:
                        env.process(sim.transfer(r, None))
            else:
                yield from self.sleep()


class Sim:
    """The cluster of a scheduled run, built in the companion's process creation order."""

    def __init__(self, res: Resolved) -> None:
        import simpy

        self.env = env = simpy.Environment()
        c, w = res.config, res.workload
        self.res = res
        model = res.model
        check_model(res)
        self.mi, self.mf = model_coefficients(model, c.lm_head)
        self.hf, self.hs, self.lf = pool_arrays(res)
        self.calibrated = c.cost_model == "calibrated"
        self.ct, self.cs = step_tables(res)
        kv_tok = int(shape(model).kv_per_token)
        host = res.catalog.link(c.host_link or DEFAULT_HOST_LINK)
        self.rules = Rules(
            policy=c.batch_policy, kv_policy=c.kv_policy,
            budget=c.max_num_batched_tokens if c.max_num_batched_tokens is not None else c.token_budget,
            block=c.kv_block_size or DEFAULT_BLOCK, max_seq_len=c.max_seq_len or DEFAULT_MAX_SEQ_LEN,
            swap=(c.preemption or DEFAULT_PREEMPTION) == "swap", host_bw=host.bandwidth,
            host_latency=host.latency, host_pj_bit=host.pj_per_bit, kv_tok=kv_tok, scheduled=c.scheduled)
        self.prefix_caching = c.prefix_caching
        s = w.sessions
        self.reqs = [Req(i, float(w.arrival[i]), int(w.prompt[i]), int(w.output[i])) for i in range(len(w))]
        if s is not None:
            for r in self.reqs:
                r.chain, r.emit = s.chain[r.rid], s.emit[r.rid]
                r.succ, r.think = int(s.successor[r.rid]), float(s.think[r.rid])
        elif c.prefix_caching and w.block_ids is not None:
            for r, chain in zip(self.reqs, block_chains(w)):
                r.chain = chain
        roots = [r for r in self.reqs if s is None or s.predecessor[r.rid] < 0]
        self.completed = self.rejected = 0
        self.done = env.event()
        self.link_busy = self.link_j = self.transit_j = 0.0
        self.n_transfers = 0
        self.step_log: list[tuple[float, float, int, int]] = []
        self.spans: list[tuple[str, str, int, int, float, float]] = []
        """Preemption spans: (what, pool, instance, request, start, end)."""
        self.endpoint = False
        self.colocated = res.colocated
        kind = Instance if c.scheduled or res.colocated else PlainInstance
        if res.colocated:
            cap = res.kv_capacity
            self.instances = [Instance(self, i, "colocated", cap) for i in range(res.n_decode)]
            self.prefill, self.decode = [], self.instances
        else:
            comp = res.compression
            self.xfer = transfers_of(res)
            if comp is not None and comp.at == "endpoint":
                self.endpoint = True
                handoff = shape(model).handoff_bytes(np.asarray(w.prompt, dtype=np.int64))
                ops, eb = endpoint_work(comp, handoff, np.asarray(w.prompt), model.kv_bytes)
                self.ep_ops, self.ep_bytes = ops.tolist(), eb.tolist()
            pre_cap = res.levers.prefill.kv_capacity  # the pool's own (stage by stage with a layout)
            self.prefill = [kind(self, i, "prefill", pre_cap) for i in range(res.n_prefill)]
            self.decode = [kind(self, i, "decode", res.kv_capacity) for i in range(res.n_decode)]
            self.instances = self.prefill + self.decode
        for inst in self.instances:
            env.process(inst.loop())
        if not res.colocated:
            self.link = simpy.Resource(env, capacity=res.channels)
        env.process(self.arrivals(roots))

    # ------------------------------------------------------------------ arrivals and routing
    def arrivals(self, roots: list[Req]) -> Generator:
        env = self.env
        for r in roots:
            yield env.timeout(max(0, r.arrival - env.now))
            self.arrive(r)

    def rejects(self, r: Req) -> bool:
        """Whether a request can never fit (§1.2; RS §6.2.1 without the levers)."""
        if not self.rules.scheduled:
            return r.p + r.o > self.decode[0].kvcap if not self.colocated else r.p + r.o > self.decode[0].mem.cap
        d = self.decode[0]
        mem = d.mem
        kvp = self.rules.kv_policy
        if kvp == "paged":
            whole = mem.units(r.p + r.o) + mem.watermark
        elif kvp == "pow2":
            whole = r.p + (1 << (r.o - 1).bit_length())
        elif kvp == "max":
            whole = max(self.rules.max_seq_len, r.p + r.o)
        else:
            whole = r.p + r.o
        if whole > mem.cap:
            return True
        return bool(self.prefill) and self.prefill[0].mem.units(r.p) > self.prefill[0].mem.cap

    def arrive(self, r: Req) -> None:
        if self.rejects(r):
            while True:  # its later turns are rejected with it
                r.status = 2
                self.rejected += 1
                if r.succ < 0:
                    break
                r = self.reqs[r.succ]
            self.check_done()
        elif self.colocated:
            inst = min(self.instances, key=Instance.load)
            r.decode_inst = inst.index
            inst.submit(r)
        else:
            inst = min(self.prefill, key=lambda p: p.queued_tokens())
            r.prefill_inst = inst.index
            inst.submit(r)

    def hand_off(self, r: Req) -> None:
        """A prefilled request picks its decode instance now and waits there for KV memory."""
        d = min(self.decode, key=Instance.load)
        r.decode_inst = d.index
        d.inbox.append(r)
        d.pull()

    def transfer(self, r: Req, d: Instance | None) -> Generator:
        env = self.env
        duration = float(self.xfer.duration[r.rid])
        with self.link.request() as req:
            yield req
            r.kv_start = env.now
            self.n_transfers += 1
            self.link_busy += duration
            self.link_j += float(self.xfer.link_j[r.rid])
            self.transit_j += float(self.xfer.transit_j[r.rid])
            yield env.timeout(duration)
        r.kv_ready = env.now
        if d is None:  # the reference: the decode instance is chosen when the KV lands
            dest = min(self.decode, key=PlainInstance.load)
            r.decode_inst = dest.index
            dest.submit(r)
            return
        self.prefill[r.prefill_inst].land_held(r)
        d.in_flight -= 1
        d.landed.append(r)
        d.poke()

    def finish(self, r: Req) -> None:
        env = self.env
        r.finish = env.now
        r.status = 1
        self.completed += 1
        if r.succ >= 0:
            nxt = self.reqs[r.succ]
            ev = env.timeout(nxt.think)
            ev.callbacks.append(lambda _e, nxt=nxt: self.release_turn(nxt))
        self.check_done()

    def release_turn(self, r: Req) -> None:
        r.arrival = self.env.now
        self.arrive(r)

    def check_done(self) -> None:
        if self.completed + self.rejected == len(self.reqs) and not self.done.triggered:
            self.done.succeed()

    def run(self) -> None:
        try:
            self.env.run(until=self.done)
        except RuntimeError as exc:  # no event left: a request can never be admitted
            left = len(self.reqs) - self.completed - self.rejected
            raise KvcargoError(f"the run stalled with {left} requests unserved (no KV memory ever frees for "
                               "them): give the instances more memory or fewer tokens per request") from exc


def block_chains(w) -> list[tuple]:  # type: ignore[no-untyped-def]
    """A trace's prompt block ids (Mooncake's ``hash_ids``: equal ids, equal prefix) as prefix
    chains: one segment per block, the last one holding the rest of the prompt."""
    chains = []
    for i, prompt in enumerate(w.prompt.tolist()):
        ids = w.block_ids[w.block_offsets[i]:w.block_offsets[i + 1]].tolist()
        sizes = [BLOCK_TOKENS] * len(ids)
        if ids:
            sizes[-1] = max(1, prompt - BLOCK_TOKENS * (len(ids) - 1))
        chains.append(tuple((f"b{b}", n) for b, n in zip(ids, sizes)))
    return chains


def _sum(values) -> float:
    """Left-to-right float sum, in instance order (as the companion adds its totals)."""
    total = 0.0
    for v in values:
        total += v
    return total


def lever_metrics(sim: Sim) -> dict[str, Any]:
    """The summary keys the levers add (levers-serving §9)."""
    c = sim.res.config
    if not c.scheduled:
        return {}
    insts = sim.instances
    served = sim.decode
    d0 = served[0]
    busy = _sum(i.busy for i in served)
    alloc = _sum(i.alloc_int for i in served)
    out: dict[str, Any] = {
        "token_budget": sim.rules.budget,
        "kv_capacity_units": d0.mem.cap,
        "kv_unit_tokens": d0.mem.unit,
    }
    if sim.prefill:
        out["prefill_kv_capacity_units"] = sim.prefill[0].mem.cap
    out["mean_running"] = _sum(i.run_int for i in served) / busy if busy > 0 else math.nan
    out["kv_token_frac"] = _sum(i.tok_int for i in served) / alloc if alloc > 0 else math.nan
    out["computed_prefill_tokens"] = sum(i.computed for i in insts)
    if c.kv_policy == "paged":
        out["preemptions"] = sum(i.preemptions for i in insts)
        out["recompute_tokens"] = sum(i.recomputed for i in insts)
        if sim.rules.swap:
            out["swap_out_GB"] = sum(i.swap_out for i in insts) / 1e9
            out["swap_in_GB"] = sum(i.swap_in_bytes for i in insts) / 1e9
            out["swap_seconds"] = _sum(i.swap_s for i in insts)
            out["swap_J"] = _sum(i.swap_j for i in insts)
    if c.prefix_caching:
        cached = sim.prefill if sim.prefill else sim.instances
        prompt = sum(i.prompt_tokens for i in cached)
        hits = sum(i.hit_tokens for i in cached)
        out["prefix_hit_rate"] = hits / prompt if prompt else 0.0
        out["prefix_hit_tokens"] = hits
        out["prefix_prompt_tokens"] = prompt
        out["prefix_evicted_tokens"] = sum(i.mem.cache.evicted_tokens for i in cached)
        out["prefix_cached_tokens_end"] = sum(i.mem.cache.tokens for i in cached)
    return out


def lever_stats(comm: Any, scale_up_j: Any) -> np.ndarray:
    """The record's per-instance lever table of a scheduled run: a layout's communication seconds
    and scale-up J (levers-parallel §2.4); no draft."""
    out = np.zeros((len(comm), 5))
    out[:, COMM], out[:, SCALE_UP_J] = comm, scale_up_j
    return out


def run_scheduled(res: Resolved):  # type: ignore[no-untyped-def]
    """Simulate a configuration with the scheduled engine; the same record as the plain one."""
    from kvcargo.engine import sched_run
    from kvcargo.engine.cluster import EngineOutput

    if sched_run.handles(res):
        return sched_run.run_arrays(res)

    sim = Sim(res)
    sim.run()
    reqs = sim.reqs
    n = len(reqs)

    def col(name: str, dtype: Any = np.float64) -> np.ndarray:
        return np.array([getattr(r, name) for r in reqs], dtype=dtype)

    stats = np.array([[i.busy, i.flops, i.nbytes, i.e_c, i.e_m, i.steps] for i in sim.instances], dtype=np.float64)
    itl_lengths = np.array([len(r.itls) for r in reqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(itl_lengths)])
    itls = np.array([x for r in reqs for x in r.itls], dtype=np.float64)
    colocated = res.colocated
    zeros = np.zeros(n)
    moved = np.zeros(n, dtype=bool) if colocated else sim.xfer.transit_bound
    log = np.array(sim.step_log, dtype=object).reshape(-1, 4)
    levers = lever_metrics(sim)
    swap_j = levers.get("swap_J", 0.0)
    return EngineOutput(
        resolved=res, arrival=col("arrival"), prompt=col("p", np.int64), output=col("o", np.int64),
        prefill_start=col("prefill_start"), first_token=col("first_token"), kv_start=col("kv_start"),
        kv_ready=col("kv_ready"), decode_start=col("decode_start"), finish=col("finish"),
        status=col("status", np.int64), prefill_inst=col("prefill_inst", np.int64),
        decode_inst=col("decode_inst", np.int64), first_step=np.full(n, -1, dtype=np.int64), stats=stats,
        kv_held=np.zeros((res.n_prefill, 2)), send_fraction=np.ones(n), want_memory=np.full(n, np.nan),
        reserved=np.full(n, np.nan), steps=log[:, :2].astype(np.float64), step_inst=log[:, 2:].astype(np.int64),
        horizon=float(sim.env.now), transfers=sim.n_transfers,
        port_busy=np.array([sim.link_busy]), port_channels=np.array([res.channels]),
        link_busy_s=sim.link_busy, link_j=sim.link_j, transit_j=sim.transit_j, transit_bound=moved,
        wire_bytes=zeros if colocated else sim.xfer.wire_bytes,
        lever_stats=lever_stats([i.comm for i in sim.instances], [i.scale_up_j for i in sim.instances]),
        verify_passes=np.zeros(n, dtype=np.int64),
        engine_stats=np.zeros((len(sim.instances), 3)), prefill_done=np.full(n, np.nan),
        itl_values=itls, itl_offsets=offsets, levers=levers, swap_j=swap_j, spans=sim.spans,
    )
