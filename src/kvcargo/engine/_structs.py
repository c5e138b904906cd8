"""Compiled-mode access to the engine's arrays: a pointer to the state's (and the parameters')
tuple of arrays.

A namedtuple of arrays is passed by value: every compiled call copies it, dozens of arrays'
fields. A pointer to it is one word. The tuple lives on the stack of the entry that takes the
addresses (:func:`run_by_pointer`, or the ahead-of-time module's wrapper), which outlives every
handler call. Reading an array through the pointer (``st.t``) is a load; the handlers compile
without numba's reference counting (``kernel(refcounts=False)``), so it costs no atomic
increment and decrement either. The engine code is the same either way: it only reads
attributes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.core.datamodel import models
from numba.core.imputils import impl_ret_borrowed, lower_getattr_generic
from numba.core.typing.templates import AttributeTemplate
from numba.extending import infer_getattr, intrinsic, register_model

from kvcargo.engine import loop


class ArraysPointer(types.Type):
    """A pointer to a namedtuple of arrays (``tup``), read by field name."""

    def __init__(self, tup: types.BaseNamedTuple) -> None:
        self.tup = tup
        super().__init__(name=f"ArraysPointer({tup})")


@register_model(ArraysPointer)
class _PointerModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, dmm.lookup(fe_type.tup).get_value_type().as_pointer())


@infer_getattr
class _PointerAttributes(AttributeTemplate):
    key = ArraysPointer

    def generic_resolve(self, typ, attr):  # type: ignore[no-untyped-def]
        if attr in typ.tup.fields:
            return typ.tup.types[typ.tup.fields.index(attr)]
        return None


@lower_getattr_generic(ArraysPointer)
def _pointer_getattr(context, builder, typ, val, attr):  # type: ignore[no-untyped-def]
    i = typ.tup.fields.index(attr)
    field = builder.load(builder.gep(val, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), i)]))
    return impl_ret_borrowed(context, builder, typ.tup.types[i], field)


@intrinsic
def by_pointer(typingctx, tup):  # type: ignore[no-untyped-def]
    """The address of a copy of ``tup`` on the caller's stack (valid until the caller returns)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return cgutils.alloca_once_value(builder, args[0])

    return ArraysPointer(tup)(tup), codegen


@njit(cache=True, nogil=True)
def run_by_pointer(st, pr):  # type: ignore[no-untyped-def]
    """:func:`kvcargo.engine.loop.run_events` over pointers to ``st`` and ``pr`` (the just-in-time
    engine's entry from Python)."""
    return loop.run_events(by_pointer(st), by_pointer(pr))
