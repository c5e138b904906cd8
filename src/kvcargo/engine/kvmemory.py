"""KV memory of one scheduled instance: units allocated, the watermark, and the prefix cache.

Memory is counted in units: one token, or one block of ``--kv-block-size`` tokens under the paged
policy. The prefix cache holds named prompt segments (a system prompt, an earlier turn) as a
tree (a segment is cached only under its chain predecessor); unpinned leaves are evicted least
recently used first (ties: the older node) when an allocation does not fit — SGLang's
RadixAttention (Zheng et al., arXiv:2312.07104) at the granularity of whole named segments.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


def ceil_div(x: int, u: int) -> int:
    """``ceil(x / u)`` for non-negative integers."""
    return -(-x // u)


@dataclass(slots=True, eq=False)
class Node:
    """One cached segment: its tokens and units, place in the tree, pins and recency."""

    key: str
    tokens: int
    units: int
    parent: Node | None
    seq: int
    last_use: float
    ref: int = 1
    children: int = 0


@dataclass
class PrefixCache:
    """Named segments shared by the requests whose prompts start with them (LRU eviction)."""

    nodes: dict[str, Node] = field(default_factory=dict)
    candidates: list[tuple[float, int, str, Node]] = field(default_factory=list)
    seq: int = 0
    evicted_tokens: int = 0

    def create(self, key: str, tokens: int, units: int, parent: Node | None, now: float) -> Node:
        """A new pinned node under ``parent``."""
        node = Node(key, tokens, units, parent, self.seq, now)
        self.seq += 1
        self.nodes[key] = node
        if parent is not None:
            parent.children += 1
        return node

    @staticmethod
    def pin(node: Node, now: float) -> None:
        node.ref += 1
        node.last_use = now

    def unpin(self, node: Node, now: float) -> None:
        """Drop one pin; an unpinned leaf becomes an eviction candidate."""
        node.ref -= 1
        node.last_use = now
        self._offer(node)

    def _offer(self, node: Node) -> None:
        if node.ref == 0 and node.children == 0:
            heapq.heappush(self.candidates, (node.last_use, node.seq, node.key, node))

    def evict(self, k: int) -> int:
        """Delete least recently used unpinned leaves until ``k`` units are freed (or none is
        left); returns the units freed."""
        freed = 0
        while freed < k and self.candidates:
            last_use, _, key, node = heapq.heappop(self.candidates)
            if self.nodes.get(key) is not node or node.ref > 0 or node.children > 0 or node.last_use != last_use:
                continue  # stale: gone, re-created, pinned, a parent again, or used since
            del self.nodes[key]
            freed += node.units
            self.evicted_tokens += node.tokens
            parent = node.parent
            if parent is not None:
                parent.children -= 1
                self._offer(parent)
        return freed

    def lookup(self, chain: tuple[tuple[str, int], ...], limit: int) -> tuple[int, list[Node]]:
        """The longest run of leading chain segments cached (each under the previous one), cut
        back by whole segments until it covers at most ``limit`` tokens: (tokens, nodes)."""
        nodes: list[Node] = []
        parent = None
        for key, _ in chain:
            node = self.nodes.get(key)
            if node is None or node.parent is not parent:
                break
            nodes.append(node)
            parent = node
        hit = sum(n.tokens for n in nodes)
        while nodes and hit > limit:
            hit -= nodes.pop().tokens
        return hit, nodes

    @property
    def tokens(self) -> int:
        return sum(n.tokens for n in self.nodes.values())


@dataclass
class KvMemory:
    """Units of one instance: capacity, allocated, the admission watermark, an optional cache."""

    cap: int
    unit: int
    watermark: int
    cache: PrefixCache | None
    used: int = 0

    def units(self, tokens: int) -> int:
        return ceil_div(tokens, self.unit)

    def room(self, n: int) -> bool:
        """Whether ``n`` more units fit, evicting cached segments if that makes them fit."""
        short = self.used + n - self.cap
        if short > 0 and self.cache is not None:
            self.used -= self.cache.evict(short)
        return self.used + n <= self.cap
