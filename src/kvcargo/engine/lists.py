"""Intrusive lists threaded through index arrays: FIFO queues and LRU lists.

No list owns memory of its own. An item (a request, a hand-off unit, a prompt block) is an index;
its link lives in an array indexed by it (``links``); a list's ends live in two columns of its
owner's row (``ends[row, head]``, ``ends[row, tail]``), -1 when empty. An item sits in at most
one list of a kind at a time.
"""

from __future__ import annotations

import numpy as np

from kvcargo._jit import kernel
from kvcargo.engine.layout import Table

NOT_LISTED = -2
"""An LRU link of an item in no list (-1 is the end of a list)."""
LRU_LINKS = Table(np.int64, PREV=NOT_LISTED, NEXT=NOT_LISTED)
"""Per list and item: the previous and the next item of its LRU list."""
PREV, NEXT = LRU_LINKS.numbers


@kernel(inline=True)
def fifo_push(links, ends, row, head, tail, item):
    """Append ``item`` to the FIFO of ``ends[row]`` (``links``: each item's successor)."""
    links[item] = -1
    last = ends[row, tail]
    if last < 0:
        ends[row, head] = item
    else:
        links[last] = item
    ends[row, tail] = item


@kernel(inline=True)
def fifo_push_front(links, ends, row, head, tail, item):
    """Put ``item`` at the head of that FIFO (it leaves first)."""
    first = ends[row, head]
    links[item] = first
    ends[row, head] = item
    if first < 0:
        ends[row, tail] = item


@kernel(inline=True)
def fifo_pop(links, ends, row, head, tail):
    """Remove and return the head of that FIFO (it is not empty)."""
    item = ends[row, head]
    fifo_cut(ends, row, head, tail, links[item])
    return item


@kernel(inline=True)
def fifo_cut(ends, row, head, tail, item):
    """Make ``item`` (or -1: none) the head of that FIFO, the items before it having left."""
    ends[row, head] = item
    if item < 0:
        ends[row, tail] = -1


@kernel(inline=True)
def lru_unlink(links, ends, row, head, tail, count, item):
    """Take ``item`` out of the LRU list of ``ends[row]`` (``links[row, item]``: its previous and
    next item; ``ends[row, count]``: the list's length)."""
    prev, nxt = links[row, item, PREV], links[row, item, NEXT]
    if prev >= 0:
        links[row, prev, NEXT] = nxt
    else:
        ends[row, head] = nxt
    if nxt >= 0:
        links[row, nxt, PREV] = prev
    else:
        ends[row, tail] = prev
    links[row, item, PREV] = NOT_LISTED
    links[row, item, NEXT] = NOT_LISTED
    ends[row, count] -= 1


@kernel(inline=True)
def lru_touch(links, ends, row, head, tail, count, item):
    """Make ``item`` the most recent of that LRU list (it may already be in it)."""
    if links[row, item, PREV] != NOT_LISTED:
        lru_unlink(links, ends, row, head, tail, count, item)
    first = ends[row, head]
    links[row, item, PREV] = -1
    links[row, item, NEXT] = first
    if first >= 0:
        links[row, first, PREV] = item
    else:
        ends[row, tail] = item
    ends[row, head] = item
    ends[row, count] += 1


@kernel(inline=True)
def lru_listed(links, row, item):
    """Whether ``item`` is in the LRU list of ``row``."""
    return links[row, item, PREV] != NOT_LISTED
