"""Compiled-mode containers for the engine's arrays (numba StructRefs).

A namedtuple of arrays is passed by value: every compiled call copies it and reference-counts
each array, which costs more than the work of a small handler. A StructRef is one pointer.
The engine code is the same either way: it only reads attributes (``st.t``, ``pr.ri``).
"""

from __future__ import annotations

from numba import njit
from numba.core import types
from numba.experimental import structref

from kvcargo.engine.state import Params, State


class _ArraysRefType(types.StructRef):
    """A StructRef of arrays, typed by their plain (non-literal) types."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


@structref.register
class StateRefType(_ArraysRefType):
    pass


@structref.register
class ParamsRefType(_ArraysRefType):
    pass


class StateRef(structref.StructRefProxy):
    pass


class ParamsRef(structref.StructRefProxy):
    pass


structref.define_proxy(StateRef, StateRefType, list(State._fields))
structref.define_proxy(ParamsRef, ParamsRefType, list(Params._fields))


# numba's own proxy constructor (``StateRef(*arrays)`` from Python) is compiled afresh in every
# process, about a second; these are the same constructors compiled once into the on-disk cache.
@njit(cache=True)
def _state_ref(*arrays):  # type: ignore[no-untyped-def]
    return StateRef(*arrays)


@njit(cache=True)
def _params_ref(*arrays):  # type: ignore[no-untyped-def]
    return ParamsRef(*arrays)


def by_reference(obj: State | Params) -> StateRef | ParamsRef:
    """A StructRef holding the very same arrays (mutations are visible in ``obj``)."""
    return _state_ref(*obj) if isinstance(obj, State) else _params_ref(*obj)
