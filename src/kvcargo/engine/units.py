"""Port queues: the FIFO of hand-off units waiting for a channel of a link, NIC or NVLink port.

Unit ``r·G + g`` is part ``g`` of request ``r``'s hand-off (G = 1: the whole hand-off; G > 1:
layer-wise slices); ``State.unext`` threads the queues.
"""

from __future__ import annotations

from kvcargo._jit import kernel
from kvcargo.engine.state import PORT_HEAD, PORT_TAIL


@kernel(inline=True)
def port_push(st, port, unit):
    """Append a unit to a port's FIFO."""
    st.unext[unit] = -1
    tail = st.ports[port, PORT_TAIL]
    if tail < 0:
        st.ports[port, PORT_HEAD] = unit
    else:
        st.unext[tail] = unit
    st.ports[port, PORT_TAIL] = unit


@kernel(inline=True)
def port_pop(st, port):
    """Remove and return the head of a port's FIFO (it is not empty)."""
    unit = st.ports[port, PORT_HEAD]
    nxt = st.unext[unit]
    st.ports[port, PORT_HEAD] = nxt
    if nxt < 0:
        st.ports[port, PORT_TAIL] = -1
    return unit
