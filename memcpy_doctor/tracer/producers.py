"""The table of live tensors' producers: which op made each live tensor's data, and its size.

The per-op path asks it twice an op: `read` for the inputs (the op graph's edges from the ops
that made them, and the bytes read), `write` for the outputs (made by this op). It never keeps
a tensor alive: an entry holds a weak reference, and counts only while its tensor lives, so an
id reused by a new tensor finds a dead entry, not a wrong producer.

Two versions of one class: `_producers.c`, compiled when the package is installed where a C
compiler is (the Python version costs about 6,000 instructions an op, a fifth of a bare
dispatch mode's whole overhead; see docs/benchmarks.md), and `PyProducerTable` here, used
when the compiled one is not built. They give the same answers (tests/test_producers.py runs
both). `ProducerTable` is the one the tracer uses.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from ..core.defaults import PRODUCER_SWEEP_MIN


def nbytes(t: Any) -> int:
    """t.nbytes, and 0 for a sparse tensor, which has none (it raises RuntimeError)."""
    try:
        return t.nbytes
    except RuntimeError:
        if getattr(t, "is_sparse", False):
            return 0
        raise


class _Entry(weakref.ref):
    """A weak reference to a tensor, with what the table knows about it: `value` (what made
    its data) and `nbytes` (its size when the op that made it was a kernel; -1: not known).
    A size once known stays right: only an op with the tensor as its output, or a rebind,
    changes a tensor's size, and either writes the entry again."""

    __slots__ = ("value", "nbytes")


class PyProducerTable:
    """A weak map from live tensors to the op that made each one and its size when known,
    by id(tensor). Dead entries are swept when the table has doubled since the last sweep,
    from `sweep_min` entries on. len() counts entries, live and dead."""

    __slots__ = ("_entries", "_sweep_at", "_sweep_min")

    def __init__(self, sweep_min: int | None = None) -> None:
        self._entries: dict[int, _Entry] = {}
        self._sweep_min = PRODUCER_SWEEP_MIN if sweep_min is None else sweep_min
        self._sweep_at = self._sweep_min

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, ins: Sequence[Any], flows_in: dict[Any, list[int]], kernel: bool) -> int:
        """For each input whose producer is known, add a read and its bytes to
        flows_in[producer] (an edge [reads, bytes], made if missing). Returns the bytes read:
        the known inputs' sizes, and with `kernel` the others' too."""
        entries = self._entries
        total = 0
        for t in ins:
            made = entries.get(id(t))
            if made is not None and made() is t:
                size = made.nbytes
                if size < 0:
                    size = nbytes(t)
                edge = flows_in.get(made.value)
                if edge is None:
                    edge = flows_in[made.value] = [0, 0]
                edge[0] += 1
                edge[1] += size
                total += size
            elif kernel:
                total += nbytes(t)
        return total

    def write(self, outs: Sequence[Any], producer: Any, kernel: bool) -> int:
        """Record that `producer` made each output; with `kernel`, also each one's size (the
        bytes written, returned; 0 without `kernel`)."""
        entries = self._entries
        total = 0
        for o in outs:
            size = -1
            if kernel:  # first: a failing size leaves no half-made entry
                size = nbytes(o)
                total += size
            made = entries.get(id(o))
            if made is None or made() is not o:
                made = entries[id(o)] = _Entry(o)
                if len(entries) > self._sweep_at:
                    self._sweep()
            made.value = producer
            made.nbytes = size
        return total

    def get(self, t: Any) -> Any:
        """What made t's data, or None."""
        made = self._entries.get(id(t))
        if made is not None and made() is t:
            return made.value
        return None

    def forget(self, t: Any) -> None:
        """t's data was made by no op the table knows of."""
        made = self._entries.get(id(t))
        if made is not None and made() is t:
            del self._entries[id(t)]

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self._sweep_at = self._sweep_min

    def _sweep(self) -> None:
        entries = self._entries
        for k in [k for k, r in entries.items() if r() is None]:
            del entries[k]
        self._sweep_at = max(self._sweep_min, 2 * len(entries))


try:
    from ._producers import ProducerTable
    COMPILED = True
except ImportError:  # no C compiler where the package was installed
    ProducerTable = PyProducerTable  # type: ignore[assignment,misc]
    COMPILED = False
