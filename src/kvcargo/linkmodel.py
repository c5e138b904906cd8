"""The measured link model (``--link-model measured``): what a real transfer stack gets out of a link.

A message of ``n`` bytes on one channel takes ``max(min_message_s, message_overhead_s + n / rate)``
with ``rate = min(bandwidth · efficiency, channel_cap)`` — Hockney's latency/bandwidth model, so
the fraction of line rate grows with the message size (Vidur's NCCL send/recv between H100
nodes: ~39% at 1 MiB, ~72% at 64 MiB). ``channel_cap`` is a host-side ceiling per channel (a
NIC's PCIe attachment). Streaming layer by layer, every slice is its own message, and each layer
adds ``layer_overhead_s`` that does not overlap the prefill (per-layer synchronisation between the
compute stream and the sender; by default ``LAYER_OVERHEAD_MESSAGES`` message overheads).

The constants are catalog fields of each link, so users override them with ``--catalog``; a link
without measured fields behaves as at line rate. :func:`fit_send_recv` fits them to a send/recv
curve (``kvcargo calibrate --send-recv``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvcargo import measured_csv
from kvcargo.catalog import Link
from kvcargo.elementwise import as_floats, maximum
from kvcargo.errors import KvcargoError
from kvcargo.transfer import Compression, Transfers, transfers

if TYPE_CHECKING:
    import numpy as np

LAYER_OVERHEAD_MESSAGES = 3.1
"""Per-layer non-overlapped cost of layer-wise sending, in message overheads. Fitted to one
figure: Splitwise's ≈ 5 ms left after layer-wise transfer of a 1,500-token Llama-2-70B prompt on
DGX-H100 over 400 Gbps InfiniBand (Patel et al., ISCA'24) with the ib-ndr constants; the A100 /
200 Gbps figure (≈ 8 ms) is held out (``kvcargo validate --group calibrated``)."""


def rate(link: Link) -> float:
    """Bytes/s one channel sustains on large messages."""
    r = link.bandwidth * (1.0 if link.efficiency is None else link.efficiency)
    return r if link.channel_cap is None else min(r, link.channel_cap)


def message_s(link: Link, nbytes: np.ndarray | float) -> np.ndarray | float:
    """Seconds one message of ``nbytes`` holds a channel under the measured model."""
    overhead = link.latency if link.message_overhead_s is None else link.message_overhead_s
    t = overhead + as_floats(nbytes) / rate(link)
    return t if link.min_message_s is None else maximum(t, link.min_message_s)


def transfer_s(link: Link, nbytes: np.ndarray | float, channels: int = 1) -> np.ndarray | float:
    """Seconds to move ``nbytes`` over ``channels`` channels of ``link`` under the measured model,
    striped as one message per channel started together (a multi-rail transfer engine)."""
    if channels < 1:
        raise KvcargoError(f"channels must be >= 1, got {channels}")
    return message_s(link, as_floats(nbytes) / channels)


def layer_overhead_s(link: Link) -> float:
    """The per-layer cost of layer-wise sending (the link's own, or the default)."""
    if link.layer_overhead_s is not None:
        return link.layer_overhead_s
    if link.message_overhead_s is None:
        return 0.0
    return LAYER_OVERHEAD_MESSAGES * link.message_overhead_s


def effective(link: Link) -> Link:
    """The link as the engine sees it under the measured model: the sustained rate as its
    bandwidth and the per-message overhead as its latency."""
    overhead = link.latency if link.message_overhead_s is None else link.message_overhead_s
    return link.model_copy(update={"bandwidth": rate(link), "latency": overhead})


def measured_transfers(link: Link, compression: Compression | None, nbytes: np.ndarray | float,
                       kv_value_bytes: float, prompt: np.ndarray | float | None = None, groups: int = 1) -> Transfers:
    """:func:`kvcargo.transfer.transfers` under the measured model (``link`` as in the catalog):
    every layer-wise slice pays the message overhead, the last one the per-layer costs of all."""
    eff = effective(link)
    x = transfers(eff, compression, nbytes, kv_value_bytes, prompt, groups)
    duration = x.duration if link.min_message_s is None else maximum(x.duration, link.min_message_s)
    if groups == 1:
        return replace(x, duration=duration)
    slice_time = x.slice_time + eff.latency
    if link.min_message_s is not None:
        slice_time = maximum(slice_time, link.min_message_s)
    last_extra = x.last_extra - eff.latency + groups * layer_overhead_s(link)
    return replace(x, duration=duration, slice_time=slice_time, last_extra=last_extra)


def link_transfers(link_model: str, link: Link, compression: Compression | None, nbytes: np.ndarray | float,
                   kv_value_bytes: float, prompt: np.ndarray | float | None = None, groups: int = 1) -> Transfers:
    """The link seam: per-request transfer figures under ``--link-model`` (for an array of
    hand-offs, or one hand-off's numbers)."""
    if link_model == "measured":
        return measured_transfers(link, compression, nbytes, kv_value_bytes, prompt, groups)
    return transfers(link, compression, nbytes, kv_value_bytes, prompt, groups)


def layerwise_exposed(link: Link, kv_bytes: float, prefill_s: float, layers: int) -> float:
    """Seconds a layer-wise hand-off still needs after its prefill under the measured model:
    slices ready at g/L of the prefill, each a message, then the per-layer costs."""
    tau = float(message_s(link, kv_bytes / layers))
    return max(tau, layers * tau - (layers - 1) / layers * prefill_s) + layers * layer_overhead_s(link)


def read_send_recv(path: str | Path, across_nodes: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Message bytes and median seconds from a Vidur ``send_recv.csv`` (2 KiB … 64 MiB), across
    nodes (``devices_per_node`` 1) or within one."""
    import numpy as np

    header, lines = measured_csv.read(path)
    need = ("devices_per_node", "size", "time_stats.send_recv.median")
    missing = [c for c in need if c not in header]
    if missing:
        raise KvcargoError(f"{path}: not a Vidur send_recv CSV (missing columns {', '.join(missing)})")
    want = "1" if across_nodes else "2"
    sizes, times = [], []
    for i, r in lines:
        if r["devices_per_node"] == want:
            size = measured_csv.positive(path, i, r, "size")
            if 2048 <= size <= 64 * 2**20:
                sizes.append(size)
                times.append(measured_csv.positive(path, i, r, "time_stats.send_recv.median") * 1e-3)
    if len(sizes) < 2:
        raise KvcargoError(f"{path}: fewer than two send/recv rows between 2 KiB and 64 MiB")
    return np.array(sizes), np.array(times)


def fit_send_recv(sizes: np.ndarray, times: np.ndarray, bandwidth: float) -> dict[str, float]:
    """``message_overhead_s`` and ``efficiency`` of a link of line rate ``bandwidth`` minimising the
    relative error of ``overhead + n / (bandwidth · efficiency)`` on a measured curve."""
    import numpy as np

    a = np.stack([1.0 / times, sizes / times], axis=1)
    (overhead, inv_rate), *_ = np.linalg.lstsq(a, np.ones_like(times), rcond=None)
    if overhead < 0 or inv_rate <= 0:
        raise KvcargoError("the send/recv curve does not fit overhead + bytes/rate (check the file)")
    return {"message_overhead_s": float(overhead), "efficiency": float(1.0 / inv_rate / bandwidth)}
